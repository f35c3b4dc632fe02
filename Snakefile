# Regenerates the project's tables and figures. Rules live in workflow/rules/, one file per stage, and only
# wire files to `gradcomp` CLI verbs.


configfile: "config/default.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/theory.smk"
include: "workflow/rules/synthetic.smk"


rule all:
    default_target: True
    input:
        expand(
            f"{RESULTS}/A4_fp_theory_{{table}}.{{ext}}",
            table=["switch_points", "relative_mse"],
            ext=["csv", "md"],
        ),
        expand(f"{RESULTS}/A7_synthetic_sparsity.{{ext}}", ext=["csv", "md"]),
