"""The rounding plan of a floating-point format: what the torch path of `quantize_fp` and its Triton kernel
both need to round to a format's grid in float32 (float64 for float64 inputs), computed once per format and
compute type, so that the two implementations agree bit for bit.

Values that may be float32 subnormals also come as bit patterns: the kernel compares those on the bits,
because Triton makes a float constant below 2^-126 a float64.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass

import torch

from gradcomp._backend import FloatLayout
from gradcomp.formats import FPFormat

FLOAT32_MIN_NORMAL = 2.0**-126
NORMALISE_EXP = 24  # 2^24 takes float32 magnitudes below 2^-126 into the normal range (an even exponent)


def _split_pow2(exponent: int) -> tuple[float, float]:
    """2^exponent as two normal float32 factors (the exponent may exceed float32's range); the second is 1
    when one factor is enough."""
    if -126 <= exponent <= 127:
        return 2.0**exponent, 1.0
    first = exponent // 2
    return 2.0**first, 2.0 ** (exponent - first)


def float_bits(value: float, layout: FloatLayout) -> int:
    """Bit pattern of `value` in the compute type (subnormal values included)."""
    float_code, int_code = ("<f", "<i") if layout.float_dtype == torch.float32 else ("<d", "<q")
    return struct.unpack(int_code, struct.pack(float_code, value))[0]


@dataclass(frozen=True)
class RoundingPlan:
    """Everything the torch path and the kernel need to round to `fmt` in `layout` (shared so they agree)."""

    discard_bits: int  # low mantissa bits dropped in the normal range
    tie_offset: int  # added to the kept LSB so that ties go to the even code of the target format
    min_normal: float
    min_normal_bits: int
    bound: float  # magnitudes are clamped here before rounding (saturation: the dtype may lower it)
    bound_bits: int
    max_value: float
    max_value_bits: int
    overflow_value: float | None  # results above max_value become this (Inf or NaN); None: saturation
    floor_bits: int  # smaller results become this: the smallest value of a format without zero (else 0)
    signed: bool
    negative_zero: bool  # False: a zero result is +0 (the format has no -0 code)
    magic: float  # 2^(qe + mantissa bits): nearest rounding to the uniform grid below min_normal
    # nearest rounding with a per-element magic constant (formats with subnormals, M >= 1, and room above
    # the top binade): the constant's bits are max(|y| bits, min_normal bits) & exponent mask + magic_offset
    per_element_magic: bool
    magic_offset: int
    exponent_mask: int
    to_quanta: tuple[float, float]  # multiply by both: x / 2^qe
    from_quanta: tuple[float, float]  # multiply by both: n * 2^qe
    # the plan for magnitudes below 2^-126 in float32, taken times 2^NORMALISE_EXP (formats with grid points
    # below 2^-125: their rounding needs the mantissa bits float32 drops there); None when not needed
    normalised: RoundingPlan | None

    @classmethod
    @functools.lru_cache(maxsize=256)
    def build(cls, fmt: FPFormat, layout: FloatLayout, shift: int = 0) -> RoundingPlan:
        """The plan for `fmt` in `layout`; for magnitudes 2^shift times larger (the grid times 2^shift) where
        shift is given: only the fields of the rounding itself then change."""
        quantum_exp = (fmt.emin - fmt.man_bits if fmt.subnormals else fmt.emin) + shift
        min_normal = 2.0 ** (fmt.emin + shift)
        float_max = float(torch.finfo(layout.float_dtype).max)
        overflow_value = {"saturate": None, "inf": math.inf, "nan": math.nan}[fmt.overflow]
        # beyond the bound everything rounds to max_value (saturate) or overflows
        bound = min(
            (fmt.max_value if overflow_value is None else 2.0 ** (fmt.emax + 1)) * 2.0**shift, float_max
        )
        normalise = shift == 0 and layout.float_dtype == torch.float32 and fmt.min_subnormal < 2.0**-125
        return cls(
            discard_bits=layout.man_bits - fmt.man_bits,
            # with M = 0 the kept LSB is the exponent field's; the compute type's bias is odd, so the target
            # field's parity differs from it by bias + 1
            tie_offset=(fmt.bias + 1) % 2 if fmt.man_bits == 0 else 0,
            min_normal=min_normal,
            min_normal_bits=float_bits(min_normal, layout),
            bound=bound,
            bound_bits=float_bits(bound, layout),
            max_value=fmt.max_value,
            max_value_bits=float_bits(fmt.max_value, layout),
            overflow_value=overflow_value,
            floor_bits=0 if fmt.zero else float_bits(fmt.min_normal, layout),
            signed=fmt.signed,
            negative_zero=fmt.signed and fmt.reserved != "neg_zero",
            magic=2.0 ** (quantum_exp + layout.man_bits),
            per_element_magic=fmt.subnormals
            and fmt.man_bits >= 1
            and fmt.emax + shift + 1 + layout.man_bits - fmt.man_bits < layout.exp_bias,
            magic_offset=(layout.man_bits - fmt.man_bits) << layout.man_bits,
            exponent_mask=layout.abs_mask & -(1 << layout.man_bits),
            to_quanta=_split_pow2(-quantum_exp),
            from_quanta=_split_pow2(quantum_exp),
            normalised=cls.build(fmt, layout, NORMALISE_EXP) if normalise else None,
        )
