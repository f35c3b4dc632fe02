"""Named, config-selectable gradient compressors: what to do with a layer's neural gradient.

A policy is a small frozen dataclass, registered by name and built from a string ``NAME[:key=value,...]``
(chains joined by ``+``), e.g. ``prune:sparsity=0.85,estimator=gaussian+fp:format=e4m1``, or from a YAML
mapping ``{name: prune, sparsity: 0.85}`` (a list of mappings for a chain). It says *what*;
`gradcomp.training.compress` says *how* (the torch ops it runs), and `gradcomp.training.attachment` *where*.
This module imports no torch, so configs are validated (e.g. while Snakemake parses the workflow) without it.

Policies describe themselves for analyses and figures: `label` (a short name), `family` (the group a figure
legend puts it in) and `bits_per_element` (what the compressed gradient takes in storage), so that no caller
needs to switch on policy classes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from gradcomp.choices import (
    ESTIMATORS,
    FITS,
    INT_BITS,
    INT_SCHEMES,
    INT_WEIGHT_SCHEMES,
    LUQ_BITS,
    LUQ_SAMPLES,
    NM_MAX_M,
    ROUNDINGS,
    SCALINGS,
    SIGN_MODES,
    choose,
    integer,
    positive,
    typed,
)
from gradcomp.formats import FPFormat, parse_format
from gradcomp.formats.block import PRESETS as BLOCK_PRESETS
from gradcomp.formats.block import BlockFormat

POLICIES: dict[str, type[Policy]] = {}
FLOAT32_BITS = 32


def register(name: str):
    def wrap(cls):
        cls.name = name
        POLICIES[name] = cls
        return cls

    return wrap


class Policy:
    """Base of all policies."""

    name: ClassVar[str] = "policy"
    two_streams: ClassVar[bool] = False  # True when activation- and weight-gradient paths differ
    reports_attainable: ClassVar[bool] = False  # reports the sparsity it could reach (pruning)
    # where the policy acts unless told otherwise (see `attach`): the placement of the paper it reproduces
    layer_types: ClassVar[tuple[str, ...]] = ("conv", "linear")

    def _check(self, key: str, check: Callable[..., Any], *bounds: Any) -> None:
        """Field `key` checked by a `gradcomp.choices` check (the message names the policy) and set to the
        value it returns, so that e.g. a numpy integer is stored (and described) as an int."""
        object.__setattr__(self, key, check(f"{self.name}: {key}", getattr(self, key), *bounds))

    def describe(self) -> str:
        """The policy string, parsed back by `parse_policy` (parameters at their default are kept)."""
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.init)
        args = ",".join(f"{key}={value}" for key, value in values if value is not None)  # None: the default
        return f"{self.name}:{args}" if args else self.name

    @property
    def label(self) -> str:
        """A short name for figures and tables, e.g. ``prune 0.85``, ``FP6 [1,4,1]``, ``int4 BHQ``."""
        raise NotImplementedError

    @property
    def family(self) -> str:
        """The group a figure legend puts the policy in (X1)."""
        raise NotImplementedError

    @property
    def uses_bn_output(self) -> bool:
        """Whether compressing a layer's output gradient reads which entries of the gradient at the
        following BatchNorm's output are non-zero (see `Prune.fit`)."""
        return False

    @property
    def reports(self) -> tuple[str, ...]:
        """The statistics of a layer's last refresh that `Attachment.layer_summary` reports (names of
        `gradcomp.training.compress.LayerStats.report`)."""
        return ()

    @property
    def constants(self) -> dict[str, Any]:
        """Facts of the policy reported with every layer's statistics."""
        return {}

    def bits_per_element(self, summary: Mapping[str, Any], then: Policy | None = None) -> float | None:
        """Bits the compressed neural gradient takes per element in storage, summed over every copy the
        backward pass keeps, given a run's summary (its measured sparsity and per-layer statistics); `then`
        is the policy that codes this one's output next in a chain. Scales (one per layer, row or column)
        are neglected. A dense code followed by another stores the later one. None where the summary does
        not say (pruning's sparsity in a run whose last epoch trained no step: every one skipped)."""
        return then.bits_per_element(summary) if then is not None else self._dense_bits()

    def _dense_bits(self) -> float:
        raise NotImplementedError


