"""log_moments: the one fused reduction that the lognormal fit (and hence the pruning threshold) needs."""

from __future__ import annotations

import torch
from torch import Tensor

from gradcomp._backend import Backend, check_float, compute_layout, use_triton

MOMENT_FIELDS = ("count_nonzero", "sum_log", "sum_log_sq", "count_zero")


def log_moments(x: Tensor, backend: Backend = "auto") -> Tensor:
    """float64 tensor [count_nonzero, sum ln|x|, sum ln^2|x|, count_zero] over x's finite elements.

    Zeros (e.g. from ReLU) are counted apart because ln 0 is undefined; NaN and +-Inf take part in neither
    count, so numel - count_nonzero - count_zero is the number of non-finite elements.
    """
    check_float(x, "log_moments")
    if x.numel() == 0:
        return torch.zeros(4, dtype=torch.float64, device=x.device)
    if use_triton(x, backend):
        from gradcomp.kernels.stats import log_moments_triton

        return log_moments_triton(x)
    magnitude = x.to(compute_layout(x.dtype).float_dtype).abs()
    nonzero = (magnitude > 0) & (magnitude < torch.inf)
    log_abs = torch.where(nonzero, torch.log(magnitude), 0.0)
    return torch.stack(
        [
            nonzero.sum(dtype=torch.float64),
            log_abs.sum(dtype=torch.float64),
            (log_abs * log_abs).sum(dtype=torch.float64),
            (magnitude == 0).sum(dtype=torch.float64),
        ]
    )
