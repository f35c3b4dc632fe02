"""How each policy compresses a layer's neural gradient: the torch side of `gradcomp.policies`.

`compress(policy, g, stats, refresh, seed, active=...)` returns the compressed gradient; `active` marks the
entries whose gradient at the following BatchNorm's output is non-zero, where the attachment knows it
(`Policy.uses_bn_output`). Per-layer statistics live in a
`LayerStats` (0-d tensors on the gradient's device): they are refreshed from the current gradient when
`refresh` says so (the attachment's schedule: every step, every K steps or once per epoch) and reused
otherwise, so compression never synchronises with the host.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gradcomp import fp_theory
from gradcomp.formats import FPFormat
from gradcomp.lognormal import cosine_threshold, expected_sparsity, fit_lognormal, truncation_k
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
from gradcomp.policies import Chain, FloatingPoint, Integer, NoCompression, Policy, Prune

_LN2 = math.log(2.0)


@dataclass
class LayerStats:
    """What a layer's compressor remembers between refreshes (0-d tensors on the gradient's device)."""

    mu: Tensor | None = None  # mean of ln|g| over non-zeros
    sigma: Tensor | None = None  # std of ln|g|
    threshold: Tensor | None = None  # pruning alpha
    scale: Tensor | None = None  # FP scale (a power of two)
    bn_zero_share: Tensor | None = None  # s0 of the reference fit: zeros at the next BatchNorm's output
    numel: int = 0  # elements of the last compressed gradient
    # heterogeneous pruning (Prune.min_cosine)
    truncation: Tensor | None = None  # k of the truncated cosine, at the last fit
    target: float | None = None  # the common sparsity allocated by `plan`, before the layer's cosine limit
    cosine: Tensor | None = None  # measured cosine between pruned and original gradient, last step
    # dynamic loss scaling (FloatingPoint scaling="dynamic"): the shared scale's state, copied in every layer
    overflow: Tensor | None = None  # whether this layer's scaled gradient exceeded the format this step
    clean_steps: int = 0  # steps since the scale last changed without an overflow
    range: Tensor | None = None  # integer quantizers: max - min of the gradient, what PTQ's bins span
    parts: list[LayerStats] = field(default_factory=list)  # one per member of a chain

    def fit(self) -> list[Tensor]:
        """The fitted values of this layer and of each chain member (what a refresh sets from the gradient):
        one of them non-finite means the gradient had nothing to fit (e.g. all zeros)."""
        values = [self.mu, self.sigma, self.threshold, self.scale, self.range]
        return [v for v in values if v is not None] + [v for part in self.parts for v in part.fit()]


Compressor = Callable[[Policy, Tensor, LayerStats, bool, int, bool, Tensor | None], Tensor]
Planner = Callable[[Policy, list[LayerStats], bool], None]
_COMPRESSORS: dict[type[Policy], Compressor] = {}
_PLANNERS: dict[type[Policy], Planner] = {}


def _implements(policy_type: type[Policy]):
    def wrap(fn: Compressor) -> Compressor:
        _COMPRESSORS[policy_type] = fn
        return fn

    return wrap


def plan(policy: Policy, layers: list[LayerStats], refresh: bool) -> None:
    """Decisions that need every layer's statistics, made before each step from the last one's: heterogeneous
    pruning's allocation (before a refresh), dynamic loss scaling's update (every step). A no-op for
    policies that treat layers independently."""
    planner = _PLANNERS.get(type(policy))
    if planner is not None:
        planner(policy, layers, refresh)


def compress(
    policy: Policy,
    g: Tensor,
    stats: LayerStats,
    refresh: bool,
    seed: int,
    weight_path: bool = False,
    active: Tensor | None = None,
) -> Tensor:
    """`policy` applied to the gradient `g`; `weight_path`: the copy fed to the weight-gradient GEMM (the
    same as the activation path's unless the policy has two streams); `active`: a boolean mask of g's
    shape, the non-zeros of the gradient at the following BatchNorm's output (None: no such BatchNorm)."""
    return _COMPRESSORS[type(policy)](policy, g, stats, refresh, seed, weight_path, active)


def _refresh_log_stats(g: Tensor, stats: LayerStats) -> Tensor:
    """Fit (mu, sigma) of ln|g| from one fused reduction; returns the moments."""
    moments = log_moments(g.detach())
    stats.mu, stats.sigma = fit_lognormal(moments)
    return moments


@_implements(NoCompression)
def _none(policy, g, stats, refresh, seed, weight_path, active):
    return g


THRESHOLDS = {"gaussian": gaussian_threshold, "laplace": laplace_threshold, "topk": topk_threshold}


@_implements(Prune)
def _prune(policy: Prune, g, stats, refresh, seed, weight_path, active):
    if refresh or stats.threshold is None:
        fitted = g.detach()
        if policy.fit == "bn_nonzero" and active is not None:
            # entries with a zero BatchNorm-output gradient count as zeros: the fit sees the rest, and the
            # thresholds below aim the fitted part at (sparsity - s0)/(1 - s0); where s0 >= sparsity that
            # would prune nothing at all (the reference's choice), so the fit takes every entry instead
            stats.bn_zero_share = 1 - active.sum(dtype=torch.float32) / active.numel()
            fitted = fitted * (active | (stats.bn_zero_share >= policy.sparsity))
        else:
            stats.bn_zero_share = None
        stats.numel = g.numel()
        moments = _refresh_log_stats(fitted, stats)
        if policy.estimator == "lognormal":
            sparsity = policy.sparsity if stats.target is None else stats.target
            threshold = lognormal_threshold_from_moments(moments, g.numel(), sparsity)
            if policy.min_cosine is not None:
                stats.truncation = _truncation(policy, fitted, moments, stats)
                alpha_n = cosine_threshold(stats.sigma, policy.min_cosine, stats.truncation)
                threshold = torch.fmin(threshold, alpha_n * torch.exp(stats.mu))  # NaN: no constraint
            stats.threshold = threshold.float()
        else:
            stats.threshold = THRESHOLDS[policy.estimator](fitted, policy.sparsity).float()
    out = stochastic_prune(g, stats.threshold, seed=seed)
    if policy.min_cosine is not None:
        stats.cosine = torch.nn.functional.cosine_similarity(
            g.detach().flatten().double(), out.detach().flatten().double(), dim=0
        )
    return out


def _truncation(policy: Prune, fitted: Tensor, moments: Tensor, stats: LayerStats) -> Tensor:
    """k of the truncated cosine: the policy's, or the reference's per-layer standardised N/300-th largest
    ln|g| over the fitted non-zeros."""
    if policy.truncation is not None:
        return torch.tensor(policy.truncation, dtype=torch.float64, device=fitted.device)
    magnitude = fitted.abs().flatten().nan_to_num(nan=0.0, posinf=0.0)
    count = int(moments[0])
    if count < 2:
        return torch.tensor(math.nan, dtype=torch.float64, device=fitted.device)
    return truncation_k(magnitude[magnitude > 0].double().log(), stats.mu, stats.sigma)


def _allocate(policy: Prune, layers: list[LayerStats], refresh: bool) -> None:
    """Heterogeneous pruning: the common sparsity q with sum_l n_l min(q, Q_l) = sparsity * sum_l n_l, where
    Q_l = s0 + (1 - s0) S(alpha_c) is the layer's sparsity at its min_cosine threshold (last fit); layers
    without a fit count at the target. q by bisection (the sum increases with q); capped below 1."""
    if policy.min_cosine is None or not refresh:
        return
    sizes = [max(stats.numel, 1) for stats in layers]
    limits = [policy.sparsity] * len(layers)
    fitted = [
        i
        for i, stats in enumerate(layers)
        if stats.sigma is not None and stats.truncation is not None and stats.numel > 0
    ]
    if fitted:  # one batched solve over the layers (one host sync), not one per layer
        sigma = torch.stack([layers[i].sigma.double() for i in fitted]).cpu()
        k = torch.stack([layers[i].truncation.double() for i in fitted]).cpu()
        shares = [layers[i].bn_zero_share for i in fitted]
        s0 = torch.tensor([0.0 if s is None else float(s) for s in shares], dtype=torch.float64)
        usable = torch.isfinite(sigma) & torch.isfinite(k)
        sigma, k = sigma.where(usable, 1.0), k.where(usable, 0.0)
        alpha_n = cosine_threshold(sigma, policy.min_cosine, k)
        limit = s0 + (1 - s0) * expected_sparsity(torch.log(alpha_n), sigma)
        for i, ok, value in zip(fitted, usable.tolist(), limit.tolist(), strict=True):
            if ok:
                limits[i] = value
    total = sum(sizes)

    def overall(q: float) -> float:
        return sum(n * min(q, limit) for n, limit in zip(sizes, limits, strict=True)) / total

    lo, hi = policy.sparsity, _MAX_ALLOCATED
    if overall(hi) <= policy.sparsity:
        q = hi  # the cosine limits leave the target out of reach: every layer at its limit
    else:
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if overall(mid) < policy.sparsity else (lo, mid)
        q = hi
    for stats in layers:
        stats.target = q


_MAX_ALLOCATED = 0.999  # the largest sparsity heterogeneous pruning gives a layer
_PLANNERS[Prune] = _allocate


@_implements(FloatingPoint)
def _floating_point(policy: FloatingPoint, g, stats, refresh, seed, weight_path, active):
    if policy.scaling in ("global", "dynamic"):
        if stats.scale is None or (refresh and policy.scaling == "global"):  # dynamic: plan() updates it
            stats.scale = torch.tensor(policy.global_scale, dtype=torch.float32, device=g.device)
        if policy.scaling == "dynamic":
            stats.overflow = g.detach().abs().amax() * stats.scale > policy.fmt.max_value
    elif refresh or stats.scale is None:
        _refresh_log_stats(g, stats)
        stats.scale = torch.exp2(layer_log2_scale(policy, stats.mu / _LN2, stats.sigma / _LN2)).float()
    return quantize_fp(g, policy.fmt, scale=stats.scale, rounding=policy.rounding, seed=seed)


def _dynamic_scale(policy: FloatingPoint, layers: list[LayerStats], refresh: bool) -> None:
    """After a step: halve the shared scale if any layer overflowed, double it after `growth_interval`
    clean steps (one host sync per step, as GradScaler's update)."""
    flags = [stats.overflow for stats in layers if stats.overflow is not None]
    if policy.scaling != "dynamic" or not flags:
        return
    scale, clean = layers[0].scale, layers[0].clean_steps + 1
    if bool(torch.stack(flags).any()):
        scale, clean = scale / 2, 0
    elif clean >= (policy.growth_interval or 2000):
        scale, clean = scale * 2, 0
    for stats in layers:
        stats.scale, stats.clean_steps, stats.overflow = scale, clean, None


_PLANNERS[FloatingPoint] = _dynamic_scale


def layer_log2_scale(policy: FloatingPoint, mu2: Tensor, sigma2: Tensor) -> Tensor:
    """log2 of the power-of-two scale `policy` gives a layer whose log2|g| has mean mu2 and std sigma2 (0-d
    tensors, on their device); what compression uses, and what analyses predict from."""
    if policy.scaling == "global":
        return torch.tensor(math.log2(policy.global_scale), dtype=mu2.dtype, device=mu2.device)
    if policy.scaling == "per_layer_mean":
        log2_scale = -mu2 - 3
    else:
        sigmas, offsets = (t.to(mu2.device) for t in _optimal_scale_table(policy.fmt))
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


@_implements(Integer)
def _integer(policy: Integer, g, stats, refresh, seed, weight_path, active):
    # the range is reported only: each call quantizes on its gradient's own range
    if g.numel() and (refresh or stats.range is None):
        low, high = torch.aminmax(g.detach())
        stats.range = (high - low).float()
    scheme = policy.weight_path if weight_path else "same"
    if scheme == "same":
        return quantize_int(g, policy.bits, policy.scheme, seed=seed)
    if scheme == "none":
        return g
    if scheme == "column":  # one scale per feature (flattened channel, row, column) across the batch
        columns = g.reshape(g.shape[0], -1).t() if g.dim() > 1 else g.reshape(1, -1)
        return quantize_int(columns, policy.weight_bits, "psq", seed=seed).t().reshape(g.shape)
    return quantize_int(g, policy.weight_bits, "ptq", seed=seed)


def _plan_chain(policy: Chain, layers: list[LayerStats], refresh: bool) -> None:
    for index, member in enumerate(policy.policies):
        plan(member, [stats.parts[index] for stats in layers if len(stats.parts) > index], refresh)


_PLANNERS[Chain] = _plan_chain


@_implements(Chain)
def _chain(policy: Chain, g, stats, refresh, seed, weight_path, active):
    if len(stats.parts) != len(policy.policies):
        stats.parts = [LayerStats() for _ in policy.policies]
    for index, (member, own) in enumerate(zip(policy.policies, stats.parts, strict=True)):
        g = compress(member, g, own, refresh, seed + 7919 * index, weight_path, active)
    return g
