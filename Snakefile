# Regenerates every table and figure of the project: training runs (one job per run and seed) -> each
# experiment's numbers (compute) -> its figure (draw) -> SUMMARY.md. Rules live in workflow/rules/, one file
# per stage, and only wire files to `gradcomp` CLI verbs from what gradcomp.experiments declares. Run with
# --configfile config/<name>.yaml; without one, config/default.yaml is used (a --configfile replaces it
# rather than being merged into it).


if not config:

    configfile: "config/default.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/experiments.smk"


rule all:
    default_target: True
    input:
        all_outputs(),
