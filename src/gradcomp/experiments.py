"""The experiments, by ID: what each one reads, its typed settings, and where its two steps live.

An experiment is one registration here plus two functions named after its slug: a compute step in
``gradcomp.analysis.<stage>`` (finished runs -> a `Result`: tables aggregated over seeds, paired comparisons
with their verdicts, findings, the papers' claims it decides and a caption generated from the settings and
the data) and a draw step in ``gradcomp.plots.<stage>`` (that `Result` -> a figure, and nothing else). The
papers' verified claims are registered with the experiment that decides them (`CLAIMS`). Each experiment's
settings are a frozen dataclass built from its section of a pipeline config: unknown keys and wrong types
are errors that name the key; the margins of its equivalence tests and the runs deciding its claim are
settings too. Runs are read with every seed the config trains them with (accuracy comparisons are paired
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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gradcomp.choices import CLAIM_TESTS, choose
from gradcomp.formats import parse_format
from gradcomp.policies import Block, parse_policy

ALL = "all"  # `runs: all`: every run of the config


# --- settings -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    """Settings of an experiment. Subclasses add fields and say which training runs they name
    (`named_runs`); `optional` lists named runs the experiment does without where the config lacks them."""

    reads_checkpoints: ClassVar[bool] = False  # measures gradients of trained models (reads chosen seeds)
    optional: tuple[str, ...] = field(default=(), kw_only=True)

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
            settings = cls(**values)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        unnamed = sorted(set(settings.optional) - set(settings.named_runs(list(settings.optional))))
        if unnamed:
            raise ValueError(f"{where}.optional: {unnamed} are not among the runs the experiment names")
        return settings

    def to_config(self) -> dict[str, Any]:
        """The settings as plain config values (lists for tuples): `from_config` reads them back."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        """Every training run the settings name, in order, without repeats."""
        return []

    def runs_read(self, all_runs: Sequence[str]) -> list[str]:
        """The training runs this experiment reads: those named, less optional ones the config lacks."""
        return [run for run in self.named_runs(all_runs) if run in all_runs or run not in self.optional]

    def present(self, names: Sequence[str], runs: Mapping[str, Any]) -> list[Any]:
        """The groups of `runs` (name -> RunGroup) named in `names`, less optional runs not trained."""
        return [runs[name] for name in dict.fromkeys(names) if name in runs or name not in self.optional]


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
    """Runs whose final accuracies are compared, every seed of each, `baseline` the uncompressed run; accuracy
    differences within `margin` points count as equivalent; `claim` names the arm whose comparison with the
    baseline decides the papers' claim the experiment tests (None: it tests none)."""

    runs: tuple[str, ...]
    baseline: str | None = None
    margin: float = 1.0
    claim: str | None = None

    def __post_init__(self) -> None:
        if not self.margin > 0:
            raise ValueError(f"margin must be positive, got {self.margin}")
        if self.claim is not None and self.claim not in self.runs:
            raise ValueError(f"claim: {self.claim!r} is not among runs")

    @property
    def baselines(self) -> tuple[str, ...]:
        """Every baseline named, in order."""
        if self.baseline is None:
            return ()
        return (self.baseline,) if isinstance(self.baseline, str) else tuple(self.baseline)

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([*self.baselines, *self.runs]))


@dataclass(frozen=True)
class CompareWithinModels(Compare):
    """A5, A8: runs of one or several models; `baseline` names the uncompressed run of each model and scale
    (one name, or a list), and every arm is compared with the one of its own model and training scale."""

    baseline: str | tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.baselines:
            raise ValueError("missing settings ['baseline'] (the uncompressed run of each model)")


@dataclass(frozen=True)
class AtCheckpoint(Params):
    """One run's trained model (or training probe) at the seeds named (None: every seed it has)."""

    reads_checkpoints: ClassVar[bool] = True
    run: str
    seeds: tuple[int, ...] | None = None

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return [self.run]


@dataclass(frozen=True)
class AcrossModels(AtCheckpoint):
    """A1-A3: `run`'s probe in detail, next to the probed runs of other architecture families (`models`),
    each read at the same seeds."""

    models: tuple[str, ...] = ()

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([self.run, *self.models]))


