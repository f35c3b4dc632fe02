"""log_moments: the one fused reduction that the lognormal fit (and hence the pruning threshold) needs."""

from __future__ import annotations

import torch
from torch import Tensor

from gradcomp._backend import Backend, CpuCompiled, check_float, compute_layout, use_triton
from gradcomp.ops._chunked import sum_chunks

MOMENT_FIELDS = ("count_nonzero", "sum_log", "sum_log_sq", "count_zero")


def log_moments(x: Tensor, backend: Backend = "auto") -> Tensor:
    """float64 tensor [count_nonzero, sum ln|x|, sum ln^2|x|, count_zero] over x's finite elements.

    Zeros (e.g. from ReLU) are counted apart because ln 0 is undefined; NaN and +-Inf take part in neither
    count, so numel - count_nonzero - count_zero is the number of non-finite elements.
    """
    x = check_float(x, "log_moments")
    if x.numel() == 0:
        return torch.zeros(4, dtype=torch.float64, device=x.device)
    if use_triton(x, backend):
        from gradcomp.kernels.stats import log_moments_triton

        return log_moments_triton(x)

    def chunk_moments(chunk: Tensor) -> tuple[Tensor, ...]:
        zeros, sum_log, sum_log_sq = _log_sums(chunk)
        if torch.isfinite(sum_log_sq):
            return chunk.numel() - zeros, sum_log, sum_log_sq, zeros
        log_abs, _ = _log_magnitudes(chunk)  # NaN or Inf in this chunk: leave them out
        finite = torch.isfinite(log_abs)
        log_abs = torch.where(finite, log_abs, 0.0)
        return finite.sum() - zeros, log_abs.sum(), torch.dot(log_abs, log_abs), zeros

    return sum_chunks(x, chunk_moments)


def _log_magnitudes(chunk: Tensor) -> tuple[Tensor, Tensor]:
    """(ln|x| with ln|0| taken as 0, 1.0 at the zeros) in the compute dtype (bool math is slow on CPUs; the
    -inf of ln 0 too). In place where possible: fresh buffers cost page faults."""
    magnitude = chunk.to(compute_layout(chunk.dtype).float_dtype).abs()
    zero = torch.eq(magnitude, 0, out=torch.empty_like(magnitude))
    return magnitude.add_(zero).log_(), zero


@CpuCompiled
def _log_sums(chunk: Tensor) -> Tensor:
    """(count of zeros, sum ln|x|, sum ln^2|x|) of one chunk, zeros left out of the sums."""
    log_abs, zero = _log_magnitudes(chunk)
    return torch.stack([zero.sum(), log_abs.sum(), torch.dot(log_abs, log_abs)])
