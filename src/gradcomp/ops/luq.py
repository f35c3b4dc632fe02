"""LUQ (Chmiel et al., ICLR 2023): neural gradients in a radix-2 logarithmic format, unbiased.

With b bits (one sign, b - 1 exponent bits) the magnitudes are 0 and alpha * 2^k, k = 0 .. 2^(b-1) - 1, where
alpha = max|x| / 2^(2^(b-1) - 1) puts the top level at the tensor's largest magnitude (alpha is raised where
x's dtype cannot hold the levels exactly: see `quantize_luq`). Below alpha,
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

from gradcomp._backend import Backend, CpuCompiled, check_float, compute_layout, constant_over, use_triton
from gradcomp.formats.luq import lowest_level_exponent, smp_spread
from gradcomp.ops._chunked import map_chunks
from gradcomp.ops.prune import alpha_in_compute_dtype
from gradcomp.ops.stats import add_zero_count, check_counter
from gradcomp.rng import chunk_counter, hash_counter, resolve_seed, uniform24

SAMPLE_SEED_STRIDE = 7927  # SMP sample k draws its random bits from seed + k * SAMPLE_SEED_STRIDE
MAX_BITS = 8  # 2^7 binades above alpha


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

    E[out] = x (up to the range limits below). alpha comes from the largest finite magnitude (a tensor of
    zeros stays zeros); NaN and +-Inf pass through and take no part in it. Computed in float32 (float64 for
    float64 x) and returned in x's dtype (a float16 or bfloat16 mean of several samples is rounded once
    more, to the nearest). Random bits come from (seed, element index). count_zeros_into: an int64
    one-element tensor on x's device to which the output's zeros are added. Three kernel launches on CUDA
    for one sample (the largest magnitude in two, the quantization in one), one more per further sample; no
    host sync. Not differentiable.

    Range limits: levels below the smallest normal number of x's dtype (2^-126 for float32 and bfloat16,
    2^-14 for float16, 2^-1022 for float64) are not used, as the dtype cannot hold them exactly: alpha is
    raised to the smallest level alpha * 2^k at or above it (never beyond the largest magnitude; see
    `luq_alpha`). So with 8 bits a float32 tensor uses all 128 levels where its largest magnitude is at
    least 2, a float16 tensor at most 30. Where alpha is below 2^24 / (largest compute value), about
    4.9e-32 (9.3e-301 for float64; never for float16), the 24-bit decisions cannot resolve |x|/alpha: with
    8 bits a float32 tensor whose largest magnitude is below 2^23, with 4 bits below 6.2e-30. There the
    underflow is `stochastic_prune`'s with such a tensor alpha: no pruning, the values below alpha pass
    through unchanged (exact, but not on a level). Levels never exceed the largest magnitude, and the SMP
    sum is taken scaled by 2^-ceil(log2 samples) (exact) where the largest magnitude is within that factor
    of the compute dtype's largest, so no finite input gives Inf. The decisions' 24-bit resolution leaves a
    bias below 2^-24 times the spacing of the levels around |x| (alpha for values below alpha)."""
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
    largest = _largest(x)
    alpha = _alpha(largest, bits, x.dtype)
    prune_alpha = alpha_in_compute_dtype(alpha, x)  # stochastic_prune's rule: 0 where 2^24 / alpha overflows
    keep_scale = torch.nextafter(constant_over(2.0**24, prune_alpha), prune_alpha.new_tensor(math.inf))
    spread_from, spread_scale = smp_spread(samples, compute_layout(dtype).exp_bias)
    sum_scale = torch.where(largest >= spread_from, largest.new_tensor(spread_scale), 1.0)
    total = torch.zeros(x.shape, dtype=dtype, device=x.device)
    for sample in range(samples):
        draw_seed = sample_seed(seed, sample)

        def quantize_chunk(chunk: Tensor, offset: int, draw_seed: int = draw_seed) -> Tensor:
            counter = chunk_counter(draw_seed, chunk.numel(), x.device, offset)
            return _luq_chunk(chunk, alpha, keep_scale, prune_alpha, *counter)

        total.addcmul_(map_chunks(x, quantize_chunk, out_dtype=dtype), sum_scale)
    out = (total if samples == 1 else total / samples / sum_scale).to(x.dtype)
    out = torch.where(torch.isnan(x), x, out)  # NaN with the input's bits
    return add_zero_count(out, count_zeros_into)


def luq_alpha(x: Tensor, bits: int) -> Tensor:
    """LUQ's smallest level, a 0-d tensor of the compute dtype: the largest finite |x| over
    2^(2^(bits-1) - 1), or over a smaller power of two where that is below the smallest normal number of x's
    dtype: the smallest level at or above it, or the largest itself where that is below it (0 for a tensor
    without a finite non-zero)."""
    return _alpha(_largest(x), bits, x.dtype)


def _largest(x: Tensor) -> Tensor:
    magnitude = x.detach().to(compute_layout(x.dtype).float_dtype).abs()
    return torch.where(torch.isfinite(magnitude), magnitude, 0.0).amax()


def _alpha(largest: Tensor, bits: int, dtype: torch.dtype) -> Tensor:
    """largest / 2^j, j the most binades (at most 2^(bits-1) - 1) that keep it a normal number of `dtype`
    (exact, as is the quotient in `dtype`)."""
    lowest = lowest_level_exponent(torch.finfo(dtype).tiny)
    binades = _power_of_two_below(largest, lowest) / 2.0**lowest
    return largest / binades.clamp(max=2.0 ** (2 ** (bits - 1) - 1))


@CpuCompiled
def _luq_chunk(
    chunk: Tensor,
    alpha: Tensor,
    keep_scale: Tensor,
    prune_alpha: Tensor,
    base: Tensor,
    first: Tensor,
    high: Tensor,
) -> Tensor:
    """One draw on one chunk, in alpha's dtype: below alpha `stochastic_prune`'s formula (with its alpha
    `prune_alpha`: alpha, or 0 where keep_scale is infinite: no pruning), above it the level below
    (low = alpha * 2^floor(log2(|x|/alpha)), one level lower where the division rounded up across a power of
    two) doubled with probability |x|/low - 1, from the same 24 random bits. Non-finite values and
    everything where alpha is 0 pass through."""
    values = chunk.to(alpha.dtype)
    magnitude = values.abs()
    random = uniform24(hash_counter(base, first, high)).to(alpha.dtype)
    pruned = (random < magnitude * keep_scale).to(alpha.dtype) * magnitude.clamp_min(prune_alpha)
    low = alpha * _power_of_two_below(magnitude / alpha)
    low = torch.where(magnitude < low, low * 0.5, low)
    up = random < (magnitude / low - 1.0) * 2.0**24
    rounded = low * (1.0 + up.to(alpha.dtype))
    out = torch.where(magnitude < alpha, pruned, rounded)
    out = torch.where(torch.isfinite(values) & (alpha > 0), out, magnitude)
    return torch.copysign(out, values)


def _power_of_two_below(q: Tensor, lowest: int = 0) -> Tensor:
    """2^floor(log2 q) for normal q >= 2^lowest, from the exponent bits (exact), clamped to [2^lowest, the
    largest power of two] (so 2^lowest for smaller q; NaN and Inf give the largest; lowest a normal
    exponent)."""
    layout = compute_layout(q.dtype)
    exponent = (q.view(layout.int_dtype) >> layout.man_bits) & (2 * layout.exp_bias + 1)
    return (exponent.clamp(layout.exp_bias + lowest, 2 * layout.exp_bias) << layout.man_bits).view(q.dtype)
