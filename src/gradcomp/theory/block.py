"""Block-scaled formats on a near-lognormal gradient: the expected shares flushed to zero and clipped, and the
relative MSE, per scale rule, with and without the Hadamard transform (`gradcomp.ops.quantize_block`).

Model (log2 units, as `gradcomp.theory.fp`): |g| iid with log2|g| ~ N(mu2, sigma2^2), random signs; a block
holds B of them. Its scale X is a function of its largest magnitude M: MX floor 2^(floor(log2 M) - emax),
MX ceil the least 2^k with M / 2^k <= max_value, NVFP4 s * E4M3(M / max_value / s) with s from the tensor's
largest magnitude (the median of the largest of `numel` draws), and under the reciprocal rule s * C /
E4M3(C s max_value / M). Given M, the other B - 1 magnitudes are iid
and below M, so every statistic is an integral over M (density B f F^(B-1)) of (B - 1) times an expectation
over the truncated distribution plus M's own term. For a given X those expectations are exact sums of
partial moments over the rounding cells of the element grid times X (nearest: cells between midpoints, the
one below the first midpoint flushing to zero; stochastic: the variance (x - lo)(hi - x) between neighbouring
points, zero with probability 1 - x / (X q_1) below the smallest point q_1); beyond X * max_value the value
is clipped to it. The integral over M is a midpoint rule on M's quantile (`nodes` points), which bounds the
error from the scale's jumps to O(1 / nodes). Checked against 2^20 Monte-Carlo draws (tests/test_block.py):
the shares within 0.004 (NVFP4 at sigma2 4: 0.01, its per-tensor scale being the sample's), the relative MSE
within 5 % where a sample can decide it (sigma2 up to 1.5; beyond, a sample's MSE is carried by its few
largest blocks), and with the transform on Gaussian gradients.

Hadamard: the transform mixes a group's values into normalised sums of random-sign terms, which the theory
takes as Gaussian with the lognormal's second moment (the central limit; for heavy tails, large sigma2, the
sum of 16 or 32 terms is still dominated by its largest, and the Gaussian model is optimistic). Its
prediction: the block's values are no longer spread over many binades, so (nearly) nothing is flushed, and
the error is that of a Gaussian block in the format, independent of sigma2. The MSE is the same in either
basis (the transform is orthogonal); the shares are those of the transformed values, what the format sees.

`per_tensor_statistics` gives the same three numbers for one power-of-two scale per tensor (the lognormal
paper's per-layer scaling), for comparison.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from gradcomp.formats import FPFormat
from gradcomp.formats.block import BlockFormat

_LN2 = math.log(2.0)
OUTER_NODES = 16  # quantiles of an outer block's largest value the theory averages over


@dataclass(frozen=True)
class ErrorShares:
    """Expected share of non-zero elements flushed to zero, share clipped, and E[(q - g)^2] / E[g^2]."""

    flushed: float
    clipped: float
    relative_mse: float


class _Lognormal:
    """|g| with ln|g| ~ N(m, s^2)."""

    def __init__(self, mu2: float, sigma2: float) -> None:
        self.m, self.s = mu2 * _LN2, sigma2 * _LN2

    def cdf(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return special.ndtr((np.log(x) - self.m) / self.s)

    def quantile(self, p: np.ndarray) -> np.ndarray:
        return np.exp(self.m + self.s * special.ndtri(p))

    def second_moment(self) -> float:
        return math.exp(2 * self.m + 2 * self.s**2)

    def partial(self, k: int, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        """E[x^k; low <= x < high]."""
        return self.moments(low, high, k + 1)[k]

    def moments(self, low: np.ndarray, high: np.ndarray, count: int = 3) -> list[np.ndarray]:
        """E[x^k; low <= x < high] for k = 0 .. count - 1 (the logarithms computed once for all k)."""
        with np.errstate(divide="ignore"):
            z_low = (np.log(low) - self.m) / self.s
            z_high = (np.log(high) - self.m) / self.s
        moments = []
        for k in range(count):
            mass = special.ndtr(z_high - k * self.s) - special.ndtr(z_low - k * self.s)
            moments.append(np.exp(k * self.m + k * k * self.s**2 / 2) * np.maximum(mass, 0.0))
        return moments


class _HalfNormal:
    """|g| with g ~ N(0, tau^2): the model of Hadamard-transformed values."""

    def __init__(self, second_moment: float) -> None:
        self.tau = math.sqrt(second_moment)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return special.erf(x / (self.tau * math.sqrt(2)))

    def quantile(self, p: np.ndarray) -> np.ndarray:
        return self.tau * math.sqrt(2) * special.erfinv(p)

    def second_moment(self) -> float:
        return self.tau**2

    def moments(self, low: np.ndarray, high: np.ndarray, count: int = 3) -> list[np.ndarray]:
        """E[x^k; low <= x < high] for k = 0 .. count - 1."""
        a, b = low / self.tau, high / self.tau
        finite_b = np.where(np.isinf(b), 0.0, b)
        density_a = np.exp(-a * a / 2) / math.sqrt(2 * math.pi)
        density_b = np.where(np.isinf(b), 0.0, np.exp(-finite_b * finite_b / 2) / math.sqrt(2 * math.pi))
        mass = special.ndtr(b) - special.ndtr(a)
        moments = [
            2 * mass,
            2 * self.tau * (density_a - density_b),
            2 * self.tau**2 * np.maximum(mass - (finite_b * density_b - a * density_a), 0.0),
        ]
        return moments[:count]


@functools.lru_cache(maxsize=64)
def _positive(fmt: FPFormat) -> np.ndarray:
    """The format's positive finite values (float64, sorted; read-only: shared by every call)."""
    values = fmt.positive_values().numpy()
    values.flags.writeable = False
    return values