@register("none")
@dataclass(frozen=True)
class NoCompression(Policy):
    @property
    def label(self) -> str:
        return "none"

    @property
    def family(self) -> str:
        return "none"

    def _dense_bits(self) -> float:
        return float(FLOAT32_BITS)


@register("prune")
@dataclass(frozen=True)
class Prune(Policy):
    """Unbiased stochastic pruning to a target sparsity; the threshold comes from `estimator`.

    Acts by default on every convolution output (the BatchNorm inputs of the lognormal paper, section 2.8),
    not on the classifier, whose output gradient is the loss gradient itself.

    fit (lognormal estimator; the other estimators model every entry): which entries the lognormal is
    fitted on, and how the threshold treats the rest. "bn_nonzero" (default): the reference code's
    population, the entries whose gradient at the following BatchNorm's output is non-zero (ReLU or
    max-pool zeroed the others, where BatchNorm's backward leaves mean corrections), whose (mu, sigma) are
    reported; the other entries get a lognormal fit of their own from the same reduction, and the
    threshold is solved for the whole tensor (the two parts' expected zeros hit the target), so the achieved
    sparsity is the target whatever those corrections are. "reference": the reference code's rule, which
    counts the other entries as zeros and prunes the fitted part to (sparsity - s0)/(1 - s0) (s0: their
    share); where BatchNorm's mean corrections are not small, fewer zeros result than asked for; where
    s0 >= sparsity it fits every entry. "all": one lognormal of every non-zero entry. A layer without a
    following BatchNorm fits every entry under each rule.

    calibrate (lognormal estimator, homogeneous, in an attachment): where a layer's gradient is not
    lognormal (heavier tails, e.g. DeiT's), the closed-form threshold misses the target by a few hundredths;
    with calibrate each refresh adds the layer's last miss (target - achieved zeros, as counted) to the
    target it solves for, so the achieved sparsity converges to the target within a few refreshes. A layer
    whose gradient already has more zeros than the target prunes nothing, and such a refresh teaches the
    correction nothing. False: the paper's closed-form threshold alone.

    min_cosine: heterogeneous sparsity (section 2.7): no layer's predicted cosine similarity between
    pruned and original gradient (lognormal truncated at `truncation` sigmas) falls below it, and
    `sparsity` is the overall (element-weighted) target. At each refresh the layers' last fits give the
    sparsity each may reach at that cosine (closed forms); one common sparsity q is solved so that every
    layer at min(q, its limit) hits the target overall (water-filling), instead of the reference's fixed
    compensation of the unconstrained layers. cosine_groups: per-group limits instead, as the reference's
    `--layers_cos_sim`/`--cos_sim` flags, e.g. "layer2=0.95;layer3=0.98;layer4=0.98": a layer whose name
    contains a group's pattern gets its limit (the first that matches), the others none. max_sparsity: no
    layer is allocated more (the reference's `--max_sparsity`, 0.9). truncation: None (the reference's)
    measures it per layer and fit as the standardised N/300-th largest ln|g| (2.713 for an exact normal);
    a number fixes it. Lognormal estimator only."""

    sparsity: float = 0.85
    estimator: str = "lognormal"
    fit: str = "bn_nonzero"
    min_cosine: float | None = None
    cosine_groups: str | None = None
    max_sparsity: float | None = None
    truncation: float | None = None
    calibrate: bool = True
    layer_types: ClassVar[tuple[str, ...]] = ("conv",)
    reports_attainable: ClassVar[bool] = (
        True  # pruning only adds zeros: the gradient's own may exceed the target
    )

    def __post_init__(self) -> None:
        if not 0 <= self.sparsity < 1:
            raise ValueError(f"prune: sparsity must be in [0, 1), got {self.sparsity}")
        self._check("estimator", choose, ESTIMATORS)
        self._check("fit", choose, FITS)
        if self.min_cosine is not None and not 0 < self.min_cosine < 1:
            raise ValueError(f"prune: min_cosine must be in (0, 1), got {self.min_cosine}")
        if self.min_cosine is not None and self.cosine_groups is not None:
            raise ValueError("prune: give min_cosine (every layer) or cosine_groups (per group), not both")
        self._cosine_groups()  # checks the groups
        if self.heterogeneous and self.estimator != "lognormal":
            raise ValueError("prune: min_cosine and cosine_groups need estimator=lognormal")
        if self.max_sparsity is not None:
            if not self.heterogeneous:
                raise ValueError("prune: max_sparsity needs min_cosine or cosine_groups")
            if not self.sparsity <= self.max_sparsity < 1:
                raise ValueError(
                    f"prune: max_sparsity must be in [sparsity, 1), got {self.max_sparsity} with sparsity "
                    f"{self.sparsity}"
                )
        if self.truncation is not None:
            self._check("truncation", positive)  # in sigmas
        if not self.calibrate and (self.estimator != "lognormal" or self.heterogeneous):
            raise ValueError(
                "prune: calibrate applies to the lognormal threshold of homogeneous pruning only; other "
                "estimators and cosine-limited layers are never calibrated"
            )

    def _cosine_groups(self) -> list[tuple[str, float]]:
        """(pattern, cosine limit) of each group of `cosine_groups`."""
        if self.cosine_groups is None:
            return []
        groups = []
        for item in filter(None, (part.strip() for part in self.cosine_groups.split(";"))):
            pattern, sep, value = item.partition("=")
            try:
                limit = float(value)
            except ValueError:
                limit = math.nan
            if not sep or not pattern.strip() or not 0 < limit < 1:
                raise ValueError(
                    f"prune: cosine_groups reads 'pattern=cosine;...' with cosines in (0, 1), got {item!r}"
                )
            groups.append((pattern.strip(), limit))
        if not groups:
            raise ValueError("prune: cosine_groups names no group")
        return groups

    @property
    def heterogeneous(self) -> bool:
        """Whether layers get different sparsities under cosine limits (section 2.7)."""
        return self.min_cosine is not None or self.cosine_groups is not None

    def cosine_limit(self, layer: str) -> float | None:
        """The least predicted cosine the layer named `layer` may have (None: unconstrained)."""
        if self.min_cosine is not None:
            return self.min_cosine
        return next((limit for pattern, limit in self._cosine_groups() if pattern in layer), None)

    @property
    def calibrated(self) -> bool:
        """Whether the threshold is calibrated by feedback (`calibrate`; lognormal, homogeneous)."""
        return self.calibrate and self.estimator == "lognormal" and not self.heterogeneous

    @property
    def uses_bn_output(self) -> bool:
        return self.fit != "all" and self.estimator == "lognormal"

    @property
    def reports(self) -> tuple[str, ...]:
        heterogeneous = ("truncation", "allocated", "cosine") if self.heterogeneous else ()
        calibrated = ("correction",) if self.calibrated else ()
        return ("mu", "sigma", "bn_zero_share", "threshold", *calibrated, *heterogeneous)

    @property
    def label(self) -> str:
        label = f"prune {self.sparsity:g}"
        if self.estimator != "lognormal":
            label += f" {self.estimator}"
        if self.min_cosine is not None:
            label += f" cos>={self.min_cosine:g}"
        if self.cosine_groups is not None:
            label += " cos per group"
        if self.max_sparsity is not None:
            label += f" max {self.max_sparsity:g}"
        if not self.calibrate:
            label += " analytic"
        if self.fit != "bn_nonzero":
            label += {"all": " (all-entries fit)", "reference": " (reference rule)"}[self.fit]
        return label

    @property
    def family(self) -> str:
        return "prune, lognormal" if self.estimator == "lognormal" else "prune, other threshold"

    def bits_per_element(self, summary: Mapping[str, Any], then: Policy | None = None) -> float | None:
        """A 1-bit occupancy mask per element (the cheaper position code down to about 1/log2(numel)
        density), plus, per survivor, a sign when it sits at +-alpha or a float32 beyond alpha; with `then`,
        every survivor in `then`'s code instead."""
        if summary.get("gradient_sparsity") is None:
            return None
        density = 1.0 - float(summary["gradient_sparsity"])
        if then is not None:
            later = then.bits_per_element(summary)
            return None if later is None else 1.0 + density * later
        return 1.0 + density + (FLOAT32_BITS - 1) * _beyond_threshold_share(summary["layers"])


