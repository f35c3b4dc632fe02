"""quantize_fp: round neural gradients to a low-bit floating-point grid, with a per-tensor scale.

Rounding works in float32 (float64 for float64 inputs) and is exact:
* in the format's normal range the Triton kernel rounds the discarded low mantissa bits on the integer bit
  pattern (carries into the exponent are correct by construction); the torch path gets the same nearest
  rounding from the FPU by adding and subtracting 2^(e - M + mantissa bits of the compute type), a constant
  built per element from its exponent e; stochastic rounding adds random bits below the kept mantissa;
* float32 has no full mantissa below 2^-126, and x * scale can be rounded there before the format sees it:
  for formats with grid points below 2^-125 (E = 8, or a bias above 120) such elements are rounded on
  x * (scale * 2^24) against the grid scaled by 2^24 (exact products for a power-of-two scale; 2^24 keeps
  the exponent field's parity, which the ties of M = 0 read), and the result scaled back (exact);
* ties of nearest rounding go to the neighbour whose code (exponent and mantissa fields read as one
  integer) is even, i.e. an even mantissa, or an even exponent field when M = 0, as if the exponent range
  were unbounded (IEEE 754's roundTiesToEven); a result above max_value then overflows. The ml_dtypes and
  torch casts to float8_e8m0fnu (M = 0) round its ties up instead;
* below the smallest normal the grid is uniform with quantum 2^qe; nearest rounding adds and subtracts
  2^(qe + mantissa bits of the compute type) (one IEEE rounding, so ties go to even), and stochastic rounding
  compares the exact fraction with 24 random bits.
Stochastic rounding is exactly unbiased in the normal range up to max_value (at most 23 discarded bits, all
compared with random bits); below it, the probability of rounding up is resolved to 2^-24, a bias below 2^-24
of one quantum per element, as for the other stochastic ops; beyond max_value the format's overflow applies.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from gradcomp._backend import Backend, FloatLayout, check_float, compiling, compute_layout, use_triton
from gradcomp.choices import ROUNDINGS, choose
from gradcomp.formats import FPFormat, parse_format
from gradcomp.formats.rounding import FLOAT32_MIN_NORMAL, NORMALISE_EXP, RoundingPlan
from gradcomp.ops._chunked import map_chunks
from gradcomp.ops.stats import add_zero_count, check_counter
from gradcomp.rng import random_bits, resolve_seed, uniform24

Rounding = Literal["nearest", "stochastic"]


def quantize_fp(
    x: Tensor,
    fmt: FPFormat | str,
    scale: float | Tensor = 1.0,
    rounding: Rounding = "nearest",
    seed: int | None = None,
    backend: Backend = "auto",
    count_zeros_into: Tensor | None = None,
) -> Tensor:
    """Q(x * scale) * (1 / scale) in x's dtype and shape, Q rounding to `fmt`'s grid.

    rounding: "nearest" (ties to even) or "stochastic" (unbiased within the format's range: a value beyond
    max_value becomes what `fmt.overflow` says, so a saturating format's E[out] is below x there; random
    bits from (seed, element index), a fresh seed from torch's generator when seed is None).
    scale: a positive number that is finite, with a finite reciprocal, in the compute type (float32; float64
    for float64 input), else ValueError; or a one-element tensor. Powers of two keep the scaling exact. A
    tensor scale that is not positive and finite in the compute type, or whose reciprocal overflows there,
    makes every finite input's output NaN (the kernel does not check it on the host, to avoid a sync); on
    CUDA it is read by the kernel where it lies (a tensor on another device is copied there first).
    Non-finite inputs pass through unchanged (NaN stays NaN, +-Inf stays +-Inf, whatever the format; a dtype
    cast would give the format's NaN, Inf or max instead). Finite values beyond the format's range give
    +-max_value (overflow="saturate"), +-Inf ("inf") or NaN ("nan"). Saturation stops at the largest value of
    the grid whose output x's dtype holds (for float16, 57344 rather than FPFormat(5, 2)'s 114688), so finite
    inputs give finite outputs; with "inf" or "nan", a grid value beyond x's dtype becomes Inf in the final
    rounding to it. Formats without -0 (reserved="neg_zero") give +0 for zero results; unsigned formats give
    NaN for negative inputs and +0 (or their smallest value, without zero) for -0. The result is computed in
    float32 (float64 for float64 input) and rounded once more to x's dtype. count_zeros_into: an int64
    one-element tensor on x's device to which the number of zeros of the output is added (on CUDA in the
    same kernel, without a host sync). Not differentiable: x is detached and the result does not require
    grad.
    """
    x = check_float(x, "quantize_fp")
    fmt = parse_format(fmt)
    choose("rounding", rounding, ROUNDINGS)
    layout = compute_layout(x.dtype)
    if isinstance(scale, Tensor):
        if scale.numel() != 1:
            raise ValueError(
                f"scale must be a number or a one-element tensor, got shape {tuple(scale.shape)}"
            )
        inverse = None
    elif isinstance(scale, bool) or not isinstance(scale, int | float):
        raise TypeError(f"scale must be a float or a one-element tensor, got {type(scale).__name__}")
    else:
        inverse = _checked_inverse(scale, layout, x.dtype)
    check_counter(count_zeros_into, x)
    seed = resolve_seed(seed) if rounding == "stochastic" else 0
    plan = RoundingPlan.build(fmt, layout)
    if x.numel() == 0:
        return x.clone()
    stochastic = rounding == "stochastic"
    if use_triton(x, backend):
        from gradcomp.kernels.fp_quant import quantize_fp_triton

        if inverse is None:
            kernel_scale: float | Tensor = scale.to(x.device) if scale.device != x.device else scale
        else:
            kernel_scale = float(np.float32(scale))
        return quantize_fp_triton(x, plan, kernel_scale, inverse, stochastic, seed, count_zeros_into)
    scale_t, inverse_scale = _scale_tensors(scale, inverse, layout, x.device)
    bound = _magnitude_bound(scale, scale_t, plan, layout, x.dtype)
    out = _quantize_fp_torch(x, plan, layout, scale_t, inverse_scale, bound, stochastic, seed)
    return add_zero_count(out, count_zeros_into)


def _checked_inverse(scale: float, layout: FloatLayout, dtype: torch.dtype) -> float:
    """1/scale in the compute type, where scale and 1/scale must be positive and finite."""
    number = np.float32 if layout.float_dtype == torch.float32 else np.float64
    with np.errstate(over="ignore", divide="ignore"):
        value = number(scale)
        inverse = number(1) / value
    if not (value > 0 and np.isfinite(value) and np.isfinite(inverse)):
        raise ValueError(
            f"scale must be positive, and it and 1/scale finite in {layout.float_dtype} (what quantize_fp "
            f"computes in for {dtype} input), got {scale}"
        )
    return float(inverse)


def _scale_tensors(
    scale: float | Tensor, inverse: float | None, layout: FloatLayout, device: torch.device
) -> tuple[Tensor, Tensor]:
    """scale and 1/scale as 0-d tensors of the compute type; `inverse` is 1/scale computed on the host for
    a number, None for a tensor scale. A tensor scale that is not positive and finite, or whose reciprocal
    overflows, gets a NaN inverse (NaN outputs) rather than a host check (a sync)."""
    if inverse is not None:
        values = torch.tensor([scale, inverse], dtype=layout.float_dtype, device=device)
        return values[0], values[1]
    scale_t = torch.as_tensor(scale, dtype=layout.float_dtype, device=device).reshape(())
    inverse_t = torch.reciprocal(scale_t)
    ok = (scale_t > 0) & torch.isfinite(scale_t) & torch.isfinite(inverse_t)
    return scale_t, torch.where(ok, inverse_t, math.nan)


def _magnitude_bound(
    scale: float | Tensor, scale_t: Tensor, plan: RoundingPlan, layout: FloatLayout, dtype: torch.dtype
) -> Tensor | float:
    """Where |x * scale| is clamped before rounding: the plan's bound, lowered for saturating formats to the
    largest grid value whose output x's dtype holds (the kernel computes the same from the scale)."""
    out_max = float(torch.finfo(dtype).max)
    if plan.overflow_value is not None:
        return plan.bound
    if not isinstance(scale, Tensor):  # the product in the compute type, as on the device, but on the host
        number = np.float32 if layout.float_dtype == torch.float32 else np.float64
        with np.errstate(over="ignore"):
            if number(scale) * number(out_max) >= plan.max_value:
                return plan.bound
    return _round_down(scale_t * out_max, plan, layout)


