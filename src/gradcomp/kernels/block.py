"""Triton kernel of `gradcomp.ops.quantize_block`: the torch implementation's operations in its order, on
tiles of whole blocks (rows of block_size elements), so that the result is the same bit for bit. MX is one
launch. The two-level formats (NVFP4) need the tensor's largest magnitude (after the transform) before any
block: the same kernel first writes one maximum per program, one program turns them into the per-tensor
scale, and the kernel runs again to quantize.

The kernel sees the format as a few constexprs derived from the `BlockFormat` once (`_constants`, cached by
value): the scale rule as one code (`RULES`), the element's and the scale's constants and the transform's,
each a named tuple; each rule's arithmetic is a `@triton.jit` helper of its own."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp._backend import compute_layout
from gradcomp.formats.block import (
    FLOAT32_MAX,
    FOUR_OVER_SIX_ENCODE,
    BlockFormat,
    prescale_shift,
    transform_norm,
)
from gradcomp.formats.rounding import RoundingPlan, float_bits
from gradcomp.kernels.floats import to_storage
from gradcomp.kernels.fp_quant import Grid, round_magnitude
from gradcomp.kernels.hadamard import butterfly, transform_signs
from gradcomp.kernels.rng import random_uint32
from gradcomp.profiling import launch
from gradcomp.rng import SIGN_COUNTER, as_int32, seed_keys

TILE = 2048  # elements per program
PARTIALS_BLOCK = 1024
FLOAT32 = compute_layout(torch.float32)

# The scale rule of a (scale kind, rule) as the kernel's one code: the MX rules below TWO_LEVEL, the
# two-level ones from it, those whose scales come from the tensor's largest magnitude (TE's, Four Over
# Six's) from TE.
RULES = {
    ("mx", "floor"): 0,
    ("mx", "ceil"): 1,
    ("mx", "three_quarters"): 2,
    ("two_level", "floor"): 3,
    ("two_level", "ceil"): 4,
    ("two_level", "reciprocal"): 5,
    ("two_level", "te"): 6,
    ("two_level", "four_over_six"): 7,
}
MX_CEIL = tl.constexpr(RULES["mx", "ceil"])
THREE_QUARTERS = tl.constexpr(RULES["mx", "three_quarters"])
TWO_LEVEL = tl.constexpr(RULES["two_level", "floor"])
TWO_LEVEL_CEIL = tl.constexpr(RULES["two_level", "ceil"])
RECIPROCAL = tl.constexpr(RULES["two_level", "reciprocal"])
TE = tl.constexpr(RULES["two_level", "te"])
FOUR_OVER_SIX = tl.constexpr(RULES["two_level", "four_over_six"])
F32_MAX = tl.constexpr(FLOAT32_MAX)
ENCODE_4_6 = tl.constexpr(FOUR_OVER_SIX_ENCODE)


class Element(NamedTuple):
    """The element format's constants: its largest value, emax, the 23 mantissa bits of its largest value,
    whether it has -0, its rounding, and TE's constants of its largest value."""

    max_value: float
    emax: int
    max_mantissa: int
    negative_zero: bool
    grid: Grid
    te_encode: float
    te_reciprocal: float
    te_decode: float


class Scale(NamedTuple):
    """A two-level format's block-scale constants: the clamp range, the ulp's bits (``ceil``), the
    per-tensor scale's floor, the ``reciprocal`` rule's constant and the scale format's rounding."""

    minimum: float
    maximum: float
    ulp: int
    tensor_floor: float
    reciprocal_constant: float
    grid: Grid


class Transform(NamedTuple):
    """The Hadamard transform's constants: its size (0: none), log2 of it, 1/sqrt(size), the block maximum
    from which a block is prescaled, the prescale and its inverse, whether its signs are random, and their
    counter offset."""

    size: int
    stages: int
    norm: float
    big: float
    down: float
    up: float
    signs: bool
    sign_counter: int


