"""Named, config-selectable gradient compressors.

A policy says *what* to do with a layer's neural gradient; `gradcomp.attach` says *where*. Policies are
small frozen dataclasses registered by name and built from a string ``NAME[:key=value,...]`` (chains joined
by ``+``), e.g. ``prune:sparsity=0.85,estimator=gaussian+fp:format=e4m1``, or from a YAML mapping
``{name: prune, sparsity: 0.85}`` (a list of mappings for a chain).

Each policy compresses with per-layer statistics held in a `LayerStats` (on the gradient's device): they are
refreshed from the current gradient when the attachment says so (every step, every K steps or once per
epoch) and reused otherwise, so no policy ever synchronises with the host.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import yaml
from torch import Tensor

from gradcomp import fp_theory
from gradcomp.formats import FPFormat, parse_format
from gradcomp.lognormal import cosine_threshold, fit_lognormal
from gradcomp.ops import (
    gaussian_threshold,
    laplace_threshold,
    log_moments,
    lognormal_threshold_from_moments,
    quantize_fp,
    quantize_int,
    stochastic_prune,
    topk_threshold,
)

_LN2 = math.log(2.0)
POLICIES: dict[str, type[Policy]] = {}


def register(name: str):
    def wrap(cls):
        cls.name = name
        POLICIES[name] = cls
        return cls

    return wrap


@dataclass
class LayerStats:
    """What a layer's compressor remembers between refreshes (0-d tensors on the gradient's device)."""

    mu: Tensor | None = None  # mean of ln|g| over non-zeros
    sigma: Tensor | None = None  # std of ln|g|
    threshold: Tensor | None = None  # pruning alpha
    scale: Tensor | None = None  # FP scale (a power of two)
    parts: list[LayerStats] = field(default_factory=list)  # one per member of a chain


class Policy:
    """Base of all policies: `compress(g, stats, refresh, seed)` returns the compressed gradient."""

    name: ClassVar[str] = "policy"
    two_streams: ClassVar[bool] = False  # True when activation- and weight-gradient paths differ
    # where the policy acts unless told otherwise (see `attach`): the placement of the paper it reproduces
    layer_types: ClassVar[tuple[str, ...]] = ("conv", "linear")

    def compress(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        raise NotImplementedError

    def compress_weight_path(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        """The gradient fed to the weight-gradient GEMM (the same as `compress` unless two_streams)."""
        return self.compress(g, stats, refresh, seed)

    def describe(self) -> str:
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.init)
        args = ",".join(f"{key}={value}" for key, value in values if value is not None)  # None: the default
        return f"{self.name}:{args}" if args else self.name


def _refresh_log_stats(g: Tensor, stats: LayerStats) -> Tensor:
    """Fit (mu, sigma) of ln|g| from one fused reduction; returns the moments."""
    moments = log_moments(g.detach())
    stats.mu, stats.sigma = fit_lognormal(moments)
    return moments


@register("none")
@dataclass(frozen=True)
class NoCompression(Policy):
    def compress(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        return g


THRESHOLDS = {"gaussian": gaussian_threshold, "laplace": laplace_threshold, "topk": topk_threshold}


@register("prune")
@dataclass(frozen=True)
class Prune(Policy):
    """Unbiased stochastic pruning to a target sparsity; the threshold comes from `estimator`.

    Acts by default on every convolution output (the BatchNorm inputs of the lognormal paper, section 2.8),
    not on the classifier, whose output gradient is the loss gradient itself.

    min_cosine: heterogeneous sparsity (section 2.7): a layer whose predicted cosine similarity between
    pruned and original gradient (lognormal truncated at `truncation` sigmas; 2.713 is the reference
    code's 99.67th percentile of an exact normal) would fall below it gets the smaller threshold that meets
    it, hence less sparsity. Lognormal estimator only."""

    sparsity: float = 0.85
    estimator: str = "lognormal"
    min_cosine: float | None = None
    truncation: float = 2.713
    layer_types: ClassVar[tuple[str, ...]] = ("conv",)

    def __post_init__(self) -> None:
        if not 0 <= self.sparsity < 1:
            raise ValueError(f"prune: sparsity must be in [0, 1), got {self.sparsity}")
        if self.estimator not in ("lognormal", *THRESHOLDS):
            raise ValueError(
                f"prune: estimator must be lognormal, gaussian, laplace or topk, got {self.estimator!r}"
            )
        if self.min_cosine is not None:
            if not 0 < self.min_cosine < 1:
                raise ValueError(f"prune: min_cosine must be in (0, 1), got {self.min_cosine}")
            if self.estimator != "lognormal":
                raise ValueError("prune: min_cosine needs estimator=lognormal")

    def compress(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        if refresh or stats.threshold is None:
            moments = _refresh_log_stats(g, stats)
            if self.estimator == "lognormal":
                threshold = lognormal_threshold_from_moments(moments, g.numel(), self.sparsity)
                if self.min_cosine is not None:
                    alpha_n = cosine_threshold(stats.sigma, self.min_cosine, self.truncation)
                    threshold = torch.fmin(threshold, alpha_n * torch.exp(stats.mu))  # NaN: no constraint
                stats.threshold = threshold.float()
            else:
                stats.threshold = THRESHOLDS[self.estimator](g.detach(), self.sparsity).float()
        return stochastic_prune(g, stats.threshold, seed=seed)


SCALINGS = ("per_layer_mean", "per_layer_optimal", "global")


@register("fp")
@dataclass(frozen=True)
class FloatingPoint(Policy):
    """Low-bit floating-point gradients: Q(g * s) / s with a per-layer or global power-of-two scale s.

    per_layer_mean (default): the reference code's rule, the log2 mean of |g| placed at 2^-3;
    per_layer_optimal: the scale minimising the relative MSE E[(Q(g)-g)^2]/E[g^2] of a lognormal with the
    layer's (mu, sigma) (fp_theory). That error is carried by the large values: for sigma2 above about 3
    binades and few exponent bits it keeps the tail and flushes most elements to zero, which trains badly
    (experiments A6 and A10), hence not the default;
    global: the fixed `global_scale` (classic loss scaling) for every layer.
    Acts by default on every convolution output; the paper's final Linear is only monitored (section 2.11).
    """

    layer_types: ClassVar[tuple[str, ...]] = ("conv",)
    format: str = "e4m3"
    scaling: str = "per_layer_mean"
    global_scale: float = 1.0
    rounding: str = "nearest"
    _fmt: FPFormat = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fmt", parse_format(self.format))
        if self.scaling not in SCALINGS:
            raise ValueError(f"fp: scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if self.rounding not in ("nearest", "stochastic"):
            raise ValueError(f"fp: rounding must be nearest or stochastic, got {self.rounding!r}")
        if not (math.isfinite(self.global_scale) and self.global_scale > 0):
            raise ValueError(f"fp: global_scale must be positive, got {self.global_scale}")

    @property
    def fmt(self) -> FPFormat:
        return self._fmt

    def compress(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        if refresh or stats.scale is None:
            stats.scale = self._scale(g, stats)
        return quantize_fp(g, self._fmt, scale=stats.scale, rounding=self.rounding, seed=seed)

    def _scale(self, g: Tensor, stats: LayerStats) -> Tensor:
        if self.scaling == "global":
            return torch.tensor(self.global_scale, device=g.device)
        _refresh_log_stats(g, stats)
        return torch.exp2(self.layer_log2_scale(stats.mu / _LN2, stats.sigma / _LN2)).float()

    def layer_log2_scale(self, mu2: Tensor, sigma2: Tensor) -> Tensor:
        """log2 of the per-layer power-of-two scale for a layer whose log2|g| has mean mu2 and std sigma2
        (0-d tensors, on their device); what `compress` uses, and what analyses predict from."""
        if self.scaling == "per_layer_mean":
            log2_scale = -mu2 - 3
        else:
            sigmas, offsets = (t.to(mu2.device) for t in _optimal_scale_table(self._fmt))
            log2_scale = _interpolate(sigma2.clamp(sigmas[0], sigmas[-1]), sigmas, offsets) - mu2
        log2_scale = torch.nan_to_num(log2_scale, nan=0.0).clamp(-120, 120)  # an all-zero gradient: any scale
        return torch.round(log2_scale)


@functools.lru_cache(maxsize=64)
def _optimal_scale_table(fmt: FPFormat) -> tuple[Tensor, Tensor]:
    """MSE-optimal log2 scale of a lognormal with log2-mean 0, against its sigma (log2 units), for `fmt`."""
    sigmas = torch.linspace(0.1, 8.0, 40, dtype=torch.float64)
    return sigmas, fp_theory.optimal_log2_scale(fmt.positive_values(), sigmas)[0]


def _interpolate(x: Tensor, xs: Tensor, ys: Tensor) -> Tensor:
    """Piecewise-linear interpolation on a sorted grid, on device (no host sync)."""
    index = torch.searchsorted(xs, x.reshape(1)).clamp(1, xs.numel() - 1)
    x0, x1, y0, y1 = xs[index - 1], xs[index], ys[index - 1], ys[index]
    return (y0 + (x - x0) * (y1 - y0) / (x1 - x0)).reshape(())


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
        if not isinstance(self.bits, int) or not 1 <= self.bits <= 16:
            raise ValueError(f"int: bits must be an integer in [1, 16], got {self.bits!r}")
        if self.scheme not in ("ptq", "psq", "bhq"):
            raise ValueError(f"int: scheme must be ptq, psq or bhq, got {self.scheme!r}")
        if self.weight_scheme not in ("auto", "same", "ptq", "column", "none"):
            raise ValueError(
                f"int: weight_scheme must be auto, same, ptq, column or none, got {self.weight_scheme!r}"
            )

    def compress(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        return quantize_int(g, self.bits, self.scheme, seed=seed)

    def compress_weight_path(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        scheme = self.weight_scheme
        if scheme == "auto":
            scheme = "ptq" if self.scheme == "ptq" else "column"
        if scheme == "same":
            return self.compress(g, stats, refresh, seed)
        if scheme == "none":
            return g
        if scheme == "column":  # one scale per feature (flattened channel, row, column) across the batch
            columns = g.reshape(g.shape[0], -1).t() if g.dim() > 1 else g.reshape(1, -1)
            return quantize_int(columns, self.weight_bits, "psq", seed=seed).t().reshape(g.shape)
        return quantize_int(g, self.weight_bits, "ptq", seed=seed)


@dataclass(frozen=True)
class Chain(Policy):
    """Apply policies in order (e.g. prune then FP); each keeps its own statistics."""

    policies: tuple[Policy, ...] = ()
    name: ClassVar[str] = "chain"

    @property
    def two_streams(self) -> bool:  # type: ignore[override]
        return any(p.two_streams for p in self.policies)

    @property
    def layer_types(self) -> tuple[str, ...]:  # type: ignore[override]
        """Every layer type a member acts on by default."""
        return tuple(dict.fromkeys(t for p in self.policies for t in p.layer_types))

    def describe(self) -> str:
        return "+".join(p.describe() for p in self.policies)

    def compress(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        return self._run(g, stats, refresh, seed, weight_path=False)

    def compress_weight_path(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int) -> Tensor:
        return self._run(g, stats, refresh, seed, weight_path=True)

    def _run(self, g: Tensor, stats: LayerStats, refresh: bool, seed: int, weight_path: bool) -> Tensor:
        if len(stats.parts) != len(self.policies):
            stats.parts = [LayerStats() for _ in self.policies]
        for index, (policy, own) in enumerate(zip(self.policies, stats.parts, strict=True)):
            step = policy.compress_weight_path if weight_path else policy.compress
            g = step(g, own, refresh, seed + 7919 * index)
        return g


def parse_policy(spec: str | Mapping[str, Any] | Sequence[Mapping[str, Any]] | Policy) -> Policy:
    """A policy from ``NAME[:key=value,...][+NAME...]``, a mapping with a ``name`` key, or a list of them."""
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, str):
        parts = [part.strip() for part in spec.split("+")]
        policies = [_parse_one(part) for part in parts]
    elif isinstance(spec, Mapping):
        policies = [_build(spec.get("name"), {k: v for k, v in spec.items() if k != "name"})]
    elif isinstance(spec, Sequence):
        policies = [parse_policy(item) for item in spec]
    else:
        raise TypeError(f"cannot build a policy from {type(spec).__name__}")
    return policies[0] if len(policies) == 1 else Chain(tuple(policies))


def _parse_one(text: str) -> Policy:
    name, _, args = text.partition(":")
    kwargs: dict[str, Any] = {}
    for item in filter(None, (a.strip() for a in args.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"policy {text!r}: expected key=value, got {item!r}")
        kwargs[key.strip()] = yaml.safe_load(value.strip())
    return _build(name.strip(), kwargs)


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _build(name: Any, kwargs: dict[str, Any]) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    cls = POLICIES[name]
    allowed = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key, value in kwargs.items():
        if key not in allowed:
            raise ValueError(f"policy {name!r} has no parameter {key!r}; parameters: {sorted(allowed)}")
        expected = allowed[key].type  # a string such as "float" or "float | None" (postponed annotations)
        types = {t.strip() for t in expected.split("|")}
        if "float" in types and isinstance(value, int) and not isinstance(value, bool):
            kwargs[key] = value = float(value)
        if types <= {"float", "int", "str", "None"} and _type_name(value) not in types:
            raise ValueError(f"policy {name!r}: {key} must be {expected}, got {value!r}")
    return cls(**kwargs)