def _beyond_threshold_share(layers: Mapping[str, Mapping[str, Any]]) -> float:
    """Share of all elements whose magnitude exceeds the layer's threshold (kept as they are), from each
    layer's lognormal fit, weighted by the layer's elements where the summary has them."""
    total, weight = 0.0, 0.0
    for layer in layers.values():
        if not (layer.get("threshold") and layer.get("sigma") and math.isfinite(layer["sigma"])):
            continue
        z = (math.log(layer["threshold"]) - layer["mu"]) / layer["sigma"]
        elements = float(layer.get("elements") or 1.0)
        total += elements * 0.5 * math.erfc(z / math.sqrt(2))
        weight += elements
    return total / weight if weight else 0.0


@register("fp")
@dataclass(frozen=True)
class FloatingPoint(Policy):
    """Low-bit floating-point gradients: Q(g * s) / s with a per-layer or global power-of-two scale s.

    per_layer_mean (default): the reference code's rule, the log2 mean of |g| placed at 2^-3;
    per_layer_optimal: the scale minimising the relative MSE E[(Q(g)-g)^2]/E[g^2] of a lognormal with the
    layer's (mu, sigma) (gradcomp.theory.fp), but at least the largest power of two that keeps the layer's
    largest finite |g| within the format's largest value. That error is carried by the large values: for
    sigma2 above about 3 binades and few exponent bits the lognormal's optimum keeps a tail far above a
    real gradient's largest value and alone would flush whole layers to zero (FP4 [1,3,0] on the default
    ResNet18); the tensor's own least MSE never lies below that clip-free scale (no value's error grows
    when the scale doubles while nothing clips: `ops.stats.clip_free_log2_scale`), so the bound changes
    nothing where the lognormal's optimum is at or above it. Not the reference's rule, hence not the
    default;
    global: the fixed `global_scale` (classic loss scaling) for every layer;
    dynamic: dynamic loss scaling as mixed-precision training does it (torch.amp.GradScaler's rule): one
    scale for every layer, starting at `global_scale`, halved after any step in which a scaled gradient
    exceeded the format's largest value, doubled after `growth_interval` steps without (None: 2000, as
    GradScaler). Values beyond the range saturate (or become Inf, by the format); steps are not skipped.
    Acts by default on every convolution output; the paper's final Linear is only monitored (section 2.11).
    """

    layer_types: ClassVar[tuple[str, ...]] = ("conv",)
    format: str = "e4m3"
    scaling: str = "per_layer_mean"
    global_scale: float = 1.0
    rounding: str = "nearest"
    growth_interval: int | None = None
    _fmt: FPFormat = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "_fmt", parse_format(self.format))
        except (TypeError, ValueError) as error:
            raise ValueError(f"fp: format={self.format!r}: {error}") from error
        self._check("scaling", choose, SCALINGS)
        self._check("rounding", choose, ROUNDINGS)
        self._check("global_scale", positive)
        if self.growth_interval is not None:
            if self.scaling != "dynamic":
                raise ValueError(f"fp: growth_interval is for scaling=dynamic, got scaling={self.scaling}")
            self._check("growth_interval", integer, 1)  # steps

    @property
    def fmt(self) -> FPFormat:
        return self._fmt

    @property
    def reports(self) -> tuple[str, ...]:
        return ("scale",) if self.scaling in ("global", "dynamic") else ("mu", "sigma", "scale")

    @property
    def constants(self) -> dict[str, Any]:
        return {"format": self.format}

    @property
    def format_label(self) -> str:
        """e.g. ``FP6 [1,4,1]``: bits and [sign, exponent, mantissa], the papers' notation."""
        return f"FP{self.fmt.bits} [1,{self.fmt.exp_bits},{self.fmt.man_bits}]"

    @property
    def scaling_label(self) -> str:
        if self.scaling == "global":
            return f"global 2^{math.log2(self.global_scale):g}"
        if self.scaling == "dynamic":
            return f"dynamic from 2^{math.log2(self.global_scale):g}"
        return {"per_layer_mean": "per-layer mean", "per_layer_optimal": "per-layer min-MSE"}[self.scaling]

    @property
    def scaling_rule(self) -> str:
        """How the scale is chosen, in words (for captions)."""
        if self.scaling == "global":
            return f"one fixed scale 2^{math.log2(self.global_scale):g} for every layer"
        if self.scaling == "dynamic":
            return (
                f"dynamic loss scaling: one scale for every layer, from 2^{math.log2(self.global_scale):g}, "
                f"halved after a step with a scaled gradient beyond {self.fmt.max_value:g}, doubled after "
                f"{self.growth_interval or 2000} steps without"
            )
        if self.scaling == "per_layer_mean":
            return (
                "per layer, the power-of-two scale that puts the mean log2|g| at 2^-3 (the reference's rule)"
            )
        return (
            "per layer, the power-of-two scale of least relative MSE for the layer's lognormal fit, at least "
            "the largest that keeps the layer's largest value within the format's"
        )

    @property
    def label(self) -> str:
        scaling = "" if self.scaling == "per_layer_mean" else f" {self.scaling_label}"
        rounding = " SR" if self.rounding == "stochastic" else ""
        return f"{self.format_label}{scaling}{rounding}"

    @property
    def family(self) -> str:
        return "FP, global scale" if self.scaling in ("global", "dynamic") else "FP, per-layer scale"

    def _dense_bits(self) -> float:
        return float(self.fmt.bits)


