# Each experiment's settings as a file of this run's results, which the compute step reads: a fresh clone
# (committed figures, no results/) writes it anew and so recomputes every experiment, A4 (no runs) included.
rule settings:
    output:
        f"{RESULTS}/experiments/{{exp}}.json",
    log:
        f"{RESULTS}/logs/settings_{{exp}}.log",
    conda:
        "../../environment.yml"
    params:
        settings=settings_json,
    shell:
        "echo {params.settings} > {output} 2> {log}"


rule compute:
    input:
        runs=run_summaries,
        settings=f"{RESULTS}/experiments/{{exp}}.json",
    output:
        numbers=f"{FIGURES}/{{exp}}_{{slug}}.json",
        csv=f"{FIGURES}/{{exp}}_{{slug}}.csv",
        md=f"{FIGURES}/{{exp}}_{{slug}}.md",
    log:
        f"{RESULTS}/logs/compute_{{exp}}_{{slug}}.log",
    conda:
        "../../environment.yml"
    threads: 1
    params:
        runs=run_arguments,
        folder=lambda wildcards, output: os.path.dirname(output.numbers),
    shell:
        "python -m gradcomp compute {wildcards.exp} --settings {input.settings} "
        "--runs {params.runs} --out-dir {params.folder} > {log} 2>&1"


rule draw:
    input:
        numbers=f"{FIGURES}/{{exp}}_{{slug}}.json",
    output:
        png=report(
            f"{FIGURES}/{{exp}}_{{slug}}.png",
            caption="../report/figure.rst",
            category="{exp}",
        ),
        pdf=f"{FIGURES}/{{exp}}_{{slug}}.pdf",
    log:
        f"{RESULTS}/logs/draw_{{exp}}_{{slug}}.log",
    conda:
        "../../environment.yml"
    threads: 1
    params:
        title=lambda wildcards: EXPERIMENTS[wildcards.exp].title,
        caption=caption,
    shell:
        "python -m gradcomp draw {input.numbers} > {log} 2>&1"


rule summary:
    input:
        [experiment_path(exp, "json") for exp in config["experiments"]],
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
