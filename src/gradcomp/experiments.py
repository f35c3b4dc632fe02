"""The experiments, by ID: what each one reads, its typed settings, and where its two steps live.

An experiment is one registration here plus two functions named after its slug: a compute step in
``gradcomp.analysis.<stage>`` (finished runs -> a `Result`: tables aggregated over seeds, paired comparisons,
headline numbers and a caption generated from the settings and the data) and a draw step in
``gradcomp.plots.<stage>`` (that `Result` -> a figure, and nothing else). Each experiment's settings are a
frozen dataclass built from its section of a pipeline config: unknown keys and wrong types are errors that
name the key. Runs are read with every seed the config trains them with (accuracy comparisons are paired
by seed); experiments that measure gradients at a trained checkpoint read the seeds their `seeds` setting
names (default: every seed of the run).

This module imports neither torch nor matplotlib: the Snakemake workflow parses it.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from gradcomp.formats import parse_format

ALL = "all"  # `runs: all`: every run of the config


# --- settings -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    """Settings of an experiment. Subclasses add fields; `runs_read` says which training runs they name."""

    reads_checkpoints: ClassVar[bool] = False  # measures gradients of trained models (reads chosen seeds)

    @classmethod
    def from_config(cls, section: Mapping[str, Any], where: str) -> Params:
        """Build from a config section; `where` (e.g. "experiments.A5") prefixes every error."""
        if not isinstance(section, Mapping):
            raise ValueError(f"{where}: expected a mapping of settings, got {section!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - set(fields))
        if unknown:
            raise ValueError(f"{where}: unknown settings {unknown}; known: {sorted(fields)}")
        hints = typing.get_type_hints(cls)
        values = {key: _coerce(value, hints[key], f"{where}.{key}") for key, value in section.items()}
        missing = [
            name
            for name, f in fields.items()
            if name not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(f"{where}: missing settings {missing}")
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    def to_config(self) -> dict[str, Any]:
        """The settings as plain config values (lists for tuples): `from_config` reads them back."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        """The training runs this experiment reads, in order, without repeats."""
        return []


def _plain(value: Any) -> Any:
    if isinstance(value, Params):
        return value.to_config()
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """`value` checked against the annotation `hint` (lists become tuples, ints are accepted as floats)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        for option in args:
            try:
                return _coerce(value, option, where)
            except ValueError:
                continue
        raise ValueError(f"{where} must be {_describe(hint)}, got {value!r}")
    if hint is type(None):
        if value is not None:
            raise ValueError(f"{where} must be null, got {value!r}")
        return None
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where} must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(item, args[0], f"{where}[{i}]") for i, item in enumerate(value))
        if len(value) != len(args):
            raise ValueError(f"{where} must be a list of {len(args)} items, got {value!r}")
        pairs = enumerate(zip(value, args, strict=True))
        return tuple(_coerce(item, arg, f"{where}[{i}]") for i, (item, arg) in pairs)
    if isinstance(hint, type) and issubclass(hint, Params):
        return hint.from_config(value, where)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and type(value) is not hint:
        raise ValueError(f"{where} must be {hint.__name__}, got {value!r}")
    return value


def _describe(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(_describe(arg) for arg in args)
    if typing.get_origin(hint) is tuple:
        return "a list"
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(arg) for arg in args)
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


@dataclass(frozen=True)
class Compare(Params):
    """Runs whose final accuracies are compared, every seed of each, `baseline` the uncompressed run."""

    runs: tuple[str, ...]
    baseline: str | None = None

    @property
    def baselines(self) -> tuple[str, ...]:
        """Every baseline named, in order."""
        if self.baseline is None:
            return ()
        return (self.baseline,) if isinstance(self.baseline, str) else tuple(self.baseline)

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([*self.baselines, *self.runs]))


@dataclass(frozen=True)
class CompareWithinModels(Compare):
    """A5, A8: runs of one or several models; `baseline` names the uncompressed run of each model (one name,
    or a list), and every arm is compared with the one of its own model (same model, options and stem)."""

    baseline: str | tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.baselines:
            raise ValueError("missing settings ['baseline'] (the uncompressed run of each model)")


@dataclass(frozen=True)
class AtCheckpoint(Params):
    """One run's trained model (or training probe) at the seeds named (None: every seed it has)."""

    reads_checkpoints: ClassVar[bool] = True
    run: str
    seeds: tuple[int, ...] | None = None

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        return [self.run]


@dataclass(frozen=True)
class AcrossModels(AtCheckpoint):
    """A1-A3: `run`'s probe in detail, next to the probed runs of other architecture families (`models`),
    each read at the same seeds."""

    models: tuple[str, ...] = ()

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([self.run, *self.models]))