@triton.jit
def _transformed(values, finite, s0, s1, ROWS: tl.constexpr, SIZE: tl.constexpr, T: tl.constexpr):
    """(the values the scales are taken of, where the output is computed, the signs, each block's 2^P or 1):
    the transform of each group of T.size with only finite values (blocks prescaled as `prescales` says),
    or the finite values themselves."""
    if T.size > 0:
        groups = tl.reshape(finite.to(tl.int32), [ROWS * SIZE // T.size, T.size])
        whole = tl.reshape(
            tl.broadcast_to(tl.min(groups, 1)[:, None], [ROWS * SIZE // T.size, T.size]), [ROWS, SIZE]
        )
        finite = whole != 0
        signs = transform_signs(tl.arange(0, T.size), s0, s1, T.signs, T.sign_counter)[None, :]
        kept = tl.where(finite, values, 0.0)
        big = tl.max(tl.abs(kept), 1)[:, None] >= T.big
        unscale = tl.where(big, T.up, 1.0)
        zeroed = tl.reshape(kept * tl.where(big, T.down, 1.0), [ROWS * SIZE // T.size, T.size])
        transformed = tl.reshape(
            butterfly(zeroed * signs, ROWS * SIZE // T.size, T.size, T.stages, T.norm), [ROWS, SIZE]
        )
    else:
        signs = 1.0
        unscale = 1.0
        transformed = tl.where(finite, values, 0.0)
    return transformed, finite, signs, unscale


@triton.jit
def _block_kernel(
    x_ptr,
    out_ptr,
    partial_ptr,
    tensor_scale_ptr,
    rows_total,
    row_blocks,
    length,
    k0,
    k1,
    s0,
    s1,
    zeros_ptr,
    SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    STAGES: tl.constexpr,
    RULE: tl.constexpr,
    ELEMENT: tl.constexpr,
    SCALE: tl.constexpr,
    TRANSFORM: tl.constexpr,
    OUTER_ROWS: tl.constexpr,
    OUT_MAX: tl.constexpr,
    MAXIMA_ONLY: tl.constexpr,
    COUNT_ZEROS: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    columns = tl.arange(0, SIZE)
    inside = (rows[:, None] < rows_total) & (columns[None, :] < SIZE)
    offsets = rows[:, None] * SIZE + columns[None, :]
    raw = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    values = raw.to(tl.float32)
    transformed, finite, signs, unscale = _transformed(
        values, tl.abs(values) < float("inf"), s0, s1, ROWS, SIZE, TRANSFORM
    )
    magnitude = tl.abs(transformed)
    amax = tl.max(magnitude, 1)[:, None]
    if MAXIMA_ONLY:  # the per-tensor scale's candidates, of the blocks as they are (not prescaled)
        if RULE >= TE:  # the tensor's largest magnitude
            tl.store(partial_ptr + tl.program_id(0), tl.max(amax))
        else:
            ratio = tl.math.div_rn(amax, ELEMENT.max_value * SCALE.maximum) * unscale
            tl.store(partial_ptr + tl.program_id(0), tl.max(ratio))
    else:
        random = random_uint32(offsets, k0, k1) if STOCHASTIC else 0
        if RULE == FOUR_OVER_SIX:
            out, scale = _four_over_six(
                magnitude, amax, tl.load(tensor_scale_ptr), random, ROWS, SIZE, STAGES, ELEMENT, SCALE,
                STOCHASTIC,
            )  # fmt: skip
            # a block at a zero scale has +0 elements (the authors' code): no sign to keep
            transformed = tl.where(scale > 0.0, transformed, 0.0)
        else:
            if RULE == TE:
                scaled, total = _te_scales(magnitude, amax, tl.load(tensor_scale_ptr), ELEMENT, SCALE)
            elif RULE >= TWO_LEVEL:
                scaled, total = _two_level_scales(
                    magnitude, amax, unscale, tensor_scale_ptr, ROWS, RULE, OUTER_ROWS, ELEMENT, SCALE
                )
            else:
                scaled, total = _mx_scales(magnitude, amax, RULE, ELEMENT)
            rounded = round_magnitude(tl.minimum(scaled, ELEMENT.max_value), random, ELEMENT.grid, STOCHASTIC)
            if RULE == THREE_QUARTERS:
                rounded = tl.math.div_rn(rounded, tl.zeros_like(rounded) + 3.0)
            out = rounded * total
        _finish(
            out, transformed, values, raw, finite, signs, unscale, offsets, inside, rows, columns, row_blocks,
            length, out_ptr, zeros_ptr, ROWS, SIZE, TRANSFORM, ELEMENT.negative_zero, OUT_MAX, COUNT_ZEROS,
        )  # fmt: skip


@triton.jit
def _mx_scales(magnitude, amax, RULE: tl.constexpr, ELEMENT: tl.constexpr):
    """OCP MX's power-of-two scales (floor, ceil, three_quarters; `gradcomp.ops.block.mx_exponent`): (the
    magnitudes in units of the block's scale, the scale)."""
    normal = amax >= 1.1754943508222875e-38
    bits = tl.where(normal, amax, amax * 16777216.0).to(tl.int32, bitcast=True)
    exponent = (bits >> 23) - tl.where(normal, 127, 151) - ELEMENT.emax
    if RULE == MX_CEIL:
        exponent += ((bits & 0x7FFFFF) > ELEMENT.max_mantissa).to(tl.int32)
    exponent = tl.minimum(tl.maximum(tl.where(amax > 0.0, exponent, -127), -127), 127)
    if RULE == THREE_QUARTERS:
        exponent += 2
        scaled = magnitude * _power_of_two(-exponent) * 3.0
    else:
        scaled = magnitude * _power_of_two(-exponent)
    return scaled, _power_of_two(exponent)


@triton.jit
def _two_level_scales(magnitude, amax, unscale, tensor_scale_ptr, ROWS: tl.constexpr, RULE: tl.constexpr,
                      OUTER_ROWS: tl.constexpr, ELEMENT: tl.constexpr, SCALE: tl.constexpr):  # fmt: skip
    """torchao's two-level scales (floor, ceil, reciprocal; `gradcomp.ops.block._two_level_scales`): (the
    magnitudes in units of the block's total scale, that scale); the float32 scale per tensor (read) or per
    outer block of OUTER_ROWS rows (whole within the tile)."""
    if OUTER_ROWS > 0:
        ratio = tl.math.div_rn(amax, ELEMENT.max_value * SCALE.maximum) * unscale
        groups = tl.max(tl.reshape(ratio, [ROWS // OUTER_ROWS, OUTER_ROWS]), 1)[:, None]
        groups = tl.broadcast_to(tl.maximum(groups, SCALE.tensor_floor), [ROWS // OUTER_ROWS, OUTER_ROWS])
        tensor_scale = tl.reshape(groups, [ROWS, 1])
    else:
        tensor_scale = tl.load(tensor_scale_ptr)
    block_scale = tl.math.div_rn(tl.math.div_rn(amax, ELEMENT.max_value), tensor_scale) * unscale
    if RULE == RECIPROCAL:  # the reciprocal clamped and rounded; a zero block's (inf) clamps to the maximum
        reciprocal = tl.math.div_rn(tl.zeros_like(block_scale) + SCALE.reciprocal_constant, block_scale)
        reciprocal = round_magnitude(
            tl.minimum(tl.maximum(reciprocal, SCALE.minimum), SCALE.maximum), 0, SCALE.grid, False
        )
        block_scale = tl.math.div_rn(tl.zeros_like(reciprocal) + SCALE.reciprocal_constant, reciprocal)
    else:
        block_scale = tl.minimum(tl.maximum(block_scale, SCALE.minimum), SCALE.maximum)
        if RULE == TWO_LEVEL_CEIL:
            block_scale = ((block_scale.to(tl.int32, bitcast=True) + (SCALE.ulp - 1)) & -SCALE.ulp).to(
                tl.float32, bitcast=True
            )
        else:
            block_scale = round_magnitude(block_scale, 0, SCALE.grid, False)
    total = tl.math.div_rn(tensor_scale * block_scale, unscale)
    return tl.math.div_rn(magnitude, total), total


@triton.jit
def _te_scales(magnitude, amax, largest, ELEMENT: tl.constexpr, SCALE: tl.constexpr):
    """Transformer Engine's NVFP4 cast (`gradcomp.ops.block._te_scales`): (the magnitudes times each block's
    element factor, its decode factor); `largest`: the tensor's largest magnitude."""
    unclamped = tl.math.div_rn(tl.zeros_like(largest) + ELEMENT.te_encode, largest)
    encode = tl.minimum(unclamped, F32_MAX)
    encode = tl.where((largest > 0.0) & (encode > 0.0), encode, 1.0)
    block_scale = tl.minimum(amax * (encode * ELEMENT.te_reciprocal), SCALE.maximum)
    block_scale = round_magnitude(block_scale, 0, SCALE.grid, False)
    product = block_scale * tl.math.div_rn(tl.zeros_like(encode) + 1.0, encode)
    inverse = tl.math.div_rn(tl.zeros_like(product) + 1.0, product)
    scaled = magnitude * tl.minimum(inverse, F32_MAX)
    total = block_scale * largest * ELEMENT.te_decode
    total = tl.where(tl.abs(total) < float("inf"), total, block_scale * (largest * ELEMENT.te_decode))
    clamped, reciprocal = _clamped(block_scale, unclamped, product, inverse)
    return scaled, tl.where(clamped, reciprocal, total)


@triton.jit
def _four_over_six(magnitude, amax, largest, random, ROWS: tl.constexpr, SIZE: tl.constexpr,
                   STAGES: tl.constexpr, ELEMENT: tl.constexpr, SCALE: tl.constexpr,
                   STOCHASTIC: tl.constexpr):  # fmt: skip
    """Four Over Six (`gradcomp.ops.block._four_over_six`): (the dequantized magnitudes, the E4M3 scale),
    each block at whichever of its two scales errs less; `largest`: the tensor's largest magnitude."""
    unclamped = tl.math.div_rn(tl.zeros_like(largest) + ENCODE_4_6, largest)
    encode = tl.minimum(unclamped, F32_MAX)
    decode = tl.math.div_rn(tl.zeros_like(encode) + 1.0, encode)
    six = tl.math.div_rn(amax, ELEMENT.max_value) * encode
    out6, scale6, error6 = _four_over_six_candidate(
        magnitude, six, decode, unclamped, largest, random, ROWS, SIZE, STAGES, ELEMENT, SCALE, STOCHASTIC
    )
    out4, scale4, error4 = _four_over_six_candidate(
        magnitude, six * 1.5, decode, unclamped, largest, random, ROWS, SIZE, STAGES, ELEMENT, SCALE,
        STOCHASTIC,
    )  # fmt: skip
    four = error4 < error6
    return tl.where(four, out4, out6), tl.where(four, scale4, scale6)


@triton.jit
def _finish(out, transformed, values, raw, finite, signs, unscale, offsets, inside, rows, columns, row_blocks,
            length, out_ptr, zeros_ptr, ROWS: tl.constexpr, SIZE: tl.constexpr, T: tl.constexpr,
            NEGATIVE_ZERO: tl.constexpr, OUT_MAX: tl.constexpr, COUNT_ZEROS: tl.constexpr):  # fmt: skip
    """The dequantized magnitudes `out` with the transformed values' signs, transformed back, non-finite
    inputs passed through, stored (and their zeros counted)."""
    sign = transformed.to(tl.int32, bitcast=True) & -2147483648
    if not NEGATIVE_ZERO:
        sign = tl.where(out == 0.0, 0, sign)
    out = (out.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    if T.size > 0:
        groups = tl.reshape(out, [ROWS * SIZE // T.size, T.size])
        out = signs * butterfly(groups, ROWS * SIZE // T.size, T.size, T.stages, T.norm)
        out = tl.reshape(out, [ROWS, SIZE]) * unscale
    out = tl.where(finite, tl.minimum(tl.maximum(out, -OUT_MAX), OUT_MAX), values)
    stored = to_storage(out, raw.dtype)
    tl.store(out_ptr + offsets, stored, mask=inside)
    if COUNT_ZEROS:  # the padding of a trailing block is not the output's
        kept = inside & ((rows % row_blocks)[:, None] * SIZE + columns[None, :] < length)
        tl.atomic_add(zeros_ptr, tl.sum(tl.sum(((stored == 0.0) & kept).to(tl.int64), 1), 0))


@triton.jit
def _four_over_six_candidate(magnitude, high, decode, unclamped, largest, random, ROWS: tl.constexpr,
                             SIZE: tl.constexpr, STAGES: tl.constexpr, ELEMENT: tl.constexpr,
                             SCALE: tl.constexpr, STOCHASTIC: tl.constexpr):  # fmt: skip
    """One of a block's two Four Over Six scales (`gradcomp.ops.block._four_over_six`): (the dequantized
    magnitudes, the E4M3 scale, each row's sum of squared errors, summed as `pairwise_sum`)."""
    scale = round_magnitude(high, 0, SCALE.grid, False)
    decoded = decode * scale
    inverse = tl.math.div_rn(tl.zeros_like(decoded) + 1.0, decoded)
    scaled = tl.where(scale > 0.0, magnitude * tl.minimum(inverse, F32_MAX), 0.0)
    rounded = round_magnitude(tl.minimum(scaled, ELEMENT.max_value), random, ELEMENT.grid, STOCHASTIC)
    product = rounded * scale
    out = tl.math.div_rn(product * largest, tl.zeros_like(product) + ENCODE_4_6)
    other = product * tl.math.div_rn(largest, ENCODE_4_6)
    out = tl.where(tl.abs(out) < float("inf"), out, other)
    clamped, reciprocal = _clamped(scale, unclamped, decoded, inverse)
    out = tl.where(clamped, rounded * reciprocal, out)
    error = (out - magnitude) * (out - magnitude)
    for stage in tl.static_range(STAGES):  # pairwise, in place: every element ends with its row's sum
        pairs = tl.permute(tl.reshape(error, [ROWS, SIZE >> (stage + 1), 2, 1 << stage]), (0, 1, 3, 2))
        first, second = tl.split(pairs)
        pairs = tl.permute(tl.join(first + second, first + second), (0, 1, 3, 2))
        error = tl.reshape(pairs, [ROWS, SIZE])
    return out, scale, tl.max(error, 1)[:, None]


@triton.jit
def _clamped(block_scale, unclamped, product, inverse):
    """`gradcomp.ops.block._clamped`: (where a block of non-zero scale was encoded with a clamped encode
    scale or element factor, the reciprocal of its element factor: `product` or 2^-128)."""
    factor_clamped = inverse > F32_MAX
    encode_clamped = (tl.zeros_like(inverse) + unclamped) > F32_MAX  # a tensor (the interpreter's |)
    clamped = (block_scale > 0.0) & (encode_clamped | factor_clamped)
    reciprocal = tl.where(factor_clamped, 1 << 21, product.to(tl.int32, bitcast=True))  # 2^-128's bits
    return clamped, reciprocal.to(tl.float32, bitcast=True)


@triton.jit
def _power_of_two(exponent):
    """2^k as float32 for int32 k in [-127, 127]."""
    return tl.where(exponent > -127, (exponent + 127) << 23, 1 << 22).to(tl.float32, bitcast=True)


@triton.jit
def _tensor_scale_kernel(partial_ptr, programs, out_ptr, FLOOR: tl.constexpr, BLOCK: tl.constexpr):
    """NVFP4's per-tensor scale: the largest of the programs' candidates, at least FLOOR."""
    largest = tl.zeros((BLOCK,), tl.float32)
    for first in range(0, programs, BLOCK):
        index = first + tl.arange(0, BLOCK)
        largest = tl.maximum(largest, tl.load(partial_ptr + index, mask=index < programs, other=0.0))
    tl.store(out_ptr, tl.maximum(tl.max(largest, 0), FLOOR))


def quantize_block_triton(
    blocks: Tensor,
    fmt: BlockFormat,
    seed: int,
    length: int,
    zeros: Tensor | None = None,
    sign_seed: int | None = None,
) -> Tensor:
    """`quantize_block` on contiguous rows of block_size elements of a kernel dtype; `length` is the
    blocked axis's length (the rows' padding beyond it is not counted in `zeros`); the transform's signs
    from `sign_seed` (None: all +1)."""
    rows_total, size = blocks.shape
    out = torch.empty_like(blocks)
    rows = max(1, TILE // size)
    programs = triton.cdiv(rows_total, rows)
    k0, k1 = seed_keys(seed)
    s0, s1 = seed_keys(sign_seed) if sign_seed is not None else (0, 0)
    constants = dict(
        SIZE=size,
        ROWS=rows,
        STAGES=size.bit_length() - 1,
        **_constants(fmt, sign_seed is not None),
        OUT_MAX=float(torch.finfo(blocks.dtype).max),
        COUNT_ZEROS=zeros is not None,
        STOCHASTIC=fmt.rounding == "stochastic",
        enable_fp_fusion=False,
    )
    keys = map(as_int32, (k0, k1, s0, s1))
    args = [blocks, out, blocks, blocks, rows_total, fmt.padded_length(length) // size, length, *keys]
    if fmt.per_tensor and not fmt.outer:
        partials = torch.empty(programs, dtype=torch.float32, device=blocks.device)
        tensor_scale = torch.empty(1, dtype=torch.float32, device=blocks.device)
        launch(
            _block_kernel, (programs,), *args[:2], partials, *args[3:], blocks, MAXIMA_ONLY=True, **constants
        )
        launch(
            _tensor_scale_kernel,
            (1,),
            partials,
            programs,
            tensor_scale,
            FLOOR=0.0 if fmt.from_tensor_max else fmt.tensor_scale_floor,
            BLOCK=PARTIALS_BLOCK,
        )
        args[3] = tensor_scale
    launch(
        _block_kernel, (programs,), *args, blocks if zeros is None else zeros, MAXIMA_ONLY=False, **constants
    )
    return out


@functools.lru_cache(maxsize=256)
def _constants(fmt: BlockFormat, random_signs: bool) -> dict:
    """The kernel's constexprs of a format (cached by value: a training step asks at every layer)."""
    element = fmt.element_format
    te_encode, te_reciprocal, te_decode = fmt.te_constants
    scale_min, scale_max = fmt.scale_range
    per_tensor = fmt.per_tensor
    hadamard = fmt.hadamard
    shift = prescale_shift(hadamard)
    return dict(
        RULE=RULES["two_level" if per_tensor else "mx", fmt.rule],
        ELEMENT=Element(
            element.max_value,
            element.emax,
            float_bits(element.max_value, FLOAT32) & 0x7FFFFF,
            RoundingPlan.build(element, FLOAT32).negative_zero,
            Grid.of(RoundingPlan.build(element, FLOAT32)),
            te_encode,
            te_reciprocal,
            te_decode,
        ),
        SCALE=Scale(
            scale_min,
            scale_max,
            fmt.scale_ulp_bits,
            fmt.tensor_scale_floor if per_tensor else 0.0,
            fmt.reciprocal_constant if per_tensor else 0.0,
            Grid.of(RoundingPlan.build(fmt.scale_format, FLOAT32)),  # TE's: E4M3 (block_format)
        ),
        TRANSFORM=Transform(
            hadamard,
            max(hadamard.bit_length() - 1, 0),
            transform_norm(hadamard) if hadamard else 1.0,
            float("inf") if fmt.from_tensor_max else 2.0 ** (127 - shift),  # TE, Four Over Six: no prescale
            2.0**-shift,
            2.0**shift,
            random_signs,
            SIGN_COUNTER,
        ),
        OUTER_ROWS=fmt.outer // fmt.block_size,
    )