@dataclass(frozen=True)
class GoodnessOfFit(AcrossModels):
    """A2: the families fitted to |g|; the claim holds where the lognormal fits better than each of the
    `light_tailed` families on every model."""

    distributions: tuple[str, ...] = (
        "lognormal",
        "halfnormal",
        "exponential",
        "weibull",
        "loglaplace",
        "loglogistic",
    )
    light_tailed: tuple[str, ...] = ("halfnormal", "exponential")

    def __post_init__(self) -> None:
        missing = sorted(set(self.light_tailed) - set(self.distributions))
        if "lognormal" not in self.distributions or missing:
            raise ValueError(f"distributions must hold lognormal and every light_tailed family {missing}")


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
    # the claim's FP4 format is predicted for the measured gradients' spread: sigma2 from here up
    gradient_sigma2: tuple[float, float] = (2.0, 4.0)

    def __post_init__(self) -> None:
        for name in self.formats:
            try:
                parse_format(name)
            except (TypeError, ValueError) as error:
                raise ValueError(f"formats: {error}") from None


@dataclass(frozen=True)
class Scaling(Params):
    """A6: per model (`baseline`: each model's uncompressed run) and format, one fixed global scale per run
    (`sweep`) and the other scaling rules (`rules`) against the per-layer mean rule of the same model and
    format; splits of one bit budget between exponent and mantissa (`splits`)."""

    baseline: str | tuple[str, ...]
    # per-layer and dynamic rules; each model and format's per-layer mean rule among them
    rules: tuple[str, ...]
    sweep: tuple[str, ...]  # fixed global scales
    splits: tuple[str, ...]  # the same bits split differently between exponent and mantissa
    margin: float = 1.0

    @property
    def baselines(self) -> tuple[str, ...]:
        return (self.baseline,) if isinstance(self.baseline, str) else tuple(self.baseline)

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([*self.baselines, *self.rules, *self.sweep, *self.splits]))


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
    # the thresholds tried for their sensitivity; the pair that agrees best on `fit_on`'s model (default:
    # the first baseline's) is then tested on the other models
    clipped_grid: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03, 0.1)
    flushed_grid: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)
    fit_on: str | None = None
    margin: float = 1.0  # accuracy points: a run within it of fp32 trains, one significantly below fails

    def __post_init__(self) -> None:
        if self.fit_on is not None and self.fit_on not in self.baselines:
            raise ValueError(f"fit_on: {self.fit_on!r} is not among baselines")

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
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
    or several, each pruned at its own compression points); an achieved sparsity within `margin` of its
    target is on target; `claim` names the lognormal runs that decide the papers' claim."""

    runs: tuple[str, ...]
    synthetic: SyntheticSparsity = SyntheticSparsity()
    margin: float = 0.01
    claim: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        outside = sorted(set(self.claim) - set(self.runs))
        if outside:
            raise ValueError(f"claim: {outside} are not among runs")

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(self.runs)


@dataclass(frozen=True)
class Heterogeneous(Params):
    """A9: the cosine-constrained run next to homogeneous runs."""

    constrained: str
    homogeneous: tuple[str, ...]
    margin: float = 1.0

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
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
    variance and its standard error; the first `batches` of them are the quantization draws' batches. A
    scheme's variance falls by 4 per bit where ln(its per-bit factor / 4) is within `per_bit_margin`."""

    bits: tuple[int, ...] = (4, 5, 6, 7, 8)
    batches: int = 4
    draws: int = 2
    sampling_batches: int = 16
    weight_bits: int | None = None  # None: the swept bits on the weight path too
    per_bit_margin: float = 0.25

    def __post_init__(self) -> None:
        if len(self.bits) < 2:
            raise ValueError("bits must name at least two bit widths (the per-bit factor is a slope)")
        if self.batches < 1 or self.draws < 1:
            raise ValueError(f"batches and draws must be at least 1, got {self.batches} and {self.draws}")
        if self.sampling_batches < 2:
            raise ValueError(
                f"sampling_batches must be at least 2 (the unbiased variance divides by B - 1), "
                f"got {self.sampling_batches}"
            )


