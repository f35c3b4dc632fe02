"""How each policy compresses a layer's neural gradient: the torch side of `gradcomp.policies`.

`compress(policy, g, stats, refresh, seed)` returns the compressed gradient. Per-layer statistics live in a
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
from gradcomp.policies import Chain, FloatingPoint, Integer, NoCompression, Policy, Prune

_LN2 = math.log(2.0)


@dataclass
class LayerStats:
    """What a layer's compressor remembers between refreshes (0-d tensors on the gradient's device)."""

    mu: Tensor | None = None  # mean of ln|g| over non-zeros
    sigma: Tensor | None = None  # std of ln|g|
    threshold: Tensor | None = None  # pruning alpha
    scale: Tensor | None = None  # FP scale (a power of two)
    parts: list[LayerStats] = field(default_factory=list)  # one per member of a chain


Compressor = Callable[[Policy, Tensor, LayerStats, bool, int, bool], Tensor]
_COMPRESSORS: dict[type[Policy], Compressor] = {}


def _implements(policy_type: type[Policy]):
    def wrap(fn: Compressor) -> Compressor:
        _COMPRESSORS[policy_type] = fn
        return fn

    return wrap


def compress(
    policy: Policy, g: Tensor, stats: LayerStats, refresh: bool, seed: int, weight_path: bool = False
) -> Tensor:
    """`policy` applied to the gradient `g`; `weight_path`: the copy fed to the weight-gradient GEMM (the
    same as the activation path's unless the policy has two streams)."""
    return _COMPRESSORS[type(policy)](policy, g, stats, refresh, seed, weight_path)


def _refresh_log_stats(g: Tensor, stats: LayerStats) -> Tensor:
    """Fit (mu, sigma) of ln|g| from one fused reduction; returns the moments."""
    moments = log_moments(g.detach())
    stats.mu, stats.sigma = fit_lognormal(moments)
    return moments


@_implements(NoCompression)
def _none(policy, g, stats, refresh, seed, weight_path):
    return g


THRESHOLDS = {"gaussian": gaussian_threshold, "laplace": laplace_threshold, "topk": topk_threshold}


@_implements(Prune)
def _prune(policy: Prune, g, stats, refresh, seed, weight_path):
    if refresh or stats.threshold is None:
        moments = _refresh_log_stats(g, stats)
        if policy.estimator == "lognormal":
            threshold = lognormal_threshold_from_moments(moments, g.numel(), policy.sparsity)
            if policy.min_cosine is not None:
                alpha_n = cosine_threshold(stats.sigma, policy.min_cosine, policy.truncation)
                threshold = torch.fmin(threshold, alpha_n * torch.exp(stats.mu))  # NaN: no constraint
            stats.threshold = threshold.float()
        else:
            stats.threshold = THRESHOLDS[policy.estimator](g.detach(), policy.sparsity).float()
    return stochastic_prune(g, stats.threshold, seed=seed)


@_implements(FloatingPoint)
def _floating_point(policy: FloatingPoint, g, stats, refresh, seed, weight_path):
    if refresh or stats.scale is None:
        if policy.scaling == "global":
            stats.scale = torch.tensor(policy.global_scale, device=g.device)
        else:
            _refresh_log_stats(g, stats)
            stats.scale = torch.exp2(layer_log2_scale(policy, stats.mu / _LN2, stats.sigma / _LN2)).float()
    return quantize_fp(g, policy.fmt, scale=stats.scale, rounding=policy.rounding, seed=seed)


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
def _integer(policy: Integer, g, stats, refresh, seed, weight_path):
    scheme = policy.weight_path if weight_path else "same"
    if scheme == "same":
        return quantize_int(g, policy.bits, policy.scheme, seed=seed)
    if scheme == "none":
        return g
    if scheme == "column":  # one scale per feature (flattened channel, row, column) across the batch
        columns = g.reshape(g.shape[0], -1).t() if g.dim() > 1 else g.reshape(1, -1)
        return quantize_int(columns, policy.weight_bits, "psq", seed=seed).t().reshape(g.shape)
    return quantize_int(g, policy.weight_bits, "ptq", seed=seed)


@_implements(Chain)
def _chain(policy: Chain, g, stats, refresh, seed, weight_path):
    if len(stats.parts) != len(policy.policies):
        stats.parts = [LayerStats() for _ in policy.policies]
    for index, (member, own) in enumerate(zip(policy.policies, stats.parts, strict=True)):
        g = compress(member, g, own, refresh, seed + 7919 * index, weight_path)
    return g