@register("luq")
@dataclass(frozen=True)
class Luq(Policy):
    """LUQ (Chmiel et al., ICLR 2023): the neural gradient in a `bits`-bit radix-2 logarithmic format whose
    top level is the tensor's largest magnitude, with stochastic underflow below its smallest level and
    unbiased rounding between levels above (`gradcomp.ops.quantize_luq`); samples > 1 is SMP, the mean of
    that many independent quantizations (the variance they add divided by it). Acts by default on every
    convolution and linear layer, as LUQ quantizes every GEMM's neural gradient."""

    bits: int = 4
    samples: int = 1

    def __post_init__(self) -> None:
        self._check("bits", integer, *LUQ_BITS)
        self._check("samples", integer, *LUQ_SAMPLES)

    @property
    def label(self) -> str:
        return f"LUQ{self.bits}" + (f" SMP{self.samples}" if self.samples > 1 else "")

    @property
    def family(self) -> str:
        return "LUQ"

    def _dense_bits(self) -> float:
        """Each SMP sample is a `bits`-bit tensor of its own (each feeds its own low-precision GEMM)."""
        return float(self.bits * self.samples)


@register("nm")
@dataclass(frozen=True)
class NM(Policy):
    """Unbiased N:M pruning with minimum variance (Chmiel, Hubara, Banner, Soudry, ICLR 2023;
    `gradcomp.ops.nm_prune`): at most n non-zeros in each block of m consecutive elements along the output
    features (a convolution output's channels, a linear output's last axis), the reduction axis of the
    GEMM that computes the input gradient, where sparse tensor cores (2:4) take the pattern."""

    n: int = 2
    m: int = 4

    def __post_init__(self) -> None:
        self._check("m", integer, 2, NM_MAX_M)
        self._check("n", integer, 1)
        if self.n >= self.m:
            raise ValueError(f"nm: need 1 <= n < m <= {NM_MAX_M}, got n={self.n}, m={self.m}")

    @property
    def label(self) -> str:
        return f"MVUE {self.n}:{self.m}"

    @property
    def family(self) -> str:
        return "N:M"

    def _dense_bits(self) -> float:
        """The n kept values in float32 and their positions (log2 C(m, n) bits per block, rounded up)."""
        return (self.n * FLOAT32_BITS + math.ceil(math.log2(math.comb(self.m, self.n)))) / self.m


