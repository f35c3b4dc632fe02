import json
import os
import shlex

from snakemake.utils import validate

from gradcomp.pipeline import check_config, experiment_runs, figure_files, run_spec
from gradcomp.plots import experiments

validate(config, "../schemas/config.schema.yaml")
check_config(config)

EXPERIMENTS = experiments()
RESULTS = f"results/{config['name']}"
FIGURES = f"figures/{config['name']}"
GPUS = config.get("gpus", 0)
LAUNCHER = (
    f"torchrun --standalone --nproc_per_node={GPUS} -m gradcomp"
    if GPUS > 1
    else "python -m gradcomp"
)


wildcard_constraints:
    run="[A-Za-z0-9_.-]+",
    exp="[ABX][0-9]+",
    slug="[a-z0-9_]+",


def run_arguments(run):
    return shlex.quote(json.dumps(run_spec(config, run)))


def run_folder(run):
    return f"{RESULTS}/runs/{run}"


def figure_inputs(wildcards):
    inputs = {
        run: f"{run_folder(run)}/summary.json"
        for run in experiment_runs(config, wildcards.exp)
    }
    if wildcards.exp == "A7":
        inputs["synthetic"] = f"{FIGURES}/A7_synthetic_sparsity.csv"
    return inputs


def figure_params(wildcards):
    params = dict(config["experiments"].get(wildcards.exp, {}))
    if wildcards.exp == "A7":
        params["synthetic_table"] = f"{FIGURES}/A7_synthetic_sparsity.csv"
    return shlex.quote(json.dumps(params))


def figure_runs(wildcards):
    return " ".join(
        f"{run}={run_folder(run)}" for run in experiment_runs(config, wildcards.exp)
    )


def all_outputs():
    # The run summaries are targets too: the figures of the default config are committed, and without the
    # runs among the targets a fresh clone would count those figures as up to date and train nothing.
    return [f"{run_folder(run)}/summary.json" for run in config["runs"]] + [
        f"{FIGURES}/{name}" for name in figure_files(config)
    ]
