"""Triton kernels of a layer's lognormal statistics, in two launches and without a host sync.

`_moments_kernel` reads the gradient once (and, where given, the mask that splits it into two populations:
the entries whose BatchNorm-output gradient is non-zero, and the rest) and writes per-program partial sums
of `log_moments` and the largest finite magnitude. `_finish_kernel`, one program, adds the partial sums in
float64 in a fixed order (the same result run to run) and, where asked, fits (mu, sigma), solves the pruning
threshold (`lognormal.mixture_log_threshold`, with the normal distribution's functions of `gradcomp.kernels.
special`) and the power-of-two FP scale (bounded below by the clip-free scale of the largest magnitude where
asked), in registers: the statistics of `gradcomp.ops.stats.fit_statistics`.
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp import lognormal
from gradcomp.kernels.special import ndtr_and_log, ndtri_approximate
from gradcomp.lognormal import Calibration
from gradcomp.profiling import launch

BLOCK = 1024
TILES_PER_PROGRAM = 16
BLOCK_PARTIALS = 128
FIT_FIELDS = ("mu", "sigma", "bn_zero_share", "threshold", "scale")
RULES = ("mixture", "reference", "all")  # how the threshold treats the BatchNorm-masked entries
# the solver's constants (gradcomp.lognormal), as compile-time constants of the kernels
_SIGMA_FIRST = tl.constexpr(lognormal._TABLE_LN_SIGMA[0])
_SIGMA_LAST = tl.constexpr(lognormal._TABLE_LN_SIGMA[1])
_SIGMA_COUNT = tl.constexpr(lognormal._TABLE_LN_SIGMA[2])
_Z_FIRST = tl.constexpr(lognormal._TABLE_Z[0])
_Z_LAST = tl.constexpr(lognormal._TABLE_Z[1])
_Z_COUNT = tl.constexpr(lognormal._TABLE_Z[2])
_MIN_SIGMA = tl.constexpr(lognormal.MIN_SIGMA)
_ITERATIONS = tl.constexpr(lognormal.MIXTURE_ITERATIONS)


@triton.jit
def _moments_kernel(
    x_ptr, mask_ptr, partial_ptr, n, MASKED: tl.constexpr, BLOCK: tl.constexpr, TILES: tl.constexpr
):
    """Partial [count of finite non-zeros, sum log2|x|, sum log2^2|x|, zeros] of one program's elements, for
    the entries where the mask is non-zero and then (MASKED) for the others, then the largest finite |x| (of
    every entry, in float32)."""
    pid = tl.program_id(0).to(tl.int64)
    count = tl.zeros((BLOCK,), tl.float32)
    sum_log = tl.zeros((BLOCK,), tl.float32)
    sum_log_sq = tl.zeros((BLOCK,), tl.float32)
    zeros = tl.zeros((BLOCK,), tl.float32)
    rest_count = tl.zeros((BLOCK,), tl.float32)
    rest_sum_log = tl.zeros((BLOCK,), tl.float32)
    rest_sum_log_sq = tl.zeros((BLOCK,), tl.float32)
    rest_zeros = tl.zeros((BLOCK,), tl.float32)
    largest = tl.zeros((BLOCK,), tl.float32)
    for tile in range(TILES):
        offsets = (pid * TILES + tile) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32))
        nonzero = inside & (magnitude > 0) & (magnitude < float("inf"))
        zero = inside & (magnitude == 0)
        log_abs = tl.log2(tl.where(nonzero, magnitude, 1.0))  # one instruction; ln = log2 * ln 2 below
        largest = tl.maximum(largest, tl.where(nonzero, magnitude, 0.0))
        if MASKED:
            active = tl.load(mask_ptr + offsets, mask=inside, other=0) != 0
            rest_count += (nonzero & ~active).to(tl.float32)
            rest_sum_log += tl.where(active, 0.0, log_abs)
            rest_sum_log_sq += tl.where(active, 0.0, log_abs * log_abs)
            rest_zeros += (zero & ~active).to(tl.float32)
            nonzero = nonzero & active
            zero = zero & active
            log_abs = tl.where(active, log_abs, 0.0)
        count += nonzero.to(tl.float32)
        sum_log += log_abs
        sum_log_sq += log_abs * log_abs
        zeros += zero.to(tl.float32)
    base = partial_ptr + pid * (9 if MASKED else 5)
    tl.store(base, tl.sum(count, 0))
    tl.store(base + 1, tl.sum(sum_log, 0))
    tl.store(base + 2, tl.sum(sum_log_sq, 0))
    tl.store(base + 3, tl.sum(zeros, 0))
    if MASKED:
        tl.store(base + 4, tl.sum(rest_count, 0))
        tl.store(base + 5, tl.sum(rest_sum_log, 0))
        tl.store(base + 6, tl.sum(rest_sum_log_sq, 0))
        tl.store(base + 7, tl.sum(rest_zeros, 0))
    tl.store(base + (8 if MASKED else 4), tl.max(largest, 0))


@triton.jit
def _field(values, columns, index):
    return tl.sum(tl.where(columns == index, values, 0.0), 0)


@triton.jit
def _fit(count, sum_log, sum_log_sq):
    """(mu, sigma) as `lognormal.fit_lognormal`: the unbiased standard deviation, 0 below two values."""
    mu = sum_log / count
    var = (sum_log_sq - sum_log * mu) / tl.maximum(count - 1.0, 1.0)
    return mu, tl.sqrt(tl.maximum(var, 0.0))


@triton.jit
def _grid_position(value, FIRST: tl.constexpr, LAST: tl.constexpr, COUNT: tl.constexpr):
    """`lognormal._grid_position`: (cell index, fraction) on a uniform grid, clamped, NaN to the first."""
    position = (value - FIRST) * ((COUNT - 1) / (LAST - FIRST))
    position = tl.minimum(tl.maximum(tl.where(position == position, position, 0.0), 0.0), COUNT - 1.0)
    index = tl.minimum(tl.maximum(tl.floor(position), 0.0), COUNT - 2.0)
    return index.to(tl.int32), position - index


@triton.jit
def _table_start(sigma, share, table_ptr):
    """`lognormal._threshold_start`: bilinear interpolation of the tabulated ln alpha_n."""
    row, row_fraction = _grid_position(tl.log(sigma), _SIGMA_FIRST, _SIGMA_LAST, _SIGMA_COUNT)
    column, column_fraction = _grid_position(ndtri_approximate(share), _Z_FIRST, _Z_LAST, _Z_COUNT)
    corner = table_ptr + row * _Z_COUNT + column
    below = tl.load(corner) + (tl.load(corner + 1) - tl.load(corner)) * column_fraction
    upper = corner + _Z_COUNT
    above = tl.load(upper) + (tl.load(upper + 1) - tl.load(upper)) * column_fraction
    return below + (above - below) * row_fraction


@triton.jit
def _sparsity_and_slope(u, sigma):
    """`lognormal._threshold_problem`'s fn: expected sparsity at ln alpha_n = u and its derivative."""
    value, _ = ndtr_and_log(u / sigma)
    _, log_tail = ndtr_and_log((u - sigma * sigma) / sigma)
    slope = tl.exp(sigma * sigma / 2 - u + log_tail)
    return value - slope, slope


