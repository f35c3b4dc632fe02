rule figure:
    input:
        unpack(figure_inputs),
    output:
        png=report(
            f"{FIGURES}/{{exp}}_{{slug}}.png",
            caption="../report/figure.rst",
            category="{exp}",
        ),
        pdf=f"{FIGURES}/{{exp}}_{{slug}}.pdf",
        csv=f"{FIGURES}/{{exp}}_{{slug}}.csv",
        md=f"{FIGURES}/{{exp}}_{{slug}}.md",
        json=f"{FIGURES}/{{exp}}_{{slug}}.json",
    log:
        f"{RESULTS}/logs/figure_{{exp}}_{{slug}}.log",
    conda:
        "../../environment.yml"
    threads: 1
    params:
        runs=figure_runs,
        settings=figure_params,
        title=lambda wildcards: EXPERIMENTS[wildcards.exp].title,
        caption=lambda wildcards: EXPERIMENTS[wildcards.exp].caption,
        folder=lambda wildcards, output: os.path.dirname(output.png),
    shell:
        "python -m gradcomp figure {wildcards.exp} --runs {params.runs} --params {params.settings} "
        "--out-dir {params.folder} > {log} 2>&1"


rule summary:
    input:
        [f"{FIGURES}/{EXPERIMENTS[exp].prefix}.json" for exp in config["experiments"]],
    output:
        f"{FIGURES}/SUMMARY.md",
    log:
        f"{RESULTS}/logs/summary.log",
    conda:
        "../../environment.yml"
    threads: 1
    params:
        folder=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "python -m gradcomp summary --figures {params.folder} --out {output} > {log} 2>&1"
