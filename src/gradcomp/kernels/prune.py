"""Triton kernel of `gradcomp.ops.stochastic_prune`: one launch, whether alpha is a number (a kernel
argument) or a tensor (read here and brought into range as the torch path does), with the output's zeros
counted in the same pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gradcomp._backend import compute_layout
from gradcomp.kernels import elementwise_grid
from gradcomp.kernels.floats import round_to
from gradcomp.kernels.rng import block_random_uint32, uniform24
from gradcomp.profiling import launch
from gradcomp.rng import as_int32, seed_keys


@triton.jit
def _stochastic_prune_kernel(
    x_ptr,
    out_ptr,
    alpha,
    keep_scale,
    n,
    k0,
    k1,
    zeros_ptr,
    ALPHA_IN_MEMORY: tl.constexpr,
    LARGEST: tl.constexpr,
    SMALLEST: tl.constexpr,
    COUNT_ZEROS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The formula of the torch implementation, copysign(keep * max(|x|, alpha), x), NaN input kept as is
    (a NaN alpha makes every other output NaN, as there). With ALPHA_IN_MEMORY, alpha points to the tensor
    and keep_scale = nextafter(2^24 / alpha, inf) is computed here."""
    if ALPHA_IN_MEMORY:
        value = tl.minimum(tl.load(alpha).to(tl.float32), LARGEST, tl.PropagateNan.ALL)
        value = round_to(value, x_ptr.dtype.element_ty)
        alpha = tl.where(value >= SMALLEST, value, tl.where(value >= 0.0, 0.0, float("nan")))
        quotient = tl.math.div_rn(16777216.0, alpha)
        next_up = (quotient.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True)
        keep_scale = tl.where(quotient < float("inf"), next_up, quotient)
    else:  # float32 arguments (the interpreter passes Python floats)
        alpha = tl.cast(alpha, tl.float32)
        keep_scale = tl.cast(keep_scale, tl.float32)
    start = tl.program_id(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    mask = lanes < n - start
    x = tl.load(x_ptr + start + lanes, mask=mask, other=0.0).to(tl.float32)
    magnitude = tl.abs(x)
    keep = uniform24(block_random_uint32(start, lanes, k0, k1)) < magnitude * keep_scale
    kept = keep.to(tl.float32) * tl.maximum(magnitude, alpha, tl.PropagateNan.ALL)
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    out = tl.where(x != x, x, (kept.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True))
    out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + start + lanes, out, mask=mask)
    if COUNT_ZEROS:
        tl.atomic_add(zeros_ptr, tl.sum(((out == 0.0) & mask).to(tl.int64)))


def stochastic_prune_triton(
    x: Tensor,
    alpha: float | Tensor,
    keep_scale: float | None,
    seed: int,
    zeros: Tensor | None = None,
    block: int | None = None,
) -> Tensor:
    """alpha: a number already rounded to x's dtype with keep_scale = 2^24 / alpha rounded up (float32), or
    a one-element tensor on x's device (keep_scale None). zeros: an int64 one-element tensor to which the
    output's zeros are added."""
    x_flat = x.contiguous().view(-1)
    out = torch.empty_like(x_flat)
    k0, k1 = seed_keys(seed)
    n = x_flat.numel()
    programs, block, warps = elementwise_grid(n, block)
    in_memory = isinstance(alpha, Tensor)
    launch(
        _stochastic_prune_kernel,
        (programs,),
        x_flat,
        out,
        alpha,
        0.0 if in_memory else keep_scale,
        n,
        as_int32(k0),
        as_int32(k1),
        x_flat if zeros is None else zeros,
        ALPHA_IN_MEMORY=in_memory,
        LARGEST=float(torch.finfo(x.dtype).max),
        SMALLEST=2.0**24 / float(torch.finfo(compute_layout(x.dtype).float_dtype).max),
        COUNT_ZEROS=zeros is not None,
        BLOCK=block,
        num_warps=warps,
        enable_fp_fusion=False,
    )
    return out.view(x.shape)
