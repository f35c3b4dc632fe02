"""Quantization error of a lognormal to a floating-point grid (lognormal paper, section 2.10).

x = |g| with log2 x ~ N(0, sigma^2) (sigma in log2 units, as in the paper's tables; a non-zero log2 mean
is absorbed by the scale). x is scaled by 2^log2_scale, rounded to the nearest point of a positive grid
(plus zero; magnitudes above the top point clamp to it, i.e. saturation) and scaled back. The relative MSE
E[(x_hat - x)^2] / E[x^2] is exact: a sum over grid bins of lognormal partial moments, no sampling.

Any grid works: `ideal_grid` is the idealised one of the paper's analysis (2^E binades of 2^M levels plus
zero), `FPFormat.positive_values()` the real formats with subnormals (saturating, IEEE-like, or with only the
all-ones code reserved as OCP's float8_e4m3fn). Where a grid is expected an `FPFormat` also works: its
positive values, and zero unless the format has none (float8_e8m0fnu). The theory clamps at the top point
whatever the format's overflow (Inf and NaN outputs have no finite error).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from gradcomp.formats import FPFormat

GridKind = Literal["ideal", "saturate", "inf", "fn"]
Grid = Tensor | FPFormat
_LN2 = math.log(2.0)
_INV_SQRT2 = 1 / math.sqrt(2.0)
_GOLDEN = (math.sqrt(5) - 1) / 2


def ideal_grid(exp_bits: int, man_bits: int) -> Tensor:
    """2^E binades of 2^M levels (positive points, float64); exp_bits = 0 is a single binade."""
    levels = 1 + torch.arange(2**man_bits, dtype=torch.float64) / 2**man_bits
    binades = 2.0 ** torch.arange(2**exp_bits, dtype=torch.float64)
    return (binades[:, None] * levels[None, :]).flatten()


def grid_for(kind: GridKind, exp_bits: int, man_bits: int) -> Tensor:
    """Positive grid of a 1+E+M-bit format: idealised, or with subnormals and every code a number
    ("saturate"), the top exponent field reserved ("inf", IEEE-like) or the all-ones code ("fn", as OCP's
    float8_e4m3fn: one value fewer than "saturate")."""
    if kind == "ideal":
        return ideal_grid(exp_bits, man_bits)
    reserved = {"saturate": "none", "inf": "ieee", "fn": "all_ones"}.get(kind)
    if reserved is None:
        raise ValueError(f"grid kind must be 'ideal', 'saturate', 'inf' or 'fn', got {kind!r}")
    return FPFormat(
        exp_bits, man_bits, reserved=reserved, overflow="inf" if kind == "inf" else "saturate"
    ).positive_values()


def min_exp_bits(kind: GridKind) -> int:
    """The fewest exponent bits of the kind's formats ("fn" with M = 0 needs 2: its top field is NaN)."""
    return {"ideal": 0, "saturate": 1, "inf": 2, "fn": 1}[kind]


def _points(grid: Grid) -> Tensor:
    """The sorted points of a grid, zero included (a tensor of positive points always has zero)."""
    if isinstance(grid, FPFormat):
        positive = grid.positive_values()
        return torch.cat([positive.new_zeros(1), positive]) if grid.zero else positive
    grid = torch.sort(grid.to(torch.float64)).values
    return torch.cat([grid.new_zeros(1), grid])


def _bin_masses(z: Tensor) -> Tensor:
    """Phi(z[i+1]) - Phi(z[i]) for increasing edges z, from whichever tail avoids cancellation."""
    upper_tail = torch.erfc(z * _INV_SQRT2)
    lower_tail = torch.erfc(-z * _INV_SQRT2)
    from_upper = 0.5 * (upper_tail[..., :-1] - upper_tail[..., 1:])
    from_lower = 0.5 * (lower_tail[..., 1:] - lower_tail[..., :-1])
    return torch.where(z[..., :-1] > 0, from_upper, from_lower)


def relative_mse(grid: Grid, sigma: Tensor | float, log2_scale: Tensor | float) -> Tensor:
    """Exact relative MSE of nearest rounding to `grid` (positive points, and 0; or a format), for
    log2|x| ~ N(0, sigma^2) scaled by 2^log2_scale. Broadcasts over sigma and log2_scale."""
    return _relative_mse(_points(grid), sigma, log2_scale)


def _log_edges(points: Tensor) -> Tensor:
    """ln of the rounding cells' edges: 0, the midpoints between the points, infinity."""
    edges = torch.cat([points.new_zeros(1), (points[:-1] + points[1:]) / 2, points.new_full((1,), math.inf)])
    return torch.log(edges)


