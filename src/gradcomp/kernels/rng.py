"""The counter-based random bits of `gradcomp.rng`, inside Triton kernels (plain tl ops only)."""

import triton
import triton.language as tl


@triton.jit
def _mix32(x):
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x846CA68B
    x ^= x >> 16
    return x


@triton.jit
def random_uint32(offsets, k0, k1):
    """bits(seed, offsets) as uint32; k0, k1 are the seed's keys passed as int32 bit patterns."""
    low = offsets.to(tl.uint32)
    high = (offsets >> 32).to(tl.uint32)
    key0 = tl.cast(k0, tl.int32).to(tl.uint32, bitcast=True)
    key1 = tl.cast(k1, tl.int32).to(tl.uint32, bitcast=True)
    return _mix32((low + key0) ^ _mix32(high ^ key1))


@triton.jit
def uniform24(bits):
    """Top 24 bits of a uint32 as float32 in [0, 2^24): exact, the same values as `gradcomp.rng.uniform24`."""
    return (bits >> 8).to(tl.float32)
