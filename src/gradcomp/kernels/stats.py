"""Triton kernel of `gradcomp.ops.log_moments`: per-program partial sums, finished in float64 by torch
(a fixed reduction order, so results are deterministic run to run)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 1024
TILES_PER_PROGRAM = 16


@triton.jit
def _log_moments_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr, TILES: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    count = tl.zeros((BLOCK,), tl.float32)
    sum_log = tl.zeros((BLOCK,), tl.float32)
    sum_log_sq = tl.zeros((BLOCK,), tl.float32)
    zeros = tl.zeros((BLOCK,), tl.float32)
    for tile in range(TILES):
        offsets = (pid * TILES + tile) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        magnitude = tl.abs(tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32))
        nonzero = mask & (magnitude > 0) & (magnitude < float("inf"))
        log_abs = tl.log(tl.where(nonzero, magnitude, 1.0))
        count += nonzero.to(tl.float32)
        sum_log += log_abs
        sum_log_sq += log_abs * log_abs
        zeros += (mask & (magnitude == 0)).to(tl.float32)
    base = partial_ptr + pid * 4
    tl.store(base, tl.sum(count, 0))
    tl.store(base + 1, tl.sum(sum_log, 0))
    tl.store(base + 2, tl.sum(sum_log_sq, 0))
    tl.store(base + 3, tl.sum(zeros, 0))


def log_moments_triton(x: Tensor, block: int = BLOCK, tiles: int = TILES_PER_PROGRAM) -> Tensor:
    x_flat = x.contiguous().view(-1)
    programs = triton.cdiv(x_flat.numel(), block * tiles)
    partial = torch.empty((programs, 4), dtype=torch.float32, device=x.device)
    _log_moments_kernel[(programs,)](x_flat, partial, x_flat.numel(), BLOCK=block, TILES=tiles)
    return partial.sum(0, dtype=torch.float64)
