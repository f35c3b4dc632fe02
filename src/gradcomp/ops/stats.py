"""log_moments: the one fused reduction that the lognormal fit (and hence the pruning threshold) needs."""

from __future__ import annotations

import torch
from torch import Tensor

from gradcomp._backend import Backend, check_float, compute_layout, use_triton
from gradcomp.ops._chunked import sum_chunks

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
    float_dtype = compute_layout(x.dtype).float_dtype

    def chunk_moments(chunk: Tensor) -> tuple[Tensor, ...]:
        magnitude = chunk.to(float_dtype).abs()
        zero = torch.eq(magnitude, 0, out=torch.empty_like(magnitude))  # 1.0 at zeros (bool math is slow)
        log_abs = torch.log(magnitude + zero)  # zeros become ln 1 = 0 (and avoid the slow -inf path)
        sum_log, sum_log_sq = log_abs.sum(), torch.dot(log_abs, log_abs)
        zeros = zero.sum()
        if not torch.isfinite(sum_log_sq):  # NaN or Inf in this chunk: leave them out
            finite = torch.isfinite(log_abs)
            log_abs = torch.where(finite, log_abs, 0.0)
            sum_log, sum_log_sq = log_abs.sum(), torch.dot(log_abs, log_abs)
            return finite.sum() - zeros, sum_log, sum_log_sq, zeros
        return magnitude.numel() - zeros, sum_log, sum_log_sq, zeros

    return sum_chunks(x, chunk_moments)