@dataclass(frozen=True)
class Unbiasedness(AtCheckpoint):
    """B3; an unbiased quantizer's error falls with log-log slope -1/2 in the draws, within `slope_margin`."""

    bits: int = 4
    draws: int = 64
    slope_margin: float = 0.1


@dataclass(frozen=True)
class FqtAccuracy(Params):
    """B4: exact, QAT and FQT (int policy + the same forward quantization) runs; `claim`: the FQT run whose
    comparison with QAT decides the papers' claim, within `margin` points."""

    exact: str
    qat: str
    runs: tuple[str, ...]
    margin: float = 1.0
    claim: str | None = None

    def __post_init__(self) -> None:
        if self.claim is not None and self.claim not in self.runs:
            raise ValueError(f"claim: {self.claim!r} is not among runs")

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([self.exact, self.qat, *self.runs]))


@dataclass(frozen=True)
class EveryRun(Params):
    """X1: every named run (`all`: every run of the config)."""

    runs: tuple[str, ...] | Literal["all"] = ALL
    baseline: str | None = None
    margin: float = 1.0

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
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
        super().__post_init__()
        if self.elements < 1024:
            raise ValueError(f"elements must be at least 1024, got {self.elements}")


@dataclass(frozen=True)
class Successors(CompareWithinModels):
    """C3: the sequels' compressors (LUQ, MVUE N:M) next to stochastic pruning: every arm's accuracy against
    the uncompressed run of its model and scale, and the variance each arm's policy adds, measured on each
    baseline's trained models (`seeds`; None: every seed) over `batches` test batches and `draws` draws,
    next to `gradcomp.unbiased_theory`'s prediction; the two agree where the ln of their ratio is within
    `theory_margin`. Single-sample LUQ decides claim Q1, non-inferior within `luq_margin` (accuracy points;
    the paper's own loss, 1.1)."""

    reads_checkpoints: ClassVar[bool] = True
    seeds: tuple[int, ...] | None = None
    batches: int = 2
    draws: int = 2
    theory_margin: float = 0.25
    luq_margin: float = 1.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batches < 1 or self.draws < 1:
            raise ValueError(f"batches and draws must be at least 1, got {self.batches} and {self.draws}")
        if not self.theory_margin > 0:
            raise ValueError(f"theory_margin must be positive, got {self.theory_margin}")


@dataclass(frozen=True)
class BlockTheory(AcrossModels):
    """C2: on the trained models of `run` and the other families (`models`), the neural gradient of every
    compressed layer (`batches` test batches, eval mode, the seeds named) in each block format of `formats`
    (policy strings: presets such as mxfp4, or block:...; nearest rounding, blocks along the output features)
    with and without the Hadamard transform of `hadamard` elements, and with one scale per layer (the element
    format at the least predicted MSE): measured flushed and clipped shares and relative MSE next to
    `gradcomp.block_theory`'s; the theory agrees where the ln of the measured over the predicted MSE is within
    `theory_margin`."""

    formats: tuple[str, ...] = ("mxfp8", "mxfp6", "mxfp4", "nvfp4")
    hadamard: int = 16
    batches: int = 1
    theory_margin: float = 0.25

    def __post_init__(self) -> None:
        for spec in self.formats:
            policy = parse_policy(spec)
            if not isinstance(policy, Block):
                raise ValueError(f"formats: {spec!r} is not a block format (e.g. mxfp4, block:...)")
            if self.hadamard and policy.format.block_size % self.hadamard:
                raise ValueError(f"hadamard: {self.hadamard} does not divide the blocks of {spec!r}")
        if self.hadamard and self.hadamard & (self.hadamard - 1):
            raise ValueError(f"hadamard must be 0 or a power of two, got {self.hadamard}")
        if self.batches < 1 or not self.theory_margin > 0:
            raise ValueError("batches must be at least 1 and theory_margin positive")


@dataclass(frozen=True)
class RangePredictor(AtCheckpoint):
    bits: int = 5
    draws: int = 4
    batches: int = 1


