"""Float helpers shared by the kernels."""

import triton
import triton.language as tl


@triton.jit
def round_to(value, DTYPE: tl.constexpr):
    """float32 value rounded to DTYPE (to nearest, ties to even) and back to float32. bfloat16 is rounded
    on the bits, because the Triton interpreter's conversion to it truncates (compiled kernels round)."""
    if tl.bfloat16 == DTYPE:
        bits = value.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        finite = tl.abs(value) < float("inf")
        return tl.where(finite, rounded.to(tl.float32, bitcast=True), value)
    return value.to(DTYPE).to(tl.float32)


@triton.jit
def to_storage(value, DTYPE: tl.constexpr):
    """float32 value converted to DTYPE for a store, rounded to nearest (see `round_to`)."""
    return round_to(value, DTYPE).to(DTYPE)
