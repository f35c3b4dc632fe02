# One job trains several (run, seed) pairs one after the other (gradcomp.pipeline.training_jobs), each into
# its folder results/<config>/runs/<run>/seed<k>/, and writes a manifest (the job's output). The job's output
# goes to its log, which Snakemake deletes before every attempt (a retry under the profile's `retries`, or a
# rerun), and is appended to <log stem>.attempts.log, which keeps every attempt's output, each after a line
# with its start time and host; its wall time and memory go to results/<config>/benchmarks/. An attempt
# resumes every pair from its checkpoint: finished pairs only rewrite their summaries.
rule train:
    output:
        f"{RESULTS}/jobs/{{job}}.json",
    log:
        f"{RESULTS}/logs/train_{{job}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_{{job}}.tsv"
    conda:
        "../envs/gradcomp.yaml"
    threads: job_threads(config)
    resources:
        gpu=GPUS,
        # training jobs sharing the GPUs at once: a profile's or the command line's `gpu_jobs` caps them
        gpu_jobs=1 if GPUS else 0,
        runtime=job_minutes,
    params:
        job=job_json,
        launcher=LAUNCHER,
        compile=int(config["cpu_compile"]),
        attempts=f"{RESULTS}/logs/train_{{job}}.attempts.log",
    shell:
        '{{ echo "== attempt started $(date -Iseconds) on $(hostname)"; '
        "GRADCOMP_COMPILE={params.compile} {params.launcher} run --job {params.job} "
        "--manifest {output} 2>&1; }} | tee -a {params.attempts} > {log}"
