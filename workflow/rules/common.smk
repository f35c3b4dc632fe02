import json
import os
import shlex

from snakemake.utils import validate

from gradcomp.experiments import experiments
from gradcomp.pipeline import (
    check_config,
    check_schema,
    experiment_reads,
    figure_files,
    run_folder,
    run_spec,
    seeds,
)

# check_schema reports every violation, one line each; validate then fills in the defaults
check_schema(
    config, os.path.join(workflow.basedir, "workflow/schemas/config.schema.yaml")
)
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
    seed="[0-9]+",
    exp="|".join(EXPERIMENTS),
    slug="|".join(experiment.slug for experiment in EXPERIMENTS.values()),


def experiment_path(exp, extension):
    return f"{FIGURES}/{EXPERIMENTS[exp].prefix}.{extension}"


def run_summaries(wildcards):
    return [
        f"{run_folder(RESULTS, run, seed)}/summary.json"
        for run, chosen in experiment_reads(config, wildcards.exp).items()
        for seed in chosen
    ]


def settings_json(wildcards):
    return shlex.quote(
        json.dumps(EXPERIMENTS[wildcards.exp].settings(config).to_config())
    )


def run_arguments(wildcards):
    return " ".join(
        f"{run}:{seed}={run_folder(RESULTS, run, seed)}"
        for run, chosen in experiment_reads(config, wildcards.exp).items()
        for seed in chosen
    )


def caption(wildcards, input):
    """The caption the compute step generated; empty until it has run (only the report reads it)."""
    try:
        with open(input.numbers) as handle:
            return json.load(handle).get("caption", "")
    except (OSError, ValueError):
        return ""


def all_outputs():
    # The run summaries and the experiments' settings files (under results/) are targets too: the figures of
    # the default config are committed, and without them among the targets a fresh clone would count those
    # figures as up to date and neither train nor compute anything.
    trained = [
        f"{run_folder(RESULTS, run, seed)}/summary.json"
        for run in config["runs"]
        for seed in seeds(config, run)
    ]
    settings = [f"{RESULTS}/experiments/{exp}.json" for exp in config["experiments"]]
    return trained + settings + [f"{FIGURES}/{name}" for name in figure_files(config)]
