"""Triton kernel of `gradcomp.ops.quantize_block`: the torch implementation's operations in its order, on
tiles of whole blocks (rows of block_size elements), so that the result is the same bit for bit. MX is one
launch. The two-level formats (NVFP4) need the tensor's largest magnitude (after the transform) before any
block: the same kernel first writes one maximum per program, one program turns them into the per-tensor
scale, and the kernel runs again to quantize."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp._backend import compute_layout
from gradcomp.block_format import (
    FLOAT32_MAX,
    FOUR_OVER_SIX_ENCODE,
    BlockFormat,
    prescale_shift,
    transform_norm,
)
from gradcomp.kernels.floats import to_storage
from gradcomp.kernels.fp_quant import _round_magnitude, _rounding_constants
from gradcomp.kernels.hadamard import butterfly, transform_signs
from gradcomp.kernels.rng import random_uint32
from gradcomp.profiling import launch
from gradcomp.rng import SIGN_COUNTER, as_int32, seed_keys
from gradcomp.rounding import RoundingPlan, float_bits

TILE = 2048  # elements per program
PARTIALS_BLOCK = 1024
FLOAT32 = compute_layout(torch.float32)


@triton.jit
def _transformed(values, finite, s0, s1, ROWS: tl.constexpr, SIZE: tl.constexpr, H: tl.constexpr,
                 H_STAGES: tl.constexpr, H_NORM: tl.constexpr, H_BIG: tl.constexpr, H_DOWN: tl.constexpr,
                 H_UP: tl.constexpr, SIGNS: tl.constexpr, SIGN_COUNTER: tl.constexpr):  # fmt: skip
    """(the values the scales are taken of, where the output is computed, the signs, each block's 2^P or 1):
    the transform of each group of H with only finite values (blocks prescaled as `prescales` says), or the
    finite values themselves."""
    if H > 0:
        groups = tl.reshape(finite.to(tl.int32), [ROWS * SIZE // H, H])
        whole = tl.reshape(tl.broadcast_to(tl.min(groups, 1)[:, None], [ROWS * SIZE // H, H]), [ROWS, SIZE])
        finite = whole != 0
        signs = transform_signs(tl.arange(0, H), s0, s1, SIGNS, SIGN_COUNTER)[None, :]
        kept = tl.where(finite, values, 0.0)
        big = tl.max(tl.abs(kept), 1)[:, None] >= H_BIG
        unscale = tl.where(big, H_UP, 1.0)
        zeroed = tl.reshape(kept * tl.where(big, H_DOWN, 1.0), [ROWS * SIZE // H, H])
        transformed = tl.reshape(
            butterfly(zeroed * signs, ROWS * SIZE // H, H, H_STAGES, H_NORM), [ROWS, SIZE]
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
    H: tl.constexpr,
    H_STAGES: tl.constexpr,
    H_NORM: tl.constexpr,
    H_BIG: tl.constexpr,
    H_DOWN: tl.constexpr,
    H_UP: tl.constexpr,
    SIGNS: tl.constexpr,
    SIGN_COUNTER: tl.constexpr,
    MAXIMA_ONLY: tl.constexpr,
    TE: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr,
    TENSOR_MAX: tl.constexpr,
    STAGES: tl.constexpr,
    THREE_QUARTERS: tl.constexpr,
    TE_ENCODE: tl.constexpr,
    TE_RECIPROCAL: tl.constexpr,
    TE_DECODE: tl.constexpr,
    FLOAT32_MAX: tl.constexpr,
    PER_TENSOR: tl.constexpr,
    OUTER_ROWS: tl.constexpr,
    TENSOR_FLOOR: tl.constexpr,
    EMAX: tl.constexpr,
    CEIL: tl.constexpr,
    RECIPROCAL: tl.constexpr,
    RECIPROCAL_CONSTANT: tl.constexpr,
    MAX_MANTISSA: tl.constexpr,
    MAX_VALUE: tl.constexpr,
    DISCARD: tl.constexpr,
    TIE_OFFSET: tl.constexpr,
    MIN_NORMAL_BITS: tl.constexpr,
    MAGIC: tl.constexpr,
    TO_Q0: tl.constexpr,
    TO_Q1: tl.constexpr,
    FROM_Q0: tl.constexpr,
    FROM_Q1: tl.constexpr,
    S_DISCARD: tl.constexpr,
    S_TIE_OFFSET: tl.constexpr,
    S_MIN_NORMAL_BITS: tl.constexpr,
    S_MAGIC: tl.constexpr,
    S_TO_Q0: tl.constexpr,
    S_TO_Q1: tl.constexpr,
    S_FROM_Q0: tl.constexpr,
    S_FROM_Q1: tl.constexpr,
    S_ULP: tl.constexpr,
    SCALE_MIN: tl.constexpr,
    SCALE_MAX: tl.constexpr,
    NEGATIVE_ZERO: tl.constexpr,
    OUT_MAX: tl.constexpr,
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
        values, tl.abs(values) < float("inf"), s0, s1, ROWS, SIZE, H, H_STAGES, H_NORM, H_BIG, H_DOWN, H_UP,
        SIGNS, SIGN_COUNTER,
    )  # fmt: skip
    magnitude = tl.abs(transformed)
    amax = tl.max(magnitude, 1)[:, None]
    if MAXIMA_ONLY:  # the per-tensor scale's candidates, of the blocks as they are (not prescaled)
        if TENSOR_MAX:  # the tensor's largest magnitude (TE, Four Over Six)
            tl.store(partial_ptr + tl.program_id(0), tl.max(amax))
        else:
            tl.store(
                partial_ptr + tl.program_id(0),
                tl.max(tl.math.div_rn(amax, MAX_VALUE * SCALE_MAX) * unscale),
            )
    elif FOUR_OVER_SIX:
        largest = tl.load(tensor_scale_ptr)
        unclamped = tl.math.div_rn(tl.zeros_like(largest) + FOUR_OVER_SIX_ENCODE, largest)
        encode = tl.minimum(unclamped, FLOAT32_MAX)
        decode = tl.math.div_rn(tl.zeros_like(encode) + 1.0, encode)
        six = tl.math.div_rn(amax, MAX_VALUE) * encode
        random = random_uint32(offsets, k0, k1) if STOCHASTIC else 0
        out6, scale6, error6 = _four_over_six_candidate(
            magnitude, six, decode, unclamped, largest, random, ROWS, SIZE, FLOAT32_MAX, STAGES, MAX_VALUE,
            DISCARD, TIE_OFFSET, MIN_NORMAL_BITS, MAGIC, TO_Q0, TO_Q1, FROM_Q0, FROM_Q1, S_DISCARD,
            S_TIE_OFFSET, S_MIN_NORMAL_BITS, S_MAGIC, S_TO_Q0, S_TO_Q1, S_FROM_Q0, S_FROM_Q1, STOCHASTIC,
        )  # fmt: skip
        out4, scale4, error4 = _four_over_six_candidate(
            magnitude, six * 1.5, decode, unclamped, largest, random, ROWS, SIZE, FLOAT32_MAX, STAGES,
            MAX_VALUE, DISCARD, TIE_OFFSET, MIN_NORMAL_BITS, MAGIC, TO_Q0, TO_Q1, FROM_Q0, FROM_Q1, S_DISCARD,
            S_TIE_OFFSET, S_MIN_NORMAL_BITS, S_MAGIC, S_TO_Q0, S_TO_Q1, S_FROM_Q0, S_FROM_Q1, STOCHASTIC,
        )  # fmt: skip
        four = error4 < error6
        # a block at a zero scale has +0 elements (the authors' code): no sign to keep
        transformed = tl.where(tl.where(four, scale4, scale6) > 0.0, transformed, 0.0)
        _finish(
            tl.where(four, out4, out6), transformed, values, raw, finite, signs, unscale, offsets, inside,
            rows, columns, row_blocks, length, out_ptr, zeros_ptr, ROWS, SIZE, H, H_STAGES, H_NORM,
            NEGATIVE_ZERO, OUT_MAX, COUNT_ZEROS,
        )  # fmt: skip
    else:
        if TE:
            largest = tl.load(tensor_scale_ptr)
            unclamped = tl.math.div_rn(tl.zeros_like(largest) + TE_ENCODE, largest)
            encode = tl.minimum(unclamped, FLOAT32_MAX)
            encode = tl.where((largest > 0.0) & (encode > 0.0), encode, 1.0)
            block_scale = tl.minimum(amax * (encode * TE_RECIPROCAL), SCALE_MAX)
            block_scale = _round_magnitude(
                block_scale, 0, S_DISCARD, S_TIE_OFFSET, S_MIN_NORMAL_BITS, S_MAGIC,
                S_TO_Q0, S_TO_Q1, S_FROM_Q0, S_FROM_Q1, False,
            )  # fmt: skip
            product = block_scale * tl.math.div_rn(tl.zeros_like(encode) + 1.0, encode)
            inverse = tl.math.div_rn(tl.zeros_like(product) + 1.0, product)
            scaled = magnitude * tl.minimum(inverse, FLOAT32_MAX)
            total = block_scale * largest * TE_DECODE
            total = tl.where(tl.abs(total) < float("inf"), total, block_scale * (largest * TE_DECODE))
            clamped, reciprocal = _clamped(block_scale, unclamped, product, inverse, FLOAT32_MAX)
            total = tl.where(clamped, reciprocal, total)
        elif PER_TENSOR:
            if OUTER_ROWS > 0:  # each outer block's float32 scale from its rows (whole within the tile)
                ratio = tl.math.div_rn(amax, MAX_VALUE * SCALE_MAX) * unscale
                groups = tl.max(tl.reshape(ratio, [ROWS // OUTER_ROWS, OUTER_ROWS]), 1)[:, None]
                groups = tl.broadcast_to(tl.maximum(groups, TENSOR_FLOOR), [ROWS // OUTER_ROWS, OUTER_ROWS])
                tensor_scale = tl.reshape(groups, [ROWS, 1])
            else:
                tensor_scale = tl.load(tensor_scale_ptr)
            block_scale = tl.math.div_rn(tl.math.div_rn(amax, MAX_VALUE), tensor_scale) * unscale
            if RECIPROCAL:  # the reciprocal clamped and rounded; a zero block's (inf) clamps to SCALE_MAX
                reciprocal = tl.math.div_rn(tl.zeros_like(block_scale) + RECIPROCAL_CONSTANT, block_scale)
                reciprocal = _round_magnitude(
                    tl.minimum(tl.maximum(reciprocal, SCALE_MIN), SCALE_MAX), 0, S_DISCARD, S_TIE_OFFSET,
                    S_MIN_NORMAL_BITS, S_MAGIC, S_TO_Q0, S_TO_Q1, S_FROM_Q0, S_FROM_Q1, False,
                )  # fmt: skip
                block_scale = tl.math.div_rn(tl.zeros_like(reciprocal) + RECIPROCAL_CONSTANT, reciprocal)
            else:
                block_scale = tl.minimum(tl.maximum(block_scale, SCALE_MIN), SCALE_MAX)
                if CEIL:
                    block_scale = ((block_scale.to(tl.int32, bitcast=True) + (S_ULP - 1)) & -S_ULP).to(
                        tl.float32, bitcast=True
                    )
                else:
                    block_scale = _round_magnitude(
                        block_scale, 0, S_DISCARD, S_TIE_OFFSET, S_MIN_NORMAL_BITS, S_MAGIC,
                        S_TO_Q0, S_TO_Q1, S_FROM_Q0, S_FROM_Q1, False,
                    )  # fmt: skip
            total = tl.math.div_rn(tensor_scale * block_scale, unscale)
            scaled = tl.math.div_rn(magnitude, total)
        else:
            normal = amax >= 1.1754943508222875e-38
            bits = tl.where(normal, amax, amax * 16777216.0).to(tl.int32, bitcast=True)
            exponent = (bits >> 23) - tl.where(normal, 127, 151) - EMAX
            if CEIL:
                exponent += ((bits & 0x7FFFFF) > MAX_MANTISSA).to(tl.int32)
            exponent = tl.minimum(tl.maximum(tl.where(amax > 0.0, exponent, -127), -127), 127)
            if THREE_QUARTERS:
                exponent += 2
                scaled = magnitude * _power_of_two(-exponent) * 3.0
            else:
                scaled = magnitude * _power_of_two(-exponent)
            total = _power_of_two(exponent)
        random = random_uint32(offsets, k0, k1) if STOCHASTIC else 0
        rounded = _round_magnitude(
            tl.minimum(scaled, MAX_VALUE), random, DISCARD, TIE_OFFSET, MIN_NORMAL_BITS, MAGIC,
            TO_Q0, TO_Q1, FROM_Q0, FROM_Q1, STOCHASTIC,
        )  # fmt: skip
        if THREE_QUARTERS:
            rounded = tl.math.div_rn(rounded, tl.zeros_like(rounded) + 3.0)
        _finish(
            rounded * total, transformed, values, raw, finite, signs, unscale, offsets, inside, rows, columns,
            row_blocks, length, out_ptr, zeros_ptr, ROWS, SIZE, H, H_STAGES, H_NORM, NEGATIVE_ZERO, OUT_MAX,
            COUNT_ZEROS,
        )  # fmt: skip


@triton.jit
def _finish(out, transformed, values, raw, finite, signs, unscale, offsets, inside, rows, columns, row_blocks,
            length, out_ptr, zeros_ptr, ROWS: tl.constexpr, SIZE: tl.constexpr, H: tl.constexpr,
            H_STAGES: tl.constexpr, H_NORM: tl.constexpr, NEGATIVE_ZERO: tl.constexpr, OUT_MAX: tl.constexpr,
            COUNT_ZEROS: tl.constexpr):  # fmt: skip
    """The dequantized magnitudes `out` with the transformed values' signs, transformed back, non-finite
    inputs passed through, stored (and their zeros counted)."""
    sign = transformed.to(tl.int32, bitcast=True) & -2147483648
    if not NEGATIVE_ZERO:
        sign = tl.where(out == 0.0, 0, sign)
    out = (out.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    if H > 0:
        groups = tl.reshape(out, [ROWS * SIZE // H, H])
        out = signs * butterfly(groups, ROWS * SIZE // H, H, H_STAGES, H_NORM)
        out = tl.reshape(out, [ROWS, SIZE]) * unscale
    out = tl.where(finite, tl.minimum(tl.maximum(out, -OUT_MAX), OUT_MAX), values)
    stored = to_storage(out, raw.dtype)
    tl.store(out_ptr + offsets, stored, mask=inside)
    if COUNT_ZEROS:  # the padding of a trailing block is not the output's
        kept = inside & ((rows % row_blocks)[:, None] * SIZE + columns[None, :] < length)
        tl.atomic_add(zeros_ptr, tl.sum(tl.sum(((stored == 0.0) & kept).to(tl.int64), 1), 0))


@triton.jit
def _four_over_six_candidate(magnitude, high, decode, unclamped, largest, random, ROWS: tl.constexpr,
                             SIZE: tl.constexpr, FLOAT32_MAX: tl.constexpr, STAGES: tl.constexpr,
                             MAX_VALUE: tl.constexpr, DISCARD: tl.constexpr,
                             TIE_OFFSET: tl.constexpr, MIN_NORMAL_BITS: tl.constexpr, MAGIC: tl.constexpr,
                             TO_Q0: tl.constexpr, TO_Q1: tl.constexpr, FROM_Q0: tl.constexpr,
                             FROM_Q1: tl.constexpr, S_DISCARD: tl.constexpr, S_TIE_OFFSET: tl.constexpr,
                             S_MIN_NORMAL_BITS: tl.constexpr, S_MAGIC: tl.constexpr, S_TO_Q0: tl.constexpr,
                             S_TO_Q1: tl.constexpr, S_FROM_Q0: tl.constexpr, S_FROM_Q1: tl.constexpr,
                             STOCHASTIC: tl.constexpr):  # fmt: skip
    """One of a block's two Four Over Six scales (`gradcomp.ops.block._four_over_six`): (the dequantized
    magnitudes, the E4M3 scale, each row's sum of squared errors, summed as `pairwise_sum`)."""
    scale = _round_magnitude(
        high, 0, S_DISCARD, S_TIE_OFFSET, S_MIN_NORMAL_BITS, S_MAGIC, S_TO_Q0, S_TO_Q1, S_FROM_Q0,
        S_FROM_Q1, False,
    )  # fmt: skip
    decoded = decode * scale
    inverse = tl.math.div_rn(tl.zeros_like(decoded) + 1.0, decoded)
    scaled = tl.where(scale > 0.0, magnitude * tl.minimum(inverse, FLOAT32_MAX), 0.0)
    rounded = _round_magnitude(
        tl.minimum(scaled, MAX_VALUE), random, DISCARD, TIE_OFFSET, MIN_NORMAL_BITS, MAGIC,
        TO_Q0, TO_Q1, FROM_Q0, FROM_Q1, STOCHASTIC,
    )  # fmt: skip
    product = rounded * scale
    out = tl.math.div_rn(product * largest, tl.zeros_like(product) + FOUR_OVER_SIX_ENCODE)
    other = product * tl.math.div_rn(largest, FOUR_OVER_SIX_ENCODE)
    out = tl.where(tl.abs(out) < float("inf"), out, other)
    clamped, reciprocal = _clamped(scale, unclamped, decoded, inverse, FLOAT32_MAX)
    out = tl.where(clamped, rounded * reciprocal, out)
    error = (out - magnitude) * (out - magnitude)
    for stage in tl.static_range(STAGES):  # pairwise, in place: every element ends with its row's sum
        half: tl.constexpr = 1 << stage
        pairs = tl.permute(tl.reshape(error, [ROWS, SIZE // (2 * half), 2, half]), (0, 1, 3, 2))
        first, second = tl.split(pairs)
        pairs = tl.permute(tl.join(first + second, first + second), (0, 1, 3, 2))
        error = tl.reshape(pairs, [ROWS, SIZE])
    return out, scale, tl.max(error, 1)[:, None]


@triton.jit
def _clamped(block_scale, unclamped, product, inverse, FLOAT32_MAX: tl.constexpr):
    """`gradcomp.ops.block._clamped`: (where a block of non-zero scale was encoded with a clamped encode
    scale or element factor, the reciprocal of its element factor: `product` or 2^-128)."""
    factor_clamped = inverse > FLOAT32_MAX
    encode_clamped = (tl.zeros_like(inverse) + unclamped) > FLOAT32_MAX  # a tensor (the interpreter's |)
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
    stochastic: bool,
    seed: int,
    hadamard: int,
    length: int,
    zeros: Tensor | None = None,
    sign_seed: int | None = None,
) -> Tensor:
    """`quantize_block` on contiguous rows of block_size elements of a kernel dtype; `length` is the
    blocked axis's length (the rows' padding beyond it is not counted in `zeros`); the transform's signs
    from `sign_seed` (None: all +1)."""
    rows_total, size = blocks.shape
    out = torch.empty_like(blocks)
    element = fmt.element_format
    plan = RoundingPlan.build(element, FLOAT32)
    scale_plan = RoundingPlan.build(fmt.scale_format, FLOAT32)  # TE's: E4M3 (block_format)
    scale_min, scale_max = fmt.scale_range
    rows = max(1, TILE // size)
    programs = triton.cdiv(rows_total, rows)
    k0, k1 = seed_keys(seed)
    s0, s1 = seed_keys(sign_seed) if sign_seed is not None else (0, 0)
    shift = prescale_shift(hadamard)
    from_tensor_max = fmt.from_tensor_max  # TE and Four Over Six: no prescale, no floor on the statistic
    prescaled_from = float("inf") if from_tensor_max else 2.0 ** (127 - shift)
    te_encode, te_reciprocal, te_decode = fmt.te_constants
    constants = dict(
        SIZE=size,
        ROWS=rows,
        H=hadamard,
        H_STAGES=max(hadamard.bit_length() - 1, 0),
        H_NORM=transform_norm(hadamard) if hadamard else 1.0,
        H_BIG=prescaled_from,
        H_DOWN=2.0**-shift,
        H_UP=2.0**shift,
        SIGNS=sign_seed is not None,
        SIGN_COUNTER=SIGN_COUNTER,
        PER_TENSOR=fmt.per_tensor,
        OUTER_ROWS=fmt.outer // size,
        TENSOR_FLOOR=fmt.tensor_scale_floor if fmt.per_tensor else 0.0,
        EMAX=element.emax,
        CEIL=fmt.rule == "ceil",
        RECIPROCAL=fmt.rule == "reciprocal",
        RECIPROCAL_CONSTANT=fmt.reciprocal_constant if fmt.per_tensor else 0.0,
        MAX_MANTISSA=float_bits(element.max_value, FLOAT32) & 0x7FFFFF,
        MAX_VALUE=element.max_value,
        DISCARD=plan.discard_bits,
        TIE_OFFSET=plan.tie_offset,
        **_rounding_constants(plan),
        S_DISCARD=scale_plan.discard_bits,
        S_TIE_OFFSET=scale_plan.tie_offset,
        **{f"S_{key}": value for key, value in _rounding_constants(scale_plan).items()},
        S_ULP=fmt.scale_ulp_bits,
        TE=fmt.rule == "te",
        FOUR_OVER_SIX=fmt.rule == "four_over_six",
        TENSOR_MAX=from_tensor_max,
        STAGES=size.bit_length() - 1,
        THREE_QUARTERS=fmt.rule == "three_quarters",
        TE_ENCODE=te_encode,
        TE_RECIPROCAL=te_reciprocal,
        TE_DECODE=te_decode,
        FLOAT32_MAX=FLOAT32_MAX,
        SCALE_MIN=scale_min,
        SCALE_MAX=scale_max,
        NEGATIVE_ZERO=plan.negative_zero,
        OUT_MAX=float(torch.finfo(blocks.dtype).max),
        COUNT_ZEROS=zeros is not None,
        STOCHASTIC=stochastic,
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
            FLOOR=0.0 if from_tensor_max else fmt.tensor_scale_floor,
            BLOCK=PARTIALS_BLOCK,
        )
        args[3] = tensor_scale
    launch(
        _block_kernel, (programs,), *args, blocks if zeros is None else zeros, MAXIMA_ONLY=False, **constants
    )
    return out
