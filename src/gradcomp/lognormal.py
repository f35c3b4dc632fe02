"""Closed-form lognormal model of neural-gradient magnitudes (natural-log units throughout).

If ln|g| ~ N(mu, sigma^2), the stochastic-pruning sparsity, its inverse and the pruned/original cosine
similarity depend on the threshold only through alpha_n = alpha * exp(-mu). Every function here is
vectorised over tensors (layers batched along any shape), runs on the tensors' device and never synchronises
with the host, so thresholds can be refreshed every step on a GPU. The `*_float` twins run the same code on
Python floats, for one layer on the CPU, where a hundred tiny tensor operations would cost more than the
layer's pruning.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from scipy import special
from torch import Tensor
from torch.special import log_ndtr, ndtr, ndtri

_SQRT2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
MIN_SIGMA = 1e-6  # a degenerate (single-valued) layer is treated as a lognormal this narrow
THRESHOLD_ITERATIONS = 4  # Newton steps from the tabulated start: float64 precision for one lognormal
MIXTURE_ITERATIONS = 8  # Newton steps (bisection where a step leaves the bracket) for a two-part mixture
MAX_CALIBRATED_TARGET = 0.9999  # a calibrated pruning target (`Calibration`) stays in [0, this]


@dataclass(frozen=True)
class Calibration:
    """Feedback that makes pruning hit its target where the lognormal model misses it (heavier or lighter
    tails than a lognormal's): the threshold is solved for target + correction, and each refresh adds the
    last refreshes' miss (target - achieved, the zeros the prune op counted since the mark over `elements`)
    to the correction, unless nothing was pruned (a gradient with the target's zeros already), keeping the
    corrected target in [0, MAX_CALIBRATED_TARGET]. The tensors live on the gradient's device and are read
    and written by the fit itself (`gradcomp.ops.stats.fit_statistics`; on CUDA inside its finishing kernel:
    no host sync)."""

    correction: Tensor  # float64 0-d, read and updated
    counter: Tensor  # int64 counter the prune op adds its zeros to
    mark: Tensor  # int64 0-d: the counter's value at the last refresh; set to its value now
    elements: int  # elements pruned since the mark (0: no miss to learn from, e.g. a fresh counter)
    threshold: Tensor  # 0-d, the threshold used since the mark: 0 (nothing pruned) teaches nothing


def expected_sparsity(log_alpha_n: Tensor, sigma: Tensor) -> Tensor:
    """Expected fraction of zeros after stochastic pruning at ln(alpha_n), section 2.5.1:
    S = Phi(u/sigma) - exp(sigma^2/2 - u) * Phi((u - sigma^2)/sigma), computed in log space for the tails."""
    return ndtr(log_alpha_n / sigma) - _sparsity_slope(log_alpha_n, sigma)


class _Numbers(NamedTuple):
    """The functions the threshold solve needs, for tensors (vectorised, on their device, no host sync) or
    for Python floats (one CPU layer's threshold without a hundred tiny tensor operations)."""

    where: Callable
    minimum: Callable
    maximum: Callable
    clamp: Callable  # (value, lo, hi)
    nan_to_zero: Callable
    floor: Callable
    to_index: Callable
    sqrt: Callable
    exp: Callable
    log: Callable
    log1p: Callable
    ndtr: Callable
    log_ndtr: Callable
    ndtri: Callable


def _float(fn: Callable) -> Callable:
    return lambda value: float(fn(value))


_TENSORS = _Numbers(
    torch.where, torch.minimum, torch.maximum, torch.clamp, lambda v: v.nan_to_num(0.0), torch.floor,
    lambda v: v.long(), torch.sqrt, torch.exp, torch.log, torch.log1p, ndtr, log_ndtr, ndtri,
)  # fmt: skip
_FLOATS = _Numbers(
    lambda condition, a, b: a if condition else b, min, max, lambda v, lo, hi: min(max(v, lo), hi),
    lambda v: 0.0 if math.isnan(v) else v, math.floor, int, math.sqrt, math.exp, math.log, math.log1p,
    _float(special.ndtr), _float(special.log_ndtr), _float(special.ndtri),
)  # fmt: skip


def fit_lognormal(moments: Tensor) -> tuple[Tensor, Tensor]:
    """(mu, sigma) of ln|g| from `log_moments` output [..., (count_nonzero, sum_ln, sum_ln_sq, count_zero)].

    sigma is the unbiased standard deviation (as the reference code's torch.std); it is 0 for fewer than two
    non-zeros and mu is NaN when there are none.
    """
    return _fit(moments[..., 0], moments[..., 1], moments[..., 2], _TENSORS)


def fit_lognormal_float(moments: Sequence[float]) -> tuple[float, float]:
    """`fit_lognormal` of one layer's moments in Python floats (at least one non-zero)."""
    return _fit(moments[0], moments[1], moments[2], _FLOATS)


def _fit(count: Tensor, sum_ln: Tensor, sum_ln_sq: Tensor, num: _Numbers) -> tuple[Tensor, Tensor]:
    mu = sum_ln / count
    var = (sum_ln_sq - sum_ln * mu) / num.clamp(count - 1, 1, math.inf)
    return mu, num.sqrt(num.clamp(var, 0, math.inf))


def _sparsity_slope(u: Tensor, sigma: Tensor, num: _Numbers = _TENSORS) -> Tensor:
    """dS/du, which is also the subtracted term of S (a lognormal identity)."""
    return num.exp(sigma * sigma / 2 - u + num.log_ndtr((u - sigma * sigma) / sigma))


def _solve_increasing(
    fn,
    target: Tensor,
    lo: Tensor,
    hi: Tensor,
    iterations: int,
    start: Tensor | None = None,
    num: _Numbers = _TENSORS,
) -> Tensor:
    """Root of the increasing fn(u) = target inside [lo, hi]: Newton steps from `start` (default: the middle
    of the bracket), bisection when a step leaves the bracket. Fixed iteration count, so no data-dependent
    control flow and no host sync."""
    u = (lo + hi) / 2 if start is None else num.minimum(num.maximum(start, lo), hi)
    for _ in range(iterations):
        value, slope = fn(u)
        above = value > target
        lo = num.where(above, lo, u)
        hi = num.where(above, u, hi)
        newton = u - (value - target) / slope
        inside = (newton >= lo) & (newton <= hi)  # a converged step stays put
        u = num.where(inside, newton, (lo + hi) / 2)
    return u


def _threshold_problem(sigma: Tensor, sparsity: Tensor, num: _Numbers = _TENSORS):
    """(fn, lo, hi) of expected_sparsity(u, sigma) = sparsity in u = ln alpha_n, with a bracket that always
    holds the root (sparsity below 1)."""
    lo = -8 * sigma - 1
    hi = sigma * sigma / 2 + 8 * sigma + 1 - num.log1p(-sparsity)

    def fn(u: Tensor) -> tuple[Tensor, Tensor]:
        slope = _sparsity_slope(u, sigma, num)
        return num.ndtr(u / sigma) - slope, slope

    return fn, lo, hi


# Grid of the starting table: ln sigma and z = Phi^-1(sparsity), wide enough for every input that
# `gradcomp.ops.prune` passes (sparsity clamped to [1e-12, 1 - 1e-9]); beyond it the edge value is used.
_TABLE_LN_SIGMA = (math.log(MIN_SIGMA), math.log(20.0), 64)
_TABLE_Z = (-7.5, 6.5, 64)


@functools.cache
def _threshold_table(device: torch.device | None) -> Tensor | list[float]:
    """ln alpha_n on the (ln sigma, z) grid, flattened, solved once to float64 precision from the bracket's
    middle (device None: as a list of floats)."""
    if device is None:
        return _threshold_table(torch.device("cpu")).tolist()
    ln_sigma = torch.linspace(*_TABLE_LN_SIGMA, dtype=torch.float64, device=device)
    z = torch.linspace(*_TABLE_Z, dtype=torch.float64, device=device)
    sigma, sparsity = torch.broadcast_tensors(torch.exp(ln_sigma)[:, None], ndtr(z)[None, :])
    fn, lo, hi = _threshold_problem(sigma, sparsity.clamp(max=1 - 1e-12))
    return _solve_increasing(fn, sparsity, lo, hi, iterations=80).flatten()


def _grid_position(value: Tensor, grid: tuple[float, float, int], num: _Numbers) -> tuple[Tensor, Tensor]:
    """(index of the cell's lower corner, fraction inside the cell) of `value` on a uniform grid, clamped
    (NaN: the first cell; the solve then stays NaN)."""
    first, last, count = grid
    position = num.clamp(num.nan_to_zero((value - first) * ((count - 1) / (last - first))), 0, count - 1)
    index = num.clamp(num.floor(position), 0, count - 2)
    return num.to_index(index), position - index


def _threshold_start(sigma: Tensor, sparsity: Tensor, num: _Numbers) -> Tensor:
    """Bilinear interpolation of `_threshold_table`: within about 1e-3 of the root, so that a few Newton
    steps reach float64 precision (a cold start from the bracket needs about 14)."""
    table = _threshold_table(sigma.device if isinstance(sigma, Tensor) else None)
    row, row_frac = _grid_position(num.log(sigma), _TABLE_LN_SIGMA, num)
    col, col_frac = _grid_position(num.ndtri(sparsity), _TABLE_Z, num)
    corner, width = row * _TABLE_Z[2] + col, _TABLE_Z[2]
    below = table[corner] + (table[corner + 1] - table[corner]) * col_frac
    above = table[corner + width] + (table[corner + width + 1] - table[corner + width]) * col_frac
    return below + (above - below) * row_frac


def normalized_threshold(sigma: Tensor, sparsity: Tensor, iterations: int = THRESHOLD_ITERATIONS) -> Tensor:
    """alpha_n = alpha * exp(-mu) with expected_sparsity(ln alpha_n, sigma) = sparsity (Appendix A.1).

    Safeguarded Newton in ln alpha_n from a tabulated start: 4 iterations reach float64 precision for sigma
    in [1e-6, 20] and sparsity in [1e-12, 1 - 1e-9], in about a fifth of the tensor operations of a cold
    start (what matters when every layer refreshes its threshold every step).
    """
    sigma, sparsity = torch.broadcast_tensors(
        torch.as_tensor(sigma, dtype=torch.float64).clamp_min(MIN_SIGMA),
        torch.as_tensor(sparsity, dtype=torch.float64),
    )
    sparsity = sparsity.to(sigma.device)
    fn, lo, hi = _threshold_problem(sigma, sparsity.clamp(max=1 - 1e-12))
    start = _threshold_start(sigma, sparsity, _TENSORS)
    return torch.exp(_solve_increasing(fn, sparsity, lo, hi, iterations, start))


def normalized_threshold_float(
    sigma: float, sparsity: float, iterations: int = THRESHOLD_ITERATIONS
) -> float:
    """`normalized_threshold` of one finite sigma and one sparsity in [0, 1), in Python floats: the same
    algorithm, twenty times faster for a single layer on the CPU (where tensor dispatch dominates)."""
    if not (math.isfinite(sigma) and 0 <= sparsity < 1):
        raise ValueError(f"needs a finite sigma and a sparsity in [0, 1), got {sigma}, {sparsity}")
    sigma = max(sigma, MIN_SIGMA)
    fn, lo, hi = _threshold_problem(sigma, min(sparsity, 1 - 1e-12), _FLOATS)
    start = _threshold_start(sigma, sparsity, _FLOATS)
    return math.exp(_solve_increasing(fn, sparsity, lo, hi, iterations, start, _FLOATS))


class Population(NamedTuple):
    """A part of a gradient modelled as its own lognormal: its count of finite non-zeros and (mu, sigma) of
    their ln|g|."""

    count: Tensor | float
    mu: Tensor | float
    sigma: Tensor | float


def mixture_log_threshold(
    first: Population, second: Population, wanted: Tensor | float, num: _Numbers = _TENSORS
) -> Tensor | float:
    """ln alpha at which stochastic pruning makes `wanted` of the two populations' non-zeros zero in
    expectation: sum_k count_k S(ln alpha - mu_k; sigma_k) = wanted, with S the closed-form sparsity.

    The sum increases with alpha, so safeguarded Newton on it converges; it starts from the tabulated root
    of one lognormal with the pooled mean and variance of ln|g|, close to the mixture's root when the two
    parts overlap (the BatchNorm-masked entries of a layer and the rest). A population without non-zeros
    drops out; with one population left the solve is `normalized_threshold`'s. The fraction wanted is
    clamped to [1e-12, 1 - 1e-9], as for one lognormal. Vectorised like the other solvers (`num`: tensors
    or Python floats)."""
    total = first.count + second.count
    share = num.clamp(num.nan_to_zero(wanted / total), 1e-12, 1 - 1e-9)
    weight = num.nan_to_zero(second.count / total)
    # a population without non-zeros has NaN statistics: it takes the other's, with weight 0
    mu2 = num.where(second.count > 0, second.mu, first.mu)
    mu1 = num.where(first.count > 0, first.mu, mu2)
    sigma1 = num.clamp(num.where(first.count > 0, first.sigma, second.sigma), MIN_SIGMA, math.inf)
    sigma2 = num.clamp(num.where(second.count > 0, second.sigma, sigma1), MIN_SIGMA, math.inf)
    pooled_mu = mu1 + weight * (mu2 - mu1)
    pooled_var = (1 - weight) * sigma1 * sigma1 + weight * sigma2 * sigma2
    pooled_var = pooled_var + weight * (1 - weight) * (mu2 - mu1) * (mu2 - mu1)
    pooled_sigma = num.clamp(num.sqrt(pooled_var), MIN_SIGMA, math.inf)
    start = pooled_mu + _threshold_start(pooled_sigma, share, num)
    fn1, lo1, hi1 = _threshold_problem(sigma1, share, num)
    fn2, lo2, hi2 = _threshold_problem(sigma2, share, num)

    def fn(u):
        value1, slope1 = fn1(u - mu1)
        value2, slope2 = fn2(u - mu2)
        return value1 + weight * (value2 - value1), slope1 + weight * (slope2 - slope1)

    lo = num.minimum(lo1 + mu1, lo2 + mu2)
    hi = num.maximum(hi1 + mu1, hi2 + mu2)
    return _solve_increasing(fn, share, lo, hi, MIXTURE_ITERATIONS, start, num)


def gaussian_sparsity(t: Tensor) -> Tensor:
    """Expected sparsity of stochastic pruning at threshold t*s for g ~ N(0, s^2) (section 2.5.4)."""
    return torch.erf(t / _SQRT2) - _SQRT_2_OVER_PI / t * (-torch.expm1(-t * t / 2))


def laplace_sparsity(r: Tensor) -> Tensor:
    """Expected sparsity of stochastic pruning at threshold r*b for |g| ~ Exp(b) (section 2.5.4)."""
    return (r + torch.expm1(-r)) / r  # = 1 - 1/r + exp(-r)/r, with less cancellation at small r


def _gaussian_value_and_slope(t: Tensor) -> tuple[Tensor, Tensor]:
    return gaussian_sparsity(t), _SQRT_2_OVER_PI * (-torch.expm1(-t * t / 2)) / (t * t)


def _laplace_value_and_slope(r: Tensor) -> tuple[Tensor, Tensor]:
    decay = torch.exp(-r)
    return laplace_sparsity(r), (1 - decay - r * decay) / (r * r)


_PRIORS = {"gaussian": _gaussian_value_and_slope, "laplace": _laplace_value_and_slope}
_PRIOR_Z = (-7.5, 6.5, 512)  # grid of z = Phi^-1(sparsity) of the prior thresholds' starting tables


def _prior_problem(prior: str, sparsity: Tensor):
    """(fn, lo, hi) of the prior's increasing sparsity curve S(t) = sparsity in u = ln t."""
    value_and_slope = _PRIORS[prior]

    def fn(u: Tensor) -> tuple[Tensor, Tensor]:
        t = torch.exp(u)
        value, slope = value_and_slope(t)
        return value, slope * t

    return fn, torch.full_like(sparsity, -20.0), 2 - torch.log1p(-sparsity.clamp(max=1 - 1e-12))


@functools.cache
def _prior_table(prior: str, device: torch.device) -> Tensor:
    """ln t of the prior on the z grid, solved once to float64 precision from the bracket's middle."""
    sparsity = ndtr(torch.linspace(*_PRIOR_Z, dtype=torch.float64, device=device))
    fn, lo, hi = _prior_problem(prior, sparsity)
    return _solve_increasing(fn, sparsity, lo, hi, iterations=80)


def _prior_threshold(prior: str, sparsity: Tensor, iterations: int) -> Tensor:
    """t with S(t) = sparsity for the prior's curve: safeguarded Newton in ln t from the tabulated root
    (linear interpolation in z), as `normalized_threshold` does for the lognormal."""
    sparsity = torch.as_tensor(sparsity, dtype=torch.float64)
    table = _prior_table(prior, sparsity.device)
    index, fraction = _grid_position(ndtri(sparsity), _PRIOR_Z, _TENSORS)
    start = table[index] + (table[index + 1] - table[index]) * fraction
    fn, lo, hi = _prior_problem(prior, sparsity)
    return torch.exp(_solve_increasing(fn, sparsity, lo, hi, iterations, start))


def gaussian_normalized_threshold(sparsity: Tensor, iterations: int = 4) -> Tensor:
    """t with gaussian_sparsity(t) = sparsity; the threshold is t * s for a Gaussian of std s."""
    return _prior_threshold("gaussian", sparsity, iterations)


def laplace_normalized_threshold(sparsity: Tensor, iterations: int = 4) -> Tensor:
    """r with laplace_sparsity(r) = sparsity; the threshold is r * b for |g| ~ Exp(b), b = mean|g|."""
    return _prior_threshold("laplace", sparsity, iterations)


def cosine_similarity(alpha_n: Tensor, sigma: Tensor) -> Tensor:
    """Expected cosine between stochastically pruned and original gradients (section 2.6, untruncated)."""
    u, s2 = torch.log(alpha_n), sigma * sigma
    energy = torch.exp(2 * s2)
    denominator = energy * 0.5 * torch.erfc((u - 2 * s2) / (_SQRT2 * sigma)) + alpha_n * torch.exp(
        s2 / 2
    ) * 0.5 * torch.erfc(-(u - s2) / (_SQRT2 * sigma))
    return torch.sqrt(energy / denominator)


def truncated_cosine_similarity(alpha_n: Tensor, sigma: Tensor, k: Tensor | float) -> Tensor:
    """Cosine with the lognormal truncated at ln x - mu < k*sigma (section 2.6, as in the reference code),
    because the untruncated second moment is dominated by an unrealistic tail."""
    u, s2 = torch.log(alpha_n), sigma * sigma
    energy = torch.exp(2 * s2)
    top = torch.erf((k * sigma - 2 * s2) / (_SQRT2 * sigma))
    numerator = energy * (1 + top)
    denominator = alpha_n * torch.exp(s2 / 2) * torch.erfc((s2 - u) / (_SQRT2 * sigma)) + energy * (
        top - torch.erf((u - 2 * s2) / (_SQRT2 * sigma))
    )
    return torch.sqrt(numerator / denominator)


def truncation_k(log_abs: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    """The reference code's per-layer truncation point: the standardised smallest of the top N/300 values."""
    top = max(1, log_abs.numel() // 300)
    return (torch.topk(log_abs.flatten(), top).values[-1] - mu) / sigma


def cosine_threshold(sigma: Tensor, cosine: Tensor, k: Tensor | float, iterations: int = 60) -> Tensor:
    """alpha_n at which the truncated cosine equals `cosine` (heterogeneous sparsity rule, section 2.7).

    The cosine decreases as the threshold grows, so the root is bracketed in ln alpha_n and bisected.
    """
    sigma = torch.as_tensor(sigma, dtype=torch.float64).clamp_min(MIN_SIGMA)
    cosine = torch.as_tensor(cosine, dtype=torch.float64, device=sigma.device)
    lo = torch.broadcast_to(-8 * sigma - 1, torch.broadcast_shapes(sigma.shape, cosine.shape))
    hi = torch.broadcast_to(sigma * sigma / 2 + 12 * sigma + 10, lo.shape)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        too_low = truncated_cosine_similarity(torch.exp(mid), sigma, k) < cosine
        lo, hi = torch.where(too_low, lo, mid), torch.where(too_low, mid, hi)
    return torch.exp((lo + hi) / 2)
