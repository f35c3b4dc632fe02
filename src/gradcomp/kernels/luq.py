"""Triton kernels of `gradcomp.ops.quantize_luq`: the largest finite magnitude (one pass writing a maximum
per program, one program turning them into alpha, the underflow's keep scale and alpha, and the SMP sum's
scale), then one elementwise launch per SMP sample, the last of which averages, writes x's dtype and counts
the zeros."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp._backend import compute_layout
from gradcomp.formats.luq import lowest_level_exponent, smp_spread
from gradcomp.kernels import elementwise_grid
from gradcomp.kernels.floats import to_storage
from gradcomp.kernels.rng import block_random_uint32, uniform24
from gradcomp.profiling import launch
from gradcomp.rng import as_int32, seed_keys

MAX_BLOCK = 4096
MAX_TILES = 16  # elements per program of the maximum: MAX_BLOCK * MAX_TILES
PARTIALS_BLOCK = 1024


@triton.jit
def _largest_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr, TILES: tl.constexpr):
    """The largest finite |x| of this program's BLOCK * TILES elements."""
    start = tl.program_id(0).to(tl.int64) * BLOCK * TILES
    lanes = tl.arange(0, BLOCK)
    largest = tl.zeros((BLOCK,), tl.float32)
    for tile in range(TILES):
        offsets = start + tile * BLOCK + lanes
        magnitude = tl.abs(tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32))
        largest = tl.maximum(largest, tl.where(magnitude < float("inf"), magnitude, 0.0))
    tl.store(partial_ptr + tl.program_id(0), tl.max(largest, 0))


