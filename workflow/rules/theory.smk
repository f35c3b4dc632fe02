rule fp_theory_tables:
    output:
        switch_csv=f"{FIGURES}/A4_switch_points.csv",
        switch_md=f"{FIGURES}/A4_switch_points.md",
        mse_csv=f"{FIGURES}/A4_relative_mse.csv",
        mse_md=f"{FIGURES}/A4_relative_mse.md",
    log:
        f"{RESULTS}/logs/fp_theory_tables.log",
    conda:
        "../../environment.yml"
    threads: 1
    params:
        bits=" ".join(str(b) for b in config["experiments"]["A4"]["bits"]),
        kinds=" ".join(config["experiments"]["A4"]["kinds"]),
        sigmas=" ".join(str(s) for s in config["experiments"]["A4"]["sigmas"]),
    shell:
        "python -m gradcomp theory --bits {params.bits} --kinds {params.kinds} "
        "--sigmas {params.sigmas} --switch-points {output.switch_csv} --mse {output.mse_csv} > {log} 2>&1"


rule synthetic_sparsity:
    output:
        csv=f"{FIGURES}/A7_synthetic_sparsity.csv",
        md=f"{FIGURES}/A7_synthetic_sparsity.md",
    log:
        f"{RESULTS}/logs/synthetic_sparsity.log",
    conda:
        "../../environment.yml"
    threads: 1
    params:
        numel=config["experiments"]["A7"]["synthetic"]["numel"],
        sigmas=" ".join(
            str(s) for s in config["experiments"]["A7"]["synthetic"]["sigmas"]
        ),
        targets=" ".join(
            str(t) for t in config["experiments"]["A7"]["synthetic"]["targets"]
        ),
        zeros=" ".join(
            str(z) for z in config["experiments"]["A7"]["synthetic"]["zero_fractions"]
        ),
    shell:
        "python -m gradcomp sparsity --numel {params.numel} --sigmas {params.sigmas} "
        "--targets {params.targets} --zero-fractions {params.zeros} --out {output.csv} > {log} 2>&1"
