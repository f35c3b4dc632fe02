"""Triton kernel of `gradcomp.ops.quantize_fp`: the same bit-level algorithm, one element per lane."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp.kernels.rng import random_uint32, uniform24
from gradcomp.rng import as_int32, seed_keys

BLOCK = 1024


@triton.jit
def _quantize_fp_kernel(
    x_ptr,
    out_ptr,
    scale_ptr,
    inv_scale_ptr,
    n,
    k0,
    k1,
    DISCARD: tl.constexpr,
    TIE_OFFSET: tl.constexpr,
    MIN_NORMAL: tl.constexpr,
    CLAMP: tl.constexpr,
    MAX_VALUE: tl.constexpr,
    OVERFLOW_TO_INF: tl.constexpr,
    MAGIC: tl.constexpr,
    TO_Q0: tl.constexpr,
    TO_Q1: tl.constexpr,
    FROM_Q0: tl.constexpr,
    FROM_Q1: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr)
    y = x * scale
    y_bits = y.to(tl.int32, bitcast=True)
    sign = y_bits & -2147483648
    magnitude = tl.minimum((y_bits & 0x7FFFFFFF).to(tl.float32, bitcast=True), CLAMP)
    magnitude_bits = magnitude.to(tl.int32, bitcast=True)

    if STOCHASTIC:
        random = random_uint32(offsets, k0, k1)
    if DISCARD > 0:
        if STOCHASTIC:
            rounded_bits = magnitude_bits + (random >> (32 - DISCARD)).to(tl.int32)
        else:
            rounded_bits = (
                magnitude_bits + ((1 << (DISCARD - 1)) - 1) + (((magnitude_bits >> DISCARD) + TIE_OFFSET) & 1)
            )
        rounded_bits = rounded_bits & -(1 << DISCARD)
    else:
        rounded_bits = magnitude_bits
    rounded = rounded_bits.to(tl.float32, bitcast=True)

    in_subnormal_range = magnitude < MIN_NORMAL
    tiny = tl.where(in_subnormal_range, magnitude, 0.0)  # keeps the unused lanes finite
    if STOCHASTIC:
        t = tiny * TO_Q0 * TO_Q1
        whole = tl.floor(t)
        up = uniform24(random) < (t - whole) * 16777216.0
        small = (whole + up.to(tl.float32)) * FROM_Q0 * FROM_Q1
    else:
        small = (tiny + MAGIC) - MAGIC
    rounded = tl.where(in_subnormal_range, small, rounded)
    if OVERFLOW_TO_INF:
        rounded = tl.where(rounded > MAX_VALUE, float("inf"), rounded)
    rounded = (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    out = rounded * tl.load(inv_scale_ptr)
    finite = tl.abs(x) < float("inf")
    out = tl.where(finite, out, x)
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def quantize_fp_triton(
    x: Tensor, plan, scale: Tensor, stochastic: bool, seed: int, block: int = BLOCK
) -> Tensor:
    """Launch on a float16/bfloat16/float32 tensor; `plan` is the op's `RoundingPlan` for float32."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"quantize_fp kernel takes float16/bfloat16/float32, got {x.dtype}")
    x_flat = x.contiguous().view(-1)
    out = torch.empty_like(x_flat)
    k0, k1 = seed_keys(seed)
    n = x_flat.numel()
    scale = scale.to(torch.float32)
    # a bad scale turns every finite output into NaN through the inverse scale (no host check)
    inverse_scale = torch.where((scale > 0) & torch.isfinite(scale), torch.reciprocal(scale), math.nan)
    _quantize_fp_kernel[(triton.cdiv(n, block),)](
        x_flat,
        out,
        scale,
        inverse_scale,
        n,
        as_int32(k0),
        as_int32(k1),
        DISCARD=plan.discard_bits,
        TIE_OFFSET=plan.tie_offset,
        MIN_NORMAL=plan.min_normal,
        CLAMP=plan.clamp,
        MAX_VALUE=plan.max_value,
        OVERFLOW_TO_INF=plan.overflow_to_inf,
        MAGIC=plan.magic,
        TO_Q0=plan.to_quanta[0],
        TO_Q1=plan.to_quanta[1],
        FROM_Q0=plan.from_quanta[0],
        FROM_Q1=plan.from_quanta[1],
        STOCHASTIC=stochastic,
        BLOCK=block,
        enable_fp_fusion=False,
    )
    return out.view(x.shape)
