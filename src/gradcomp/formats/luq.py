"""LUQ's levels: what `gradcomp.ops.quantize_luq` and its Triton kernel (`gradcomp.kernels.luq`) agree on,
without torch (as `gradcomp.formats.block` is for block formats). The callers read the numbers these take
from their dtypes."""

from __future__ import annotations

import math


def lowest_level_exponent(smallest_normal: float) -> int:
    """log2 of the smallest level LUQ uses on x of a dtype whose smallest normal number is `smallest_normal`
    (torch.finfo(dtype).tiny): levels below lose bits in it."""
    return round(math.log2(smallest_normal))


def smp_spread(samples: int, exp_bias: int) -> tuple[float, float]:
    """(from, scale) of the SMP sum of `samples` draws in the compute dtype whose exponent bias is `exp_bias`
    (emax: 127 for float32, 1023 for float64): where the largest magnitude is at least from = 2^(emax - s),
    s = ceil(log2 samples), the sum could overflow, so it is taken times scale = 2^-s (exact: every level is
    at least 2^(emax - s - 127) there)."""
    spread = (samples - 1).bit_length()
    return 2.0 ** (exp_bias - spread), 2.0**-spread