@functools.lru_cache(maxsize=64)
def _grid(fmt: FPFormat) -> np.ndarray:
    """0 and the format's positive finite values: the points a magnitude is rounded to (read-only)."""
    values = np.concatenate([[0.0], _positive(fmt)])
    values.flags.writeable = False
    return values


def _cells(distribution, scale: np.ndarray, points: np.ndarray, upper: np.ndarray, stochastic: bool):
    """(flushed mass, clipped mass, E[err^2]) of magnitudes below `upper` quantized at `scale` to the grid
    `points` (0 first, max_value last); arrays over the leading axis of scale and upper (one per node)."""
    scale, upper = scale[:, None], upper[:, None]

    def partials(low: np.ndarray, high: np.ndarray, count: int = 3) -> list[np.ndarray]:
        high = np.minimum(high, upper)
        inside = high > low
        moments = distribution.moments(low, np.maximum(high, low), count)
        return [np.where(inside, moment, 0.0) for moment in moments]

    top = points[-1] * scale
    clipped = partials(top, np.full_like(top, np.inf))
    clip_error = clipped[2] - 2 * top * clipped[1] + top * top * clipped[0]
    if stochastic:
        low, high = points[None, :-1] * scale, points[None, 1:] * scale
        moments = partials(low, high)
        error = -moments[2] + (low + high) * moments[1] - low * high * moments[0]
        first = points[1] * scale[:, 0]
        below = partials(np.zeros_like(top), first[:, None], 2)
        flushed = below[0][:, 0] - below[1][:, 0] / first
    else:
        edges = np.concatenate([[0.0], (points[:-1] + points[1:]) / 2, [np.inf]])
        low, high = edges[None, :-1] * scale, edges[None, 1:] * scale
        high = np.where(np.isinf(edges[None, 1:]), top, high)  # the last cell ends where clipping starts
        value = points[None, :] * scale
        moments = partials(low, high)
        error = moments[2] - 2 * value * moments[1] + value * value * moments[0]
        flushed = moments[0][:, 0]
    # the sums cancel for very wide lognormals (sigma2 beyond about 10): never below zero
    return flushed, clipped[0][:, 0], np.maximum(error.sum(1) + clip_error[:, 0], 0.0)