def _relative_mse(
    points: Tensor, sigma: Tensor | float, log2_scale: Tensor | float, log_edges: Tensor | None = None
) -> Tensor:
    """`relative_mse` on the points; `log_edges`: theirs (`_log_edges`), where a search reuses them."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    log2_scale = torch.as_tensor(log2_scale, dtype=torch.float64)
    if (sigma <= 0).any():
        raise ValueError("sigma must be positive")
    s = (sigma * _LN2)[..., None]  # natural-log parameters of y = x * scale
    mu = (log2_scale * _LN2)[..., None]
    log_edges = _log_edges(points) if log_edges is None else log_edges
    var = s * s

    def mass(k: int) -> Tensor:
        return _bin_masses((log_edges - mu - k * var) / s)

    r = points * torch.exp(-mu - var)
    per_bin = r * r * mass(0) - 2 * r * torch.exp(-var / 2) * mass(1) + mass(2)
    return per_bin.sum(-1)


def optimal_log2_scale(
    grid: Grid, sigma: Tensor | float, step: float = 0.25, refine: int = 30
) -> tuple[Tensor, Tensor]:
    """MSE-optimal log2 scale and its relative MSE, for each sigma (log2 units).

    Scans scales every `step` around the analytic centre (grid's log-centre minus 2 ln2 sigma^2, where the
    distribution's energy sits), then golden-section refines inside the best bracket.
    """
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    points = _points(grid)
    log_grid = torch.log2(points[points > 0])
    centre = (log_grid.min() + log_grid.max()) / 2 - 2 * _LN2 * sigma * sigma
    # beyond ~6 sigma from the centre the tails are clipped or flushed; a grid wider than that is periodic
    # (one binade) in the scale near its centre, so the search never needs more than this half-width
    half_width = torch.clamp((log_grid.max() - log_grid.min()) / 2 + 6 * sigma + 4, max=6 * sigma + 6)
    offsets = torch.arange(-1.0, 1.0 + 1e-9, step / float(half_width.max()), dtype=torch.float64)
    candidates = centre[..., None] + offsets * half_width[..., None]
    log_edges = _log_edges(points)  # the same cells at every scale tried
    mse = _relative_mse(points, sigma[..., None], candidates, log_edges)
    best = candidates.gather(-1, mse.argmin(-1, keepdim=True)).squeeze(-1)
    spacing = step * half_width / half_width.max()
    lo, hi = best - spacing, best + spacing
    for _ in range(refine):
        a, b = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
        left_better = _relative_mse(points, sigma, a, log_edges) < _relative_mse(points, sigma, b, log_edges)
        lo, hi = torch.where(left_better, lo, a), torch.where(left_better, b, hi)
    log2_scale = (lo + hi) / 2
    return log2_scale, _relative_mse(points, sigma, log2_scale, log_edges)


def mse_by_exp_bits(total_bits: int, sigma: Tensor | float, kind: GridKind = "ideal") -> dict[int, Tensor]:
    """{E: minimal relative MSE of the 1+E+M format with M = total_bits - 1 - E} at each sigma."""
    if total_bits < 2:
        raise ValueError("a format needs at least 2 bits (sign + one exponent or mantissa bit)")
    return {
        exp_bits: optimal_log2_scale(grid_for(kind, exp_bits, total_bits - 1 - exp_bits), sigma)[1]
        for exp_bits in range(min_exp_bits(kind), total_bits)
    }


def optimal_exp_bits(total_bits: int, sigma: Tensor | float, kind: GridKind = "ideal") -> Tensor:
    """MSE-optimal number of exponent bits of an n-bit gradient format, for each sigma (log2 units)."""
    table = mse_by_exp_bits(total_bits, sigma, kind)
    exp_bits = torch.tensor(list(table), dtype=torch.int64)
    return exp_bits[torch.stack(list(table.values()), -1).argmin(-1)]


def switch_points(
    total_bits: int, kind: GridKind = "ideal", sigma_max: float = 20.0, resolution: float = 0.05
) -> dict[int, float]:
    """{E: sigma at which the optimal exponent width first exceeds E - 1 and reaches E}, to `resolution`.

    Scans sigma on a coarse geometric grid (switch points roughly double per exponent bit), then bisects
    each change of the optimum.
    """
    coarse = torch.logspace(math.log10(0.05), math.log10(sigma_max), 32, dtype=torch.float64)
    best = optimal_exp_bits(total_bits, coarse, kind)
    points: dict[int, float] = {}
    for i in torch.nonzero(best[1:] != best[:-1]).flatten().tolist():
        lo, hi = float(coarse[i]), float(coarse[i + 1])
        below = int(best[i])
        while hi - lo > resolution / 2:
            mid = (lo + hi) / 2
            if int(optimal_exp_bits(total_bits, mid, kind)) == below:
                lo = mid
            else:
                hi = mid
        points[int(best[i + 1])] = round((lo + hi) / 2, 3)
    return points