@dataclass(frozen=True)
class GoodnessOfFit(AcrossModels):
    distributions: tuple[str, ...] = (
        "lognormal",
        "halfnormal",
        "exponential",
        "weibull",
        "loglaplace",
        "loglogistic",
    )


@dataclass(frozen=True)
class FpTheory(Params):
    bits: tuple[int, ...] = (4, 5, 6, 8)
    kinds: tuple[Literal["ideal", "saturate", "inf", "fn"], ...] = ("ideal", "saturate", "inf", "fn")
    # named formats (parse_format names: the ml_dtypes / OCP dtypes, or e{E}m{M}-...) at their optimal scale
    formats: tuple[str, ...] = (
        "float8_e5m2",
        "float8_e4m3",
        "e4m3fn",
        "e4m3fnuz",
        "e5m2fnuz",
        "e3m2fn",
        "e2m3fn",
        "e2m1fn",
        "e8m0fnu",
    )
    sigmas: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)
    monte_carlo: int = 200_000  # samples of each Monte-Carlo check
    seeds: tuple[int, ...] = (0, 1, 2)  # one Monte-Carlo estimate per seed

    def __post_init__(self) -> None:
        for name in self.formats:
            try:
                parse_format(name)
            except (TypeError, ValueError) as error:
                raise ValueError(f"formats: {error}") from None


@dataclass(frozen=True)
class Scaling(Params):
    """A6: a global-scale sweep and other scaling rules for one format; splits of one bit budget."""

    baseline: str
    rules: tuple[str, ...]  # the format with each per-layer or dynamic rule (the first: the reference rule)
    sweep: tuple[str, ...]  # the same format with one fixed global scale each
    splits: tuple[str, ...]  # the same bits split differently between exponent and mantissa

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([self.baseline, *self.rules, *self.sweep, *self.splits]))


@dataclass(frozen=True)
class FailurePairs(Params):
    """A10: the lognormal theory's predictions from each model's measured gradients, next to trained
    outcomes: (failing run, fixing run) pairs and every other FP run in `arms`."""

    baselines: tuple[str, ...]  # each model's uncompressed probed run: its statistics and fp32 reference
    pairs: tuple[tuple[str, str], ...]
    arms: tuple[str, ...] = ()  # more FP runs whose prediction is set next to their outcome
    format: str = "e4m1"  # the format whose global-scale window is predicted for each model
    formats: tuple[str, ...] = ("e5m2", "e4m3", "e4m2", "e4m1", "e3m2", "e3m1", "e3m0", "e5m0")
    log2_scales: tuple[int, int] = (-16, 48)  # the global scales predicted, 2^a to 2^b
    # the predicted failure: more of the non-zero values clipped, or flushed to zero, than these shares
    max_clipped: float = 0.01
    max_flushed: float = 0.99

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        paired = [run for pair in self.pairs for run in pair]
        return list(dict.fromkeys([*self.baselines, *paired, *self.arms]))


@dataclass(frozen=True)
class SyntheticSparsity(Params):
    numel: int = 262_144
    sigmas: tuple[float, ...] = (1.0, 2.0, 3.0)
    targets: tuple[float, ...] = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95)
    zero_fractions: tuple[float, ...] = (0.0, 0.3)
    seeds: tuple[int, ...] = (0, 1, 2)  # one synthetic draw per seed


@dataclass(frozen=True)
class Calibration(Params):
    """A7: target vs achieved sparsity, on synthetic lognormal gradients and in training runs (of one model
    or several, each pruned at its own compression points)."""

    runs: tuple[str, ...]
    synthetic: SyntheticSparsity = SyntheticSparsity()

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        return list(self.runs)


@dataclass(frozen=True)
class Heterogeneous(Params):
    """A9: the cosine-constrained run next to homogeneous runs."""

    constrained: str
    homogeneous: tuple[str, ...]

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([self.constrained, *self.homogeneous]))


@dataclass(frozen=True)
class BinUsage(AtCheckpoint):
    bits: int = 8
    layer: str = "layer2.0.conv1"
    draws: int = 10  # stochastic draws of each scheme's variance


