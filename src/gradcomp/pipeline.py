"""What the Snakemake rules need from a pipeline config (config/*.yaml), kept out of the Snakefiles.

A config names training runs (`runs`: a policy string or a mapping of TrainConfig keys, on top of the shared
`train` keys) and experiments (`experiments`: ID -> settings, with `run` or `runs` naming what they read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gradcomp.plots import experiments
from gradcomp.policies import parse_policy
from gradcomp.train import TrainConfig


def run_spec(config: Mapping[str, Any], run: str) -> dict[str, Any]:
    """The run's training config: the shared `train` keys, then the run's own (a string is a policy)."""
    own = config["runs"][run]
    own = {"policy": own} if isinstance(own, str) else own
    return {**config["train"], **own}


def experiment_runs(config: Mapping[str, Any], experiment: str) -> list[str]:
    section = config["experiments"].get(experiment, {})
    names = section.get("runs", [section["run"]] if "run" in section else [])
    return list(config["runs"]) if names == "all" else list(names)


def figure_files(config: Mapping[str, Any]) -> list[str]:
    """Names of the files the pipeline writes into figures/<config name>/: each experiment's figure, table
    and headline files, the summary, and the tables of the theory and synthetic-sparsity rules."""
    registry = experiments()
    names = [name for experiment in config["experiments"] for name in registry[experiment].outputs()]
    return [*names, "SUMMARY.md", "A4_switch_points.csv", "A7_synthetic_sparsity.csv"]


def check_config(config: Mapping[str, Any]) -> None:
    """Errors the schema cannot see: unknown training keys, bad policies, experiments naming missing runs."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(config["train"]) - known)
    if unknown:
        raise ValueError(f"config key train: unknown training keys {unknown}; known: {sorted(known)}")
    for run in config["runs"]:
        spec = run_spec(config, run)
        bad = sorted(set(spec) - known)
        if bad:
            raise ValueError(f"config key runs.{run}: unknown training keys {bad}")
        try:
            parse_policy(spec["policy"])
        except ValueError as error:
            raise ValueError(f"config key runs.{run}: {error}") from None
    for experiment in config["experiments"]:
        missing = [run for run in experiment_runs(config, experiment) if run not in config["runs"]]
        if missing:
            raise ValueError(f"config key experiments.{experiment}: runs {missing} are not defined in runs")