@register("int")
@dataclass(frozen=True)
class Integer(Policy):
    """Unbiased b-bit integer gradients (statistical FQT): `scheme` on the activation-gradient path and, as
    in the reference code, an 8-bit quantizer on the weight-gradient path (per-tensor for PTQ, per-column
    otherwise); weight_scheme=same uses the activation path's quantizer, none leaves that path exact.
    Acts by default on every convolution and linear layer, the final classifier included (section 2.0)."""

    bits: int = 8
    scheme: str = "ptq"
    weight_bits: int = 8
    weight_scheme: str = "auto"
    two_streams: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self._check("bits", integer, *INT_BITS)
        self._check("weight_bits", integer, *INT_BITS)
        self._check("scheme", choose, INT_SCHEMES)
        self._check("weight_scheme", choose, INT_WEIGHT_SCHEMES)

    @property
    def reports(self) -> tuple[str, ...]:
        return ("range",)

    @property
    def constants(self) -> dict[str, Any]:
        return {"bins": 2**self.bits - 1}

    @property
    def weight_path(self) -> str:
        """The weight-gradient path's quantizer: ptq, column, same or none (auto resolved)."""
        if self.weight_scheme == "auto":
            return "ptq" if self.scheme == "ptq" else "column"
        return self.weight_scheme

    @property
    def label(self) -> str:
        return f"int{self.bits} {self.scheme.upper()}"

    @property
    def family(self) -> str:
        return f"int {self.scheme.upper()}"

    def _dense_bits(self) -> float:
        """Two copies: the b-bit activation path and the weight path (8-bit by default, float32 if exact)."""
        weight = {"same": self.bits, "none": FLOAT32_BITS}.get(self.weight_path, self.weight_bits)
        return float(self.bits + weight)


