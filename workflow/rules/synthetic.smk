rule synthetic_sparsity:
    output:
        multiext(f"{RESULTS}/A7_synthetic_sparsity", ".csv", ".md"),
    params:
        numel=config["synthetic"]["numel"],
        sigmas=as_args(config["synthetic"]["sigmas"]),
        targets=as_args(config["synthetic"]["targets"]),
        zeros=as_args(config["synthetic"]["zero_fractions"]),
        stem=f"{RESULTS}/A7_synthetic_sparsity",
    log:
        f"{RESULTS}/logs/synthetic_sparsity.log",
    threads: 1
    conda:
        "../../environment.yml"
    shell:
        "python -m gradcomp sparsity --numel {params.numel} --sigmas {params.sigmas} "
        "--targets {params.targets} --zero-fractions {params.zeros} --out {params.stem} > {log} 2>&1"
