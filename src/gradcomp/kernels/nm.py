"""Triton kernel of `gradcomp.ops.nm_prune`: one launch over rows of m elements, the torch implementation's
operations in its order (the block's scale, column sums one column after the other, the water-filling
rounds, systematic sampling with the running sum capped at n), so that the result is the same bit for bit."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp.formats.nm import SHRINK, shrink_from
from gradcomp.kernels.floats import to_storage
from gradcomp.kernels.rng import random_uint32, uniform24
from gradcomp.profiling import launch
from gradcomp.rng import as_int32, seed_keys

ROWS = 256  # blocks per program


@triton.jit
def _column(tile, columns, j):
    """Column j of a (rows, M_PAD) tile, exactly (one value plus zeros)."""
    return tl.sum(tl.where(columns[None, :] == j, tile, 0.0), 1)


@triton.jit
def _shares(magnitude, capped, columns, N: tl.constexpr, M: tl.constexpr):
    """n - (capped count) shared over the uncapped magnitudes, in proportion."""
    free = tl.where(capped, 0.0, magnitude)
    rest = _column(free, columns, 0)
    for j in tl.static_range(1, M):
        rest = rest + _column(free, columns, j)
    budget = N - tl.sum(capped.to(tl.float32), 1)
    return tl.math.div_rn(budget[:, None] * magnitude, rest[:, None])


@triton.jit
def _nm_kernel(
    x_ptr,
    out_ptr,
    rows_total,
    k0,
    k1,
    N: tl.constexpr,
    M: tl.constexpr,
    M_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    SHRINK: tl.constexpr,
    SHRINK_FROM: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    columns = tl.arange(0, M_PAD)
    inside = (rows[:, None] < rows_total) & (columns[None, :] < M)
    offsets = rows[:, None] * M + columns[None, :]
    raw = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    values = raw.to(tl.float32)
    magnitude = tl.abs(values)
    magnitude *= tl.where(tl.max(magnitude, 1) >= SHRINK_FROM, SHRINK, 1.0)[:, None]  # `block_scale`
    capped = magnitude < 0.0  # all False
    for _ in tl.static_range(N):
        share = _shares(magnitude, capped, columns, N, M)
        capped = capped | ((share >= 1.0) & ~capped)
    share = _shares(magnitude, capped, columns, N, M)
    p = tl.where(capped, 1.0, share)
    p = tl.where((p != p) | (p == float("inf")), 1.0, p)
    p = tl.where(magnitude > 0.0, p, 0.0)
    u = uniform24(random_uint32(rows, k0, k1)) * 5.9604644775390625e-08  # 2^-24
    cumulative = tl.zeros((ROWS,), tl.float32)
    keep = magnitude < 0.0
    for j in tl.static_range(M):
        before = tl.math.ceil(cumulative - u)
        cumulative = tl.minimum(cumulative + _column(p, columns, j), N * 1.0)
        keep = tl.where(columns[None, :] == j, (tl.math.ceil(cumulative - u) > before)[:, None], keep)
    out = tl.where(keep, tl.math.div_rn(values, p), 0.0)
    finite = tl.sum(tl.where((magnitude < float("inf")) | ~inside, 0, 1), 1) == 0
    out = tl.where(finite[:, None], to_storage(out, raw.dtype), raw)
    tl.store(out_ptr + offsets, out, mask=inside)


def nm_prune_triton(blocks: Tensor, n: int, seed: int) -> Tensor:
    """`nm_prune_blocks` on contiguous rows of m elements of a kernel dtype."""
    rows_total, m = blocks.shape
    out = torch.empty_like(blocks)
    k0, k1 = seed_keys(seed)
    launch(
        _nm_kernel,
        (triton.cdiv(rows_total, ROWS),),
        blocks,
        out,
        rows_total,
        as_int32(k0),
        as_int32(k1),
        N=n,
        M=m,
        M_PAD=triton.next_power_of_2(m),
        ROWS=ROWS,
        SHRINK=SHRINK,
        SHRINK_FROM=shrink_from(torch.float32),
        enable_fp_fusion=False,
    )
    return out