# --- the registry -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budgets(Params):
    """X4: headline arms and their references trained for each of `budgets` (epochs; run `<stem>_<b>ep`,
    cosine schedule over the budget); `pairs`: (arm stem, reference stem, claim) each; `reference`: the fp32
    stem, whose learning curves and gain between the two longest budgets show where accuracy levels off;
    `replicates`: the budget at which the pairs replicate the claims' verdicts of config/default.yaml's full
    scale (on other seeds). Gaps within `margin` points count as none."""

    pairs: tuple[tuple[str, str, str], ...]
    reference: str = "baseline"
    budgets: tuple[int, ...] = (2, 4, 8)
    replicates: int = 2
    margin: float = 1.0

    def __post_init__(self) -> None:
        if len(self.budgets) < 3 or list(self.budgets) != sorted(set(self.budgets)):
            raise ValueError(f"budgets must be at least 3 increasing epoch counts, got {list(self.budgets)}")
        if self.replicates not in self.budgets:
            raise ValueError(
                f"replicates must be one of the budgets {list(self.budgets)}, got {self.replicates}"
            )
        for _, _, claim in self.pairs:
            if claim not in CLAIMS:
                raise ValueError(f"pairs: unknown claim {claim!r}; known: {list(CLAIMS)}")

    @staticmethod
    def run(stem: str, budget: int) -> str:
        return f"{stem}_{budget}ep"

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        stems = [self.reference, *(stem for pair in self.pairs for stem in pair[:2])]
        return list(dict.fromkeys(self.run(stem, b) for b in self.budgets for stem in stems))


@dataclass(frozen=True)
class Claim:
    """A verified claim of one of the two papers (from the reference digests: abstracts, theorems, the
    authors' code; no table values were available), decided by the experiment `experiment`."""

    id: str
    experiment: str
    paper: str
    text: str
    test: str  # how its deciding comparisons decide it (gradcomp.choices.CLAIM_TESTS)
    margin: str  # why the margin (the value is a setting of the experiment)

    def __post_init__(self) -> None:
        choose(f"claim {self.id}'s test", self.test, CLAIM_TESTS)


@dataclass(frozen=True)
class Experiment:
    """One experiment: `compute` is gradcomp.analysis.<stage>.<slug>, `draw` gradcomp.plots.<stage>.<slug>."""

    id: str
    slug: str
    stage: str
    title: str
    params: type[Params]

    @property
    def prefix(self) -> str:
        """Every output file of the experiment is figures/<config>/<prefix>.<extension>."""
        return f"{self.id}_{self.slug}"

    @property
    def claims(self) -> list[Claim]:
        """The papers' claims this experiment decides."""
        return [claim for claim in CLAIMS.values() if claim.experiment == self.id]

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
CLAIMS: dict[str, Claim] = {}
LOGNORMAL = "Chmiel et al., ICLR 2021"
STATQUANT = "Chen et al., NeurIPS 2020"
LUQ = "Chmiel et al., ICLR 2023 (LUQ)"
MVUE = "Chmiel, Hubara, Banner, Soudry, ICLR 2023 (MVUE N:M)"
EQUIVALENCE, DIFFERENCE, NON_INFERIORITY, SUPERIORITY, EXACT = CLAIM_TESTS
ACCURACY_MARGIN = (
    "1 accuracy point: the smallest loss a user would act on, and about the seed-to-seed sd of fp32 accuracy "
    "at these scales (0.5 to 1 pt)"
)
SPARSITY_MARGIN = "0.01 of sparsity: at 0.85, 7 % more or fewer kept elements than asked for"


def register(
    *,
    id: str,
    slug: str,
    stage: str,
    title: str,
    params: type[Params],
    claims: Mapping[str, tuple[str, str, str, str]] | None = None,
) -> None:
    """Add an experiment; `claims`: claim ID -> (paper, claim, test, why the margin) for each verified claim
    it decides."""
    EXPERIMENTS[id] = Experiment(id, slug, stage, title, params)
    for claim, (paper, text, test, margin) in (claims or {}).items():
        CLAIMS[claim] = Claim(claim, id, paper, text, test, margin)


