"""Reading finished training runs (the folders `gradcomp train` writes), grouped by run over seeds."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gradcomp.analysis.seeds import FRACTION, LINEAR, Bounds, Estimate
from gradcomp.training.datasets import DATASETS
from gradcomp.training.policies import Policy, parse_policy

if TYPE_CHECKING:
    from torch import Tensor, nn

    Batch = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class Run:
    """One training run at one seed."""

    name: str
    seed: int
    folder: Path
    config: dict
    summary: dict

    @functools.cached_property
    def policy(self) -> Policy:
        return parse_policy(self.config["compression"]["policy"])

    @property
    def accuracy(self) -> float:
        return float(self.summary["final_test_accuracy"])

    @property
    def sparsity(self) -> float | None:
        return self.summary["gradient_sparsity"]

    def records(self, kind: str) -> list[dict]:
        """The lines of the run's metrics.jsonl of one kind ("step", "epoch", "noise"), in order."""
        lines = (self.folder / "metrics.jsonl").read_text().splitlines()
        return [record for record in map(json.loads, lines) if record.get("kind") == kind]


@dataclass(frozen=True)
class RunGroup:
    """One run of a config at every seed it was read with (the same settings but for the seed)."""

    name: str
    runs: Mapping[int, Run]

    @property
    def first(self) -> Run:
        return self.runs[min(self.runs)]

    @property
    def seeds(self) -> list[int]:
        return sorted(self.runs)

    @property
    def policy(self) -> Policy:
        return self.first.policy

    @property
    def config(self) -> dict:
        return self.first.config

    @property
    def forward_bits(self) -> int | None:
        return self.config.get("forward_bits")

    @property
    def model(self) -> str:
        """The architecture as trained, e.g. ``resnet18 (channels=[16, 32, 64, 128], 3x3s2 stem)``."""
        return model_description(self.config)

    @property
    def compression_points(self) -> str:
        """Where the run's gradients are compressed and probed, e.g. ``convolution outputs``."""
        compression = self.config.get("compression") or {}
        types = compression.get("layer_types") or self.policy.layer_types
        where = " and ".join(LAYER_NAMES.get(t, t) for t in types)
        return f"{where} {'inputs' if compression.get('placement') == 'input' else 'outputs'}"

    @property
    def label(self) -> str:
        """The policy's label, or what an uncompressed run is (fp32, or QAT with quantized forward), with
        its schedule where it starts uncompressed (e.g. ``prune 0.85, 39 steps uncompressed first``) and
        the layers it keeps in high precision throughout (e.g. ``NVFP4 ..., last 3 layers kept``)."""
        if self.policy.family == "none":
            return f"QAT {self.forward_bits}-bit" if self.forward_bits else "fp32"
        compression = self.config.get("compression") or {}
        warmup = compression.get("warmup_steps") or 0
        last, worst = compression.get("keep_last") or 0, compression.get("keep_worst") or 0
        return (
            self.policy.label
            + (f", {warmup} steps uncompressed first" if warmup else "")
            + (f", last {last} layers kept" if last else "")
            + (f", {worst} layers of lowest predicted R kept" if worst else "")
        )

    @property
    def scale_key(self) -> tuple:
        """What makes two runs' training the same size: data, subset, epochs, batch, step limit."""
        config = self.config
        keys = ("dataset", "subset_per_class", "test_subset_per_class", "epochs", "batch_size", "max_steps")
        return tuple(config.get(key) for key in keys)

    @property
    def scale(self) -> str:
        """The training scale in words, e.g. ``Fashion-MNIST, 500 images per class, 1 epoch of batch 64
        (78 steps)``."""
        config = self.config
        data = DATASETS[config["dataset"]].title if config["dataset"] in DATASETS else config["dataset"]
        if config.get("subset_per_class"):
            data += f", {config['subset_per_class']:,} images per class"
        epochs = config["epochs"]
        steps = {run.summary.get("steps") for run in self.runs.values()}
        text = f"{data}, {epochs} epoch{'s' * (epochs != 1)} of batch {config['batch_size']}"
        return text + (f" ({steps.pop()} steps)" if len(steps) == 1 and None not in steps else "")

    @property
    def family(self) -> str:
        if self.policy.family == "none":
            return f"QAT ({self.forward_bits}-bit forward)" if self.forward_bits else "fp32"
        return self.policy.family

    def per_seed(self, value: Callable[[Run], float | None]) -> dict[int, float]:
        """value(run) for every seed (seeds where it is None left out)."""
        values = {seed: value(run) for seed, run in self.runs.items()}
        return {seed: float(v) for seed, v in values.items() if v is not None}

    def estimate(self, value: Callable[[Run], float | None], bounds: Bounds = LINEAR) -> Estimate:
        return Estimate.of(self.per_seed(value).values(), bounds)

    @property
    def accuracy(self) -> dict[int, float]:
        return self.per_seed(lambda run: run.accuracy)


def one_per_model(groups: Sequence[RunGroup], where: str) -> dict[tuple, RunGroup]:
    """The groups keyed by the model they train and its scale (`model_key`); two runs of one model at one
    scale are an error naming `where`."""
    by_model: dict[tuple, RunGroup] = {}
    for group in groups:
        key = model_key(group)
        if key in by_model:
            raise ValueError(
                f"{where}: runs {by_model[key].name!r} and {group.name!r} both train {group.model} at "
                f"{group.scale}; name one run per model and scale"
            )
        by_model[key] = group
    return by_model


