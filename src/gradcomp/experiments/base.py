"""What every stage's experiments share: the settings base classes and their parsing from a config section,
the `Experiment` and `Claim` records, the registry (`register`, `EXPERIMENTS`, `CLAIMS`) and the papers and
margins claims cite. Imports neither torch nor matplotlib (the Snakemake workflow parses it)."""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gradcomp.choices import CLAIM_TESTS, choose
from gradcomp.training.policies import NM, Block, FloatingPoint, Integer, Luq, NoCompression, Policy, Prune

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


# --- what a named run must have trained ---------------------------------------------------------------------
@dataclass(frozen=True)
class RunKind:
    """What the runs one setting names must have been trained with, for the experiment to mean anything (an
    FP experiment's arms an FP policy, a baseline no compression): a policy of one of `policies` (empty: any
    but none) and forward quantization where `forward` says (True: forward_bits set, False: unset, None:
    either). `text` says it in the error."""

    text: str
    policies: tuple[type[Policy], ...] = ()
    forward: bool | None = None

    def accepts(self, policy: Policy, forward_bits: int | None) -> bool:
        if self.forward is not None and self.forward != (forward_bits is not None):
            return False
        if not self.policies:
            return not isinstance(policy, NoCompression)
        return isinstance(policy, self.policies)


UNCOMPRESSED = RunKind("an uncompressed run (policy none)", (NoCompression,))
EXACT_RUN = RunKind("an exact run (policy none, no forward_bits)", (NoCompression,), forward=False)
QAT_RUN = RunKind("a QAT run (policy none with forward_bits)", (NoCompression,), forward=True)
QUANTIZED_FORWARD = RunKind("a run trained with forward quantization (forward_bits set)", (Policy,), True)
COMPRESSED = RunKind("a compressed run (any policy but none)")
FP_RUN = RunKind("an fp policy (one fp:..., not a chain)", (FloatingPoint,))
FP_OR_BLOCK_RUN = RunKind(
    "an fp or block-scaled policy (fp:..., mxfp4, nvfp4, block:...)", (FloatingPoint, Block)
)
BLOCK_RUN = RunKind("a block-scaled policy (mxfp4, nvfp4, a recipe, block:...)", (Block,))
PRUNE_RUN = RunKind("a prune policy (prune:..., not a chain)", (Prune,))
FQT_RUN = RunKind("an int policy with forward quantization (int:... and forward_bits)", (Integer,), True)
SEQUEL_RUN = RunKind("a luq, nm or prune policy", (Luq, NM, Prune))


def named_in(value: Any) -> list[str]:
    """The run names a setting's value holds (a name, a list of names, a list of pairs of names)."""
    if isinstance(value, str):
        return [value]
    return [name for item in value or () for name in named_in(item)]


# --- the registry -------------------------------------------------------------------------------------------


NO_LOSS = "0: the claim is that nothing is lost"
PILOT = "the committed figures of 2bf856b"  # the runs the plans' sds come from (before the runs they plan)


@dataclass(frozen=True)
class Plan:
    """A claim's design, fixed before the runs that decide it (pre-registration). `sd`: the paired sd of a
    deciding comparison (in its unit), pooled over like comparisons of a pilot only (same family, scale,
    metric, reference and kind of arm; `source` names them, `df` its degrees of freedom; where the deciding
    comparisons differ in kind, the largest group's). `effect`: the true difference a - b the seeds are
    planned at (0 for "no loss", the paper's number where it states one, else the pilot's smallest decided
    effect: `effect_source` says which). The claim's planned seeds follow (power 0.9 at 0.05 over its
    deciding comparisons, `gradcomp.analysis.claims`). `decided_in`: the configuration whose runs decide it
    (others show it at their scale and cite that one). `sensitivity`: a second margin the verdict is also
    shown at, and why (the paper's own number, or a stricter one where the paper states none)."""

    sd: float
    df: int
    source: str
    effect: float = 0.0
    effect_source: str = NO_LOSS
    decided_in: str = "default"
    sensitivity: tuple[float, str] | None = None

    def __post_init__(self) -> None:
        if not (self.sd > 0 and self.df >= 1):
            raise ValueError(f"a plan needs a positive sd and at least 1 degree of freedom, got {self}")


@dataclass(frozen=True)
class Claim:
    """A verified claim of one of the papers (from the reference digests: abstracts, theorems, the
    authors' code; no table values were available), decided by the experiment `experiment` by its `test`;
    `margin` says where the margin (a setting of the experiment) comes from; `plan` is its pre-registered
    design (None: decided by exact computation)."""

    id: str
    experiment: str
    paper: str
    text: str
    test: str  # how its deciding comparisons decide it (gradcomp.choices.CLAIM_TESTS)
    margin: str  # why the margin (the value is a setting of the experiment)
    plan: Plan | None = None
    short: str = ""  # the claim in at most 10 words (the claims at a glance)

    def __post_init__(self) -> None:
        choose(f"claim {self.id}'s test", self.test, CLAIM_TESTS)
        if (self.plan is None) != (self.test == EXACT):
            raise ValueError(f"claim {self.id}: a plan is needed exactly where the test is not exact")
        if not 0 < len(self.short.split()) <= 10:
            raise ValueError(f"claim {self.id}: its short form must have 1 to 10 words, got {self.short!r}")


@dataclass(frozen=True)
class Experiment:
    """One experiment: `compute` is gradcomp.analysis.<stage>.<slug>, `draw` gradcomp.plots.<stage>.<slug>."""

    id: str
    slug: str
    stage: str
    title: str
    params: type[Params]
    kinds: Mapping[str, RunKind] = field(default_factory=dict)  # setting -> what the runs it names train

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

    def mistrained(
        self, settings: Params, trained: Callable[[str], tuple[Policy, int | None] | None]
    ) -> list[str]:
        """Each run a setting names that was not trained as the experiment needs (see `kinds`), in one line
        starting with the setting; `trained(run)` gives the run's policy and forward_bits (None: a run that
        is not there, which is not this check's business)."""
        wrong = []
        for setting, kind in self.kinds.items():
            for run in dict.fromkeys(named_in(getattr(settings, setting))):
                found = trained(run)
                if found is not None and not kind.accepts(*found):
                    policy, forward_bits = found
                    forward = f" with forward_bits {forward_bits}" if forward_bits is not None else ""
                    wrong.append(
                        f"{setting}: run {run!r} trains policy {policy.describe()}{forward}; {self.id} needs "
                        f"{kind.text} there"
                    )
        return wrong

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
    claims: Mapping[str, tuple[str, str, str, str, Plan | None, str]] | None = None,
    kinds: Mapping[str, RunKind] | None = None,
) -> None:
    """Add an experiment; `claims`: claim ID -> (paper, claim, test, where the margin comes from, its plan,
    the claim in at most 10 words) for each verified claim it decides; `kinds`: setting -> what the runs it
    names must have trained (`RunKind`)."""
    EXPERIMENTS[id] = Experiment(id, slug, stage, title, params, dict(kinds or {}))
    for claim, (paper, text, test, margin, plan, short) in (claims or {}).items():
        CLAIMS[claim] = Claim(claim, id, paper, text, test, margin, plan, short)