@dataclass(frozen=True)
class VarianceVsBits(AtCheckpoint):
    """B2. `batches` x `draws` FQT gradients per (bits, scheme) give the quantization variance;
    `sampling_batches` QAT gradients (one pass each, far cheaper) give the unbiased minibatch sampling
    variance and its standard error; the first `batches` of them are the quantization draws' batches."""

    bits: tuple[int, ...] = (4, 5, 6, 7, 8)
    batches: int = 4
    draws: int = 2
    sampling_batches: int = 16
    weight_bits: int | None = None  # None: the swept bits on the weight path too

    def __post_init__(self) -> None:
        if not self.bits:
            raise ValueError("bits must name at least one bit width")
        if self.batches < 1 or self.draws < 1:
            raise ValueError(f"batches and draws must be at least 1, got {self.batches} and {self.draws}")
        if self.sampling_batches < 2:
            raise ValueError(
                f"sampling_batches must be at least 2 (the unbiased variance divides by B - 1), "
                f"got {self.sampling_batches}"
            )


@dataclass(frozen=True)
class Unbiasedness(AtCheckpoint):
    bits: int = 4
    draws: int = 64


@dataclass(frozen=True)
class FqtAccuracy(Params):
    """B4: exact, QAT and FQT (int policy + the same forward quantization) runs."""

    exact: str
    qat: str
    runs: tuple[str, ...]

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([self.exact, self.qat, *self.runs]))


@dataclass(frozen=True)
class EveryRun(Params):
    """X1: every named run (`all`: every run of the config)."""

    runs: tuple[str, ...] | Literal["all"] = ALL
    baseline: str | None = None

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        named = list(all_runs) if self.runs == ALL else list(self.runs)
        return list(dict.fromkeys([*([self.baseline] if self.baseline else []), *named]))


@dataclass(frozen=True)
class PruneWithFp(Compare):
    """X3: accuracies of prune, FP and prune-then-FP runs, and the mechanism behind them measured on
    synthetic signed lognormal gradients of `elements` entries per layer with each layer's (mu, sigma) as
    the FP-alone runs measured them (seeded by `seed`)."""

    elements: int = 2**18
    seed: int = 0

    def __post_init__(self) -> None:
        if self.elements < 1024:
            raise ValueError(f"elements must be at least 1024, got {self.elements}")


@dataclass(frozen=True)
class RangePredictor(AtCheckpoint):
    bits: int = 5
    draws: int = 4
    batches: int = 1


# --- the registry -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Experiment:
    """One experiment: `compute` is gradcomp.analysis.<stage>.<slug>, `draw` gradcomp.plots.<stage>.<slug>."""

    id: str
    slug: str
    stage: str
    title: str
    params: type[Params]
    claim: str  # what the papers verifiably claim (SUMMARY.md), or "(beyond the papers)"

    @property
    def prefix(self) -> str:
        """Every output file of the experiment is figures/<config>/<prefix>.<extension>."""
        return f"{self.id}_{self.slug}"

    def settings(self, config: Mapping[str, Any]) -> Params:
        """The experiment's settings from a pipeline config (its section under `experiments`)."""
        return self.params.from_config(config["experiments"].get(self.id) or {}, f"experiments.{self.id}")

    @property
    def compute(self) -> Callable:
        return getattr(importlib.import_module(f"gradcomp.analysis.{self.stage}"), self.slug)

    @property
    def draw(self) -> Callable:
        return getattr(importlib.import_module(f"gradcomp.plots.{self.stage}"), self.slug)


COMPUTED = ("json", "csv", "md")  # what the compute step writes
DRAWN = ("png", "pdf")  # what the draw step writes
EXPERIMENTS: dict[str, Experiment] = {}


def register(*args: Any) -> None:
    experiment = Experiment(*args)
    EXPERIMENTS[experiment.id] = experiment


