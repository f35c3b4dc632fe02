rule train:
    output:
        summary=f"{RESULTS}/runs/{{run}}/seed{{seed}}/summary.json",
    log:
        f"{RESULTS}/logs/train_{{run}}_seed{{seed}}.log",
    conda:
        "../../environment.yml"
    threads: 1 if GPUS == 0 else 4 * GPUS
    resources:
        gpu=GPUS,
        runtime=config.get("train_minutes", 60),
    params:
        spec=lambda wildcards: shlex.quote(
            json.dumps(run_spec(config, wildcards.run, int(wildcards.seed)))
        ),
        folder=lambda wildcards, output: os.path.dirname(output.summary),
        launcher=LAUNCHER,
        compile=int(config["cpu_compile"]),
    shell:
        "GRADCOMP_COMPILE={params.compile} {params.launcher} run --spec {params.spec} "
        "--out {params.folder} > {log} 2>&1"
