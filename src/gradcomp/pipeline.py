"""What the Snakemake rules need from a pipeline config (config/*.yaml), kept out of the Snakefiles.

A config names training runs (`runs`: a policy string or a mapping of training keys, on top of the shared
`train` keys), the seeds each run is trained with (`seeds`, overridable per run) and experiments
(`experiments`: ID -> settings, see `gradcomp.experiments`). Every (run, seed) pair writes
`results/<config>/runs/<run>/seed<k>/`; a training job trains several pairs one after the other (runs in
config order, each run's seeds in order) up to `job_steps` optimizer steps, so that one process start-up
(imports, data, compilation) serves them all. Nothing here imports torch or matplotlib.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gradcomp.experiments import COMPUTED, DRAWN, experiments
from gradcomp.training.config import known_keys, resolve_config
from gradcomp.training.datasets import DATASETS

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


def run_steps(config: Mapping[str, Any], run: str) -> int:
    """Optimizer steps of one seed of `run`, from its training keys and the dataset's size (no data read)."""
    train = resolve_config(None, **run_spec(config, run, 0))
    images = DATASETS[train.dataset].training_images(train.subset_per_class)
    steps = train.epochs * (images // train.batch_size)
    return steps if train.max_steps is None else min(steps, train.max_steps)


@dataclass(frozen=True)
class TrainingJob:
    """(run, seed) pairs one process trains one after the other; `name` says which (`first..last` run)."""

    name: str
    items: tuple[tuple[str, int], ...]
    steps: int


def training_jobs(config: Mapping[str, Any]) -> dict[str, TrainingJob]:
    """Every (run, seed) pair of the config in training jobs of at most `job_steps` optimizer steps (a pair
    longer than that is a job alone); without `job_steps`, one job per pair."""
    limit = config.get("job_steps")
    pending: list[tuple[str, int]] = []
    jobs: list[TrainingJob] = []
    steps = 0
    for run in config["runs"]:
        cost = run_steps(config, run)
        for seed in seeds(config, run):
            if pending and (limit is None or steps + cost > limit):
                jobs.append(_job(config, pending, steps))
                pending, steps = [], 0
            pending.append((run, seed))
            steps += cost
    jobs.append(_job(config, pending, steps))
    return {job.name: job for job in jobs}


def _job(config: Mapping[str, Any], items: list[tuple[str, int]], steps: int) -> TrainingJob:
    def part(run: str) -> str:
        chosen = [seed for name, seed in items if name == run]
        if chosen == seeds(config, run):
            return run
        return f"{run}.seed{chosen[0]}" + (f"-{chosen[-1]}" if len(chosen) > 1 else "")

    runs = list(dict.fromkeys(run for run, _ in items))
    name = part(runs[0]) if len(runs) == 1 else f"{part(runs[0])}..{part(runs[-1])}"
    return TrainingJob(name, tuple(items), steps)


def job_of(jobs: Mapping[str, TrainingJob], run: str, seed: int) -> str:
    """The name of the job that trains `run` at `seed`."""
    return next(name for name, job in jobs.items() if (run, seed) in job.items)


def job_threads(config: Mapping[str, Any]) -> int:
    """CPU cores a training job holds: the shared `train.threads` (else 1 on CPU, 4 per GPU) per process."""
    gpus = config.get("gpus", 0)
    return (config["train"].get("threads") or (4 if gpus else 1)) * max(1, gpus)


def job_items(config: Mapping[str, Any], job: TrainingJob, results: str) -> list[dict[str, Any]]:
    """What `gradcomp run --job` reads: each pair's run, seed, folder and training keys."""
    return [
        {"run": run, "seed": seed, "out": run_folder(results, run, seed), "spec": run_spec(config, run, seed)}
        for run, seed in job.items
    ]


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


def schema_violations(config: Mapping[str, Any], schema_file: str | Path) -> list[str]:
    """Every violation of the config schema as one line, `config path: problem` (snakemake.utils.validate
    reports only the first, followed by the whole schema)."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_file).read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    lines = []
    for error in sorted(validator.iter_errors(config), key=lambda error: list(map(str, error.absolute_path))):
        # oneOf: the problem inside the alternative of the value's type (a mapping where a run may be a string
        # or a mapping), rather than "is not of type 'string'"
        inside = [e for e in error.context if e.validator != "type" or e.path]
        if inside:
            error = jsonschema.exceptions.best_match(inside)
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
        lines.append(f"{where.lstrip('.') or 'the config'}: {error.message}")
    return lines


def check_schema(config: Mapping[str, Any], schema_file: str | Path) -> None:
    """Raise, one line per violation, when the config does not follow its schema."""
    violations = schema_violations(config, schema_file)
    if violations:
        raise ValueError(f"the config does not follow {schema_file}:\n" + "\n".join(violations))


def check_config(config: Mapping[str, Any]) -> None:
    """Errors the schema cannot see, each naming the key: unknown training keys, bad policies or training
    values, unknown timm models (read from timm's sources, without importing torch), a seed set in `train`,
    experiment settings, runs or seeds an experiment names but the config does not train, and runs trained
    otherwise than the experiment needs (`Experiment.kinds`: an FP experiment's arm without an fp policy).
    `model_kwargs` keys and the layers `include` / `exclude` select need the model, hence torch: each
    training job checks them for all its runs before it loads any data."""
    known = set(known_keys()) - {"out", "resume", "overwrite", "progress"}
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
        wrong = experiments()[experiment].mistrained(settings, lambda run: _trained(config, run))
        if wrong:
            raise ValueError(f"config key experiments.{experiment}.{wrong[0]}")
        _check_claim_design(config, experiment, settings)


def _trained(config: Mapping[str, Any], run: str) -> tuple[Any, int | None] | None:
    """A run's policy and forward_bits (None: the config has no such run)."""
    if run not in config["runs"]:
        return None
    train = resolve_config(None, **run_spec(config, run, seeds(config, run)[0]))
    return train.compression.policy, train.forward_bits


def _check_claim_design(config: Mapping[str, Any], experiment: str, settings: Any) -> None:
    """A claim's design must be able to decide it before anything runs: its deciding runs (the settings'
    `claim`), or the models an experiment with claims measures, need at least 2 seeds for a paired test."""
    claims = [claim.id for claim in experiments()[experiment].claims if claim.test != "exact"]
    if not claims:
        return
    named = getattr(settings, "claim", None)
    for run in [named] if isinstance(named, str) else list(named or ()):
        if run in config["runs"] and len(seeds(config, run)) < 2:
            raise ValueError(
                f"config key experiments.{experiment}.claim: run {run} is trained with "
                f"{len(seeds(config, run))} seed; claims {claims} need at least 2 to be decided"
            )
    if settings.reads_checkpoints:
        for run, chosen in experiment_reads(config, experiment).items():
            if len(chosen) < 2:
                raise ValueError(
                    f"config key experiments.{experiment}.seeds: run {run} is measured at {len(chosen)} "
                    f"seed; claims {claims} need at least 2 to be decided"
                )
