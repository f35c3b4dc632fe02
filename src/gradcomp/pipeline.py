"""What the Snakemake rules need from a pipeline config (config/*.yaml), kept out of the Snakefiles.

A config names training runs (`runs`: a policy string or a mapping of training keys, on top of the shared
`train` keys), the seeds each run is trained with (`seeds`, overridable per run) and experiments
(`experiments`: ID -> settings, see `gradcomp.experiments`). Every (run, seed) pair is one training job
writing `results/<config>/runs/<run>/seed<k>/`. Nothing here imports torch or matplotlib.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gradcomp.config import known_keys, resolve_config
from gradcomp.experiments import COMPUTED, DRAWN, experiments

DEFAULT_SEEDS = (0,)


def _own(config: Mapping[str, Any], run: str) -> dict[str, Any]:
    own = config["runs"][run]
    return {"policy": own} if isinstance(own, str) else dict(own)


def seeds(config: Mapping[str, Any], run: str) -> list[int]:
    """The seeds `run` is trained with: its own `seeds`, else the config's, else [0]."""
    return list(_own(config, run).get("seeds", config.get("seeds", DEFAULT_SEEDS)))


def run_spec(config: Mapping[str, Any], run: str, seed: int) -> dict[str, Any]:
    """The training config of one (run, seed): the shared `train` keys, then the run's own, then the seed."""
    own = {key: value for key, value in _own(config, run).items() if key != "seeds"}
    return {**config["train"], **own, "seed": seed}


def run_folder(results: str, run: str, seed: int) -> str:
    return f"{results}/runs/{run}/seed{seed}"


def experiment_reads(config: Mapping[str, Any], experiment: str) -> dict[str, list[int]]:
    """Run -> seeds an experiment reads: every seed of the runs it compares; for measurements at a trained
    checkpoint, the seeds its `seeds` setting names (default: every seed of the run)."""
    spec = experiments()[experiment]
    settings = spec.settings(config)
    reads = {}
    for run in settings.runs_read(list(config["runs"])):
        chosen = seeds(config, run)
        if spec.params.reads_checkpoints and settings.seeds is not None:
            chosen = list(settings.seeds)
        reads[run] = chosen
    return reads


def figure_files(config: Mapping[str, Any]) -> list[str]:
    """Names of the files the pipeline writes into figures/<config name>/: each experiment's numbers (JSON,
    CSV, Markdown) and figure (PNG, PDF), and SUMMARY.md."""
    registry = experiments()
    names = [
        f"{registry[exp].prefix}.{extension}"
        for exp in config["experiments"]
        for extension in COMPUTED + DRAWN
    ]
    return [*names, "SUMMARY.md"]


def check_config(config: Mapping[str, Any]) -> None:
    """Errors the schema cannot see, each naming the key: unknown training keys, bad policies or training
    values, a seed set in `train`, experiment settings, runs or seeds an experiment names but the config
    does not train."""
    known = set(known_keys()) - {"out", "resume", "progress"}
    for where, keys in [("train", config["train"])] + [
        (f"runs.{run}", _own(config, run)) for run in config["runs"]
    ]:
        unknown = sorted(set(keys) - known - {"seeds"})
        if unknown:
            raise ValueError(f"config key {where}: unknown training keys {unknown}; known: {sorted(known)}")
        if "seed" in keys:
            raise ValueError(
                f"config key {where}.seed: give the seeds as `seeds: [...]` (top level or per run)"
            )
    for run in config["runs"]:
        for seed in seeds(config, run):
            try:
                resolve_config(None, **run_spec(config, run, seed))
            except (TypeError, ValueError) as error:
                raise ValueError(f"config key runs.{run}: {error}") from None
    unknown = sorted(set(config["experiments"]) - set(experiments()))
    if unknown:
        raise ValueError(
            f"config key experiments: unknown experiments {unknown}; known: {list(experiments())}"
        )
    for experiment in config["experiments"]:
        settings = experiments()[experiment].settings(config)  # validates the experiment's settings
        missing = [run for run in settings.runs_read(list(config["runs"])) if run not in config["runs"]]
        if missing:
            raise ValueError(f"config key experiments.{experiment}: runs {missing} are not defined in runs")
        for run, chosen in experiment_reads(config, experiment).items():
            untrained = sorted(set(chosen) - set(seeds(config, run)))
            if untrained:
                where = f"config key experiments.{experiment}.seeds"
                raise ValueError(f"{where}: run {run} is not trained with seeds {untrained}")