register(
    "A1",
    "gradient_histograms",
    "distributions",
    "Neural gradients are near-lognormal",
    AcrossModels,
    "Neural-gradient magnitudes are heavy-tailed and near-lognormal (ln|g| close to Gaussian); weights and "
    "activations are light-tailed and bell-shaped (Chmiel et al., abstract).",
)
register(
    "A2",
    "goodness_of_fit",
    "distributions",
    "Goodness of fit: |g| against lognormal and alternatives",
    GoodnessOfFit,
    "Gradients are 'near-lognormal' (ICLR title): close to, not exactly, lognormal; the KS table values were "
    "not available, and the reference code's KS procedure is only meaningful on ln|g| (digest section 2.3).",
)
register(
    "A3",
    "statistics_over_training",
    "distributions",
    "Per-layer mu and sigma of log2|g| over training",
    AcrossModels,
    "Per-layer statistics differ, which motivates per-layer ('local') loss scaling derived from (mu, sigma) "
    "(Chmiel et al., abstract).",
)
register(
    "A4",
    "fp_mse_theory",
    "fp",
    "Quantization MSE of a lognormal in low-bit FP formats",
    FpTheory,
    "After the optimal scale the FP quantization MSE depends on sigma only; the optimal exponent width grows "
    "with sigma; [1,3,0] is the predicted FP4 format (digest sections 2.10, A.2).",
)
register(
    "A5",
    "fp_formats",
    "fp",
    "Accuracy with FP gradient formats and per-layer scaling",
    CompareWithinModels,
    "FP6 gradients without accuracy degradation on ImageNet, with per-layer scaling (Chmiel et al., "
    "abstract).",
)
register(
    "A6",
    "scaling_and_split",
    "fp",
    "Per-layer vs global loss scaling; exponent/mantissa split",
    Scaling,
    "Per-layer scaling gives loss scaling a theoretical basis; the exponent/mantissa split should follow "
    "sigma (Chmiel et al., abstract).",
)
register(
    "A7",
    "target_vs_achieved_sparsity",
    "sparsity",
    "Target vs achieved gradient sparsity for each threshold estimator",
    Calibration,
    "The lognormal threshold sets the sparsity level accurately; Gaussian priors mispredict it (digest's "
    "simulation: target 0.5 at sigma 2.5 reaches 0.77-0.98 with Gaussian thresholds).",
)
register(
    "A8",
    "accuracy_vs_sparsity",
    "sparsity",
    "Accuracy vs gradient sparsity",
    CompareWithinModels,
    "Up to 85% gradient sparsity on ResNet18/ImageNet without accuracy loss (Chmiel et al., abstract).",
)
register(
    "A9",
    "heterogeneous_sparsity",
    "sparsity",
    "Heterogeneous sparsity with a cosine-similarity constraint",
    Heterogeneous,
    "Heterogeneous per-layer sparsity under a cosine-similarity constraint (Chmiel et al., code and README "
    "command); no verified numbers.",
)
register(
    "A10",
    "failure_cases",
    "fp",
    "Where low-precision FP gradients fail, and the fix",
    FailurePairs,
    "The lognormal model explains workloads where low-precision FP was reported to fail (Chmiel et al., v1 "
    "abstract): too few exponent bits for sigma, or one scale for layers with different mu; here its "
    "predictions from each model's measured gradients are set next to trained outcomes.",
)
register(
    "B1",
    "bin_usage",
    "statquant",
    "Quantization bins used by PTQ, PSQ and BHQ on one neural gradient",
    BinUsage,
    "PTQ puts most values in a few central bins; PSQ and BHQ use more of the bins (Chen et al., "
    "reviewer-confirmed figure).",
)
register(
    "B2",
    "variance_vs_bits",
    "statquant",
    "Gradient quantization variance against bits: PTQ, PSQ, BHQ",
    VarianceVsBits,
    "Quantization variance falls about 4x per bit; PTQ > PSQ > BHQ; compare with the QAT sampling variance "
    "(Chen et al., variance theorem).",
)
register(
    "B3",
    "unbiasedness",
    "statquant",
    "FQT gradients average to the QAT gradient",
    Unbiasedness,
    "With unbiased gradient quantizers the FQT gradient is an unbiased estimator of the QAT gradient (Chen "
    "et al., theorem).",
)
register(
    "B4",
    "accuracy_table",
    "statquant",
    "Test accuracy: Exact, QAT and FQT with PTQ, PSQ, BHQ gradients",
    FqtAccuracy,
    "5-bit BHQ on ResNet-50/ImageNet loses only 0.5% top-1 against QAT; 8-bit quantizers are close to QAT "
    "(Chen et al., abstract).",
)
register(
    "X1",
    "accuracy_vs_bits",
    "beyond",
    "Accuracy vs bits per gradient element, every compressor",
    EveryRun,
    "(beyond the papers) no paper claim.",
)
register(
    "X2",
    "range_sigma_predictor",
    "statquant",
    "Spread of per-sample gradient ranges as a predictor of the PSQ and BHQ gains",
    RangePredictor,
    "(beyond the papers) the digest's sigma sweep: BHQ/PSQ variance ratio 0.86 at sigma 0.5 to 0.03 at "
    "sigma 3 on synthetic rows (digest section 6).",
)
register(
    "X3",
    "prune_plus_fp",
    "beyond",
    "Pruning and low-bit FP together",
    PruneWithFp,
    "(beyond the papers) no paper claim.",
)


def experiments() -> dict[str, Experiment]:
    """The registry, sorted by ID (A1, A2, ..., A10, B1, ..., X3)."""
    return dict(sorted(EXPERIMENTS.items(), key=lambda item: (item[0][0], int(item[0][1:]))))
