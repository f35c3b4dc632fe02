"""gradcomp: compression of neural gradients (loss gradients w.r.t. layer outputs) for training.

Reproduces "Neural gradients are near-lognormal" (Chmiel et al., ICLR 2021) and "A Statistical Framework
for Low-bitwidth Training of Deep Neural Networks" (Chen et al., NeurIPS 2020).

The public names below load on first use (PEP 562), so that importing a torch-free module of the package
(`gradcomp.experiments`, `gradcomp.pipeline`, `gradcomp.training.policies`: what parsing the Snakemake
workflow needs) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Attachment": "gradcomp.training.attachment",
    "attach": "gradcomp.training.attachment",
    "select_layers": "gradcomp.training.attachment",
    "CompressionConfig": "gradcomp.training.config",
    "Block": "gradcomp.training.policies",
    "BlockFormat": "gradcomp.formats.block",
    "Chain": "gradcomp.training.policies",
    "FloatingPoint": "gradcomp.training.policies",
    "Integer": "gradcomp.training.policies",
    "Luq": "gradcomp.training.policies",
    "NM": "gradcomp.training.policies",
    "NoCompression": "gradcomp.training.policies",
    "Policy": "gradcomp.training.policies",
    "Prune": "gradcomp.training.policies",
    "parse_policy": "gradcomp.training.policies",
    "DTYPE_FORMATS": "gradcomp.formats",
    "E2M1FN": "gradcomp.formats",
    "E2M3FN": "gradcomp.formats",
    "E3M2FN": "gradcomp.formats",
    "E4M3": "gradcomp.formats",
    "E4M3FN": "gradcomp.formats",
    "E4M3FNUZ": "gradcomp.formats",
    "E5M2": "gradcomp.formats",
    "E5M2FNUZ": "gradcomp.formats",
    "E8M0FNU": "gradcomp.formats",
    "PAPER_FORMATS": "gradcomp.formats",
    "FPFormat": "gradcomp.formats",
    "parse_format": "gradcomp.formats",
    "count_work": "gradcomp.profiling",
    "fit_statistics": "gradcomp.ops",
    "gaussian_threshold": "gradcomp.ops",
    "laplace_threshold": "gradcomp.ops",
    "log_moments": "gradcomp.ops",
    "lognormal_threshold": "gradcomp.ops",
    "lognormal_threshold_from_moments": "gradcomp.ops",
    "hadamard": "gradcomp.ops",
    "hadamard_inverse": "gradcomp.ops",
    "nm_prune": "gradcomp.ops",
    "quantize_block": "gradcomp.ops",
    "quantize_fp": "gradcomp.ops",
    "quantize_int": "gradcomp.ops",
    "quantize_luq": "gradcomp.ops",
    "stochastic_prune": "gradcomp.ops",
    "topk_threshold": "gradcomp.ops",
}
__all__ = [
    "DTYPE_FORMATS",
    "E2M1FN",
    "E2M3FN",
    "E3M2FN",
    "E4M3",
    "E4M3FN",
    "E4M3FNUZ",
    "E5M2",
    "E5M2FNUZ",
    "E8M0FNU",
    "NM",
    "PAPER_FORMATS",
    "Attachment",
    "Block",
    "BlockFormat",
    "Chain",
    "CompressionConfig",
    "FPFormat",
    "FloatingPoint",
    "Integer",
    "Luq",
    "NoCompression",
    "Policy",
    "Prune",
    "attach",
    "count_work",
    "fit_statistics",
    "gaussian_threshold",
    "hadamard",
    "hadamard_inverse",
    "laplace_threshold",
    "log_moments",
    "lognormal_threshold",
    "lognormal_threshold_from_moments",
    "nm_prune",
    "parse_format",
    "parse_policy",
    "quantize_block",
    "quantize_fp",
    "quantize_int",
    "quantize_luq",
    "select_layers",
    "stochastic_prune",
    "topk_threshold",
]

if TYPE_CHECKING:
    from gradcomp.formats import (
        DTYPE_FORMATS,
        E2M1FN,
        E2M3FN,
        E3M2FN,
        E4M3,
        E4M3FN,
        E4M3FNUZ,
        E5M2,
        E5M2FNUZ,
        E8M0FNU,
        PAPER_FORMATS,
        FPFormat,
        parse_format,
    )
    from gradcomp.formats.block import BlockFormat
    from gradcomp.ops import (
        fit_statistics,
        gaussian_threshold,
        hadamard,
        hadamard_inverse,
        laplace_threshold,
        log_moments,
        lognormal_threshold,
        lognormal_threshold_from_moments,
        nm_prune,
        quantize_block,
        quantize_fp,
        quantize_int,
        quantize_luq,
        stochastic_prune,
        topk_threshold,
    )
    from gradcomp.profiling import count_work
    from gradcomp.training.attachment import Attachment, attach, select_layers
    from gradcomp.training.config import CompressionConfig
    from gradcomp.training.policies import (
        NM,
        Block,
        Chain,
        FloatingPoint,
        Integer,
        Luq,
        NoCompression,
        Policy,
        Prune,
        parse_policy,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gradcomp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