def _round_down(value: Tensor, plan: RoundingPlan, layout: FloatLayout) -> Tensor:
    """The largest grid value not above `value` (positive, at least 2^-126), capped at max_value."""
    bits = value.view(layout.int_dtype)
    if plan.discard_bits > 0:
        bits = bits & -(1 << plan.discard_bits)
    in_quanta = torch.floor(_times(value, plan.to_quanta))
    rounded = torch.where(
        value < plan.min_normal, _times(in_quanta, plan.from_quanta), bits.view(value.dtype)
    )
    if plan.floor_bits:
        rounded = torch.clamp_min(rounded, plan.min_normal)
    return torch.clamp_max(rounded, plan.max_value)


def _quantize_fp_torch(
    x: Tensor,
    plan: RoundingPlan,
    layout: FloatLayout,
    scale: Tensor,
    inverse_scale: Tensor,
    bound: Tensor | float,
    stochastic: bool,
    seed: int,
) -> Tensor:
    unit_scale = bool(scale == 1)  # a host sync, harmless for this path (CPU tensors, or forced "torch")
    out_max = float(torch.finfo(x.dtype).max)
    if plan.normalised is not None:  # capped, so that x = 0 gives 0 rather than NaN for a huge scale
        normalised_scale = torch.clamp_max(scale * 2.0**NORMALISE_EXP, torch.finfo(layout.float_dtype).max)

    def quantize_chunk(chunk: Tensor, offset: int) -> Tensor:
        values = chunk.to(layout.float_dtype)
        scaled = values if unit_scale else values * scale
        magnitude = torch.clamp(scaled.abs(), max=bound)
        random = random_bits(seed, chunk.numel(), chunk.device, offset) if stochastic else None
        rounded = _round(magnitude, random, plan, layout)
        below = magnitude < FLOAT32_MIN_NORMAL if plan.normalised is not None else None
        if below is not None and below.any():  # x * scale was rounded to fewer bits: round x * scale * 2^24
            normalised = torch.clamp_max((values * normalised_scale).abs(), plan.normalised.bound)
            rounded_up = _round(normalised, random, plan.normalised, layout)
            rounded = torch.where(below, rounded_up * 2.0**-NORMALISE_EXP, rounded)
        if plan.floor_bits:
            rounded = torch.clamp_min(rounded, plan.min_normal)
        if plan.overflow_value is not None:
            rounded.masked_fill_(rounded > plan.max_value, plan.overflow_value)
        out = _apply_sign(rounded, values, plan)
        if not unit_scale:
            out *= inverse_scale
            if plan.overflow_value is None:  # 1/scale is rounded: keep saturated outputs finite
                out.clamp_(-out_max, out_max)
        if torch.isfinite(values.sum()):  # one cheap reduction spares the select in the common case
            return out
        return torch.where(torch.isfinite(values), out, values)

    return map_chunks(x, quantize_chunk)