def _round_to(y: np.ndarray, points: np.ndarray, stochastic: bool) -> tuple[np.ndarray, np.ndarray]:
    """(P(result is zero), E[(Q(y) - y)^2]) of single magnitudes y on the grid (clipped above max)."""
    clipped = np.minimum(y, points[-1])
    above = np.clip(np.searchsorted(points, clipped, side="right"), 1, len(points) - 1)
    low, high = points[above - 1], points[above]
    if stochastic:
        error = (clipped - low) * (high - clipped) + (y - clipped) ** 2
        zero = np.where(low == 0, 1 - clipped / high, 0.0)
        return zero, error
    nearest = np.where(clipped - low < high - clipped, low, high)  # ties have measure zero
    return (nearest == 0).astype(float), (nearest - y) ** 2


def _block_scale(fmt: BlockFormat, largest: np.ndarray, tensor_largest: float) -> np.ndarray:
    """X as a function of the block's largest magnitude M (>0), as `gradcomp.ops.block` computes it."""
    if fmt.from_tensor_max:
        raise ValueError(
            "the block theory models the floor, ceil, 3/4 and reciprocal scale rules, not TE's (no lower "
            "clamp) or Four Over Six's (a choice by each block's error)"
        )
    element = fmt.element_format
    if fmt.per_tensor:
        low_scale, high_scale = fmt.scale_range
        tensor_scale = max(tensor_largest / (high_scale * element.max_value), fmt.tensor_scale_floor)
        ratio = largest / element.max_value / tensor_scale
        reciprocal, constant = fmt.rule == "reciprocal", fmt.reciprocal_constant
        value = np.clip(constant / ratio if reciprocal else ratio, low_scale, high_scale)  # what is rounded
        grid = _positive(fmt.scale_format)
        index = np.clip(np.searchsorted(grid, value), 1, len(grid) - 1)
        low, high = grid[index - 1], grid[index]
        if fmt.rule == "ceil":  # rounded up: high is the least grid value >= value
            return tensor_scale * np.where(value <= low, low, high)
        nearest = np.where(value - low < high - value, low, high)
        return tensor_scale * (constant / nearest if reciprocal else nearest)
    _, exponent = np.frexp(largest)  # largest = m 2^exponent, m in [0.5, 1)
    k = exponent - 1 - element.emax
    if fmt.rule == "ceil":
        k = k + (largest > element.max_value * np.exp2(k))
    scale = np.exp2(np.clip(k, -127, 127).astype(float))
    return scale * (4.0 / 3.0) if fmt.rule == "three_quarters" else scale  # rounding on 4/3 of the grid


def block_statistics(
    fmt: BlockFormat,
    sigma2: float,
    rounding: str = "nearest",
    hadamard: bool = False,
    numel: int = 1 << 20,
    nodes: int = 4096,
    mu2: float = 0.0,
    tensor_largest: float | None = None,
) -> ErrorShares:
    """The expected flushed and clipped shares and relative MSE of `fmt` on iid lognormal magnitudes with
    log2 mean mu2 and std sigma2 (see the module); numel: the tensor's size (NVFP4's per-tensor scale, from
    the median largest of numel draws unless `tensor_largest` gives the tensor's largest magnitude; with
    outer blocks, averaged over the distribution of the largest of `fmt.outer` draws, one outer block's).
    Power-of-two scales make the result periodic in mu2 with period 1 (up to the scale formats' range): the
    fractional part matters where the block maxima span less than a binade (small sigma2, and the Gaussian
    model of the transform, whose second moment is the lognormal's)."""
    lognormal = _Lognormal(mu2, sigma2)
    distribution = _HalfNormal(lognormal.second_moment()) if hadamard else lognormal
    size = fmt.block_size
    u = (np.arange(nodes) + 0.5) / nodes
    largest = distribution.quantile(u ** (1.0 / size))
    if tensor_largest is None and fmt.outer:  # averaged over an outer block's largest (quantile midpoints)
        u = (np.arange(OUTER_NODES) + 0.5) / OUTER_NODES
        shares = [
            block_statistics(fmt, sigma2, rounding, hadamard, numel, nodes, mu2, float(top))
            for top in distribution.quantile(u ** (1.0 / fmt.outer))
        ]
        return ErrorShares(*np.mean([dataclasses.astuple(share) for share in shares], axis=0).tolist())
    if tensor_largest is None:
        tensor_largest = float(distribution.quantile(np.array([0.5 ** (1.0 / numel)]))[0])
    else:  # a block of a level near the tensor's largest value cannot exceed it
        largest = np.minimum(largest, tensor_largest)
    scale = _block_scale(fmt, largest, tensor_largest)
    points = _grid(fmt.element_format)
    stochastic = rounding == "stochastic"
    flushed, clipped, error = _cells(distribution, scale, points, largest, stochastic)
    below = distribution.cdf(largest)  # the mass the other B - 1 are drawn from
    own_zero, own_error = _round_to(largest / scale, points, stochastic)
    own_error = own_error * scale * scale
    own_clipped = (largest > points[-1] * scale).astype(float)
    others = (size - 1) / below
    mean = lambda values: float(np.mean(values)) / size  # noqa: E731
    return ErrorShares(
        flushed=mean(others * flushed + own_zero),
        clipped=mean(others * clipped + own_clipped),
        relative_mse=mean(others * error + own_error) / distribution.second_moment(),
    )


