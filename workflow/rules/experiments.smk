REPORT = f"{RESULTS}/report"
# A page per experiment (its figure, caption and tables) and one for SUMMARY.md: the report shows HTML, images
# and PDFs but only offers other files (CSV, Markdown) for download, and keeps captions in an info pane.
# The report sorts its categories as text (A1, A10, A2): a two-digit position in the registry's ID order
# (A1, A2, ..., A10, B1, ...) goes first.
REPORT_ORDER = [exp for exp in EXPERIMENTS if exp in config["experiments"]]
REPORT_CATEGORIES = {
    exp: f"{n:02d} {exp}" for n, exp in enumerate(REPORT_ORDER, start=1)
}
SUMMARY_CATEGORY = "00 Summary"
# The configuration's report page: SUMMARY.md (the claims at a glance first) with every figure embedded
REPORT_PAGE = f"{RESULTS}/report.html"
REPORT_PAGES = [f"{REPORT}/{EXPERIMENTS[exp].prefix}.html" for exp in REPORT_ORDER] + [
    REPORT_PAGE
]


# Each experiment's settings as a file of this run's results, which the compute step reads: a fresh clone
# (committed figures, no results/) writes it anew and so recomputes every experiment, A4 (no runs) included.
rule settings:
    output:
        f"{RESULTS}/experiments/{{exp}}.json",
    log:
        f"{RESULTS}/logs/settings_{{exp}}.log",
    conda:
        "../envs/gradcomp.yaml"
    params:
        settings=settings_json,
    shell:
        "echo {params.settings} > {output} 2> {log}"


rule compute:
    input:
        runs=training_manifests,
        settings=f"{RESULTS}/experiments/{{exp}}.json",
    output:
        numbers=f"{FIGURES}/{{exp}}_{{slug}}.json",
        csv=report(
            f"{FIGURES}/{{exp}}_{{slug}}.csv",
            category=lambda wildcards: REPORT_CATEGORIES[wildcards.exp],
            labels={"item": "main table (CSV)"},
        ),
        md=report(
            f"{FIGURES}/{{exp}}_{{slug}}.md",
            category=lambda wildcards: REPORT_CATEGORIES[wildcards.exp],
            labels={"item": "tables (Markdown)"},
        ),
    log:
        f"{RESULTS}/logs/compute_{{exp}}_{{slug}}.log",
    # wall time and peak memory of each experiment's computation (e.g. to size a configuration)
    benchmark:
        f"{RESULTS}/benchmarks/compute_{{exp}}_{{slug}}.tsv"
    conda:
        "../envs/gradcomp.yaml"
    threads: 1
    params:
        runs=run_arguments,
        folder=lambda wildcards, output: os.path.dirname(output.numbers),
        # as the training jobs: compiling each layer shape the ops meet once costs more than it saves
        compile=int(config["cpu_compile"]),
    shell:
        "GRADCOMP_COMPILE={params.compile} python -m gradcomp compute {wildcards.exp} --settings {input.settings} "
        "--runs {params.runs} --out-dir {params.folder} --threads {threads} > {log} 2>&1"


rule draw:
    input:
        numbers=f"{FIGURES}/{{exp}}_{{slug}}.json",
    output:
        png=report(
            f"{FIGURES}/{{exp}}_{{slug}}.png",
            caption="../report/figure.rst",
            category=lambda wildcards: REPORT_CATEGORIES[wildcards.exp],
            labels={"item": "figure (PNG)"},
        ),
        pdf=report(
            f"{FIGURES}/{{exp}}_{{slug}}.pdf",
            caption="../report/figure.rst",
            category=lambda wildcards: REPORT_CATEGORIES[wildcards.exp],
            labels={"item": "figure (PDF)"},
        ),
    log:
        f"{RESULTS}/logs/draw_{{exp}}_{{slug}}.log",
    conda:
        "../envs/gradcomp.yaml"
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
        report(
            f"{FIGURES}/SUMMARY.md",
            category=SUMMARY_CATEGORY,
            labels={"item": "SUMMARY.md"},
        ),
    log:
        f"{RESULTS}/logs/summary.log",
    conda:
        "../envs/gradcomp.yaml"
    threads: 1
    params:
        folder=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "python -m gradcomp summary --figures {params.folder} --out {output} > {log} 2>&1"


rule page:
    input:
        md=f"{FIGURES}/{{exp}}_{{slug}}.md",
        png=f"{FIGURES}/{{exp}}_{{slug}}.png",
    output:
        report(
            f"{REPORT}/{{exp}}_{{slug}}.html",
            category=lambda wildcards: REPORT_CATEGORIES[wildcards.exp],
            labels={"item": "caption, figure and tables"},
        ),
    log:
        f"{RESULTS}/logs/page_{{exp}}_{{slug}}.log",
    conda:
        "../envs/gradcomp.yaml"
    threads: 1
    shell:
        "python -m gradcomp page {input.md} --figure {input.png} --out {output} > {log} 2>&1"


rule summary_page:
    input:
        md=f"{FIGURES}/SUMMARY.md",
        figures=[experiment_path(exp, "png") for exp in config["experiments"]],
    output:
        report(
            REPORT_PAGE,
            category=SUMMARY_CATEGORY,
            labels={"item": "papers and ours (page)"},
        ),
    log:
        f"{RESULTS}/logs/summary_page.log",
    conda:
        "../envs/gradcomp.yaml"
    threads: 1
    shell:
        "python -m gradcomp page {input.md} --out {output} > {log} 2>&1"