@triton.jit
def _power_of_two_below(q, LOWEST: tl.constexpr):
    """`gradcomp.ops.luq._power_of_two_below` of float32 q."""
    exponent = tl.minimum(tl.maximum((q.to(tl.int32, bitcast=True) >> 23) & 0xFF, 127 + LOWEST), 254)
    return (exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def _alpha_kernel(
    partial_ptr,
    programs,
    params_ptr,
    LOWEST: tl.constexpr,
    LOWEST_LEVEL: tl.constexpr,
    TOP: tl.constexpr,
    SMALLEST: tl.constexpr,
    SUM_FROM: tl.constexpr,
    SUM_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """params = (alpha, keep scale, alpha of the underflow, SMP sum scale) as the torch path forms them:
    `_alpha`; stochastic_prune's `alpha_in_compute_dtype` of it (whose rounding to x's dtype leaves alpha
    as it is, so it is left out) and its keep scale nextafter(2^24 / that, inf); `smp_spread`'s scale."""
    largest = tl.zeros((BLOCK,), tl.float32)
    for first in range(0, programs, BLOCK):
        rows = first + tl.arange(0, BLOCK)
        largest = tl.maximum(largest, tl.load(partial_ptr + rows, mask=rows < programs, other=0.0))
    largest = tl.max(largest, 0)
    binades = tl.math.div_rn(_power_of_two_below(largest, LOWEST), LOWEST_LEVEL)
    alpha = tl.math.div_rn(largest, tl.minimum(binades, TOP))
    prune_alpha = tl.where(alpha >= SMALLEST, alpha, 0.0)
    quotient = tl.math.div_rn(16777216.0, prune_alpha)
    next_up = (quotient.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True)
    tl.store(params_ptr, alpha)
    tl.store(params_ptr + 1, tl.where(quotient < float("inf"), next_up, quotient))
    tl.store(params_ptr + 2, prune_alpha)
    tl.store(params_ptr + 3, tl.where(largest >= SUM_FROM, SUM_SCALE, 1.0))


@triton.jit
def _luq_kernel(
    x_ptr,
    total_ptr,
    out_ptr,
    params_ptr,
    n,
    k0,
    k1,
    zeros_ptr,
    SAMPLE: tl.constexpr,
    SAMPLES: tl.constexpr,
    COUNT_ZEROS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One draw of `_luq_chunk` (its operations in its order), added to the running total of the samples;
    the last sample writes the mean in x's dtype."""
    alpha = tl.load(params_ptr)
    keep_scale = tl.load(params_ptr + 1)
    prune_alpha = tl.load(params_ptr + 2)
    sum_scale = tl.load(params_ptr + 3)
    start = tl.program_id(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    mask = lanes < n - start
    raw = tl.load(x_ptr + start + lanes, mask=mask, other=0.0)
    x = raw.to(tl.float32)
    magnitude = tl.abs(x)
    random = uniform24(block_random_uint32(start, lanes, k0, k1))
    pruned = (random < magnitude * keep_scale).to(tl.float32) * tl.maximum(magnitude, prune_alpha)
    low = alpha * _power_of_two_below(tl.math.div_rn(magnitude, alpha), 0)
    low = tl.where(magnitude < low, low * 0.5, low)
    up = random < (tl.math.div_rn(magnitude, low) - 1.0) * 16777216.0
    rounded = low * (1.0 + up.to(tl.float32))
    value = tl.where(magnitude < alpha, pruned, rounded)
    value = tl.where(magnitude < float("inf"), value, magnitude)
    value = tl.where(alpha > 0.0, value, magnitude)
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    value = (value.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    previous = tl.zeros((BLOCK,), tl.float32)
    if SAMPLE > 0:
        previous = tl.load(total_ptr + start + lanes, mask=mask, other=0.0)
    total = previous + value * sum_scale
    if SAMPLE == SAMPLES - 1:
        mean = total if SAMPLES == 1 else tl.math.div_rn(tl.math.div_rn(total, SAMPLES * 1.0), sum_scale)
        out = to_storage(mean, out_ptr.dtype.element_ty)
        out = tl.where(raw != raw, raw, out)
        tl.store(out_ptr + start + lanes, out, mask=mask)
        if COUNT_ZEROS:
            tl.atomic_add(zeros_ptr, tl.sum(((out == 0.0) & mask).to(tl.int64)))
    else:
        tl.store(total_ptr + start + lanes, total, mask=mask)


def quantize_luq_triton(x: Tensor, bits: int, seeds: list[int], zeros: Tensor | None = None) -> Tensor:
    """`quantize_luq` on a kernel dtype (float32 compute), one sample per seed; zeros: an int64 counter of
    the output's zeros."""
    samples = len(seeds)
    x_flat = x.contiguous().view(-1)
    n = x_flat.numel()
    programs = triton.cdiv(n, MAX_BLOCK * MAX_TILES)
    partial = torch.empty(programs, dtype=torch.float32, device=x.device)
    launch(_largest_kernel, (programs,), x_flat, partial, n, BLOCK=MAX_BLOCK, TILES=MAX_TILES)
    params = torch.empty(4, dtype=torch.float32, device=x.device)
    lowest = lowest_level_exponent(torch.finfo(x.dtype).tiny)
    sum_from, sum_scale = smp_spread(samples, compute_layout(torch.float32).exp_bias)
    launch(
        _alpha_kernel,
        (1,),
        partial,
        programs,
        params,
        LOWEST=lowest,
        LOWEST_LEVEL=2.0**lowest,
        TOP=2.0 ** (2 ** (bits - 1) - 1),
        SMALLEST=2.0**24 / float(torch.finfo(compute_layout(x.dtype).float_dtype).max),
        SUM_FROM=sum_from,
        SUM_SCALE=sum_scale,
        BLOCK=PARTIALS_BLOCK,
        num_warps=4,
    )
    out = torch.empty_like(x_flat)
    total = torch.empty(n if samples > 1 else 1, dtype=torch.float32, device=x.device)
    grid, block, warps = elementwise_grid(n)
    for sample, draw_seed in enumerate(seeds):
        k0, k1 = seed_keys(draw_seed)
        launch(
            _luq_kernel,
            (grid,),
            x_flat,
            total,
            out,
            params,
            n,
            as_int32(k0),
            as_int32(k1),
            x_flat if zeros is None else zeros,
            SAMPLE=sample,
            SAMPLES=samples,
            COUNT_ZEROS=zeros is not None,
            BLOCK=block,
            num_warps=warps,
            enable_fp_fusion=False,
        )
    return out.view(x.shape)
