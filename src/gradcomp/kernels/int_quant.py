"""Triton kernels of `gradcomp.ops.quantize_int`: per-row stochastic affine quantization (PTQ/PSQ and the
quantization step of BHQ) and the block-Householder reflection of BHQ."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp.kernels.rng import random_uint32, uniform24
from gradcomp.rng import as_int32, seed_keys

BLOCK = 1024
BLOCK_COLUMNS = 256


@triton.jit
def _stochastic_affine_kernel(
    x_ptr, out_ptr, params_ptr, n, row_length, n_rows, levels, k0, k1, BLOCK: tl.constexpr
):
    """`AffineMap` of each row, its fields stacked in params (7, n_rows); the operations and their order
    are those of the torch implementation (no fused multiply-adds), so the bits agree."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    row = offsets // row_length
    pre = tl.load(params_ptr + row, mask=mask, other=1.0)
    zero = tl.load(params_ptr + n_rows + row, mask=mask, other=0.0)
    scale = tl.load(params_ptr + 2 * n_rows + row, mask=mask, other=1.0)
    step = tl.load(params_ptr + 3 * n_rows + row, mask=mask, other=1.0)
    post = tl.load(params_ptr + 4 * n_rows + row, mask=mask, other=1.0)
    low = tl.load(params_ptr + 5 * n_rows + row, mask=mask, other=0.0)
    high = tl.load(params_ptr + 6 * n_rows + row, mask=mask, other=0.0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    codes = (x * pre - zero) * scale
    codes = tl.minimum(tl.maximum(codes, 0.0), levels)
    whole = tl.floor(codes)
    up = uniform24(random_uint32(offsets, k0, k1)) < (codes - whole) * 16777216.0
    out = ((whole + up.to(tl.float32)) * step + zero) * post
    out = tl.minimum(tl.maximum(out, low, tl.PropagateNan.ALL), high, tl.PropagateNan.ALL)  # as torch.clamp
    tl.store(out_ptr + offsets, out, mask=mask)


def stochastic_affine_triton(
    rows: Tensor, params: Tensor, levels: int, seed: int, block: int = BLOCK
) -> Tensor:
    """float32 rows (R, D) and the stacked fields of their `AffineMap` (7, R), float32."""
    rows = rows.contiguous()
    params = params.contiguous()
    out = torch.empty_like(rows)
    k0, k1 = seed_keys(seed)
    n = rows.numel()
    _stochastic_affine_kernel[(triton.cdiv(n, block),)](
        rows,
        out,
        params,
        n,
        rows.shape[1],
        rows.shape[0],
        float(levels),
        as_int32(k0),
        as_int32(k1),
        BLOCK=block,
        enable_fp_fusion=False,
    )
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
    members = torch.argsort(transform.block, stable=True)
    starts = torch.zeros(n_rows + 1, dtype=torch.int64, device=rows.device)
    starts[1:] = torch.cumsum(torch.bincount(transform.block, minlength=n_rows), 0)
    out = torch.empty_like(rows)
    _householder_kernel[(n_rows, triton.cdiv(row_length, block_columns))](
        rows,
        out,
        members,
        starts,
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
