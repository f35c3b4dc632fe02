"""LUQ (Chmiel et al., ICLR 2023): neural gradients in a radix-2 logarithmic format, unbiased.

With b bits (one sign, b - 1 exponent bits) the magnitudes are 0 and alpha * 2^k, k = 0 .. 2^(b-1) - 1, where
alpha = max|x| / 2^(2^(b-1) - 1) puts the top level at the tensor's largest magnitude. Below alpha,
stochastic underflow: exactly `stochastic_prune`'s rule (sign(x)*alpha with probability |x|/alpha, else 0,
the same 24-bit decision and, for the first sample, the same random bits). Above it, stochastic rounding
between the two neighbouring levels, up with probability (|x| - low)/low: unbiased in value (a plain
[1,3,0] `quantize_fp` would round to power-of-two levels of a power-of-two scale, not of alpha, and flush
or keep subnormals instead of underflowing stochastically, so LUQ is an op of its own). `samples` > 1 is
LUQ's SMP: the mean of that many independent quantizations, which divides the added variance by it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gradcomp._backend import Backend, CpuCompiled, check_float, compute_layout, use_triton
from gradcomp.ops._chunked import map_chunks
from gradcomp.ops.stats import add_zero_count, check_counter
from gradcomp.rng import chunk_counter, hash_counter, resolve_seed, uniform24

SAMPLE_SEED_STRIDE = 7927  # SMP sample k draws its random bits from seed + k * SAMPLE_SEED_STRIDE
MAX_BITS = 8  # 2^7 binades above alpha: a float32 alpha keeps every level a normal float32


def sample_seed(seed: int, sample: int) -> int:
    """The seed of SMP sample `sample` (0 for the first) of a quantization with seed `seed`."""
    return seed + SAMPLE_SEED_STRIDE * sample


def quantize_luq(
    x: Tensor,
    bits: int = 4,
    samples: int = 1,
    seed: int | None = None,
    backend: Backend = "auto",
    count_zeros_into: Tensor | None = None,
) -> Tensor:
    """x in LUQ's `bits`-bit logarithmic format (see the module), the mean of `samples` independent draws.

    E[out] = x. alpha comes from the largest finite magnitude (a tensor of zeros stays zeros); NaN and +-Inf
    pass through and take no part in it. Computed in float32 (float64 for float64 x) and returned in x's
    dtype (a float16 or bfloat16 result is rounded once more, to the nearest). Random bits come from (seed,
    element index). count_zeros_into: an int64 one-element tensor on x's device to which the output's zeros
    are added. Three kernel launches on CUDA for one sample (the largest magnitude in two, the quantization
    in one), one more per further sample; no host sync. Not differentiable."""
    x = check_float(x, "quantize_luq")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an int in [2, {MAX_BITS}], got {bits!r}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    check_counter(count_zeros_into, x)
    seed = resolve_seed(seed)
    if x.numel() == 0:
        return x.clone()
    if use_triton(x, backend):
        from gradcomp.kernels.luq import quantize_luq_triton

        seeds = [sample_seed(seed, sample) for sample in range(samples)]
        return quantize_luq_triton(x, bits, seeds, count_zeros_into)
    dtype = compute_layout(x.dtype).float_dtype
    alpha = luq_alpha(x, bits)
    keep_scale = torch.nextafter(2.0**24 / alpha, alpha.new_tensor(math.inf))
    total = torch.zeros(x.shape, dtype=dtype, device=x.device)
    for sample in range(samples):
        draw_seed = sample_seed(seed, sample)

        def quantize_chunk(chunk: Tensor, offset: int, draw_seed: int = draw_seed) -> Tensor:
            counter = chunk_counter(draw_seed, chunk.numel(), x.device, offset)
            return _luq_chunk(chunk, alpha, keep_scale, *counter)

        total += map_chunks(x, quantize_chunk, out_dtype=dtype)
    out = (total if samples == 1 else total / samples).to(x.dtype)
    out = torch.where(torch.isnan(x), x, out)  # NaN with the input's bits
    return add_zero_count(out, count_zeros_into)


def luq_alpha(x: Tensor, bits: int) -> Tensor:
    """LUQ's smallest level: the largest finite |x| over 2^(2^(bits-1) - 1), a 0-d tensor of the compute
    dtype (0 for a tensor without a finite non-zero)."""
    magnitude = x.detach().to(compute_layout(x.dtype).float_dtype).abs()
    largest = torch.where(torch.isfinite(magnitude), magnitude, 0.0).amax()
    return largest * 2.0 ** -(2 ** (bits - 1) - 1)


@CpuCompiled
def _luq_chunk(
    chunk: Tensor, alpha: Tensor, keep_scale: Tensor, base: Tensor, first: Tensor, high: Tensor
) -> Tensor:
    """One draw on one chunk, in alpha's dtype: below alpha `stochastic_prune`'s formula, above it the
    level below (low = alpha * 2^floor(log2(|x|/alpha)), one level lower where the division rounded up
    across a power of two) doubled with probability |x|/low - 1, from the same 24 random bits. Non-finite
    values and everything where alpha is 0 pass through."""
    values = chunk.to(alpha.dtype)
    magnitude = values.abs()
    random = uniform24(hash_counter(base, first, high)).to(alpha.dtype)
    pruned = (random < magnitude * keep_scale).to(alpha.dtype) * magnitude.clamp_min(alpha)
    low = alpha * _power_of_two_below(magnitude / alpha)
    low = torch.where(magnitude < low, low * 0.5, low)
    up = random < (magnitude / low - 1.0) * 2.0**24
    rounded = low * (1.0 + up.to(alpha.dtype))
    out = torch.where(magnitude < alpha, pruned, rounded)
    out = torch.where(torch.isfinite(values) & (alpha > 0), out, magnitude)
    return torch.copysign(out, values)


def _power_of_two_below(q: Tensor) -> Tensor:
    """2^floor(log2 q) for normal q >= 1, from the exponent bits (exact; other q give some finite value,
    which the caller masks)."""
    if q.dtype == torch.float64:
        exponent = (q.view(torch.int64) >> 52) & 0x7FF
        return (exponent.clamp(1023, 2046) << 52).view(torch.float64)
    exponent = (q.view(torch.int32) >> 23) & 0xFF
    return (exponent.clamp(127, 254) << 23).view(torch.float32)
