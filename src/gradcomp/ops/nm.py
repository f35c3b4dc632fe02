"""Unbiased N:M pruning of neural gradients with minimum variance (Chmiel, Hubara, Banner, Soudry, ICLR 2023).

In each block of m consecutive elements along `axis` at most n stay non-zero, as the sparse tensor cores of
Ampere and later GPUs take them (2:4). Keeping the n largest (the MSE-optimal mask) is biased, which
gradients do not tolerate. The estimator here keeps element i with probability p_i and divides it by p_i,
which is unbiased for any p with sum p_i = n; its variance sum x_i^2 (1/p_i - 1) is least for p_i
proportional to |x_i|, capped at 1 with the rest shared again (water-filling). Exactly n elements (fewer
where the block has fewer non-zeros) are drawn with these marginals by systematic sampling: one uniform u
per block, element i kept where an integer lies in [C_(i-1) - u, C_i - u), C the running sum of p. For
1:2 this is the paper's closed form: keep x_1 with probability |x_1|/(|x_1| + |x_2|), as
sign(x_1)(|x_1| + |x_2|).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gradcomp._backend import Backend, check_float, use_triton
from gradcomp.formats.nm import keep_probabilities
from gradcomp.ops._blocks import as_blocks
from gradcomp.ops.stats import add_zero_count, check_counter
from gradcomp.rng import random_bits, resolve_seed, uniform24

MAX_M = 16


def nm_prune(
    x: Tensor,
    n: int = 2,
    m: int = 4,
    axis: int = -1,
    seed: int | None = None,
    backend: Backend = "auto",
    count_zeros_into: Tensor | None = None,
) -> Tensor:
    """x with at most n non-zeros in every block of m consecutive elements along `axis`, unbiased with
    minimum variance (see the module). A trailing block shorter than m (axis length not a multiple of m)
    is treated as padded with zeros: it too keeps at most n. A block with a NaN or Inf passes through
    unchanged (no probabilities can be formed from it). Computed in float32 (float64 for float64 x) and
    returned in x's dtype. Random bits come from (seed, block index in x's layout with `axis` last).
    count_zeros_into: an int64 one-element tensor on x's device to which the output's zeros are added.
    One kernel launch on CUDA (plus a copy where `axis` is not the last, contiguous one or m does not
    divide it); no host sync. Not differentiable.

    Range limits: the pattern holds for every finite block, whatever its magnitudes: the probabilities are
    formed on the block times 2^-8 where its largest magnitude reaches 2^120 (2^1016 for float64), which is
    exact and keeps their sums finite (an element below 2^-141, 2^-1066 for float64, of such a block may
    then get p = 0: a bias of its own magnitude). A kept element comes out as x_i / p_i: x_i where p_i
    = 1, else sign(x_i) times the summed magnitude of the elements with p < 1 over the number of them to
    keep. Where that exceeds the largest finite value of x's dtype (e.g. four float16 20000 at 1:4: 80000),
    no unbiased N:M sample of the block exists in the dtype, and the value overflows to +-Inf, as the
    dtype's own arithmetic does (not saturated, which would bias silently; loss scalers such as
    torch.amp.GradScaler see the Inf and skip the step). Every other finite block gives finite values.
    Kept values are rounded once to x's dtype, to the nearest: for float16 and bfloat16, and below the
    dtype's normal range, a bias of at most half a unit in the last place (a kept subnormal of 1.5 units
    becomes 2). The decisions draw u with 24 bits: probabilities resolve to 2^-24."""
    x = check_float(x, "nm_prune")
    for name, value in (("n", n), ("m", m)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if not 1 <= n < m <= MAX_M:
        raise ValueError(f"need 1 <= n < m <= {MAX_M}, got n={n}, m={m}")
    check_counter(count_zeros_into, x)
    seed = resolve_seed(seed)
    if x.numel() == 0:
        return x.clone()
    blocks, restore = as_blocks(x, m, axis)
    if use_triton(x, backend):
        from gradcomp.kernels.nm import nm_prune_triton

        out = nm_prune_triton(blocks, n, seed)
    else:
        out = nm_prune_blocks(blocks, n, seed)
    return add_zero_count(restore(out), count_zeros_into)


def nm_prune_blocks(blocks: Tensor, n: int, seed: int) -> Tensor:
    """The torch implementation on rows of m elements (the oracle of the kernel). The running sum of p is
    capped at n, so that a sum rounded above n cannot make an (n+1)-th element kept."""
    dtype = torch.float64 if blocks.dtype == torch.float64 else torch.float32
    values = blocks.to(dtype)
    p = keep_probabilities(values.abs(), n)
    u = uniform24(random_bits(seed, blocks.shape[0], blocks.device)).to(dtype) * 2.0**-24
    keep, cumulative = [], torch.zeros_like(u)
    for column in range(blocks.shape[1]):
        before = torch.ceil(cumulative - u)
        cumulative = (cumulative + p[:, column]).clamp(max=n)
        keep.append(torch.ceil(cumulative - u) > before)
    kept = torch.stack(keep, 1)
    out = torch.where(kept, values / p, 0.0).to(blocks.dtype)
    return torch.where(torch.isfinite(values).all(1, keepdim=True), out, blocks)