@dataclass(frozen=True)
class BlockLevels:
    """The correlated model of a tensor's blocks: log2|g| = b + w over its non-zeros, a level b ~ N(mu2,
    between^2) of each block (the magnitudes of one position's channels, or of one channel's positions, move
    together) and a spread w ~ N(0, within^2) inside it; between^2 + within^2 is the iid model's sigma2^2.
    Fitted by the one-way analysis of variance of the blocks' log2 moments (one reduction per block)."""

    mu2: float
    between: float
    within: float

    @classmethod
    def of(cls, blocks) -> BlockLevels | None:
        """From a (blocks, B) tensor (`gradcomp.ops._blocks.as_blocks`); None without two non-zeros in one
        block and two blocks holding non-zeros."""
        import torch

        x = blocks.detach().double().abs()
        present = (x > 0) & torch.isfinite(x)
        logs = torch.where(present, torch.log2(torch.where(present, x, 1.0)), 0.0)
        n, s1, s2 = present.sum(1).double(), logs.sum(1), logs.square().sum(1)
        used = n > 0
        n, s1, s2 = n[used], s1[used], s2[used]
        total, groups = float(n.sum()), int(used.sum())
        if groups < 2 or total - groups < 1:
            return None
        within = float((s2 - s1.square() / n).sum()) / (total - groups)
        grand = float(s1.sum()) / total
        spread = float((n * (s1 / n - grand) ** 2).sum()) / (groups - 1)
        size = (total - float(n.square().sum()) / total) / (groups - 1)  # the ANOVA's mean group size
        between = max((spread - within) / size, 0.0)
        return cls(grand, math.sqrt(between), math.sqrt(max(within, 0.0)))

    def rounded(self) -> BlockLevels:
        """mu2 modulo 1 (power-of-two block scales make the theory periodic in it) and the spreads, to
        0.05: the levels at which layers share `correlated_block_statistics`' cached results."""
        return BlockLevels(*(round(value * 20) / 20 for value in (self.mu2 % 1.0, self.between, self.within)))


@functools.lru_cache(maxsize=8192)  # integrals over levels and maxima: milliseconds each, per layer and step
def correlated_block_statistics(
    fmt: BlockFormat,
    levels: BlockLevels,
    rounding: str = "nearest",
    hadamard: bool = False,
    numel: int = 1 << 20,
    levels_nodes: int = 8,
    nodes: int = 128,
) -> ErrorShares:
    """`block_statistics` under the correlated model: the iid theory of each block at its own level b with
    the within-block spread, averaged over b (the midpoints of `levels_nodes` quantiles; the MSE weighted
    by each level's second moment, an exact tilt of the level's normal). The tensor's largest value (NVFP4's
    per-tensor scale) is the median largest of `numel` draws of the model (of `fmt.outer` with outer blocks:
    an approximation that takes their elements as independent), and no level lies above the one whose
    blocks' median largest value reaches it."""
    within = max(levels.within, 0.05)
    tensor_largest = _largest_of_levels(levels, within, hadamard, fmt.outer or numel)
    # the highest level a block can have: its median largest value at the tensor's largest
    if hadamard:
        top = math.log2(tensor_largest / (math.sqrt(2) * special.erfinv(0.5 ** (1 / fmt.block_size))))
        top -= within**2 * _LN2
    else:
        top = math.log2(tensor_largest) - within * special.ndtri(0.5 ** (1 / fmt.block_size))
    u = (np.arange(levels_nodes) + 0.5) / levels_nodes

    def average(shift: float) -> np.ndarray:
        """Over the levels b ~ N(mu2 + shift, between^2) truncated above at `top` (midpoints of its
        quantiles): (flushed, clipped, relative MSE)."""
        mean = levels.mu2 + shift
        if levels.between == 0:
            chosen = np.array([min(mean, top)])
        else:
            chosen = mean + levels.between * special.ndtri(u * special.ndtr((top - mean) / levels.between))
        values = [
            block_statistics(fmt, within, rounding, hadamard, numel, nodes, level, tensor_largest)
            for level in chosen
        ]
        return np.array([[v.flushed, v.clipped, v.relative_mse] for v in values]).mean(0)

    flushed, clipped, _ = average(0.0)
    # the MSE is energy-weighted: a level's weight times 2^(2b) tilts N(mu2, between^2) by 2 ln2 between^2
    _, _, mse = average(2 * _LN2 * levels.between**2)
    return ErrorShares(float(flushed), float(clipped), float(mse))