def model_key(group: RunGroup) -> tuple:
    """The model and training scale a run is compared within (an arm only ever against its own baseline)."""
    return (group.model, group.scale_key)


def load_run(name: str, seed: int, folder: Path | str) -> Run:
    folder = Path(folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    return Run(name, seed, folder, config, summary)


def load_groups(folders: Mapping[str, Mapping[int, Path | str]]) -> dict[str, RunGroup]:
    """Run name -> seed -> folder, read into one RunGroup per run (in the order given)."""
    return {
        name: RunGroup(name, {seed: load_run(name, seed, folder) for seed, folder in sorted(seeds.items())})
        for name, seeds in folders.items()
    }


def seed_list(seeds: list[int]) -> str:
    """e.g. "3 seeds (0, 1, 2)" or "seed 0"."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return f"{len(seeds)} seeds ({', '.join(map(str, seeds))})"


LAYER_NAMES = {"conv": "convolution", "linear": "linear-layer", "bn": "BatchNorm"}


def model_description(config: Mapping[str, Any]) -> str:
    """A run config's architecture: the timm name with its options and stem."""
    options = [f"{key}={value}" for key, value in (config.get("model_kwargs") or {}).items()]
    if config.get("stem", "model") != "model":
        options.append(f"{config['stem']} stem")
    return config["model"] + (f" ({', '.join(options)})" if options else "")


def training_context(groups: Mapping[str, RunGroup]) -> str:
    """What the runs were trained as, from their configs: model(s), the training scale of each, optimizers
    and seeds (for captions)."""
    model = " / ".join(dict.fromkeys(group.model for group in groups.values()))
    scales: dict[str, list[str]] = {}
    for group in groups.values():
        scales.setdefault(group.scale, []).append(group.name)
    if len(scales) == 1:
        scale = next(iter(scales))
    else:
        scale = "; ".join(f"{text} ({', '.join(names)})" for text, names in scales.items())
    optimizers = " / ".join(
        dict.fromkeys(f"{g.config['optimizer'].upper()} lr {g.config['lr']:g}" for g in groups.values())
    )
    return f"{model} on {scale}, {optimizers}; {seed_counts(groups.values())}"


def seed_counts(groups: Iterable[RunGroup]) -> str:
    """How many seeds the runs have, e.g. "3 seeds (0, 1, 2) per run" or "8 seeds: baseline, prune_85;
    3 seeds: every other run"."""
    groups = list(groups)
    by_count: dict[int, list[str]] = {}
    for group in groups:
        by_count.setdefault(len(group.runs), []).append(group.name)
    if len(by_count) == 1:
        seeds = sorted({seed for group in groups for seed in group.seeds})
        count = next(iter(by_count))
        return f"{seed_list(seeds)} per run" if count == len(seeds) else f"{count} seeds per run"
    ordered = sorted(by_count.items(), reverse=True)
    parts = [f"{count} seed{'s' * (count != 1)}: {', '.join(names)}" for count, names in ordered[:-1]]
    last = ordered[-1][0]
    return "; ".join([*parts, f"{last} seed{'s' * (last != 1)}: every other run"])


def accuracy_estimate(group: RunGroup) -> Estimate:
    """The run's final test accuracy over its seeds (a fraction: its interval stays within [0, 1])."""
    return group.estimate(lambda run: run.accuracy, FRACTION)


def load_trained_model(run: Run, device: str = "cpu") -> nn.Module:
    """The run's final model (its checkpoint), rebuilt as in training, forward quantization included."""
    import torch

    from gradcomp.training.data import load_split
    from gradcomp.training.models import create_model
    from gradcomp.training.qat import quantize_forward

    config = run.config
    test = load_split(config["dataset"], config["data_dir"], False, 1)
    model = create_model(
        config["model"],
        test.num_classes,
        test.in_chans,
        test.image_size,
        config.get("stem", "model"),
        **config["model_kwargs"],
    )
    if config.get("forward_bits"):
        quantize_forward(model, config["forward_bits"])
    checkpoint = torch.load(run.folder / "checkpoint.pt", map_location=device, weights_only=False)
    model.load_state_dict(checkpoint["model"])
    return model.to(device)


def trained_models(group: RunGroup) -> Iterator[tuple[int, Run, nn.Module]]:
    """(seed, run, its trained model in eval mode) of each run of the group, loaded one at a time."""
    for seed, run in group.runs.items():
        yield seed, run, load_trained_model(run).eval()


def eval_batches(run: Run, count: int) -> list[Batch]:
    """The first `count` full test batches of the run's batch size, in a fixed shuffled order so that every
    batch mixes classes; test splits are never augmented."""
    config = run.config
    from gradcomp.training.data import load_split  # torch-side, as load_trained_model's imports

    split = load_split(config["dataset"], config["data_dir"], False)
    stream = split.batches(config["batch_size"], shuffle=True, seed=config["seed"], drop_last=True)
    batches = list(itertools.islice(stream, count))
    if len(batches) < count:
        raise ValueError(
            f"the test split holds {len(batches)} batches of {config['batch_size']}, {count} requested"
        )
    return batches
