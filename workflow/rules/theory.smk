rule fp_theory:
    output:
        multiext(f"{RESULTS}/A4_fp_theory_switch_points", ".csv", ".md"),
        multiext(f"{RESULTS}/A4_fp_theory_relative_mse", ".csv", ".md"),
    params:
        bits=as_args(config["theory"]["bits"]),
        kinds=as_args(config["theory"]["kinds"]),
        sigmas=as_args(config["theory"]["sigmas"]),
        stem=f"{RESULTS}/A4_fp_theory",
    log:
        f"{RESULTS}/logs/fp_theory.log",
    threads: 1
    conda:
        "../../environment.yml"
    shell:
        "python -m gradcomp theory --bits {params.bits} --kinds {params.kinds} "
        "--sigmas {params.sigmas} --out {params.stem} > {log} 2>&1"
