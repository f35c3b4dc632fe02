"""Triton side of `gradcomp.ops.hadamard`: the butterfly on a tile of blocks (also fused into the block
quantizer) and the standalone transform, one launch over rows of block_size elements."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp.formats.block import prescale_shift, transform_norm
from gradcomp.kernels.floats import to_storage
from gradcomp.kernels.rng import random_uint32
from gradcomp.profiling import launch
from gradcomp.rng import SIGN_COUNTER, as_int32, seed_keys

ROWS = 64  # blocks per program


@triton.jit
def butterfly(values, ROWS: tl.constexpr, SIZE: tl.constexpr, STAGES: tl.constexpr, NORM: tl.constexpr):
    """H v / sqrt(SIZE) of each row of a (ROWS, SIZE) float32 tile (SIZE = 2^STAGES): stage s adds and
    subtracts the elements 2^s apart, as `gradcomp.ops.hadamard.butterfly`."""
    for stage in tl.static_range(STAGES):
        # the shape inline: a name for 1 << stage is refused by Triton 3.8's compiler (a constexpr reassigned)
        pairs = tl.permute(tl.reshape(values, [ROWS, SIZE >> (stage + 1), 2, 1 << stage]), (0, 1, 3, 2))
        first, second = tl.split(pairs)
        pairs = tl.permute(tl.join(first + second, first - second), (0, 1, 3, 2))
        values = tl.reshape(pairs, [ROWS, SIZE])
    return values * NORM


@triton.jit
def transform_signs(columns, k0, k1, SIGNS: tl.constexpr, SIGN_COUNTER: tl.constexpr):
    """D's diagonal at these positions of the block: the top bit of the bits at SIGN_COUNTER + position."""
    if SIGNS:
        bits = random_uint32(columns.to(tl.int64) + SIGN_COUNTER, k0, k1)
        return tl.where((bits >> 31) != 0, -1.0, 1.0)
    return tl.full(columns.shape, 1.0, tl.float32)


@triton.jit
def _hadamard_kernel(
    x_ptr,
    out_ptr,
    rows_total,
    k0,
    k1,
    SIZE: tl.constexpr,
    STAGES: tl.constexpr,
    NORM: tl.constexpr,
    BIG: tl.constexpr,
    DOWN: tl.constexpr,
    UP: tl.constexpr,
    SIGNS: tl.constexpr,
    SIGN_COUNTER: tl.constexpr,
    INVERSE: tl.constexpr,
    ROWS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    columns = tl.arange(0, SIZE)
    inside = (rows[:, None] < rows_total) & (columns[None, :] < SIZE)
    offsets = rows[:, None] * SIZE + columns[None, :]
    raw = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    signs = transform_signs(columns, k0, k1, SIGNS, SIGN_COUNTER)[None, :]
    values = raw.to(tl.float32)
    big = tl.max(tl.abs(values), 1)[:, None] >= BIG  # prescaled so that no sum overflows
    values = values * tl.where(big, DOWN, 1.0)
    if INVERSE:
        out = signs * butterfly(values, ROWS, SIZE, STAGES, NORM)
    else:
        out = butterfly(values * signs, ROWS, SIZE, STAGES, NORM)
    out = out * tl.where(big, UP, 1.0)
    tl.store(out_ptr + offsets, to_storage(out, raw.dtype), mask=inside)


def hadamard_triton(blocks: Tensor, seed: int | None, inverse: bool) -> Tensor:
    """The transform of contiguous rows of a kernel dtype (float16/bfloat16/float32)."""
    rows_total, size = blocks.shape
    out = torch.empty_like(blocks)
    k0, k1 = seed_keys(0 if seed is None else seed)
    shift = prescale_shift(size)
    launch(
        _hadamard_kernel,
        (triton.cdiv(rows_total, ROWS),),
        blocks,
        out,
        rows_total,
        as_int32(k0),
        as_int32(k1),
        SIZE=size,
        STAGES=size.bit_length() - 1,
        NORM=transform_norm(size),
        BIG=2.0 ** (127 - shift),
        DOWN=2.0**-shift,
        UP=2.0**shift,
        SIGNS=seed is not None,
        SIGN_COUNTER=SIGN_COUNTER,
        INVERSE=inverse,
        ROWS=ROWS,
        enable_fp_fusion=False,
    )
    return out