def _apply_sign(rounded: Tensor, values: Tensor, plan: RoundingPlan) -> Tensor:
    """x's sign (that of x * scale; it survives underflow) on the rounded magnitude, as far as the format
    has codes for it."""
    if not plan.signed:
        return torch.where(values < 0, math.nan, rounded)
    out = torch.copysign(rounded, values)
    return out if plan.negative_zero else torch.where(rounded == 0, 0.0, out)


def _round(magnitude: Tensor, random: Tensor | None, plan: RoundingPlan, layout: FloatLayout) -> Tensor:
    """Stochastic rounding with these random bits, or nearest rounding when there are none."""
    if random is not None:
        return _round_stochastic(magnitude, random, plan, layout)
    if plan.per_element_magic:
        return _round_nearest_magic(magnitude, plan, layout)
    return _round_nearest_bits(magnitude, plan, layout)


def _round_nearest_magic(magnitude: Tensor, plan: RoundingPlan, layout: FloatLayout) -> Tensor:
    """Nearest rounding by the FPU: (a + C) - C with C = 2^(max(e, emin) - M + mantissa bits of a)."""
    magic_bits = torch.clamp_min(magnitude.view(layout.int_dtype), plan.min_normal_bits)
    magic_bits &= plan.exponent_mask
    magic_bits += plan.magic_offset
    magic = magic_bits.view(layout.float_dtype)
    rounded = magnitude + magic
    rounded -= magic
    return rounded


