"""Triton kernel of `gradcomp.ops.stochastic_prune`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp.kernels.rng import random_uint32, uniform24
from gradcomp.rng import as_int32, seed_keys

BLOCK = 1024


@triton.jit
def _stochastic_prune_kernel(x_ptr, out_ptr, alpha_ptr, keep_scale_ptr, n, k0, k1, BLOCK: tl.constexpr):
    """The formula of the torch implementation, copysign(keep * max(|x|, alpha), x), NaN input kept as is
    (a NaN alpha makes every other output NaN, as there)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    magnitude = tl.abs(x)
    keep = uniform24(random_uint32(offsets, k0, k1)) < magnitude * tl.load(keep_scale_ptr)
    kept = keep.to(tl.float32) * tl.maximum(magnitude, tl.load(alpha_ptr), tl.PropagateNan.ALL)
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    out = tl.where(x != x, x, (kept.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True))
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def stochastic_prune_triton(
    x: Tensor, alpha: Tensor, keep_scale: Tensor, seed: int, block: int = BLOCK
) -> Tensor:
    """alpha and keep_scale = 2^24 / alpha (rounded up) are float32 0-d tensors on x's device."""
    x_flat = x.contiguous().view(-1)
    out = torch.empty_like(x_flat)
    k0, k1 = seed_keys(seed)
    n = x_flat.numel()
    _stochastic_prune_kernel[(triton.cdiv(n, block),)](
        x_flat, out, alpha, keep_scale, n, as_int32(k0), as_int32(k1), BLOCK=block, enable_fp_fusion=False
    )
    return out.view(x.shape)
