rule fp_theory:
    output:
        switch_csv=f"{RESULTS}/A4_fp_theory_switch_points.csv",
        switch_md=f"{RESULTS}/A4_fp_theory_switch_points.md",
        mse_csv=f"{RESULTS}/A4_fp_theory_relative_mse.csv",
        mse_md=f"{RESULTS}/A4_fp_theory_relative_mse.md",
    log:
        f"{RESULTS}/logs/fp_theory.log",
    conda:
        "../../environment.yml"
    threads: 1
    params:
        bits=as_args(config["theory"]["bits"]),
        kinds=as_args(config["theory"]["kinds"]),
        sigmas=as_args(config["theory"]["sigmas"]),
    shell:
        "python -m gradcomp theory --bits {params.bits} --kinds {params.kinds} "
        "--sigmas {params.sigmas} --switch-points {output.switch_csv} --mse {output.mse_csv} > {log} 2>&1"
