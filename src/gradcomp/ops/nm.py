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
    divide it); no host sync. Not differentiable."""
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


def keep_probabilities(magnitude: Tensor, n: int) -> Tensor:
    """p of each row of magnitudes: proportional to the magnitude with sum n, capped at 1 and the rest
    shared again (n rounds at most); 1 for every non-zero where a row has at most n of them. Sums run
    column by column (the kernel's order)."""
    capped = torch.zeros_like(magnitude, dtype=torch.bool)
    for _ in range(n):  # each round caps at least one more, and at most n can be capped
        capped = capped | ((_shares(magnitude, capped, n) >= 1.0) & ~capped)
    p = torch.where(capped, 1.0, _shares(magnitude, capped, n))
    return torch.where(magnitude > 0, torch.nan_to_num(p, nan=1.0, posinf=1.0), 0.0)


def _shares(magnitude: Tensor, capped: Tensor, n: int) -> Tensor:
    """n - (capped count) shared over the uncapped magnitudes of each row, in proportion."""
    free = torch.where(capped, 0.0, magnitude)
    rest = free[:, 0]
    for column in range(1, magnitude.shape[1]):
        rest = rest + free[:, column]
    budget = n - capped.sum(1).to(magnitude.dtype)
    return (budget[:, None] * magnitude) / rest[:, None]


def nm_prune_blocks(blocks: Tensor, n: int, seed: int) -> Tensor:
    """The torch implementation on rows of m elements (the oracle of the kernel)."""
    dtype = torch.float64 if blocks.dtype == torch.float64 else torch.float32
    values = blocks.to(dtype)
    magnitude = values.abs()
    p = keep_probabilities(magnitude, n)
    u = uniform24(random_bits(seed, blocks.shape[0], blocks.device)).to(dtype) * 2.0**-24
    keep, cumulative = [], torch.zeros_like(u)
    for column in range(blocks.shape[1]):
        before = torch.ceil(cumulative - u)
        cumulative = cumulative + p[:, column]
        keep.append(torch.ceil(cumulative - u) > before)
    kept = torch.stack(keep, 1)
    out = torch.where(kept, values / p, 0.0).to(blocks.dtype)
    return torch.where(torch.isfinite(values).all(1, keepdim=True), out, blocks)
