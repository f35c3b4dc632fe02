"""Triton kernel of `gradcomp.ops.quantize_fp`: the same bit-level algorithm, one element per lane, in one
launch (the scale comes as a kernel argument or is read from device memory; counting the output's zeros is
fused into the same pass).

Format values that may be float32 subnormals (min_normal, max_value, the smallest value of a format without
zero) come as bit patterns and are compared on the bits of non-negative floats (the same order): Triton
would make a float constant below 2^-126 a float64."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp.formats.rounding import RoundingPlan
from gradcomp.kernels import elementwise_grid
from gradcomp.kernels.floats import to_storage
from gradcomp.kernels.rng import block_random_uint32, uniform24
from gradcomp.profiling import launch
from gradcomp.rng import as_int32, seed_keys


class Grid(NamedTuple):
    """A `RoundingPlan`'s float32 rounding as one constexpr of `round_magnitude`: the low mantissa bits
    dropped and the tie offset (normal range), and below the smallest normal its bits, the magic constant of
    nearest rounding and the factors to and from quanta."""

    discard: int
    tie_offset: int
    min_normal_bits: int
    magic: float
    to_q0: float
    to_q1: float
    from_q0: float
    from_q1: float

    @classmethod
    def of(cls, plan: RoundingPlan) -> Grid:
        return cls(
            plan.discard_bits, plan.tie_offset, plan.min_normal_bits, plan.magic, *plan.to_quanta,
            *plan.from_quanta,
        )  # fmt: skip


@triton.jit
def round_magnitude(magnitude, random, GRID: tl.constexpr, STOCHASTIC: tl.constexpr):
    """Nearest or stochastic rounding of non-negative magnitudes to one plan's grid (`Grid`)."""
    magnitude_bits = magnitude.to(tl.int32, bitcast=True)
    if GRID.discard > 0:
        if STOCHASTIC:
            rounded_bits = magnitude_bits + (random >> (32 - GRID.discard)).to(tl.int32)
        else:
            rounded_bits = (
                magnitude_bits
                + ((1 << (GRID.discard - 1)) - 1)
                + (((magnitude_bits >> GRID.discard) + GRID.tie_offset) & 1)
            )
        rounded_bits = rounded_bits & -(1 << GRID.discard)
    else:
        rounded_bits = magnitude_bits
    rounded = rounded_bits.to(tl.float32, bitcast=True)

    in_subnormal_range = magnitude_bits < GRID.min_normal_bits
    tiny = tl.where(in_subnormal_range, magnitude, 0.0)  # keeps the unused lanes finite
    if STOCHASTIC:
        t = tiny * GRID.to_q0 * GRID.to_q1
        whole = tl.floor(t)
        up = uniform24(random) < (t - whole) * 16777216.0
        small = (whole + up.to(tl.float32)) * GRID.from_q0 * GRID.from_q1
    else:
        small = (tiny + GRID.magic) - GRID.magic
    return tl.where(in_subnormal_range, small, rounded)


@triton.jit
def _largest_grid_bits(value, GRID: tl.constexpr, FLOOR_BITS: tl.constexpr, MAX_VALUE_BITS: tl.constexpr):
    """Bits of the largest grid value not above `value` (positive, at least 2^-126), at most max_value: the
    torch path's `_round_down`."""
    bits = value.to(tl.int32, bitcast=True)
    if GRID.discard > 0:
        bits = bits & -(1 << GRID.discard)
    in_quanta = tl.floor(value * GRID.to_q0 * GRID.to_q1) * GRID.from_q0 * GRID.from_q1
    bits = tl.where(
        value.to(tl.int32, bitcast=True) < GRID.min_normal_bits, in_quanta.to(tl.int32, bitcast=True), bits
    )
    return tl.minimum(tl.maximum(bits, FLOOR_BITS), MAX_VALUE_BITS)