@dataclass(frozen=True)
class BlockCopy:
    """How a block policy quantizes one copy of the gradient: its format (with its rounding and transform;
    the scale rule may differ by rounding) and the transform's sign mode (`SIGN_MODES`: where its seed
    comes from)."""

    format: BlockFormat
    signs: str

    @property
    def rounding(self) -> str:
        return self.format.rounding

    @property
    def hadamard(self) -> int:
        """The transform's size (0: none)."""
        return self.format.hadamard

    @property
    def label(self) -> str:
        """e.g. " SR H16 fixed signs": what sets this copy apart from nearest rounding without transform."""
        rounding = " SR" if self.rounding == "stochastic" else ""
        signs = {"call": "", "step": " per-step signs", "run": " fixed signs", "none": " unsigned"}[
            self.signs
        ]
        return rounding + (f" H{self.hadamard}{signs}" if self.hadamard else "")


@register("block")
@dataclass(frozen=True)
class Block(Policy):
    """Block-scaled floating-point gradients (OCP MX, NVFP4; `gradcomp.ops.quantize_block`): blocks of `block`
    consecutive elements share a scale of format `scale` (`gradcomp.formats.block`), optionally after a random
    Hadamard transform of `hadamard` elements (0: none) whose signs are drawn as `signs` says (`SIGN_MODES`:
    anew at every call, once per step, once for the run, or none), with nearest or stochastic rounding; the
    weight-gradient copy takes `weight_rounding`, `weight_hadamard` and `weight_signs` where they are given
    (NVIDIA's NVFP4 recipe transforms that copy only). The output
    gradient feeds two GEMMs whose reductions run along different axes, and the hardware recipes quantize
    each copy with blocks along its GEMM's reduction axis: the input-gradient copy along the output features
    (a convolution's channels, a linear layer's last axis), the weight-gradient copy along the batch (and
    spatial positions), every other axis flattened. The presets ``mxfp8``, ``mxfp6``, ``mxfp4`` and ``nvfp4``
    are names for their formats (parameters may follow: ``mxfp4:rounding=stochastic,hadamard=32``). The scale
    rule defaults to ``floor`` (OCP MX 1.0) with nearest and ``ceil`` with stochastic rounding, which is
    unbiased only where nothing saturates (`gradcomp.formats.block.check_rule`). Acts by default on every
    convolution and linear layer, as the recipes quantize every GEMM."""

    element: str = "e4m3fn"
    block: int = 32
    scale: str = "e8m0fnu"
    rule: str | None = None
    rounding: str = "nearest"
    hadamard: int = 0
    signs: str = "call"
    weight_rounding: str | None = None  # None: as `rounding`
    weight_hadamard: int | None = None  # None: as `hadamard`
    weight_signs: str | None = None  # None: as `signs`
    outer: int = 0  # two-level scales: the float32 scale per `outer` elements along the axis (0: per tensor)
    two_streams: ClassVar[bool] = True
    _copies: tuple[BlockCopy, BlockCopy] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            copies = (
                self._copy(self.rounding, self.hadamard, self.signs),
                self._copy(
                    self.rounding if self.weight_rounding is None else self.weight_rounding,
                    self.hadamard if self.weight_hadamard is None else self.weight_hadamard,
                    self.signs if self.weight_signs is None else self.weight_signs,
                ),
            )
        except (TypeError, ValueError) as error:
            raise ValueError(f"block: {error}") from error
        object.__setattr__(self, "_copies", copies)
        self._check_signs()
        object.__setattr__(self, "element", copies[0].format.element)
        rules = {copy.format.rule for copy in copies}
        object.__setattr__(self, "rule", rules.pop() if len(rules) == 1 else None)

    def _check_signs(self) -> None:
        """Sign modes act on a transform: one given where no copy it sets has one is refused (it would
        do nothing)."""
        inputs, weights = self._copies
        if self.weight_signs is not None and not weights.hadamard:
            raise ValueError(
                f"block: weight_signs={self.weight_signs} sets the signs of the weight-gradient copy's "
                "transform, which has none (weight_hadamard=0): give weight_hadamard, or leave it out"
            )
        transformed = inputs.hadamard or (self.weight_signs is None and weights.hadamard)
        if self.signs != "call" and not transformed:
            raise ValueError(
                f"block: signs={self.signs} sets the signs of a Hadamard transform, and no copy it applies "
                "to has one (hadamard=0): give hadamard, or leave it out"
            )

    def _copy(self, rounding: str, hadamard: int, signs: str) -> BlockCopy:
        choose("signs", signs, SIGN_MODES)
        fmt = BlockFormat(
            self.element, self.block, self.scale, self.rule, self.outer, rounding, hadamard,
            signs=not (hadamard and signs == "none"),
        )  # fmt: skip
        return BlockCopy(fmt, signs)

    def copy(self, weight_path: bool) -> BlockCopy:
        """The settings of the weight-gradient copy (weight_path) or of the input-gradient one."""
        return self._copies[int(weight_path)]

    @property
    def format(self) -> BlockFormat:
        """The input-gradient copy's format (the copies share element, block and scale format)."""
        return self._copies[0].format

    @property
    def label(self) -> str:
        """e.g. "MXFP4 SR H32"; where the copies differ, each: "NVFP4 SR (dW: SR H16 fixed signs)"."""
        inputs, weights = (copy.label for copy in self._copies)
        return f"{self.format.label}{inputs}" + ("" if weights == inputs else f" (dW:{weights or ' plain'})")

    @property
    def family(self) -> str:
        return "FP, block scale"

    def _dense_bits(self) -> float:
        """Two copies, each element bits plus the scale's 8 bits shared by a block (e.g. MXFP4: 4.25)."""
        return 2 * self.format.bits_per_element


