"""The variance that unbiased compressors add to a lognormal neural gradient, relative to its second moment.

For |g| with ln|g| ~ N(mu, sigma^2) each compressor here is unbiased (E[out | g] = g), so the error it adds
is its conditional variance; all are reported as E[Var(out | g)] / E[g^2], which does not depend on mu (the
compressors are scale-equivariant). Partial moments of the lognormal give closed forms: with
z = (ln x - mu)/sigma, E[x^k; a <= x < b] = exp(k mu + k^2 sigma^2 / 2) (Phi(z_b - k sigma) - Phi(z_a -
k sigma)).

- stochastic pruning at threshold alpha: Var = alpha |g| - g^2 below alpha, 0 above;
- LUQ: the same below alpha, (|g| - L_k)(L_(k+1) - |g|) between neighbouring levels above; alpha is set by
  the tensor's maximum, taken here as the median of the largest of `numel` draws; SMP divides by `samples`;
- MVUE N:M: sum over a block of g_i^2 (1/p_i - 1); for 1:2 this is 2 |g_1||g_2| per block, so the relative
  variance is exactly exp(-sigma^2); for other N:M the block expectation is an m-dimensional integral,
  computed by Gauss-Hermite quadrature (no closed form).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from scipy import special

from gradcomp.formats.nm import keep_probabilities
from gradcomp.lognormal import normalized_threshold_float


def _partial(k: int, sigma: float, low: float, high: float) -> float:
    """E[x^k; low <= x < high] for ln x ~ N(0, sigma^2) (bounds in x; 0 and inf allowed)."""
    z_low = -math.inf if low <= 0 else math.log(low) / sigma
    z_high = math.inf if math.isinf(high) else math.log(high) / sigma
    mass = special.ndtr(z_high - k * sigma) - special.ndtr(z_low - k * sigma)
    return math.exp(k * k * sigma * sigma / 2) * mass


def _underflow(alpha: float, sigma: float) -> float:
    """E[alpha x - x^2; x < alpha]: the variance stochastic underflow at alpha adds (mu = 0)."""
    return alpha * _partial(1, sigma, 0.0, alpha) - _partial(2, sigma, 0.0, alpha)


def prune_variance(sigma: float, sparsity: float, zero_share: float = 0.0) -> float:
    """Relative variance of stochastic pruning at the lognormal threshold for `sparsity`, where a share
    `zero_share` of the elements is zero already (the non-zeros are pruned to the rest of the target)."""
    if sparsity <= zero_share:
        return 0.0
    alpha = normalized_threshold_float(sigma, (sparsity - zero_share) / (1 - zero_share))
    return _underflow(alpha, sigma) / math.exp(2 * sigma * sigma)


def largest_of(numel: int, sigma: float) -> float:
    """The median of the largest of `numel` draws of x (mu = 0): exp(sigma Phi^-1(2^(-1/numel)))."""
    return math.exp(sigma * special.ndtri(0.5 ** (1.0 / numel)))


def luq_variance(
    sigma: float, bits: int = 4, numel: int = 1 << 20, samples: int = 1, largest: float | None = None
) -> float:
    """Relative variance of LUQ with `bits` bits on a tensor of `numel` elements, `samples` SMP samples;
    `largest`: the tensor's largest magnitude over exp(mu) where known (else `largest_of(numel, sigma)`).
    Mass above the top level (about 1/(2 numel)) is neglected."""
    levels = 2 ** (bits - 1)
    top = largest_of(numel, sigma) if largest is None else largest
    alpha = top * 2.0 ** -(levels - 1)
    total = _underflow(alpha, sigma)
    for k in range(levels - 1):
        low, high = alpha * 2.0**k, alpha * 2.0 ** (k + 1)
        moments = [_partial(j, sigma, low, high) for j in range(3)]
        total += -moments[2] + (low + high) * moments[1] - low * high * moments[0]
    return total / math.exp(2 * sigma * sigma) / samples


def nm_keep_probabilities(magnitude: np.ndarray, n: int) -> np.ndarray:
    """`gradcomp.formats.nm.keep_probabilities` (the op's) in float64 numpy, for the quadrature."""
    return keep_probabilities(torch.from_numpy(magnitude), n).numpy()


def nm_variance(sigma: float, n: int = 2, m: int = 4, nodes: int = 16, zero_share: float = 0.0) -> float:
    """Relative variance of MVUE n:m pruning of iid lognormal magnitudes: exp(-sigma^2) for 1:2, otherwise
    E[sum_i x_i^2 (1/p_i - 1)] / (m E[x^2]) by Gauss-Hermite quadrature with `nodes` points per element.
    With `zero_share`, each element is zero independently with that probability: a block with k non-zeros
    is a full n:k block (nothing added where k <= n)."""
    if zero_share > 0:
        added = sum(
            math.comb(m, k)
            * (1 - zero_share) ** k
            * zero_share ** (m - k)
            * k
            * nm_variance(sigma, n, k, nodes)
            for k in range(n + 1, m + 1)
        )
        return added / (m * (1 - zero_share))
    if (n, m) == (1, 2):
        return math.exp(-sigma * sigma)
    points, weights = np.polynomial.hermite_e.hermegauss(nodes)
    weights = weights / weights.sum()
    grid = np.array(list(itertools.product(range(nodes), repeat=m)))
    magnitude = np.exp(sigma * points[grid])
    weight = np.prod(weights[grid], axis=1)
    p = nm_keep_probabilities(magnitude, n)
    added = np.where(p > 0, magnitude**2 * (1.0 / np.where(p > 0, p, 1.0) - 1.0), 0.0).sum(1)
    return float((weight * added).sum() / m / math.exp(2 * sigma * sigma))
