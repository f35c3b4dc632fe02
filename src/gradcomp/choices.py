"""What every op, policy, config key and command accepts: the choice sets and bounds, and the checks of a
value against them, in one place.

No torch here: configs are validated while Snakemake parses the workflow, which must not import it (dtypes
are named by their torch names without the ``torch.`` prefix). Every check raises ValueError for a value
outside what is accepted, whatever its type (what configs and the ops have always raised, and what the
`gradcomp` command reports in one line), with one message form: ``NAME must be ..., got VALUE``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# ops (gradcomp.ops) and the policies that run them
ROUNDINGS = ("nearest", "stochastic")  # quantize_fp, quantize_block
INT_SCHEMES = ("ptq", "psq", "bhq")  # quantize_int
INT_WEIGHT_SCHEMES = ("auto", "same", "ptq", "column", "none")  # Integer.weight_scheme
INT_BITS = (1, 16)  # quantize_int, Integer.bits and weight_bits: [low, high]
LUQ_BITS = (2, 8)  # 2^7 binades above alpha: a float32 alpha keeps every level a normal float32
LUQ_SAMPLES = (1, 16)  # the Luq policy's SMP samples
NM_MAX_M = 16  # nm_prune: 1 <= n < m <= NM_MAX_M
# quantize_block's scale formats: OCP MX's power of two, and the two-level scales (a float32 per tensor times
# an 8-bit float per block): NVFP4's E4M3, and the E3M4 and unsigned E5M3 (UE5M3) FP4 All the Way compares
BLOCK_SCALES = ("e8m0fnu", "e4m3fn", "float8_e3m4", "e5m3fnu")
# quantize_block's scale rules (te: Transformer Engine's NVFP4; three_quarters: floor and Tseng et al.'s 3/4;
# four_over_six: each NVFP4 block's largest value mapped to 6 or to 4, whichever errs less; reciprocal: FP4
# All the Way's variant, the block scale's reciprocal rounded to the scale format)
SCALE_RULES = ("floor", "ceil", "te", "three_quarters", "four_over_six", "reciprocal")
# Block.signs: the transform's random signs drawn anew at every call (Quartet), once per step for every layer,
# once for the run (NVIDIA's NVFP4 recipe), or none (the deterministic Walsh-Hadamard matrix)
SIGN_MODES = ("call", "step", "run", "none")
MAX_OUTER = 1024  # a two-level format's outer blocks (float32 scales): powers of two up to this
MAX_BLOCK = 256  # block sizes and Hadamard transform sizes: powers of two in [2, MAX_BLOCK]
ESTIMATORS = ("lognormal", "gaussian", "laplace", "topk")  # Prune.estimator
FITS = ("bn_nonzero", "reference", "all")  # Prune.fit
SCALINGS = ("per_layer_mean", "per_layer_optimal", "global", "dynamic")  # FloatingPoint.scaling
BACKENDS = ("auto", "torch", "triton")
KERNEL_DTYPES = ("float16", "bfloat16", "float32")  # what the Triton kernels and float32-only ops take
# where and when an attachment compresses (CompressionConfig)
LAYER_TYPES = ("conv", "linear", "bn")
PLACEMENTS = ("output", "input")
REFRESHES = ("step", "epoch")  # or an integer K >= 1: every K steps
# the noise ratio the precision guard and keep_worst act on (gradcomp.training.noise_monitor): measured with
# the weight-gradient GEMMs (needs measure_noise), or predicted from the error the compression made, or from
# the lognormal theory of the policy's error
GUARD_RATIOS = ("measured", "carried", "theory")
# training (TrainConfig, `gradcomp train`)
DEVICES = ("auto", "cpu", "cuda")  # or cuda:K, the K-th GPU
OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("cosine", "step", "constant")
STEMS = ("model", "3x3", "3x3s2")  # the model's own first layers, or a small-image ResNet stem (models.py)
# what a claim's deciding comparisons test (gradcomp.analysis.verdicts; "exact": computed, no seeds)
CLAIM_TESTS = ("equivalence", "difference", "non-inferiority", "superiority", "exact")

_CUDA_INDEX = re.compile(r"cuda:\d+")
# annotation -> the values it accepts, for `typed`
_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": numbers.Integral,
    "float": numbers.Real,
    "bool": bool,
    "dict": dict,
    "list": list,
    "None": type(None),
}


def choose(name: str, value: object, options: Sequence[T]) -> T:
    """The option equal to `value` (of the same type: True is not 1)."""
    for option in options:
        if type(value) is type(option) and value == option:
            return option
    raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")


def is_integer(value: object) -> bool:
    """Whether `value` is an integer: an int or a numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """`value` as an int (numpy integers taken), if it is an integer >= low and <= high (None: unbounded; a
    high bound comes with a low one)."""
    if is_integer(value) and (low is None or value >= low) and (high is None or value <= high):
        return int(value)
    bounds = "" if low is None else f" >= {low}" if high is None else f" in [{low}, {high}]"
    raise ValueError(f"{name} must be an integer{bounds}, got {value!r}")


def positive(name: str, value: object) -> float:
    """`value` as a float, if it is a finite real number > 0."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def device(name: str, value: object) -> str:
    """A device: one of DEVICES, or cuda:K."""
    if isinstance(value, str) and _CUDA_INDEX.fullmatch(value):
        return value
    return choose(name, value, DEVICES)


def typed(name: str, annotation: str, value: Any) -> Any:
    """`value` checked against a dataclass field's annotation string (postponed annotations: ``"float |
    None"``) and returned as the plain type: an integer where a float is expected is a float (YAML writes 1
    for 1.0), numpy scalars become Python numbers. Annotations naming other types (a nested config) are left
    to that type's own check."""
    options = [option.strip() for option in annotation.split("|")]
    if not all(option in _TYPES for option in options):
        return value
    for option in options:
        if isinstance(value, _TYPES[option]) and (option == "bool" or not isinstance(value, bool)):
            if option == "float":
                return float(value)
            return int(value) if option == "int" else value
    raise ValueError(f"{name} must be {annotation}, got {value!r}")
