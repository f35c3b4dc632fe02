"""Public compression ops: a vectorised torch implementation each (the CPU path and the test oracle) and a
Triton kernel used for CUDA tensors; `backend="auto"|"torch"|"triton"` chooses."""

from gradcomp.ops.block import quantize_block
from gradcomp.ops.fp_quant import quantize_fp
from gradcomp.ops.hadamard import hadamard, hadamard_inverse
from gradcomp.ops.int_quant import quantize_int
from gradcomp.ops.luq import quantize_luq
from gradcomp.ops.nm import nm_prune
from gradcomp.ops.prune import (
    gaussian_threshold,
    laplace_threshold,
    lognormal_threshold,
    lognormal_threshold_from_moments,
    stochastic_prune,
    topk_threshold,
)
from gradcomp.ops.stats import fit_statistics, log_moments

__all__ = [
    "fit_statistics",
    "gaussian_threshold",
    "hadamard",
    "hadamard_inverse",
    "laplace_threshold",
    "log_moments",
    "lognormal_threshold",
    "lognormal_threshold_from_moments",
    "nm_prune",
    "quantize_block",
    "quantize_fp",
    "quantize_int",
    "quantize_luq",
    "stochastic_prune",
    "topk_threshold",
]
