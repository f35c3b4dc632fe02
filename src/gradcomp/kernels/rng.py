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
def _keys(k0, k1):
    return tl.cast(k0, tl.int32).to(tl.uint32, bitcast=True), tl.cast(k1, tl.int32).to(
        tl.uint32, bitcast=True
    )


@triton.jit
def random_uint32(offsets, k0, k1):
    """bits(seed, offsets) as uint32 for any int64 offsets; k0, k1 are the seed's keys passed as int32 bit
    patterns."""
    key0, key1 = _keys(k0, k1)
    low = offsets.to(tl.uint32)
    high = (offsets >> 32).to(tl.uint32)
    return _mix32((low + key0) ^ _mix32(high ^ key1))


@triton.jit
def block_random_uint32(start, lanes, k0, k1):
    """bits(seed, start + lanes) for a block that does not cross a multiple of 2^32 (start a multiple of a
    power-of-two block size, 0 <= lanes < block): the high word's hash is computed once per program and the
    lanes need 32-bit arithmetic only (the same bits as `random_uint32`)."""
    key0, key1 = _keys(k0, k1)
    high = _mix32((start >> 32).to(tl.uint32) ^ key1)
    low = start.to(tl.uint32) + lanes.to(tl.uint32)
    return _mix32((low + key0) ^ high)


@triton.jit
def uniform24(bits):
    """Top 24 bits of a uint32 as float32 in [0, 2^24): exact, the same values as `gradcomp.rng.uniform24`."""
    return (bits >> 8).to(tl.float32)
