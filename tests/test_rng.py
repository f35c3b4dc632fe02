import math

import pytest
import torch
import triton
import triton.language as tl

from gradcomp.kernels.rng import random_uint32
from gradcomp.rng import (
    MASK32,
    as_int32,
    chunk_counter,
    hash_counter,
    mix32,
    random_bits,
    resolve_seed,
    seed_keys,
    uniform24,
)


@triton.jit
def _bits_kernel(out_ptr, n, start, k0, k1, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    bits = random_uint32(offsets + start, k0, k1)
    tl.store(out_ptr + offsets, bits.to(tl.int32, bitcast=True), mask=mask)


def _kernel_bits(seed, n, device, block, start=0):
    out = torch.empty(n, dtype=torch.int32, device=device)
    k0, k1 = seed_keys(seed)
    _bits_kernel[(triton.cdiv(n, block),)](out, n, start, as_int32(k0), as_int32(k1), BLOCK=block)
    return out.cpu()


@pytest.mark.parametrize("block", [128, 1024])
def test_kernel_bits_equal_torch_bits_for_any_block_size(kernel_device, block):
    assert torch.equal(_kernel_bits(11, 3000, kernel_device, block), random_bits(11, 3000))


def test_kernel_bits_use_the_high_word_of_large_offsets(kernel_device):
    k0, k1 = seed_keys(5)
    start = (1 << 32) + 7
    expected = [as_int32(mix32(((start + i) & MASK32) + k0 & MASK32 ^ mix32(1 ^ k1))) for i in range(64)]
    assert _kernel_bits(5, 64, kernel_device, 64, start=start).tolist() == expected


def test_torch_bits_match_the_scalar_definition():
    k0, k1 = seed_keys(3)
    expected = [as_int32(mix32((i + k0) & MASK32 ^ mix32(k1))) for i in range(100)]
    assert random_bits(3, 100).tolist() == expected


def test_bits_are_uniform_and_seeds_are_independent():
    n = 1 << 16
    a = (random_bits(1, n).long() & MASK32).double() / 2**32
    b = (random_bits(2, n).long() & MASK32).double() / 2**32
    counts = torch.histc(a, bins=64, min=0, max=1)
    chi2 = ((counts - n / 64) ** 2 / (n / 64)).sum()
    assert chi2 < 63 + 5 * math.sqrt(2 * 63)  # chi-square with 63 dof, 5 sigma
    for u, v in ((a, b), (a[:-1], a[1:])):  # across seeds and between neighbours
        correlation = torch.corrcoef(torch.stack([u, v]))[0, 1]
        assert abs(correlation) < 5 / math.sqrt(n)


def test_uniform24_range():
    u = uniform24(random_bits(0, 1 << 12))
    assert u.min() >= 0 and u.max() < 2**24


def test_seed_resolution():
    torch.manual_seed(0)
    first = resolve_seed(None)
    torch.manual_seed(0)
    assert resolve_seed(None) == first
    assert resolve_seed(None) != first
    with pytest.raises(TypeError):
        resolve_seed(1.5)


def test_empty_bits():
    assert random_bits(0, 0).numel() == 0


@pytest.mark.parametrize("start", [(1 << 31) - 5, (1 << 32) - 300_000, (1 << 33) + 11])
@pytest.mark.parametrize("numel", [1000, 400_000])  # one short piece, or a long one
def test_torch_bits_at_large_offsets_match_the_scalar_definition(start, numel):
    k0, k1 = seed_keys(9)
    bits = random_bits(9, numel, start=start)
    for i in (0, 1, numel // 2, numel - 1):
        position = start + i
        low, high = position & MASK32, position >> 32
        assert bits[i].item() == as_int32(mix32((low + k0) & MASK32 ^ mix32(high ^ k1))), i


def test_chunk_counters_stay_inside_one_block():
    with pytest.raises(ValueError, match="chunk"):
        chunk_counter(0, 10, "cpu", start=(1 << 32) - 5)
    with pytest.raises(ValueError, match="chunk"):
        chunk_counter(0, (1 << 18) + 1, "cpu")
    assert torch.equal(hash_counter(*chunk_counter(4, 100, "cpu", start=50)), random_bits(4, 150)[50:])
