"""quantize_fp: round neural gradients to a low-bit floating-point grid, with a per-tensor scale.

Rounding works in float32 (float64 for float64 inputs) and is exact:
* in the format's normal range the Triton kernel rounds the discarded low mantissa bits on the integer bit
  pattern (carries into the exponent are correct by construction); the torch path gets the same nearest
  rounding from the FPU by adding and subtracting 2^(e - M + mantissa bits of the compute type), a constant
  built per element from its exponent e; stochastic rounding adds random bits below the kept mantissa;
* ties of nearest rounding go to the neighbour whose code (exponent and mantissa fields read as one
  integer) is even, i.e. an even mantissa, or an even exponent field when M = 0, as in IEEE 754;
* below the smallest normal the grid is uniform with quantum 2^qe; nearest rounding adds and subtracts
  2^(qe + mantissa bits of the compute type) (one IEEE rounding, so ties go to even), and stochastic rounding
  compares the exact fraction with 24 random bits.
Stochastic rounding is exactly unbiased in the normal range (at most 23 discarded bits, all compared with
random bits); below it, the probability of rounding up is resolved to 2^-24, a bias below 2^-24 of one
quantum per element, as for the other stochastic ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from torch import Tensor

from gradcomp._backend import Backend, FloatLayout, check_float, compute_layout, use_triton
from gradcomp.formats import FPFormat, parse_format
from gradcomp.ops._chunked import map_chunks
from gradcomp.rng import random_bits, resolve_seed, uniform24

Rounding = Literal["nearest", "stochastic"]


def _split_pow2(exponent: int) -> tuple[float, float]:
    """2^exponent as two normal float32 factors (the exponent may exceed float32's range); the second is 1
    when one factor is enough."""
    if -126 <= exponent <= 127:
        return 2.0**exponent, 1.0
    first = exponent // 2
    return 2.0**first, 2.0 ** (exponent - first)


@dataclass(frozen=True)
class RoundingPlan:
    """Everything the torch path and the kernel need to round to `fmt` in `layout` (shared so they agree)."""

    discard_bits: int  # low mantissa bits dropped in the normal range
    tie_offset: int  # added to the kept LSB so that ties go to the even code of the target format
    min_normal: float
    min_normal_bits: int
    clamp: float  # magnitudes are clamped here before rounding
    max_value: float
    overflow_to_inf: bool
    magic: float  # 2^(qe + mantissa bits): nearest rounding to the uniform grid below min_normal
    # nearest rounding with a per-element magic constant (formats with subnormals, M >= 1, and room above
    # the top binade): the constant's bits are max(|y| bits, min_normal bits) & exponent mask + magic_offset
    per_element_magic: bool
    magic_offset: int
    exponent_mask: int
    to_quanta: tuple[float, float]  # multiply by both: x / 2^qe
    from_quanta: tuple[float, float]  # multiply by both: n * 2^qe

    @classmethod
    def build(cls, fmt: FPFormat, layout: FloatLayout) -> RoundingPlan:
        quantum_exp = fmt.emin - fmt.man_bits if fmt.subnormals else fmt.emin
        float_max = float(torch.finfo(layout.float_dtype).max)
        return cls(
            discard_bits=layout.man_bits - fmt.man_bits,
            # with M = 0 the kept LSB is the exponent field's; the compute type's bias is odd, so the target
            # field's parity differs from it by bias + 1
            tie_offset=(fmt.bias + 1) % 2 if fmt.man_bits == 0 else 0,
            min_normal=fmt.min_normal,
            min_normal_bits=layout.pow2_bits(fmt.emin),
            # beyond the clamp everything rounds to max_value (saturate) or overflows (inf)
            clamp=fmt.max_value if fmt.overflow == "saturate" else min(2.0 ** (fmt.emax + 1), float_max),
            max_value=fmt.max_value,
            overflow_to_inf=fmt.overflow == "inf",
            magic=2.0 ** (quantum_exp + layout.man_bits),
            per_element_magic=fmt.subnormals
            and fmt.man_bits >= 1
            and fmt.emax + 1 + layout.man_bits - fmt.man_bits < layout.exp_bias,
            magic_offset=(layout.man_bits - fmt.man_bits) << layout.man_bits,
            exponent_mask=layout.abs_mask & -(1 << layout.man_bits),
            to_quanta=_split_pow2(-quantum_exp),
            from_quanta=_split_pow2(quantum_exp),
        )


def quantize_fp(
    x: Tensor,
    fmt: FPFormat | str,
    scale: float | Tensor = 1.0,
    rounding: Rounding = "nearest",
    seed: int | None = None,
    backend: Backend = "auto",
) -> Tensor:
    """Q(x * scale) * (1 / scale) in x's dtype and shape, Q rounding to `fmt`'s grid.

    rounding: "nearest" (ties to even) or "stochastic" (unbiased; random bits from (seed, element index),
    a fresh seed from torch's generator when seed is None).
    scale: a positive finite float or 0-d tensor; powers of two keep the scaling exact. A tensor scale that
    is not positive and finite makes every finite input's output NaN (the kernel does not check it on the
    host, to avoid a sync).
    Non-finite inputs pass through unchanged (NaN stays NaN, +-Inf stays +-Inf); finite values beyond the
    format's range give +-max_value (overflow="saturate") or +-Inf (overflow="inf"). The result is computed
    in float32 (float64 for float64 input) and rounded once more to x's dtype.
    """
    check_float(x, "quantize_fp")
    fmt = parse_format(fmt)
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    if not isinstance(scale, Tensor):
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be positive and finite, got {scale}")
    elif scale.numel() != 1:
        raise ValueError(f"scale must be a number or a one-element tensor, got shape {tuple(scale.shape)}")
    layout = compute_layout(x.dtype)
    scale_t = torch.as_tensor(scale, dtype=layout.float_dtype, device=x.device).reshape(())
    seed = resolve_seed(seed) if rounding == "stochastic" else 0
    plan = RoundingPlan.build(fmt, layout)
    if x.numel() == 0:
        return x.clone()
    if use_triton(x, backend):
        from gradcomp.kernels.fp_quant import quantize_fp_triton

        return quantize_fp_triton(x, plan, scale_t, rounding == "stochastic", seed)
    return _quantize_fp_torch(x, plan, layout, scale_t, rounding == "stochastic", seed)


def _quantize_fp_torch(
    x: Tensor, plan: RoundingPlan, layout: FloatLayout, scale: Tensor, stochastic: bool, seed: int
) -> Tensor:
    scale_ok = (scale > 0) & torch.isfinite(scale)
    # a bad tensor scale turns every finite output into NaN through the inverse scale
    inverse_scale = torch.where(scale_ok, torch.reciprocal(scale), math.nan)
    unit_scale = bool(scale == 1)  # a host sync, harmless for this path (CPU tensors, or forced "torch")
    if stochastic:
        round_magnitude = partial(_round_stochastic, plan=plan, layout=layout, seed=seed)
    elif plan.per_element_magic:
        round_magnitude = partial(_round_nearest_magic, plan=plan, layout=layout)
    else:
        round_magnitude = partial(_round_nearest_bits, plan=plan, layout=layout)

    def quantize_chunk(chunk: Tensor, offset: int) -> Tensor:
        values = chunk.to(layout.float_dtype)
        scaled = values if unit_scale else values * scale
        magnitude = torch.clamp(scaled.abs(), max=plan.clamp)
        rounded = round_magnitude(magnitude, offset)
        if plan.overflow_to_inf:
            rounded.masked_fill_(rounded > plan.max_value, math.inf)
        out = torch.copysign(rounded, scaled)
        if not unit_scale:
            out *= inverse_scale
        if torch.isfinite(values.sum()):  # one cheap reduction spares the select in the common case
            return out
        return torch.where(torch.isfinite(values), out, values)

    return map_chunks(x, quantize_chunk)


def _round_nearest_magic(magnitude: Tensor, offset: int, plan: RoundingPlan, layout: FloatLayout) -> Tensor:
    """Nearest rounding by the FPU: (a + C) - C with C = 2^(max(e, emin) - M + mantissa bits of a)."""
    magic_bits = torch.clamp_min(magnitude.view(layout.int_dtype), plan.min_normal_bits)
    magic_bits &= plan.exponent_mask
    magic_bits += plan.magic_offset
    magic = magic_bits.view(layout.float_dtype)
    rounded = magnitude + magic
    rounded -= magic
    return rounded


def _round_nearest_bits(magnitude: Tensor, offset: int, plan: RoundingPlan, layout: FloatLayout) -> Tensor:
    """Nearest rounding on the bit pattern (any format), with the uniform grid below min_normal."""
    magnitude_bits = magnitude.view(layout.int_dtype)
    d = plan.discard_bits
    rounded_bits = magnitude_bits + ((1 << (d - 1)) - 1 if d > 0 else 0)
    if d > 0:
        rounded_bits += ((magnitude_bits >> d) + plan.tie_offset) & 1
        rounded_bits &= -(1 << d)
    rounded = rounded_bits.view(layout.float_dtype)
    small = magnitude < plan.min_normal
    if small.any():
        tiny = torch.where(small, magnitude, 0.0)
        rounded = torch.where(small, (tiny + plan.magic) - plan.magic, rounded)
    return rounded


def _round_stochastic(
    magnitude: Tensor, offset: int, plan: RoundingPlan, layout: FloatLayout, seed: int
) -> Tensor:
    """Stochastic rounding: random bits added below the kept mantissa, exact fractions below min_normal."""
    random = random_bits(seed, magnitude.numel(), magnitude.device, offset)
    d = plan.discard_bits
    rounded_bits = magnitude.view(layout.int_dtype) + (_top_random_bits(random, d, layout) if d > 0 else 0)
    if d > 0:
        rounded_bits &= -(1 << d)
    rounded = rounded_bits.view(layout.float_dtype)
    small = magnitude < plan.min_normal
    if small.any():  # the other lanes compute garbage (possibly inf/NaN) that where() discards
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
    return _times(whole + (uniform24(random) < t), plan.from_quanta)


def _times(x: Tensor, factors: tuple[float, float]) -> Tensor:
    x = x * factors[0]
    return x * factors[1] if factors[1] != 1.0 else x
