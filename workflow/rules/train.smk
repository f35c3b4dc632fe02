rule train:
    output:
        summary=f"{RESULTS}/runs/{{run}}/summary.json",
    log:
        f"{RESULTS}/logs/train_{{run}}.log",
    conda:
        "../../environment.yml"
    threads: 1 if GPUS == 0 else 4 * GPUS
    resources:
        gpu=GPUS,
        runtime=config.get("train_minutes", 60),
    params:
        spec=lambda wildcards: run_arguments(wildcards.run),
        folder=lambda wildcards, output: os.path.dirname(output.summary),
        launcher=LAUNCHER,
    shell:
        "{params.launcher} run --spec {params.spec} --out {params.folder} > {log} 2>&1"
