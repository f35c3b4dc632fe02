import json
import os
import re
import shlex

from snakemake.utils import validate

from gradcomp.experiments import experiments
from gradcomp.pipeline import (
    check_config,
    check_schema,
    experiment_reads,
    figure_files,
    job_items,
    job_of,
    job_threads,
    run_folder,
    training_jobs,
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
JOBS = training_jobs(config)
LAUNCHER = (
    f"torchrun --standalone --nproc_per_node={GPUS} -m gradcomp"
    if GPUS > 1
    else "python -m gradcomp"
)


wildcard_constraints:
    job="|".join(re.escape(name) for name in JOBS),
    exp="|".join(EXPERIMENTS),
    slug="|".join(experiment.slug for experiment in EXPERIMENTS.values()),


def experiment_path(exp, extension):
    return f"{FIGURES}/{EXPERIMENTS[exp].prefix}.{extension}"


def training_manifests(wildcards):
    """The manifests of the training jobs that train the runs and seeds the experiment reads."""
    return sorted(
        {
            f"{RESULTS}/jobs/{job_of(JOBS, run, seed)}.json"
            for run, chosen in experiment_reads(config, wildcards.exp).items()
            for seed in chosen
        }
    )


def job_minutes(wildcards):
    """The job's wall-time request on a cluster: `train_minutes` per (run, seed) pair it trains."""
    return config["train_minutes"] * len(JOBS[wildcards.job].items)


def job_json(wildcards):
    return shlex.quote(json.dumps(job_items(config, JOBS[wildcards.job], RESULTS)))


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
    # The training jobs' manifests and the experiments' settings files (under results/) are targets too: the
    # figures of the default config are committed, and without them among the targets a fresh clone would
    # count those figures as up to date and neither train nor compute anything.
    trained = [f"{RESULTS}/jobs/{job}.json" for job in JOBS]
    settings = [f"{RESULTS}/experiments/{exp}.json" for exp in config["experiments"]]
    return trained + settings + [f"{FIGURES}/{name}" for name in figure_files(config)]
