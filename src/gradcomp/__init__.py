"""gradcomp: compression of neural gradients (loss gradients w.r.t. layer outputs) for training.

Reproduces "Neural gradients are near-lognormal" (Chmiel et al., ICLR 2021) and "A Statistical Framework
for Low-bitwidth Training of Deep Neural Networks" (Chen et al., NeurIPS 2020).
"""

from gradcomp.formats import E4M3, E5M2, PAPER_FORMATS, FPFormat, parse_format
from gradcomp.ops import (
    gaussian_threshold,
    laplace_threshold,
    log_moments,
    lognormal_threshold,
    lognormal_threshold_from_moments,
    quantize_fp,
    quantize_int,
    stochastic_prune,
    topk_threshold,
)

__version__ = "0.1.0"

__all__ = [
    "E4M3",
    "E5M2",
    "PAPER_FORMATS",
    "FPFormat",
    "gaussian_threshold",
    "laplace_threshold",
    "log_moments",
    "lognormal_threshold",
    "lognormal_threshold_from_moments",
    "parse_format",
    "quantize_fp",
    "quantize_int",
    "stochastic_prune",
    "topk_threshold",
]
