"""Typed training configuration: what a run does, with no torch import (configs are validated at parse time).

`TrainConfig` holds the training keys; the compression settings sit in one nested `CompressionConfig`, which
is what `gradcomp.attach` takes (as torchao hands a `Float8LinearConfig` over). In YAML files and on the
command line the compression keys may be written flat (``policy: prune:sparsity=0.85``, ``refresh: 10``)
or nested under ``compression:``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gradcomp.choices import (
    GUARD_RATIOS,
    LAYER_TYPES,
    LR_SCHEDULES,
    OPTIMIZERS,
    PLACEMENTS,
    REFRESHES,
    STEMS,
    choose,
    device,
    integer,
    is_integer,
    positive,
    typed,
)
from gradcomp.training.datasets import DATASETS, lookup
from gradcomp.training.policies import Chain, NoCompression, Policy, parse_policy


class ConfigError(ValueError):
    """A mistake in what was asked for (a key, a value, a path, the state of the output folder): the
    `gradcomp` command prints its message as one line instead of a traceback."""


_GUARD_PATIENCE = 2  # the guard's default patience: another value without a guard is refused


@dataclass(frozen=True)
class CompressionConfig:
    """What to compress and where, and when its statistics are refreshed.

    layer_types: "conv", "linear", "bn" (None: the policy's own placement, `Policy.layer_types`);
    include / exclude: fully-qualified layer-name patterns (fnmatch); placement: the gradient w.r.t. each
    selected layer's output (both GEMMs consume it) or input (e.g. BatchNorm inputs). refresh: "step",
    "epoch" (first step of each epoch, as in the reference code) or an integer K (every K steps); no
    compression during the first `warmup_steps` steps (the reference code prunes after half an epoch: a fit
    from the first steps of a new network describes a longer refresh interval poorly).

    Noise ratio (`gradcomp.training.noise_monitor`): every `noise_every` steps each compressed convolution and
    linear layer predicts R = ||g_W|| / ||noise in g_W|| without a GEMM (one host sync per such step), and
    with `measure_noise` also measures it (two extra weight-gradient GEMMs per layer on those steps). With
    `guard` (e.g. 1.732, FP4 All the Way's sqrt(3)), a layer whose R stays below it at `guard_patience`
    consecutive noise steps compresses with `fallback` (a policy, default exact gradients) for the rest of
    training; with `switch_step`, every layer does from that step on (a fixed late switch of the backward
    pass, FP4 All the Way's section 5). `guard_on` says which R the guard (and keep_worst) reads: "measured"
    (needs measure_noise), "carried" or "theory" (`GUARD_RATIOS`); unset, the measured one where it is
    measured and the carried prediction elsewhere (the prediction overstates R up to tenfold for
    nearest-rounding formats, whose error is correlated with the gradient). Under torch.distributed every
    rank reads the smallest R of all ranks, so that all of them switch the same layers.

    Layers kept in high precision (`fallback`) throughout: `keep_last`, the last k selected layers (in the
    model's order: NVIDIA's NVFP4 recipe keeps its last layers in BF16, whose weight gradients err most);
    `keep_worst`, the k layers whose R (the guard's) is lowest at the first noise step, from then on (the
    same choice made by gradcomp's own prediction; needs noise_every).

    Keys that would do nothing are refused: `fallback` or `guard_patience` without a key that switches,
    `guard_on` without guard or keep_worst, the noise keys with `placement` "input".
    """

    policy: Policy = field(default_factory=NoCompression)  # a policy string is parsed (parse_policy)
    layer_types: tuple[str, ...] | None = None
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    placement: str = "output"
    refresh: str | int = "step"
    warmup_steps: int = 0
    noise_every: int | None = None
    measure_noise: bool = False
    guard: float | None = None
    guard_patience: int = _GUARD_PATIENCE
    guard_on: str | None = None
    switch_step: int | None = None
    keep_last: int = 0
    keep_worst: int = 0
    fallback: Policy = field(default_factory=NoCompression)

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", parse_policy(self.policy))
        object.__setattr__(self, "fallback", parse_policy(self.fallback))
        for key in ("layer_types", "include", "exclude"):
            value = getattr(self, key)
            if isinstance(value, str):
                raise ValueError(f"compression {key} must be a list of names, got the string {value!r}")
            if value is not None:
                object.__setattr__(self, key, tuple(value))
        for kind in self.layer_types or ():
            choose("layer_types", kind, LAYER_TYPES)
        choose("placement", self.placement, PLACEMENTS)
        members = self.policy.policies if isinstance(self.policy, Chain) else (self.policy,)
        two_streams = [member for member in members if member.two_streams]
        if two_streams and self.placement != "output":  # they wrap the layer's forward: its output
            raise ValueError(
                f"{two_streams[0].label} ({two_streams[0].name} policy) compresses the input- and "
                "weight-gradient GEMMs' copies of a layer's output gradient separately: it needs "
                f"placement='output', got {self.placement!r}"
            )
        refresh = int(self.refresh) if str(self.refresh).isdigit() else self.refresh  # "10" from a flag
        if refresh not in REFRESHES and not (is_integer(refresh) and refresh >= 1):
            raise ValueError(f"refresh must be 'step', 'epoch' or an integer >= 1, got {self.refresh!r}")
        object.__setattr__(self, "refresh", refresh if isinstance(refresh, str) else int(refresh))
        object.__setattr__(self, "warmup_steps", integer("warmup_steps", self.warmup_steps, 0))
        self._check_noise()

    def _check_noise(self) -> None:
        if self.noise_every is not None:
            object.__setattr__(self, "noise_every", integer("noise_every", self.noise_every, 1))
        if not isinstance(self.measure_noise, bool):
            raise ValueError(f"measure_noise must be true or false, got {self.measure_noise!r}")
        object.__setattr__(self, "guard_patience", integer("guard_patience", self.guard_patience, 1))
        needs = [key for key in ("measure_noise", "guard") if getattr(self, key)]
        if needs and self.noise_every is None:
            raise ValueError(f"{needs[0]} needs noise_every (the steps at which the noise ratio is taken)")
        if self.noise_every is not None and self.placement != "output":
            raise ValueError(
                "noise_every: the noise ratio is that of a layer's weight gradient, which the gradient at "
                f"its output feeds: it needs placement='output', got {self.placement!r}"
            )
        if self.guard is not None:
            object.__setattr__(self, "guard", positive("guard", self.guard))
        if self.switch_step is not None:
            object.__setattr__(self, "switch_step", integer("switch_step", self.switch_step, 0))
        for key in ("keep_last", "keep_worst"):
            object.__setattr__(self, key, integer(key, getattr(self, key), 0))
        if self.keep_worst and self.noise_every is None:
            raise ValueError("keep_worst needs noise_every (it ranks the layers by their noise ratio)")
        self._check_guard_on()
        switching = self.switching
        if switching and isinstance(self.policy, NoCompression):
            raise ValueError(
                f"{switching[0]}: the policy 'none' adds no noise, there is nothing to switch from"
            )
        if not switching and self.fallback != NoCompression():
            raise ValueError(
                f"fallback {self.fallback.describe()!r} acts only on layers that switch to it: give guard, "
                "switch_step, keep_last or keep_worst too, or leave it out"
            )
        if self.guard is None and self.guard_patience != _GUARD_PATIENCE:
            raise ValueError("guard_patience counts the noise steps below the guard: give guard too")
        if switching and self.fallback.two_streams and not self.policy.two_streams:
            raise ValueError(
                f"fallback {self.fallback.label} quantizes the two GEMMs' copies apart, which "
                f"{self.policy.label} does not: choose a one-stream fallback (e.g. none, fp)"
            )

    def _check_guard_on(self) -> None:
        """`guard_on` resolved where a ratio is read (guard, keep_worst): the measured R where it is
        measured, else the carried prediction; refused where nothing reads it."""
        if self.guard is None and not self.keep_worst:
            if self.guard_on is not None:
                raise ValueError(
                    "guard_on says which noise ratio guard and keep_worst read: give one of them"
                )
            return
        if self.guard_on is None:
            object.__setattr__(self, "guard_on", "measured" if self.measure_noise else "carried")
        choose("guard_on", self.guard_on, GUARD_RATIOS)
        if self.guard_on == "measured" and not self.measure_noise:
            raise ValueError("guard_on='measured' needs measure_noise (the weight-gradient GEMMs measure R)")

    @property
    def switching(self) -> list[str]:
        """The settings that move layers to the fallback (guard, switch_step, keep_last, keep_worst)."""
        given = {
            "guard": self.guard is not None,
            "switch_step": self.switch_step is not None,  # 0 included: every layer from the start
            "keep_last": self.keep_last > 0,
            "keep_worst": self.keep_worst > 0,
        }
        return [key for key, on in given.items() if on]

    @property
    def types(self) -> tuple[str, ...]:
        """The layer types acted on: the configured ones, else the policy's placement."""
        return self.policy.layer_types if self.layer_types is None else self.layer_types

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON values (the policy as its string), read back by the constructor."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["policy"] = self.policy.describe()
        values["fallback"] = self.fallback.describe()
        return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


COMPRESSION_KEYS = tuple(f.name for f in dataclasses.fields(CompressionConfig))


# timm registers a model by decorating its entrypoint with @register_model, and keeps old names through
# register_model_deprecations(__name__, {old: new, ...}) in the same module
_TIMM_ENTRYPOINT = re.compile(r"^@register_model\s*\ndef (\w+)", re.MULTILINE)
_TIMM_DEPRECATIONS = re.compile(r"register_model_deprecations\(\s*__name__,\s*\{(.*?)\}\s*\)", re.DOTALL)
_QUOTED_KEY = re.compile(r"['\"]([\w.-]+)['\"]\s*:")


@functools.cache
def timm_model_names() -> frozenset[str] | None:
    """timm's model names read from its sources (some 30 ms) rather than from `timm.list_models()`: importing
    timm imports torch (seconds), which parsing the workflow must not. None when timm is not installed or its
    sources no longer look as expected (then only building the model checks the name)."""
    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        return None
    names: set[str] = set()
    for path in (Path(spec.submodule_search_locations[0]) / "models").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        names.update(_TIMM_ENTRYPOINT.findall(text))
        for mapping in _TIMM_DEPRECATIONS.findall(text):
            names.update(_QUOTED_KEY.findall(mapping))
    return frozenset(names) if len(names) > 100 else None  # timm has well over a thousand


def check_model_name(name: str) -> None:
    """Refuse a name timm does not know (a pretrained tag after a dot is ignored, as timm does). Once timm is
    imported its registry decides, so that models registered at run time count."""
    timm = sys.modules.get("timm")
    if timm is not None:
        if timm.is_model(name):
            return
        known = timm.list_models()
    else:
        known = timm_model_names()
        if known is None or name.split(".", 1)[0] in known:
            return
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else " (see timm.list_models())"
    raise ConfigError(f"unknown timm model {name!r}{hint}")


@dataclass
class TrainConfig:
    out: str = "runs/train"
    model: str = "resnet18"
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    subset_per_class: int | None = None
    test_subset_per_class: int | None = None
    stem: str = "model"  # one of STEMS: "3x3"/"3x3s2" replace a ResNet's ImageNet stem (models.py)
    model_kwargs: dict = field(default_factory=dict)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    # compression's warmup_steps in epochs (the reference schedules: an fp32 first epoch before FP6, pruning
    # from half an epoch on); training turns it into warmup_steps, which the run's config.yaml records
    uncompressed_epochs: float | None = None
    # optimisation
    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 128
    eval_batch_size: int = 500
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "cosine"
    warmup_epochs: float = 0.0
    milestones: list = field(default_factory=list)  # epochs, for lr_schedule=step
    gamma: float = 0.1
    label_smoothing: float = 0.0
    max_skipped_steps: int = 20
    checkpoint_every: int | None = None  # also checkpoint every N steps (an epoch's checkpoint always)
    reduce_statistics: bool = False  # report compression sparsity summed over all ranks (else rank 0's)
    workers: int = 4  # DataLoader workers for streamed datasets (ImageNet)
    # run
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    channels_last: bool = False  # NHWC tensors: 1.1-1.9x faster CPU steps on the default config's models
    log_every: int = 20
    progress: bool = True
    resume: bool = False  # continue from out/checkpoint.pt (start when there is none)
    overwrite: bool = False  # delete the run files a previous run left in `out`, then start
    probe: dict | None = None
    forward_bits: int | None = None  # QAT: quantize conv/linear inputs and weights in the forward pass

    def __post_init__(self) -> None:
        if isinstance(self.compression, Mapping):
            self.compression = CompressionConfig(**self.compression)
        for item in dataclasses.fields(self):  # a YAML value of the wrong type (epochs: "3") fails here
            setattr(self, item.name, typed(item.name, item.type, getattr(self, item.name)))
        check_model_name(self.model)
        lookup(self.dataset)  # a known dataset
        if self.uncompressed_epochs is not None:
            if self.uncompressed_epochs < 0:
                raise ValueError(f"uncompressed_epochs must be >= 0, got {self.uncompressed_epochs}")
            if self.compression.warmup_steps:
                raise ValueError("give the warm-up as warmup_steps or as uncompressed_epochs, not both")
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: continue the run or replace it")
        choose("optimizer", self.optimizer, OPTIMIZERS)
        choose("stem", self.stem, STEMS)
        choose("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        device("device", self.device)
        for name in ("epochs", "batch_size", "eval_batch_size", "log_every", "max_steps", "checkpoint_every",
                     "subset_per_class", "test_subset_per_class"):  # fmt: skip
            if getattr(self, name) is not None:  # counts
                integer(name, getattr(self, name), 1)
        positive("lr", self.lr)
        integer("seed", self.seed, 0)

    @property
    def policy(self) -> Policy:
        return self.compression.policy

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON values (what config.yaml and checkpoints hold), read back by `resolve_config`."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**values, "compression": self.compression.to_dict()}


TRAIN_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig))


def known_keys() -> list[str]:
    """Every key a training config may hold: TrainConfig's, and the compression keys written flat."""
    return sorted({*TRAIN_KEYS, *COMPRESSION_KEYS})


def resolve_config(file: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Defaults, then the dataset's defaults, then the YAML file, then explicit overrides (None = unset).
    Compression keys may be flat or nested under `compression`; the same key both ways is an error."""
    values: dict[str, Any] = {}
    if file is not None:
        try:
            values = yaml.safe_load(Path(file).read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{file} is not valid YAML: {' '.join(str(error).split())}") from error
        if not isinstance(values, dict):
            raise ConfigError(f"{file}: a training config must be a mapping of keys to values")
    # resume and overwrite say what to do with a previous run: either one given as an override replaces the
    # file's choice (a run's config.yaml records the one it was started with)
    for key, other in (("resume", "overwrite"), ("overwrite", "resume")):
        if overrides.get(key) and overrides.get(other) is None:
            values.pop(other, None)
    values.update({key: value for key, value in overrides.items() if value is not None})
    unknown = sorted(set(values) - set(known_keys()))
    if unknown:
        raise ConfigError(f"unknown training config keys {unknown}; known keys: {known_keys()}")
    compression = dict(values.pop("compression", None) or {})
    for key in COMPRESSION_KEYS:
        if key in values:
            if key in compression and compression[key] != values[key]:
                raise ConfigError(f"{key} is given both flat and under compression; give it once")
            compression[key] = values.pop(key)
    name = values.get("dataset", TrainConfig.dataset)
    merged = {**(DATASETS[name].defaults if name in DATASETS else {}), **values}
    try:
        return TrainConfig(**merged, compression=CompressionConfig(**compression))
    except (TypeError, ValueError) as error:  # the dataclasses' and the policies' checks of values
        raise ConfigError(str(error)) from error