@triton.jit
def _quantize_fp_kernel(
    x_ptr,
    out_ptr,
    scale,
    inverse_scale,
    n,
    k0,
    k1,
    zeros_ptr,
    GRID: tl.constexpr,
    BOUND_BITS: tl.constexpr,
    NORMALISE: tl.constexpr,
    N_BOUND: tl.constexpr,
    N_GRID: tl.constexpr,
    MAX_VALUE_BITS: tl.constexpr,
    OVERFLOWS: tl.constexpr,
    OVERFLOW_VALUE: tl.constexpr,
    FLOOR_BITS: tl.constexpr,
    SIGNED: tl.constexpr,
    NEGATIVE_ZERO: tl.constexpr,
    OUT_MAX: tl.constexpr,
    SCALE_IN_MEMORY: tl.constexpr,
    COUNT_ZEROS: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """scale and inverse_scale are float32 arguments, or (SCALE_IN_MEMORY) scale points to a one-element
    tensor and the inverse is computed here as the torch path does (NaN unless both are positive and
    finite)."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    mask = lanes < n - start
    x = tl.load(x_ptr + start + lanes, mask=mask, other=0.0).to(tl.float32)
    if SCALE_IN_MEMORY:
        scale = tl.load(scale).to(tl.float32)
        inverse = tl.math.div_rn(1.0, scale)
        usable = (scale > 0.0) & (scale < float("inf")) & (inverse < float("inf"))
        inverse_scale = tl.where(usable, inverse, float("nan"))
    else:  # float32 arguments (the interpreter passes Python floats)
        scale = tl.cast(scale, tl.float32)
        inverse_scale = tl.cast(inverse_scale, tl.float32)
    magnitude_bits = tl.minimum(tl.abs(x * scale).to(tl.int32, bitcast=True), BOUND_BITS)  # NaN: the bound
    if not OVERFLOWS:  # saturation stops at the largest grid value whose output x's dtype holds
        limit = _largest_grid_bits(scale * OUT_MAX, GRID, FLOOR_BITS, MAX_VALUE_BITS)
        magnitude_bits = tl.minimum(magnitude_bits, limit)
    magnitude = magnitude_bits.to(tl.float32, bitcast=True)
    random = block_random_uint32(start, lanes, k0, k1) if STOCHASTIC else 0
    rounded = round_magnitude(magnitude, random, GRID, STOCHASTIC)
    if NORMALISE:  # below 2^-126: x * (scale * 2^24) against the grid times 2^24 (the N_ plan)
        normalised_scale = tl.minimum(scale * 16777216.0, 3.4028234663852886e38)
        normalised = tl.minimum(tl.abs(x * normalised_scale), N_BOUND)
        rounded_up = round_magnitude(normalised, random, N_GRID, STOCHASTIC)
        rounded = tl.where(magnitude < 1.1754943508222875e-38, rounded_up * 5.9604644775390625e-08, rounded)
    rounded_bits = rounded.to(tl.int32, bitcast=True)
    if FLOOR_BITS > 0:
        rounded_bits = tl.maximum(rounded_bits, FLOOR_BITS)
    rounded = rounded_bits.to(tl.float32, bitcast=True)
    if OVERFLOWS:
        rounded = tl.where(rounded_bits > MAX_VALUE_BITS, OVERFLOW_VALUE, rounded)
    if SIGNED:  # x's sign: that of x * scale, and it survives underflow
        sign = x.to(tl.int32, bitcast=True) & -2147483648
        if not NEGATIVE_ZERO:
            sign = tl.where(rounded == 0.0, 0, sign)
        rounded = (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    else:
        rounded = tl.where(x < 0.0, float("nan"), rounded)
    out = rounded * inverse_scale
    if not OVERFLOWS:  # saturation: 1/scale is rounded, keep the outputs within x's dtype
        out = tl.where(out > OUT_MAX, OUT_MAX, tl.where(out < -OUT_MAX, -OUT_MAX, out))
    finite = tl.abs(x) < float("inf")
    out = to_storage(tl.where(finite, out, x), out_ptr.dtype.element_ty)
    tl.store(out_ptr + start + lanes, out, mask=mask)
    if COUNT_ZEROS:
        tl.atomic_add(zeros_ptr, tl.sum(((out == 0.0) & mask).to(tl.int64)))


def quantize_fp_triton(
    x: Tensor,
    plan: RoundingPlan,
    scale: float | Tensor,
    inverse_scale: float | None,
    stochastic: bool,
    seed: int,
    zeros: Tensor | None = None,
    block: int | None = None,
) -> Tensor:
    """Launch on a float16/bfloat16/float32 tensor; `plan` is the op's `RoundingPlan` for float32. `scale` is
    a number (with its float32 inverse computed by the op) or a one-element tensor on x's device (read there).
    `zeros` (int64, one element): the output's zeros are added to it."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"quantize_fp kernel takes float16/bfloat16/float32, got {x.dtype}")
    x_flat = x.contiguous().view(-1)
    out = torch.empty_like(x_flat)
    k0, k1 = seed_keys(seed)
    n = x_flat.numel()
    programs, block, warps = elementwise_grid(n, block)
    normalised = plan.normalised or plan  # the N_ constants are unused without it
    in_memory = isinstance(scale, Tensor)
    launch(
        _quantize_fp_kernel,
        (programs,),
        x_flat,
        out,
        scale,
        0.0 if in_memory else inverse_scale,
        n,
        as_int32(k0),
        as_int32(k1),
        x_flat if zeros is None else zeros,
        GRID=Grid.of(plan),
        BOUND_BITS=plan.bound_bits,
        NORMALISE=plan.normalised is not None,
        N_BOUND=normalised.bound,
        N_GRID=Grid.of(normalised)._replace(discard=plan.discard_bits, tie_offset=plan.tie_offset),
        MAX_VALUE_BITS=plan.max_value_bits,
        OVERFLOWS=plan.overflow_value is not None,
        OVERFLOW_VALUE=plan.overflow_value or 0.0,
        FLOOR_BITS=plan.floor_bits,
        SIGNED=plan.signed,
        NEGATIVE_ZERO=plan.negative_zero,
        OUT_MAX=float(torch.finfo(x.dtype).max),
        SCALE_IN_MEMORY=in_memory,
        COUNT_ZEROS=zeros is not None,
        STOCHASTIC=stochastic,
        BLOCK=block,
        num_warps=warps,
        enable_fp_fusion=False,
    )
    return out.view(x.shape)
