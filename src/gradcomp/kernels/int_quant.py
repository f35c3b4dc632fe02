"""Triton kernels of `gradcomp.ops.quantize_int`: per-group stochastic affine quantization (PTQ, PSQ, the
weight path's per-column PSQ and the quantization step of BHQ) in three launches with no host sync, and the
block-Householder reflection of BHQ.

Groups are the rows or the columns of a 2-D view (R, D) of the tensor. `_range_kernel` writes each group's
partial [min, max] over a piece of it; `_affine_kernel` reduces those and computes the group's `AffineMap`
exactly as the torch path does; `_quantize_kernel` rounds every element stochastically with the random bits
of its row-major index. No fused multiply-adds anywhere (enable_fp_fusion=False), so the bits agree with
the torch path's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp.kernels.floats import to_storage
from gradcomp.kernels.rng import block_random_uint32, random_uint32, uniform24
from gradcomp.profiling import launch
from gradcomp.rng import as_int32, seed_keys

RANGE_TILE = (32, 256)  # groups x elements along them in one step of the range kernel
RANGE_STEPS = 8  # steps of a range program along the reduced axis
BLOCK_GROUPS = 128
BLOCK_COLUMNS = 256
PARAMS = 7  # the fields of an AffineMap


@triton.jit
def _tile_range(tile, inside, axis: tl.constexpr):
    """(min, max) of a tile along `axis` over the lanes inside, NaN where a NaN is among them (as
    torch.aminmax): the built-in reductions on the other lanes, and the NaNs counted apart."""
    nan = inside & (tile != tile)
    low = tl.min(tl.where(inside & ~nan, tile, float("inf")), axis)
    high = tl.max(tl.where(inside & ~nan, tile, -float("inf")), axis)
    has_nan = tl.max(nan.to(tl.int32), axis) > 0
    return tl.where(has_nan, float("nan"), low), tl.where(has_nan, float("nan"), high)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, tl.PropagateNan.ALL)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, tl.PropagateNan.ALL)


@triton.jit
def _range_kernel(
    x_ptr,
    partial_ptr,
    n_rows,
    n_columns,
    COLUMNS: tl.constexpr,
    GROUPS: tl.constexpr,
    ALONG: tl.constexpr,
    STEPS: tl.constexpr,
):
    """Partial (min, max) of GROUPS groups over STEPS tiles of ALONG elements along the reduced axis (NaN
    propagates, as in torch.aminmax): partial[0 or 1, piece, group]."""
    piece = tl.program_id(0)
    other = tl.program_id(1)
    groups = n_columns if COLUMNS else n_rows
    group = other * GROUPS + tl.arange(0, GROUPS)
    low = tl.full((GROUPS,), float("inf"), tl.float32)
    high = tl.full((GROUPS,), -float("inf"), tl.float32)
    for step in range(STEPS):  # tiles along the reduced axis
        along = (piece * STEPS + step) * ALONG + tl.arange(0, ALONG)
        rows, columns = (along, group) if COLUMNS else (group, along)
        inside = (rows[:, None] < n_rows) & (columns[None, :] < n_columns)
        offsets = rows[:, None].to(tl.int64) * n_columns + columns[None, :]
        tile = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        tile_low, tile_high = _tile_range(tile, inside, 0 if COLUMNS else 1)
        low = _min_nan(low, tile_low)
        high = _max_nan(high, tile_high)
    pieces = tl.num_programs(0)
    tl.store(partial_ptr + piece * groups + group, low, mask=group < groups)
    tl.store(partial_ptr + (pieces + piece) * groups + group, high, mask=group < groups)


@triton.jit
def _power_of_two_rescaling(magnitude):
    """`ops.int_quant._power_of_two_rescaling`: (2^k, 2^-k), k = -frexp exponent of the magnitude, limited
    to [-126, 126] (frexp's exponent: 0 for 0 and for non-finite values, which come out NaN anyway)."""
    bits = magnitude.to(tl.int32, bitcast=True)
    biased = (bits >> 23) & 0xFF
    normalised = (magnitude * 18446744073709551616.0).to(tl.int32, bitcast=True)  # subnormals times 2^64
    exponent = tl.where(biased == 0, ((normalised >> 23) & 0xFF) - 190, biased - 126)
    exponent = tl.where((magnitude == 0) | (biased == 0xFF), 0, exponent)
    k = tl.minimum(tl.maximum(-exponent, -126), 126)
    return ((k + 127) << 23).to(tl.float32, bitcast=True), ((127 - k) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _affine_kernel(partial_ptr, params_ptr, pieces, groups, levels, BLOCK_GROUPS: tl.constexpr):
    """Each group's [min, max] from the partial ranges, then its `AffineMap` (params[field, group])."""
    group = tl.program_id(0) * BLOCK_GROUPS + tl.arange(0, BLOCK_GROUPS)
    inside = group < groups
    low = tl.full((BLOCK_GROUPS,), float("inf"), tl.float32)
    high = tl.full((BLOCK_GROUPS,), -float("inf"), tl.float32)
    for piece in range(pieces):
        low = _min_nan(low, tl.load(partial_ptr + piece * groups + group, mask=inside, other=0.0))
        high = _max_nan(
            high, tl.load(partial_ptr + (pieces + piece) * groups + group, mask=inside, other=0.0)
        )
    levels = tl.cast(levels, tl.float32)
    pre, post = _power_of_two_rescaling(_max_nan(-low, high))
    zero = low * pre
    spread = high * pre - zero
    flat = spread == 0
    finite = tl.abs(spread) < float("inf")
    zero = tl.where(finite, zero, float("nan"))
    low = tl.where(finite, low + 0.0, float("nan"))
    high = tl.where(finite, high + 0.0, float("nan"))
    scale = tl.where(flat, 1.0, tl.math.div_rn(levels, spread))
    step = tl.where(flat, 1.0, tl.math.div_rn(spread, levels))
    tl.store(params_ptr + group, pre, mask=inside)
    tl.store(params_ptr + groups + group, zero, mask=inside)
    tl.store(params_ptr + 2 * groups + group, scale, mask=inside)
    tl.store(params_ptr + 3 * groups + group, step, mask=inside)
    tl.store(params_ptr + 4 * groups + group, post, mask=inside)
    tl.store(params_ptr + 5 * groups + group, low, mask=inside)
    tl.store(params_ptr + 6 * groups + group, high, mask=inside)


@triton.jit
def _quantize_kernel(
    x_ptr,
    out_ptr,
    params_ptr,
    n_rows,
    n_columns,
    levels,
    k0,
    k1,
    zeros_ptr,
    COLUMNS: tl.constexpr,
    WIDE: tl.constexpr,
    COUNT_ZEROS: tl.constexpr,
    TILE_R: tl.constexpr,
    TILE_C: tl.constexpr,
):
    """The stochastic affine map of each element's group over a (TILE_R, TILE_C) tile; the operations and
    their order are those of the torch implementation, so the bits agree. Each group's parameters are read
    once per tile row (or column); WIDE: more than 2^32 elements (the random counter's high word varies)."""
    rows = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    columns = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    mask = (rows[:, None] < n_rows) & (columns[None, :] < n_columns)
    offsets = rows[:, None].to(tl.int64) * n_columns + columns[None, :]
    if COLUMNS:
        group, groups, inside = columns[None, :], n_columns, columns[None, :] < n_columns
    else:
        group, groups, inside = rows[:, None], n_rows, rows[:, None] < n_rows
    pre = tl.load(params_ptr + group, mask=inside, other=1.0)
    zero = tl.load(params_ptr + groups + group, mask=inside, other=0.0)
    scale = tl.load(params_ptr + 2 * groups + group, mask=inside, other=1.0)
    step = tl.load(params_ptr + 3 * groups + group, mask=inside, other=1.0)
    post = tl.load(params_ptr + 4 * groups + group, mask=inside, other=1.0)
    low = tl.load(params_ptr + 5 * groups + group, mask=inside, other=0.0)
    high = tl.load(params_ptr + 6 * groups + group, mask=inside, other=0.0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    levels = tl.cast(levels, tl.float32)
    codes = (x * pre - zero) * scale
    codes = tl.minimum(tl.maximum(codes, 0.0, tl.PropagateNan.ALL), levels, tl.PropagateNan.ALL)
    whole = tl.floor(codes)
    if WIDE:
        bits = random_uint32(offsets, k0, k1)
    else:  # the counter's high word is 0 everywhere: its hash once per program
        bits = block_random_uint32(tl.full((), 0, tl.int64), offsets, k0, k1)
    up = uniform24(bits) < (codes - whole) * 16777216.0
    out = ((whole + up.to(tl.float32)) * step + zero) * post
    out = tl.minimum(tl.maximum(out, low, tl.PropagateNan.ALL), high, tl.PropagateNan.ALL)  # as torch.clamp
    out = to_storage(out, out_ptr.dtype.element_ty)
    tl.store(out_ptr + offsets, out, mask=mask)
    if COUNT_ZEROS:
        tl.atomic_add(zeros_ptr, tl.sum(tl.sum(((out == 0.0) & mask).to(tl.int64), 1), 0))


def _tile(n_rows: int, n_columns: int, elements: int = 4096) -> tuple[int, int]:
    """A tile of about `elements` that fits the tensor's shape (powers of two)."""
    columns = min(elements, triton.next_power_of_2(n_columns))
    return min(max(1, elements // columns), triton.next_power_of_2(n_rows)), columns


def affine_params_triton(x: Tensor, levels: int, columns: bool = False) -> Tensor:
    """The stacked `AffineMap` fields (7, groups) in float32 of the rows (or columns) of a 2-D tensor: two
    launches."""
    n_rows, n_columns = x.shape
    groups, length = (n_columns, n_rows) if columns else (n_rows, n_columns)
    tile_groups, tile_along = RANGE_TILE
    grid = (triton.cdiv(length, tile_along * RANGE_STEPS), triton.cdiv(groups, tile_groups))
    partial = torch.empty((2, grid[0], groups), dtype=torch.float32, device=x.device)
    launch(
        _range_kernel, grid, x, partial, n_rows, n_columns,
        COLUMNS=columns, GROUPS=tile_groups, ALONG=tile_along, STEPS=RANGE_STEPS,
    )  # fmt: skip
    params = torch.empty((PARAMS, groups), dtype=torch.float32, device=x.device)
    launch(
        _affine_kernel, (triton.cdiv(groups, BLOCK_GROUPS),), partial, params, grid[0], groups, float(levels),
        BLOCK_GROUPS=BLOCK_GROUPS, enable_fp_fusion=False,
    )  # fmt: skip
    return params


def quantize_groups_triton(
    x: Tensor,
    levels: int,
    seed: int,
    columns: bool = False,
    params: Tensor | None = None,
    zeros: Tensor | None = None,
    tile: tuple[int, int] | None = None,
) -> Tensor:
    """Stochastic affine quantization of each row (or column) of a contiguous 2-D tensor of a kernel dtype,
    in x's dtype: three launches (one where `params`, the stacked AffineMap fields, are given). zeros: an
    int64 one-element tensor to which the output's zeros are added."""
    if params is None:
        params = affine_params_triton(x, levels, columns)
    out = torch.empty_like(x)
    k0, k1 = seed_keys(seed)
    n_rows, n_columns = x.shape
    tile_r, tile_c = tile or _tile(n_rows, n_columns)
    launch(
        _quantize_kernel, (triton.cdiv(n_rows, tile_r), triton.cdiv(n_columns, tile_c)), x, out, params,
        n_rows, n_columns, float(levels), as_int32(k0), as_int32(k1), x if zeros is None else zeros,
        COLUMNS=columns, WIDE=x.numel() > 1 << 32, COUNT_ZEROS=zeros is not None,
        TILE_R=tile_r, TILE_C=tile_c, enable_fp_fusion=False,
    )  # fmt: skip
    return out


@triton.jit
def _householder_kernel(
    src_ptr,
    dst_ptr,
    members_ptr,
    starts_ptr,
    v_ptr,
    pre_ptr,
    post_ptr,
    row_length,
    HAS_PRE: tl.constexpr,
    HAS_POST: tl.constexpr,
    BLOCK_COLUMNS: tl.constexpr,
):
    """One program per (block, column tile): w = sum_r v_r z_r over the block's rows, then
    dst_r = (z_r - 2 v_r w) * post_r with z_r = src_r * pre_r. Rows are visited in ascending order, the
    order in which the torch implementation (index_add_) accumulates."""
    block = tl.program_id(0)
    columns = tl.program_id(1).to(tl.int64) * BLOCK_COLUMNS + tl.arange(0, BLOCK_COLUMNS)
    column_mask = columns < row_length
    start = tl.load(starts_ptr + block)
    end = tl.load(starts_ptr + block + 1)
    projection = tl.zeros((BLOCK_COLUMNS,), tl.float32)
    for i in range(start, end):
        row = tl.load(members_ptr + i)
        z = tl.load(src_ptr + row * row_length + columns, mask=column_mask, other=0.0)
        if HAS_PRE:
            z = z * tl.load(pre_ptr + row)
        projection += tl.load(v_ptr + row) * z
    for i in range(start, end):
        row = tl.load(members_ptr + i)
        z = tl.load(src_ptr + row * row_length + columns, mask=column_mask, other=0.0)
        if HAS_PRE:
            z = z * tl.load(pre_ptr + row)
        out = z - 2 * tl.load(v_ptr + row) * projection
        if HAS_POST:
            out = out * tl.load(post_ptr + row)
        tl.store(dst_ptr + row * row_length + columns, out, mask=column_mask)


def householder_triton(
    rows: Tensor,
    transform,
    pre_scale: Tensor | None,
    post_scale: Tensor | None,
    block_columns: int = BLOCK_COLUMNS,
) -> Tensor:
    """H_blocks(rows * pre_scale) * post_scale for a `BlockHouseholder` transform (float32 rows (N, D))."""
    rows = rows.contiguous()
    n_rows, row_length = rows.shape
    out = torch.empty_like(rows)
    launch(
        _householder_kernel,
        (n_rows, triton.cdiv(row_length, block_columns)),
        rows,
        out,
        transform.members,
        transform.starts,
        transform.v,
        pre_scale if pre_scale is not None else rows,
        post_scale if post_scale is not None else rows,
        row_length,
        HAS_PRE=pre_scale is not None,
        HAS_POST=post_scale is not None,
        BLOCK_COLUMNS=block_columns,
        enable_fp_fusion=False,
    )
    return out
