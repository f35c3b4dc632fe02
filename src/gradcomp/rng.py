"""Counter-based random bits: bits(seed, i) depends only on the seed and the element's row-major index i.

The same function is computed by the torch ops (here) and inside every Triton kernel
(`gradcomp.kernels.rng`), so a seed gives the same result on CPU and GPU and for any kernel block size.

    k0, k1 = splitmix64(seed)                    (two 32-bit keys)
    bits(i) = mix32(((i mod 2^32) + k0) ^ mix32((i >> 32) ^ k1))     (uint32 arithmetic)

`mix32` is the "lowbias32" integer hash (two multiply/xorshift rounds, near-ideal avalanche).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from gradcomp.choices import is_integer

MASK32 = 0xFFFFFFFF
MIX1, MIX2 = 0x7FEB352D, 0x846CA68B
SIGN_COUNTER = 1 << 62  # counters of the Hadamard transform's signs: beyond any element index
_CHUNK = 1 << 32  # elements sharing the high word of the counter
_SHORT = 1 << 18  # requests up to this size (the chunks of gradcomp.ops) start from a cached counter


def mix32(x: int) -> int:
    """lowbias32 on a Python int (uint32 semantics)."""
    x ^= x >> 16
    x = (x * MIX1) & MASK32
    x ^= x >> 15
    x = (x * MIX2) & MASK32
    return x ^ (x >> 16)


def seed_keys(seed: int) -> tuple[int, int]:
    """The two 32-bit keys of a seed (splitmix64 finaliser, so nearby seeds give unrelated streams)."""
    z = (seed + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z & MASK32, z >> 32


def fresh_seed() -> int:
    """A new seed from torch's global CPU generator, so `torch.manual_seed` makes runs repeatable."""
    return int(torch.randint(0, 2**62, (1,)).item())


def resolve_seed(seed: int | None) -> int:
    """`seed` as an int (numpy integers taken), or a fresh one for None. A bool, float or string is a
    TypeError: it would key the random bits by accident (True is 1, 2.0 fails deep inside the mixing)."""
    if seed is None:
        return fresh_seed()
    if not is_integer(seed):
        raise TypeError(f"seed must be an integer or None, got {seed!r}")
    return int(seed)


def as_int32(value: int) -> int:
    """A uint32 bit pattern as the int32 with the same bits (what torch int32 tensors hold)."""
    return value - (1 << 32) if value >= 1 << 31 else value


def _mix32_(x: Tensor) -> Tensor:
    """lowbias32 in place on an int32 tensor holding uint32 bit patterns (int32 products wrap mod 2^32)."""
    tmp = torch.empty_like(x)
    for shift, multiplier in ((16, MIX1), (15, MIX2)):
        torch.bitwise_right_shift(x, shift, out=tmp)
        tmp &= (1 << (32 - shift)) - 1  # logical shift from an arithmetic one
        x ^= tmp
        x *= as_int32(multiplier)
    torch.bitwise_right_shift(x, 16, out=tmp)
    tmp &= 0xFFFF
    x ^= tmp
    return x


@functools.cache
def _short_counter(device: torch.device) -> Tensor:
    """0, 1, ..., _SHORT - 1 as int32: the counters of a chunk are this plus a constant (one pass instead
    of an arange, which is several times slower than an addition on CPUs)."""
    return torch.arange(_SHORT, dtype=torch.int32, device=device)


def _keys_at(k0: int, k1: int, position: int) -> tuple[int, int]:
    """(first, high) as int32: bits(position + j) = mix32(((j + first) mod 2^32) ^ high) while the high word
    of position + j stays the same."""
    return as_int32(((position % _CHUNK) + k0) & MASK32), as_int32(mix32((position >> 32) ^ k1))


class ChunkCounter(NamedTuple):
    """The counters of `numel` elements from `start`, as tensors only (so that a compiled chunk function
    takes every seed and offset without recompiling): bits = hash_counter(base, first, high)."""

    base: Tensor  # 0, 1, ..., numel - 1 (int32)
    first: Tensor  # 0-d int32
    high: Tensor  # 0-d int32


def chunk_counter(seed: int, numel: int, device: torch.device | str, start: int = 0) -> ChunkCounter:
    """Counters of a chunk of at most 2^18 elements that does not cross a multiple of 2^32 (the chunks of
    `gradcomp.ops` never do)."""
    if numel > _SHORT or (numel and start // _CHUNK != (start + numel - 1) // _CHUNK):
        raise ValueError(f"a chunk is at most {_SHORT} elements in one 2^32 block, got {numel} at {start}")
    device = torch.device(device)
    return ChunkCounter(_short_counter(device)[:numel], *counter_keys(seed, device, start))


def counter_keys(seed: int, device: torch.device | str, start: int = 0) -> tuple[Tensor, Tensor]:
    """(first, high) of `_keys_at` for the counters from `start`, as 0-d int32 tensors on `device` (so that a
    compiled function takes every seed and offset without recompiling)."""
    as_tensor = functools.partial(torch.tensor, dtype=torch.int32, device=device)
    first, high = _keys_at(*seed_keys(seed), start)
    return as_tensor(first), as_tensor(high)


def counter_bits(numel: int, first: Tensor, high: Tensor) -> Tensor:
    """`random_bits` of the `numel` positions from the start of their `counter_keys` (within one multiple of
    2^32: numel <= 2^32 from 0); compiled, the counter is index arithmetic."""
    base = torch.arange(numel, dtype=torch.int64, device=first.device).to(torch.int32)
    return hash_counter(base, first, high)


def hash_counter(base: Tensor, first: Tensor | int, high: Tensor | int) -> Tensor:
    """The random bits of a `ChunkCounter` (int32 sums wrap mod 2^32, which is the bit pattern we want)."""
    counter = base + first
    counter ^= high
    return _mix32_(counter)


def random_bits(seed: int, numel: int, device: torch.device | str = "cpu", start: int = 0) -> Tensor:
    """bits(seed, i) for i in [start, start + numel), as an int32 tensor holding the uint32 bit patterns."""
    k0, k1 = seed_keys(seed)
    pieces = []
    position, end = start, start + numel
    while position < end:  # pieces that share the high word of the counter
        piece_end = min(end, (position // _CHUNK + 1) * _CHUNK)
        count = piece_end - position
        if count <= _SHORT:
            base = _short_counter(torch.device(device))[:count]
        else:  # offsets above 2^31 wrap to negative int32, the bit pattern we want
            base = torch.arange(count, dtype=torch.int64, device=device).to(torch.int32)
        pieces.append(hash_counter(base, *_keys_at(k0, k1, position)))
        position = piece_end
    if not pieces:
        return torch.empty(0, dtype=torch.int32, device=device)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def uniform24(bits: Tensor) -> Tensor:
    """The top 24 bits of `random_bits` as an int32 in [0, 2^24) (exact in float32)."""
    return (bits >> 8) & 0xFFFFFF
