"""quantize_fp: round neural gradients to a low-bit floating-point grid, with a per-tensor scale.

Rounding works on the float32 bit pattern (float64 for float64 inputs), which makes it exact:
* in the format's normal range the discarded low mantissa bits are rounded on the integer bit pattern
  (carries into the exponent are correct by construction);
* ties of nearest rounding go to the neighbour whose code (exponent and mantissa fields read as one
  integer) is even, i.e. an even mantissa, or an even exponent field when M = 0, as in IEEE 754;
* below the smallest normal the grid is uniform with quantum 2^qe; nearest rounding adds and subtracts
  2^(qe + mantissa bits of the compute type) (one IEEE rounding, so ties go to even), and stochastic rounding
  compares the exact fraction with 32 random bits.
Stochastic rounding is exactly unbiased whenever the discarded part fits in 32 random bits (always in the
normal range); below that its probabilities are resolved to 2^-32 of one quantum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from gradcomp._backend import Backend, FloatLayout, check_float, compute_layout, use_triton
from gradcomp.formats import FPFormat, parse_format
from gradcomp.rng import random_bits, resolve_seed

Rounding = Literal["nearest", "stochastic"]


def _split_pow2(exponent: int) -> tuple[float, float]:
    """2^exponent as two normal float32 factors (the exponent may exceed float32's range)."""
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
            clamp=fmt.max_value if fmt.overflow == "saturate" else float_max,
            max_value=fmt.max_value,
            overflow_to_inf=fmt.overflow == "inf",
            magic=2.0 ** (quantum_exp + layout.man_bits),
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
    is not positive and finite makes the output NaN (it is not checked on the host, to avoid a sync).
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
    xc = x.to(layout.float_dtype).contiguous()
    y = xc * scale
    y_bits = y.view(layout.int_dtype)
    sign = y_bits & layout.sign_mask
    magnitude_bits = y_bits & layout.abs_mask
    magnitude = magnitude_bits.view(layout.float_dtype)
    torch.clamp_(magnitude, max=plan.clamp)

    rounded_bits = magnitude_bits.clone()
    d = plan.discard_bits
    random = random_bits(seed, x.numel(), x.device).view(x.shape) if stochastic else None
    if d > 0:
        if stochastic:
            rounded_bits += _top_random_bits(random, d, layout)
        else:
            rounded_bits += (1 << (d - 1)) - 1
            rounded_bits += ((magnitude_bits >> d) + plan.tie_offset) & 1
        rounded_bits &= -(1 << d)
    rounded = rounded_bits.view(layout.float_dtype)

    small = magnitude_bits < plan.min_normal_bits
    if small.any():
        tiny = magnitude[small]
        if stochastic:
            rounded[small] = _stochastic_quanta(tiny, random[small], plan)
        else:
            rounded[small] = (tiny + plan.magic) - plan.magic
    if plan.overflow_to_inf:
        rounded.masked_fill_(rounded > plan.max_value, math.inf)
    rounded_bits |= sign
    out = rounded * torch.reciprocal(scale)
    out = torch.where(torch.isfinite(xc), out, xc)
    out = torch.where((scale > 0) & torch.isfinite(scale), out, math.nan)
    return out.to(x.dtype)


def _top_random_bits(random: Tensor, count: int, layout: FloatLayout) -> Tensor:
    """`count` uniform random bits as a non-negative integer (32 random bits, shifted up for float64)."""
    if count <= 32:
        return (random >> (32 - count)) & ((1 << count) - 1)
    return (random.to(layout.int_dtype) & 0xFFFFFFFF) << (count - 32)


def _stochastic_quanta(magnitude: Tensor, random: Tensor, plan: RoundingPlan) -> Tensor:
    """Stochastic rounding to the uniform grid below min_normal: up with probability = the exact fraction."""
    t = magnitude * plan.to_quanta[0] * plan.to_quanta[1]
    whole = torch.floor(t)
    threshold = torch.ceil((t - whole) * 2.0**32).to(torch.int64)
    up = (random.to(torch.int64) & 0xFFFFFFFF) < threshold
    return (whole + up) * plan.from_quanta[0] * plan.from_quanta[1]
