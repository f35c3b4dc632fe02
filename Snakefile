# Regenerates every table and figure of the project: training jobs (each trains (run, seed) pairs one after
# the other) -> each experiment's numbers (compute) -> its figure (draw) -> SUMMARY.md, and one report page per
# experiment.
# Rules live in workflow/rules/, one file per stage, and only wire files to `gradcomp` CLI verbs from what
# gradcomp.experiments declares. Run with --configfile config/<name>.yaml; without one, config/default.yaml is
# used (a --configfile replaces it rather than being merged into it).
import shlex
from pathlib import Path

if not config:

    configfile: "config/default.yaml"


report: "workflow/report/workflow.rst"


# Jobs import gradcomp from this checkout's src/: the workflow's conda environment (`--sdm conda`,
# workflow/envs/gradcomp.yaml) holds only gradcomp's dependencies.
shell.prefix(
    "set -euo pipefail; export PYTHONPATH="
    + shlex.quote(str(Path(workflow.basedir) / "src"))
    + "${{PYTHONPATH:+:$PYTHONPATH}}; "
)


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/experiments.smk"


rule all:
    default_target: True
    input:
        all_outputs(),
        REPORT_PAGES,