@triton.jit
def _mixture_log_threshold(count1, mu1, sigma1, count2, mu2, sigma2, wanted, table_ptr):
    """`lognormal.mixture_log_threshold`, the same steps in float64 registers."""
    total = count1 + count2
    share = wanted / total
    share = tl.minimum(tl.maximum(tl.where(share == share, share, 0.0), 1e-12), 1 - 1e-9)
    weight = count2 / total
    weight = tl.where(weight == weight, weight, 0.0)
    mu2 = tl.where(count2 > 0, mu2, mu1)
    mu1 = tl.where(count1 > 0, mu1, mu2)
    sigma1 = tl.maximum(tl.where(count1 > 0, sigma1, sigma2), _MIN_SIGMA)
    sigma2 = tl.maximum(tl.where(count2 > 0, sigma2, sigma1), _MIN_SIGMA)
    pooled_mu = mu1 + weight * (mu2 - mu1)
    pooled_var = (1 - weight) * sigma1 * sigma1 + weight * sigma2 * sigma2
    pooled_var = pooled_var + weight * (1 - weight) * (mu2 - mu1) * (mu2 - mu1)
    pooled_sigma = tl.maximum(tl.sqrt(pooled_var), _MIN_SIGMA)
    start = pooled_mu + _table_start(pooled_sigma, share, table_ptr)
    room = tl.log(1 - share)
    lo = tl.minimum(-8 * sigma1 - 1 + mu1, -8 * sigma2 - 1 + mu2)
    hi = tl.maximum(
        sigma1 * sigma1 / 2 + 8 * sigma1 + 1 - room + mu1, sigma2 * sigma2 / 2 + 8 * sigma2 + 1 - room + mu2
    )
    u = tl.minimum(tl.maximum(start, lo), hi)
    for _ in range(_ITERATIONS):
        value, slope = _sparsity_and_slope(u - mu1, sigma1)
        if weight > 0:  # a second population
            value2, slope2 = _sparsity_and_slope(u - mu2, sigma2)
            value = value + weight * (value2 - value)
            slope = slope + weight * (slope2 - slope)
        above = value > share
        lo = tl.where(above, lo, u)
        hi = tl.where(above, u, hi)
        newton = u - (value - share) / slope
        inside = (newton >= lo) & (newton <= hi)
        u = tl.where(inside, newton, (lo + hi) / 2)
    return u