register(
    id="A1",
    slug="gradient_histograms",
    stage="distributions",
    title="Neural gradients are near-lognormal",
    params=AcrossModels,
)
register(
    id="A2",
    slug="goodness_of_fit",
    stage="distributions",
    title="Goodness of fit: |g| against lognormal and alternatives",
    params=GoodnessOfFit,
    claims={
        "L1": (
            LOGNORMAL,
            "Neural-gradient magnitudes are heavy-tailed and near-lognormal: a lognormal fits them better "
            "than light-tailed (Gaussian, Laplace) models (abstract; Kolmogorov-Smirnov tests).",
            SUPERIORITY,
            "none: the claim is an ordering of fits (any consistent difference in the KS statistic)",
        )
    },
)
register(
    id="A3",
    slug="statistics_over_training",
    stage="distributions",
    title="Per-layer mu and sigma of log2|g| over training",
    params=AcrossModels,
)
register(
    id="A4",
    slug="fp_mse_theory",
    stage="fp",
    title="Quantization MSE of a lognormal in low-bit FP formats",
    params=FpTheory,
    claims={
        "L2": (
            LOGNORMAL,
            "At the optimal scale the FP quantization MSE of a lognormal depends on sigma only, the optimal "
            "number of exponent bits grows with sigma, and [1,3,0] is the predicted FP4 format (analysis; "
            "the authors' code table).",
            EXACT,
            "none: computed exactly",
        )
    },
)
register(
    id="A5",
    slug="fp_formats",
    stage="fp",
    title="Accuracy with FP gradient formats and per-layer scaling",
    params=CompareWithinModels,
    claims={
        "L3": (
            LOGNORMAL,
            "FP6 gradients train without accuracy degradation, with per-layer scaling (abstract; ImageNet).",
            NON_INFERIORITY,
            ACCURACY_MARGIN,
        )
    },
)
register(
    id="A6",
    slug="scaling_and_split",
    stage="fp",
    title="Per-layer vs global loss scaling; exponent/mantissa split",
    params=Scaling,
)
register(
    id="A7",
    slug="target_vs_achieved_sparsity",
    stage="sparsity",
    title="Target vs achieved gradient sparsity for each threshold estimator",
    params=Calibration,
    claims={
        "L4": (
            LOGNORMAL,
            "The lognormal threshold sets the gradient sparsity level accurately: achieved equals target "
            "(abstract).",
            EQUIVALENCE,
            SPARSITY_MARGIN,
        ),
        "L5": (
            LOGNORMAL,
            "Gaussian and Laplace priors (Ye et al. 2019) mispredict the sparsity a threshold reaches on "
            "neural gradients (abstract: such priors fail for them).",
            DIFFERENCE,
            SPARSITY_MARGIN,
        ),
    },
)
register(
    id="A8",
    slug="accuracy_vs_sparsity",
    stage="sparsity",
    title="Accuracy vs gradient sparsity",
    params=CompareWithinModels,
    claims={
        "L6": (
            LOGNORMAL,
            "Up to 85 % gradient sparsity on ResNet18 without accuracy loss (abstract; ImageNet).",
            NON_INFERIORITY,
            ACCURACY_MARGIN,
        )
    },
)
register(
    id="A9",
    slug="heterogeneous_sparsity",
    stage="sparsity",
    title="Heterogeneous sparsity with a cosine-similarity constraint",
    params=Heterogeneous,
)
register(
    id="A10",
    slug="failure_cases",
    stage="fp",
    title="Where low-precision FP gradients fail, and the fix",
    params=FailurePairs,
    claims={
        "L7": (
            LOGNORMAL,
            "The lognormal model explains the workloads where low-precision FP gradients fail: too few "
            "exponent bits for sigma, or one scale for layers with different mu (v1 abstract).",
            SUPERIORITY,
            "a run fails when it is worse than fp32 of its model beyond the accuracy margin",
        )
    },
)
register(
    id="B1",
    slug="bin_usage",
    stage="statquant",
    title="Quantization bins used by PTQ, PSQ and BHQ on one neural gradient",
    params=BinUsage,
    claims={
        "S1": (
            STATQUANT,
            "Per-tensor quantization (PTQ) wastes its range on neural gradients, whose samples have very "
            "different ranges; per-sample scales (PSQ, BHQ) use more of the bins (analysis).",
            SUPERIORITY,
            "none: the claim is an ordering",
        )
    },
)
register(
    id="B2",
    slug="variance_vs_bits",
    stage="statquant",
    title="Gradient quantization variance against bits: PTQ, PSQ, BHQ",
    params=VarianceVsBits,
    claims={
        "S2": (
            STATQUANT,
            "PSQ and BHQ have a lower gradient variance than PTQ (theorem).",
            SUPERIORITY,
            "none: the claim is an ordering",
        ),
        "S3": (
            STATQUANT,
            "The quantization variance falls about 4x per extra gradient bit (variance bound "
            "N D R^2 / 4B^2).",
            EQUIVALENCE,
            "0.25 in ln of the per-bit factor: 4x within a factor 1.28, between 3.1x and 5.1x per bit",
        ),
    },
)
register(
    id="B3",
    slug="unbiasedness",
    stage="statquant",
    title="FQT gradients average to the QAT gradient",
    params=Unbiasedness,
    claims={
        "S4": (
            STATQUANT,
            "With unbiased gradient quantizers the FQT gradient is an unbiased estimator of the QAT gradient "
            "(theorem).",
            EQUIVALENCE,
            "0.1 in the log-log slope of the error against draws: an unbiased mean falls with slope -1/2, "
            "a bias flattens it",
        )
    },
)
register(
    id="B4",
    slug="accuracy_table",
    stage="statquant",
    title="Test accuracy: Exact, QAT and FQT with PTQ, PSQ, BHQ gradients",
    params=FqtAccuracy,
    claims={
        "S5": (
            STATQUANT,
            "5-bit BHQ gradients lose only about 0.5 % top-1 accuracy against QAT (abstract; ResNet-50 on "
            "ImageNet).",
            NON_INFERIORITY,
            ACCURACY_MARGIN,
        )
    },
)
register(
    id="C1",
    slug="block_formats",
    stage="blocks",
    title="Block-scaled gradient formats in training, next to per-layer FP formats",
    params=CompareWithinModels,
)
register(
    id="C2",
    slug="block_theory",
    stage="blocks",
    title="The lognormal theory of block scaling against the real gradients of each family",
    params=BlockTheory,
)
register(
    id="C3",
    slug="successors",
    stage="sequels",
    title="The sequels: LUQ and unbiased N:M gradient pruning against stochastic pruning",
    params=Successors,
    claims={
        "Q1": (
            LUQ,
            "Neural gradients in LUQ's 4-bit logarithmic format (stochastic underflow, unbiased rounding "
            "between powers of two) train with little accuracy loss: ResNet-50 on ImageNet with all GEMMs in "
            "4 bits loses 1.1 % top-1 (abstract).",
            NON_INFERIORITY,
            "the paper's own loss: 1.1 accuracy points",
        ),
        "Q2": (
            MVUE,
            "The minimum-variance unbiased N:M mask of the neural gradient (1:2, 2:4) has a lower variance "
            "than other unbiased N:M estimators (theorem).",
            SUPERIORITY,
            "none: the claim is an ordering",
        ),
    },
)
register(
    id="X1",
    slug="accuracy_vs_bits",
    stage="beyond",
    title="Accuracy vs bits per gradient element, every compressor",
    params=EveryRun,
)
register(
    id="X2",
    slug="range_sigma_predictor",
    stage="statquant",
    title="Spread of per-sample gradient ranges as a predictor of the PSQ and BHQ gains",
    params=RangePredictor,
)
register(
    id="X4",
    slug="training_budget",
    stage="convergence",
    title="Accuracy gaps against the training budget: loss or slower convergence",
    params=Budgets,
)
register(
    id="X3",
    slug="prune_plus_fp",
    stage="beyond",
    title="Pruning and low-bit FP together",
    params=PruneWithFp,
)


def experiments() -> dict[str, Experiment]:
    """The registry, sorted by ID (A1, A2, ..., A10, B1, ..., X3)."""
    return dict(sorted(EXPERIMENTS.items(), key=lambda item: (item[0][0], int(item[0][1:]))))