@dataclass(frozen=True)
class Chain(Policy):
    """Apply policies in order (e.g. prune then FP); each keeps its own statistics."""

    policies: tuple[Policy, ...] = ()
    name: ClassVar[str] = "chain"

    def __post_init__(self) -> None:
        names = [policy.name for policy in self.policies]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # a slip (e.g. a preset appended to a chain holding one): the gradient is coded twice
            raise ValueError(
                f"chain {self.describe()!r} names {', '.join(twice)} more than once; a chain applies each "
                "policy once (give all of its parameters in one)"
            )

    @property
    def two_streams(self) -> bool:  # type: ignore[override]
        return any(p.two_streams for p in self.policies)

    @property
    def layer_types(self) -> tuple[str, ...]:  # type: ignore[override]
        """Every layer type a member acts on by default."""
        return tuple(dict.fromkeys(t for p in self.policies for t in p.layer_types))

    @property
    def uses_bn_output(self) -> bool:
        return any(p.uses_bn_output for p in self.policies)

    def describe(self) -> str:
        return "+".join(p.describe() for p in self.policies)

    @property
    def label(self) -> str:
        return " + ".join(p.label for p in self.policies)

    @property
    def family(self) -> str:
        return " + ".join(dict.fromkeys(p.family.split(",")[0] for p in self.policies))

    def bits_per_element(self, summary: Mapping[str, Any], then: Policy | None = None) -> float | None:
        first, *rest = self.policies
        following = [*rest, then] if then is not None else rest
        return first.bits_per_element(summary, _chain(following))


