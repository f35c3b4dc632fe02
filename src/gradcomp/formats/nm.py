"""MVUE N:M's keep probabilities: what `gradcomp.ops.nm_prune`, its Triton kernel (`gradcomp.kernels.nm`)
and the theory (`gradcomp.theory.unbiased.nm_variance`, which integrates them in float64) agree on, below all
three (as `gradcomp.formats.block` is for block formats; unlike it, this module imports torch, as the
probabilities are computed on tensors). The kernel takes `SHRINK` and `shrink_from` from here."""

from __future__ import annotations

import torch
from torch import Tensor

from gradcomp._backend import compute_layout

SHRINK = 2.0**-8  # see `block_scale`


def keep_probabilities(magnitude: Tensor, n: int) -> Tensor:
    """p of each row of magnitudes: proportional to the magnitude with sum n, capped at 1 and the rest
    shared again (n rounds at most); 1 for every non-zero where a row has at most n of them. Formed on the
    row times `block_scale` (exact), so that no sum overflows. Sums run column by column (the kernel's
    order)."""
    magnitude = magnitude * block_scale(magnitude)
    capped = torch.zeros_like(magnitude, dtype=torch.bool)
    for _ in range(n):  # each round caps at least one more, and at most n can be capped
        capped = capped | ((_shares(magnitude, capped, n) >= 1.0) & ~capped)
    p = torch.where(capped, 1.0, _shares(magnitude, capped, n))
    return torch.where(magnitude > 0, torch.nan_to_num(p, nan=1.0, posinf=1.0), 0.0)


def block_scale(magnitude: Tensor) -> Tensor:
    """SHRINK for the rows whose largest magnitude reaches `shrink_from`, else 1: a power of two (exact,
    but for magnitudes that become subnormal), after which a sum of MAX_M = 16 (`gradcomp.ops.nm.MAX_M`)
    magnitudes or n times one stays finite, while the other rows are left as they are (so are their
    results, bit for bit)."""
    return torch.where(magnitude.amax(1, keepdim=True) >= shrink_from(magnitude.dtype), SHRINK, 1.0)


def shrink_from(dtype: torch.dtype) -> float:
    """2^(emax - 7) of the compute dtype `dtype`: a row of up to MAX_M = 2^4 magnitudes below it sums to
    less than 2^(emax - 3), and one times SHRINK is below it."""
    return 2.0 ** (compute_layout(dtype).exp_bias - 7)


def _shares(magnitude: Tensor, capped: Tensor, n: int) -> Tensor:
    """n - (capped count) shared over the uncapped magnitudes of each row, in proportion."""
    free = torch.where(capped, 0.0, magnitude)
    rest = free[:, 0]
    for column in range(1, magnitude.shape[1]):
        rest = rest + free[:, column]
    budget = n - capped.sum(1).to(magnitude.dtype)
    return (budget[:, None] * magnitude) / rest[:, None]