def _round_nearest_bits(magnitude: Tensor, plan: RoundingPlan, layout: FloatLayout) -> Tensor:
    """Nearest rounding on the bit pattern (any format), with the uniform grid below min_normal."""
    d = plan.discard_bits
    bits = magnitude.view(layout.int_dtype)
    if d > 0:
        bits = (bits + (1 << (d - 1)) - 1 + (((bits >> d) + plan.tie_offset) & 1)) & -(1 << d)
    rounded = bits.view(layout.float_dtype)
    small = magnitude < plan.min_normal
    if compiling() or small.any():  # compiled: branch-free (the same values)
        tiny = torch.where(small, magnitude, 0.0)
        rounded = torch.where(small, (tiny + plan.magic) - plan.magic, rounded)
    return rounded


def _round_stochastic(magnitude: Tensor, random: Tensor, plan: RoundingPlan, layout: FloatLayout) -> Tensor:
    """Stochastic rounding: random bits added below the kept mantissa, exact fractions below min_normal."""
    d = plan.discard_bits
    bits = magnitude.view(layout.int_dtype)
    if d > 0:
        bits = (bits + _top_random_bits(random, d, layout)) & -(1 << d)
    rounded = bits.view(layout.float_dtype)
    small = magnitude < plan.min_normal
    # the other lanes compute garbage (possibly inf/NaN) that where() discards; compiled: branch-free
    if compiling() or small.any():
        rounded = torch.where(small, _stochastic_quanta(magnitude, random, plan), rounded)
    return rounded


def _top_random_bits(random: Tensor, count: int, layout: FloatLayout) -> Tensor:
    """`count` uniform random bits as a non-negative integer (32 random bits, shifted up for float64)."""
    if count <= 32:
        return (random >> (32 - count)) & ((1 << count) - 1)
    return (random.to(layout.int_dtype) & 0xFFFFFFFF) << (count - 32)


def _stochastic_quanta(magnitude: Tensor, random: Tensor, plan: RoundingPlan) -> Tensor:
    """Stochastic rounding on the uniform grid below min_normal: up with probability = the fraction."""
    t = _times(magnitude, plan.to_quanta)
    whole = torch.floor(t)
    t -= whole
    t *= 2.0**24
    if compiling():  # ceil(clamp(t - u, 0, 1)) is 1 where u < t, as exact arithmetic:
        # inductor stores a compared mask element by element where a custom operator splits the loop (3x)
        return _times(whole + torch.ceil(torch.clamp(t - uniform24(random), 0.0, 1.0)), plan.from_quanta)
    return _times(whole + (uniform24(random) < t), plan.from_quanta)


def _times(x: Tensor, factors: tuple[float, float]) -> Tensor:
    x = x * factors[0]
    return x * factors[1] if factors[1] != 1.0 else x