def _chain(policies: Sequence[Policy]) -> Policy | None:
    if not policies:
        return None
    return policies[0] if len(policies) == 1 else Chain(tuple(policies))


def parse_policy(spec: str | Mapping[str, Any] | Sequence[Mapping[str, Any]] | Policy) -> Policy:
    """A policy from ``NAME[:key=value,...][+NAME...]``, a mapping with a ``name`` key, or a list of them."""
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, str):
        policies = [_parse_one(part.strip()) for part in spec.split("+")]
    elif isinstance(spec, Mapping):
        policies = [_build(spec.get("name"), {k: v for k, v in spec.items() if k != "name"})]
    elif isinstance(spec, Sequence):
        policies = [parse_policy(item) for item in spec]
    else:
        raise TypeError(f"cannot build a policy from {type(spec).__name__}")
    return _chain(policies)


# The block recipes of 2025-2026 as specs of the block policy (parameters given after a recipe's name
# override its own, e.g. ``quartet:hadamard=16``):
RECIPES: dict[str, str] = {
    # NVIDIA's NVFP4 pretraining (arXiv 2509.25149, section 4, appendices B and E) as Transformer Engine
    # casts it: stochastic rounding on both gradient copies, a 16-point transform on the weight-gradient
    # copy only, its signs one vector for the whole run. (Its last layers in high precision are a choice of
    # layers, made where the policy is attached.)
    "nvidia_nvfp4": "nvfp4:rule=te,rounding=stochastic,weight_hadamard=16,weight_signs=run",
    # Quartet (arXiv 2505.14669): MXFP4 with stochastic rounding after a 32-point transform whose signs are
    # drawn anew at every backward call
    "quartet": "mxfp4:rounding=stochastic,hadamard=32,signs=call",
    # Tseng et al. (arXiv 2502.20586): MXFP4 stochastic rounding after the 3/4 prescale, after a transform
    # with signs drawn at every call; theirs spans 64 elements (two MX blocks), the op's stays within a
    # block: 32
    "tseng_mxfp4": "mxfp4:rule=three_quarters,rounding=stochastic,hadamard=32,signs=call",
    # TetraJet-v2 (arXiv 2510.27527): NVFP4 with the transform on both gradient copies, stochastic rounding,
    # and a two-level scale whose float32 level spans 128 elements instead of the tensor
    "tetrajet_v2": "nvfp4:rounding=stochastic,hadamard=16,outer=128",
}


def _split(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME[:key=value,...]`` as the name and its parameters (values read as YAML)."""
    name, _, args = text.partition(":")
    kwargs: dict[str, Any] = {}
    for item in filter(None, (a.strip() for a in args.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"policy {text!r}: expected key=value, got {item!r}")
        if key.strip() in kwargs:
            raise ValueError(f"policy {text!r} gives {key.strip()} twice; give each parameter once")
        kwargs[key.strip()] = yaml.safe_load(value.strip())
    return name.strip(), kwargs


def _parse_one(text: str) -> Policy:
    return _build(*_split(text))


def _build(name: Any, kwargs: dict[str, Any]) -> Policy:
    if name in RECIPES:  # a recipe: its policy and parameters, then the ones given
        name, own = _split(RECIPES[name])
        kwargs = {**own, **kwargs}
    if name in BLOCK_PRESETS:  # a block format's name: its parameters, then the ones given
        preset = BLOCK_PRESETS[name]
        fields = {"element": preset.element, "block": preset.block_size, "scale": preset.scale}
        name, kwargs = "block", {**fields, **kwargs}
    if name not in POLICIES:
        raise ValueError(
            f"unknown policy {name!r}; choose from {sorted([*POLICIES, *BLOCK_PRESETS, *RECIPES])}"
        )
    cls = POLICIES[name]
    allowed = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key, value in kwargs.items():
        if key not in allowed:
            raise ValueError(f"policy {name!r} has no parameter {key!r}; parameters: {sorted(allowed)}")
        kwargs[key] = typed(f"policy {name!r}: {key}", allowed[key].type, value)
    return cls(**kwargs)