def _largest_of_levels(levels: BlockLevels, within: float, hadamard: bool, numel: int) -> float:
    """The median largest of `numel` magnitudes under the correlated model: its marginal is a lognormal of
    log2 std sqrt(between^2 + within^2); after the transform, a mixture over the levels of half-normals of
    each level's second moment (solved by bisection on log t)."""
    if not hadamard:
        marginal = _Lognormal(levels.mu2, math.hypot(levels.between, within))
        return float(marginal.quantile(np.array([0.5 ** (1.0 / numel)]))[0])
    points, weights = np.polynomial.hermite_e.hermegauss(32)
    weights = weights / weights.sum()
    # each level's half-normal scale: sqrt of the second moment of log2|g| ~ N(b, within^2)
    log2_tau = levels.mu2 + levels.between * points + within**2 * _LN2
    target = 0.5 ** (1.0 / numel)
    low, high = -200.0, 200.0  # log2 t
    for _ in range(60):
        middle = (low + high) / 2
        below = weights @ special.erf(2.0 ** (middle - log2_tau) / math.sqrt(2))
        low, high = (middle, high) if below < target else (low, middle)
    return 2.0 ** ((low + high) / 2)


def per_tensor_statistics(
    element: FPFormat,
    sigma2: float,
    log2_scale: float,
    rounding: str = "nearest",
    largest: float | None = None,
    numel: int = 1,
) -> ErrorShares:
    """The same for one scale for the whole tensor (g * 2^log2_scale is rounded, log2|g| ~ N(0, sigma2^2):
    a log2 mean mu2 adds to log2_scale) on the element format's grid, saturating: the lognormal paper's
    per-layer scaling. Given the tensor's `largest` magnitude (in the units of g, so over 2^mu2 where mu2
    is not 0) and its `numel` magnitudes, the statistics are those of that tensor, as for a block: the
    other numel - 1 drawn below the largest, plus its own term (for few exponent bits and wide lognormals
    the expected error is otherwise carried by the clipping of a tail the tensor does not have)."""
    distribution = _Lognormal(0.0, sigma2)
    points = _grid(element)
    scale = 2.0**-log2_scale
    stochastic = rounding == "stochastic"
    upper = np.array([math.inf if largest is None else largest])
    flushed, clipped, error = (
        float(v[0]) for v in _cells(distribution, np.array([scale]), points, upper, stochastic)
    )
    if largest is None:
        return ErrorShares(flushed, clipped, error / distribution.second_moment())
    others = (numel - 1) / float(distribution.cdf(upper)[0])
    energy = others * float(distribution.partial(2, np.zeros(1), upper)[0]) + largest**2
    own_zero, own_error = _round_to(upper / scale, points, stochastic)
    own_clipped = float(largest / scale > points[-1])
    return ErrorShares(
        (others * flushed + float(own_zero[0])) / numel,
        (others * clipped + own_clipped) / numel,
        (others * error + float(own_error[0]) * scale**2) / energy,
    )