@triton.jit
def _round_half_even(value):
    rounded = tl.floor(value + 0.5)
    odd = rounded - 2.0 * tl.floor(rounded * 0.5) != 0
    return tl.where((rounded - value == 0.5) & odd, rounded - 1.0, rounded)


@triton.jit
def _log2_scale(mu, sigma, scale_ptr, POINTS: tl.constexpr, POINTS_BLOCK: tl.constexpr):
    """`compress.layer_log2_scale` of a per-layer rule given as (sigma2, offset) points: round(offset(sigma2)
    - mu2), interpolated linearly, sigma2 clamped to the points (NaN: scale 1)."""
    mu2 = mu / 0.6931471805599453
    sigma2 = sigma / 0.6931471805599453
    index = tl.arange(0, POINTS_BLOCK)
    xs = tl.load(scale_ptr + index, mask=index < POINTS, other=float("inf"))
    ys = tl.load(scale_ptr + POINTS + index, mask=index < POINTS, other=0.0)
    first = tl.load(scale_ptr)
    last = tl.load(scale_ptr + POINTS - 1)
    x = tl.where(sigma2 == sigma2, tl.minimum(tl.maximum(sigma2, first), last), sigma2)
    right = tl.minimum(tl.maximum(tl.sum((xs < x).to(tl.int32), 0), 1), POINTS - 1)
    x0 = _field(xs, index, right - 1)
    x1 = _field(xs, index, right)
    y0 = _field(ys, index, right - 1)
    y1 = _field(ys, index, right)
    log2_scale = y0 + (x - x0) * (y1 - y0) / (x1 - x0) - mu2
    log2_scale = tl.minimum(tl.maximum(tl.where(log2_scale == log2_scale, log2_scale, 0.0), -120.0), 120.0)
    return _round_half_even(log2_scale)


@triton.jit
def _clip_free_log2_scale(amax, MAX_EXPONENT: tl.constexpr, MAX_MANTISSA: tl.constexpr):
    """`gradcomp.ops.stats.clip_free_log2_scale` of a float32 amax for the format's largest value given as
    frexp's exponent and the mantissa field of its float64 bits: from amax's float64 bits, exact; -inf for
    0 (no bound)."""
    bits = amax.to(tl.float64).to(tl.int64, bitcast=True)
    exponent = (bits >> 52) - 1022  # frexp's: amax = m * 2^exponent, m in [0.5, 1)
    larger = (bits & 0xFFFFFFFFFFFFF) > MAX_MANTISSA  # amax's m above the largest value's
    bound = (MAX_EXPONENT - exponent - larger.to(tl.int64)).to(tl.float64)
    return tl.where(amax > 0, bound, float("-inf"))


