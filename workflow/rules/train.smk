# The job's output goes to its log, which Snakemake deletes before every attempt (a retry under the profile's
# `retries`, or a rerun), and is appended to <log stem>.attempts.log, which keeps every attempt's output, each
# after a line with its start time and host.
rule train:
    output:
        summary=f"{RESULTS}/runs/{{run}}/seed{{seed}}/summary.json",
    log:
        f"{RESULTS}/logs/train_{{run}}_seed{{seed}}.log",
    conda:
        "../envs/gradcomp.yaml"
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
        attempts=f"{RESULTS}/logs/train_{{run}}_seed{{seed}}.attempts.log",
    shell:
        '{{ echo "== attempt started $(date -Iseconds) on $(hostname)"; '
        "GRADCOMP_COMPILE={params.compile} {params.launcher} run --spec {params.spec} "
        "--out {params.folder} 2>&1; }} | tee -a {params.attempts} > {log}"
