rule synthetic_sparsity:
    output:
        csv=f"{RESULTS}/A7_synthetic_sparsity.csv",
        md=f"{RESULTS}/A7_synthetic_sparsity.md",
    log:
        f"{RESULTS}/logs/synthetic_sparsity.log",
    conda:
        "../../environment.yml"
    threads: 1
    params:
        numel=config["synthetic"]["numel"],
        sigmas=as_args(config["synthetic"]["sigmas"]),
        targets=as_args(config["synthetic"]["targets"]),
        zeros=as_args(config["synthetic"]["zero_fractions"]),
    shell:
        "python -m gradcomp sparsity --numel {params.numel} --sigmas {params.sigmas} "
        "--targets {params.targets} --zero-fractions {params.zeros} --out {output.csv} > {log} 2>&1"