@triton.jit
def _finish_kernel(
    partial_ptr,
    programs,
    moments_ptr,
    fit_ptr,
    alpha_ptr,
    table_ptr,
    scale_ptr,
    correction_ptr,
    counter_ptr,
    mark_ptr,
    threshold_ptr,
    zeros_ptr,
    numel,
    elements,
    min_zeros,
    MASKED: tl.constexpr,
    FIT: tl.constexpr,
    SPARSITY: tl.constexpr,
    CALIBRATE: tl.constexpr,
    MAX_TARGET: tl.constexpr,
    COUNT_ZEROS: tl.constexpr,
    RULE: tl.constexpr,
    ALPHA_MAX: tl.constexpr,
    SCALE_POINTS: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    SCALE_BOUND: tl.constexpr,
    MAX_EXPONENT: tl.constexpr,
    MAX_MANTISSA: tl.constexpr,
    BLOCK_PARTIALS: tl.constexpr,
):
    """Moments (4, or 8 with a mask) in float64; with FIT, the fit vector (FIT_FIELDS) and, where SPARSITY
    is set (>= 0), the threshold (also in alpha_ptr, capped at ALPHA_MAX, in float32) and, where SCALE_POINTS
    is set, the FP scale, with SCALE_BOUND at least the clip-free scale of the largest finite magnitude for
    the format's largest value (frexp's exponent MAX_EXPONENT and the float64 mantissa field MAX_MANTISSA).
    Partials: rows of the 4 (8) moments and the largest magnitude. CALIBRATE: the threshold aims at
    SPARSITY plus the correction, updated first from the zeros counted since the mark over `elements`,
    where the last threshold pruned (`gradcomp.lognormal.Calibration`)."""
    columns = tl.arange(0, 8)
    fields = 8 if MASKED else 4
    totals = tl.zeros((8,), tl.float64)
    largest = tl.zeros((BLOCK_PARTIALS,), tl.float32)
    for first in range(0, programs, BLOCK_PARTIALS):
        rows = first + tl.arange(0, BLOCK_PARTIALS)
        inside = (rows[:, None] < programs) & (columns[None, :] < fields)
        block = tl.load(partial_ptr + rows[:, None] * (fields + 1) + columns[None, :], mask=inside, other=0.0)
        totals += tl.sum(block.to(tl.float64), 0)
        if SCALE_BOUND:
            row_largest = tl.load(partial_ptr + rows * (fields + 1) + fields, mask=rows < programs, other=0.0)
            largest = tl.maximum(largest, row_largest)
    # log2 to ln: the sums times ln 2, the sums of squares times ln^2 2
    ln2 = 0.6931471805599453
    totals = totals * tl.where((columns % 4) == 1, ln2, tl.where((columns % 4) == 2, ln2 * ln2, 1.0))
    tl.store(moments_ptr + columns, totals, mask=columns < fields)
    if COUNT_ZEROS:  # x's own zeros or min_zeros, the more, added to an int64 counter
        zero_count = tl.sum(tl.where((columns % 4) == 3, totals, 0.0), 0).to(tl.int64)
        tl.store(zeros_ptr, tl.load(zeros_ptr) + tl.maximum(zero_count, min_zeros))
    if FIT:
        count = _field(totals, columns, 0)
        sum_log = _field(totals, columns, 1)
        sum_log_sq = _field(totals, columns, 2)
        zeros = _field(totals, columns, 3)
        rest_count = _field(totals, columns, 4)
        rest_sum_log = _field(totals, columns, 5)
        rest_sum_log_sq = _field(totals, columns, 6)
        rest_zeros = _field(totals, columns, 7)
        n = tl.cast(numel, tl.float64)
        all_zeros = zeros + rest_zeros
        target = SPARSITY
        if CALIBRATE:
            correction = tl.load(correction_ptr)
            counted = tl.load(counter_ptr)
            achieved = (counted - tl.load(mark_ptr)).to(tl.float64) / tl.cast(
                tl.maximum(elements, 1), tl.float64
            )
            updated = tl.minimum(
                tl.maximum(correction + SPARSITY - achieved, -SPARSITY), MAX_TARGET - SPARSITY
            )
            learn = (elements > 0) & (tl.load(threshold_ptr).to(tl.float64) > 0)
            correction = tl.where(learn, updated, correction)
            tl.store(correction_ptr, correction)
            tl.store(mark_ptr, counted)
            target = SPARSITY + correction
        # the population fitted (and reported): the mask's entries, or all of them (without a mask the
        # second population is empty)
        share = (rest_count + rest_zeros) / n
        if not MASKED:
            pooled = share > -1.0
            share = share * float("nan")
        elif RULE == 1:  # the reference rule fits every entry where the masked share reaches the target
            pooled = share >= target
        elif RULE == 2:
            pooled = share > -1.0
        else:
            pooled = share < -1.0
        fitted_count = tl.where(pooled, count + rest_count, count)
        mu, sigma = _fit(
            fitted_count,
            tl.where(pooled, sum_log + rest_sum_log, sum_log),
            tl.where(pooled, sum_log_sq + rest_sum_log_sq, sum_log_sq),
        )
        rest_mu, rest_sigma = _fit(rest_count, rest_sum_log, rest_sum_log_sq)
        tl.store(fit_ptr, mu)
        tl.store(fit_ptr + 1, sigma)
        tl.store(fit_ptr + 2, share)
        if SPARSITY >= 0:
            wanted = target * n - all_zeros
            if RULE == 1:  # the masked entries count as zeros
                wanted = tl.where(pooled, wanted, wanted - rest_count)
            second = tl.where(pooled, 0.0, rest_count) if RULE == 0 else 0.0 * rest_count
            log_alpha = _mixture_log_threshold(
                fitted_count, mu, sigma, second, rest_mu, rest_sigma, wanted, table_ptr
            )
            alpha = tl.exp(log_alpha)
            alpha = tl.where((wanted > 0) & (fitted_count + second > 0) & (alpha < float("inf")), alpha, 0.0)
            tl.store(fit_ptr + 3, alpha)
            tl.store(alpha_ptr, tl.minimum(alpha, ALPHA_MAX).to(tl.float32))
        else:
            tl.store(fit_ptr + 3, float("nan"))
        if SCALE_POINTS > 0:
            log2_scale = _log2_scale(mu, sigma, scale_ptr, SCALE_POINTS, SCALE_BLOCK)
            if SCALE_BOUND:
                floor = _clip_free_log2_scale(tl.max(largest, 0), MAX_EXPONENT, MAX_MANTISSA)
                log2_scale = tl.minimum(tl.maximum(log2_scale, floor), 120.0)
            tl.store(fit_ptr + 4, ((log2_scale.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True))
        else:
            tl.store(fit_ptr + 4, float("nan"))


@triton.jit
def _thresholds_kernel(moments_ptr, numel_ptr, numel, out_ptr, table_ptr, SPARSITY: tl.constexpr,
                       NUMEL_PER_ROW: tl.constexpr):  # fmt: skip
    """`gradcomp.ops.lognormal_threshold_from_moments` of one row of moments (count, sum ln, sum ln^2,
    zeros) per program: the threshold solve of `_finish_kernel` with one population."""
    row = tl.program_id(0).to(tl.int64)
    count = tl.load(moments_ptr + row * 4)
    zeros = tl.load(moments_ptr + row * 4 + 3)
    n = tl.load(numel_ptr + row).to(tl.float64) if NUMEL_PER_ROW else tl.cast(numel, tl.float64)
    mu, sigma = _fit(count, tl.load(moments_ptr + row * 4 + 1), tl.load(moments_ptr + row * 4 + 2))
    wanted = SPARSITY * n - zeros
    alpha = tl.exp(_mixture_log_threshold(count, mu, sigma, 0.0 * count, mu, sigma, wanted, table_ptr))
    tl.store(out_ptr + row, tl.where((wanted > 0) & (count > 0) & (alpha < float("inf")), alpha, 0.0))


def thresholds_triton(moments: Tensor, numel: int | Tensor, sparsity: float) -> Tensor:
    """One threshold (float64) per row of float64 moments (rows, 4); numel an int or one per row."""
    out = torch.empty(moments.shape[0], dtype=torch.float64, device=moments.device)
    per_row = isinstance(numel, Tensor)
    launch(
        _thresholds_kernel,
        (moments.shape[0],),
        moments,
        numel if per_row else moments,
        0 if per_row else numel,
        out,
        lognormal._threshold_table(moments.device),
        SPARSITY=float(sparsity),
        NUMEL_PER_ROW=per_row,
        num_warps=1,
    )
    return out


def statistics_triton(
    x: Tensor,
    mask: Tensor | None,
    sparsity: float | None = None,
    rule: str = "mixture",
    scale_points: Tensor | None = None,
    fit: bool = True,
    calibration: Calibration | None = None,
    zeros: Tensor | None = None,
    min_zeros: int = 0,
    max_value: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(moments, fit, alpha): two launches. moments float64 (4,) or (2, 4) with a mask; fit float64 over
    FIT_FIELDS (NaN where not asked); alpha the threshold in float32 capped at x's largest value (empty when
    no sparsity is given). scale_points: float64 (2, P) of (sigma2, log2 scale offset) for the FP scale.
    calibration: see `gradcomp.lognormal.Calibration`; zeros: an int64 counter to which x's zeros or
    min_zeros, the more, are added; max_value: the FP format's largest value that bounds the scale below
    (`gradcomp.ops.stats.fit_statistics`)."""
    x_flat = x.contiguous().view(-1)
    mask_flat = None if mask is None else mask.contiguous().view(-1)
    n = x_flat.numel()
    programs = max(1, triton.cdiv(n, BLOCK * TILES_PER_PROGRAM))
    fields = 4 if mask is None else 8
    partial = torch.empty((programs, fields + 1), dtype=torch.float32, device=x.device)  # + the largest |x|
    max_bits = struct.unpack("<q", struct.pack("<d", max_value or 0.0))[0]
    launch(
        _moments_kernel,
        (programs,),
        x_flat,
        x_flat if mask_flat is None else mask_flat,
        partial,
        n,
        MASKED=mask is not None,
        BLOCK=BLOCK,
        TILES=TILES_PER_PROGRAM,
    )
    moments = torch.empty(fields, dtype=torch.float64, device=x.device)
    fitted = torch.empty(len(FIT_FIELDS), dtype=torch.float64, device=x.device)
    alpha = torch.empty((), dtype=torch.float32, device=x.device)
    launch(
        _finish_kernel,
        (1,),
        partial,
        programs,
        moments,
        fitted,
        alpha,
        lognormal._threshold_table(x.device) if sparsity is not None else moments,
        moments if scale_points is None else scale_points,
        moments if calibration is None else calibration.correction,
        alpha if calibration is None else calibration.counter,
        alpha if calibration is None else calibration.mark,
        alpha if calibration is None else calibration.threshold,
        alpha if zeros is None else zeros,
        n,
        0 if calibration is None else calibration.elements,
        min_zeros,
        MASKED=mask is not None,
        FIT=fit,
        SPARSITY=-1.0 if sparsity is None else float(sparsity),
        CALIBRATE=calibration is not None,
        MAX_TARGET=lognormal.MAX_CALIBRATED_TARGET,
        COUNT_ZEROS=zeros is not None,
        RULE=RULES.index(rule),
        ALPHA_MAX=float(torch.finfo(x.dtype).max),
        SCALE_POINTS=0 if scale_points is None else scale_points.shape[1],
        SCALE_BLOCK=64 if scale_points is None else triton.next_power_of_2(scale_points.shape[1]),
        SCALE_BOUND=max_value is not None,
        MAX_EXPONENT=(max_bits >> 52) - 1022,
        MAX_MANTISSA=max_bits & ((1 << 52) - 1),
        BLOCK_PARTIALS=BLOCK_PARTIALS,
        num_warps=1,  # one program of scalar work: more warps would only repeat it
    )
    return moments.view(2, 4) if mask is not None else moments, fitted, alpha
