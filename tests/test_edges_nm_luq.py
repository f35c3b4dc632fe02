"""nm_prune and quantize_luq at the limits of their dtypes (issue 27): tiny tensors, subnormals, values near
the largest finite one. Both backends bit for bit, the N:M pattern, finiteness where the exact result is
representable, and unbiasedness: the mean of K independent draws within 5 standard errors of x, the
standard error from the exact variance of one draw."""

import math
from collections.abc import Callable

import pytest
import torch
from helpers import kernel_can_hold, kernel_property, same_bits
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from gradcomp import nm_prune, quantize_luq
from gradcomp.ops.luq import luq_alpha
from gradcomp.ops.nm import keep_probabilities
from gradcomp.rng import random_bits, uniform24

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
F32_MAX = torch.finfo(torch.float32).max
# a 2:4 block whose rounded p add up to 2 + 2^-21, and a seed whose first block draws u = 0: without the
# cap of the running sum at n, this block keeps 3
OVERSHOOT_BLOCK = [0.6672822833061218, 0.7637840509414673, 0.7370861768722534, 0.3129650354385376]
OVERSHOOT_SEED = 18795701


def run(op: Callable[..., Tensor], x: Tensor, *args, device: str, **kwargs) -> Tensor:
    """op on the torch path, after checking that its kernel on `device` gives the same bits (float64 has no
    kernel)."""
    expected = op(x, *args, backend="torch", **kwargs)
    if x.dtype != torch.float64:
        got = op(x.to(device), *args, backend="triton", **kwargs).cpu()
        assert same_bits(got, expected), (x, got, expected)
    return expected


def subnormal(dtype: torch.dtype) -> float:
    """The smallest positive subnormal of dtype."""
    info = torch.finfo(dtype)
    return info.tiny * info.eps


def assert_unbiased(draws: Tensor, x: Tensor, variance_of: Callable[[Tensor, float], Tensor]) -> None:
    """Every element's mean over the rows of `draws` within 5 standard errors of x (exactly x where the
    variance of a draw is 0). variance_of(x * unit, unit): the exact variance of one draw of x times unit,
    a power of two that brings x's largest magnitude near 1 (so that squares and sums stay finite)."""
    exponent = math.floor(math.log2(float(x.double().abs().max())))
    unit = 2.0 ** -min(max(exponent, -1000), 1000)
    scaled = x.double() * unit
    error = ((draws.double() * unit).mean(0) - scaled).abs()
    bound = 5 * (variance_of(scaled, unit) / draws.shape[0]).sqrt()
    assert (error <= bound).all(), (x[error > bound], error[error > bound], bound[error > bound])


def luq_variance(x: Tensor, alpha: float) -> Tensor:
    """The exact variance of one LUQ draw of each element (alpha > 0; 0 where x passes through)."""
    magnitude = x.double().abs()
    low = alpha * torch.exp2(torch.floor(torch.log2(magnitude / alpha)))
    low = torch.where(low > magnitude, low / 2, low)
    return torch.where(
        magnitude < alpha, magnitude * (alpha - magnitude), (magnitude - low) * (2 * low - magnitude)
    )


def nm_variance(rows: Tensor, n: int, m: int) -> Tensor:
    """The exact variance of one N:M draw of each element of rows of blocks, x^2 (1/p - 1)."""
    values = rows.double()
    p = keep_probabilities(values.abs().reshape(-1, m), n).reshape(values.shape)
    return torch.where(p > 0, values**2 * (1 / p - 1), 0.0)


def assert_pattern(out: Tensor, n: int, m: int) -> None:
    assert int((out != 0).reshape(-1, m).sum(1).max()) <= n


# --- N:M ----------------------------------------------------------------------------------------------------
def test_nm_float16_beyond_its_range_overflows_as_documented(kernel_device):
    """4 x 20000 at 1:4: the unbiased kept value 80000 is beyond float16 (65504), so it is Inf; in float32
    the same block gives 80000 exactly."""
    out = run(nm_prune, torch.full((4,), 20000.0, dtype=torch.float16), 1, 4, seed=0, device=kernel_device)
    assert int((out != 0).sum()) == 1 and out.abs().max() == math.inf
    out = run(nm_prune, torch.full((4,), 20000.0), 1, 4, seed=0, device=kernel_device)
    assert sorted(out.tolist()) == [0.0, 0.0, 0.0, 80000.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nm_blocks_near_the_largest_value_keep_n(kernel_device, dtype):
    """Blocks whose sums overflow the dtype (4 x 1e38 at 2:4, once all zero) keep exactly 2, each twice
    its value, and random blocks of magnitudes up to max/4 stay finite (their kept values are at most
    3/4 of the largest)."""
    x = torch.full((4,), 1e38, dtype=dtype)
    out = run(nm_prune, x, 2, 4, seed=0, device=kernel_device)
    assert int((out != 0).sum()) == 2 and bool((out[out != 0] == 2 * x[0]).all())
    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.finfo(dtype).max / 4 * torch.rand(64, 16, generator=generator)
    x = (magnitudes * torch.where(torch.rand(64, 16, generator=generator) < 0.5, -1.0, 1.0)).to(dtype)
    for n, m in ((2, 4), (1, 2), (3, 8)):
        out = run(nm_prune, x, n, m, seed=1, device=kernel_device)
        assert_pattern(out, n, m)
        assert torch.isfinite(out).all()


def test_nm_a_running_sum_rounded_above_n_keeps_n(kernel_device):
    x = torch.tensor([OVERSHOOT_BLOCK])
    p = keep_probabilities(x, 2)[0]
    assert float(p[0] + p[1] + p[2] + p[3]) == 2 + 2.0**-21
    assert int(uniform24(random_bits(OVERSHOOT_SEED, 1, x.device))) == 0
    out = run(nm_prune, x, 2, 4, seed=OVERSHOOT_SEED, device=kernel_device)
    assert int((out != 0).sum()) == 2


@pytest.mark.parametrize(
    ("dtype", "scale"),
    [
        (torch.float32, F32_MAX / 8),
        (torch.bfloat16, 2.0**120),
        (torch.float16, 4096.0),
        (torch.float64, 1e300),
    ],
)
def test_nm_is_unbiased_near_the_largest_value(kernel_device, dtype, scale):
    """Blocks of magnitudes up to an eighth of the largest value (kept values up to about 3/4 of it)."""
    x = (torch.tensor([[1.0, -0.5, 0.25, 0.75, -1.0, 0.9, 0.1, -0.3]], dtype=torch.float64) * scale).to(dtype)
    draws = run(nm_prune, x.repeat(4000, 1), 2, 4, seed=3, device=kernel_device)
    assert torch.isfinite(draws).all()
    assert_pattern(draws, 2, 4)
    assert_unbiased(draws, x[0], lambda scaled, _: nm_variance(scaled, 2, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_nm_is_unbiased_on_subnormals(kernel_device, dtype):
    """Subnormal blocks whose kept values the dtype holds exactly (multiples of its smallest subnormal)."""
    units = torch.tensor([[1.0, 2.0, 3.0, 6.0, 2.0, 2.0, 2.0, 2.0, 1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    x = (units * subnormal(dtype)).to(dtype)
    draws = run(nm_prune, x.repeat(4000, 1), 2, 4, seed=5, device=kernel_device)
    assert_pattern(draws, 2, 4)
    assert_unbiased(draws, x[0], lambda scaled, _: nm_variance(scaled, 2, 4))


# --- LUQ ----------------------------------------------------------------------------------------------------
def test_luq_of_the_issue_is_exact_on_its_small_entries(kernel_device):
    """[1, 1e-42 x 3] at 8 bits once made every small entry alpha = 2^-127 (5,900 times the input): alpha is
    2^-126 now, below 2^24/max, so the small entries pass through as stochastic_prune would."""
    x = torch.tensor([1.0, 1e-42, 1e-42, 1e-42])
    assert float(luq_alpha(x, 8)) == 2.0**-126
    draws = run(quantize_luq, x.repeat(200), 8, seed=0, device=kernel_device).view(200, -1)
    assert torch.equal(draws[:, 1:], x[1:].expand(200, 3))
    assert bool((draws[:, 0] == 1.0).all())


@pytest.mark.parametrize(
    ("x", "bits"),
    [
        ([5e-30, 1e-32, 2e-32, -3e-32, 6e-32, 1e-31, 4e-31, -2.5e-30], 4),  # alpha 3.9e-32: small ones stay
        ([1e-29, 2e-31, -9e-32, 5e-32, 1e-30, 3e-31, -7e-30, 4e-30], 4),  # alpha 7.8e-32: they underflow
        ([2e8, 1e-31, 2e-31, -3e-31, 5e-30, 1e-20, 3.0, -1e5], 8),  # alpha 1.2e-30
        ([1.5, 1e-38, 5e-39, 2e-38, -3e-38, 1e-37, 1e-3, 5e-20], 8),  # alpha raised, 1.5 * 2^-126
    ],
)
def test_luq_is_unbiased_on_tiny_tensors(kernel_device, x, bits):
    x = torch.tensor(x)
    alpha = float(luq_alpha(x, bits))
    draws = run(quantize_luq, x.repeat(4000), bits, seed=1, device=kernel_device).view(4000, -1)
    stays = (x.abs() < alpha) & (alpha < 2.0**24 / F32_MAX)  # stochastic_prune's rule: no underflow
    assert_unbiased(
        draws, x, lambda scaled, unit: torch.where(stays, 0.0, luq_variance(scaled, alpha * unit))
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("largest", [2.0**-20, 3 * 2.0**-13, 0.01])
def test_luq_is_unbiased_on_half_precision_tensors_with_tiny_values(kernel_device, dtype, largest):
    """Levels below the dtype's normal range are not used (float16 could not hold them): every output is
    exact in the dtype. bfloat16 takes the same values (all in its normal range)."""
    units = torch.tensor(
        [1.0, 0.5, 0.3, 0.07, 0.01, 0.004, -0.002, 0.0009, 0.0003, 0.0001], dtype=torch.float64
    )
    x = (units * largest).to(dtype)
    x = torch.where(kernel_can_hold(x), x, 0.0)
    draws = run(quantize_luq, x.repeat(4000), 4, seed=2, device=kernel_device).view(4000, -1)
    alpha = float(luq_alpha(x, 4))
    assert alpha >= torch.finfo(dtype).tiny or alpha == float(x.abs().max())
    assert_unbiased(draws, x, lambda scaled, unit: luq_variance(scaled, alpha * unit))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("samples", [1, 3])
def test_luq_near_the_largest_value_is_finite_and_unbiased(kernel_device, dtype, samples):
    largest = torch.finfo(dtype).max
    units = torch.tensor([1.0, -0.9, 0.7, 0.45, -0.3, 0.01, 1e-3, 0.6], dtype=torch.float64)
    x = (units * largest).to(dtype)
    draws = run(quantize_luq, x.repeat(2000), 4, samples, seed=4, device=kernel_device).view(2000, -1)
    assert torch.isfinite(draws).all()
    if dtype in (torch.float32, torch.float64) or samples == 1:  # else each mean is rounded to x's dtype
        alpha = float(luq_alpha(x, 4))
        assert_unbiased(draws, x, lambda scaled, unit: luq_variance(scaled, alpha * unit) / samples)
    constant = torch.full((4,), largest, dtype=dtype)  # SMP sums of largest values once overflowed
    assert torch.equal(run(quantize_luq, constant, 4, 3, seed=0, device=kernel_device), constant)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_luq_passes_a_subnormal_tensor_through(kernel_device, dtype):
    """The largest magnitude subnormal: it is alpha, below 2^24 / max, so nothing is pruned (bfloat16
    subnormals on the torch path only: the interpreter's conversions flush them)."""
    x = torch.tensor([3.0, -1.0, 7.0, 0.0, -7.0], dtype=torch.float64) * subnormal(dtype)
    x = x.to(dtype)
    for bits, samples in ((4, 1), (8, 2)):
        assert same_bits(quantize_luq(x, bits, samples, seed=0, backend="torch"), x)
        held = torch.where(kernel_can_hold(x), x, 0.0)
        assert same_bits(run(quantize_luq, held, bits, samples, seed=0, device=kernel_device), held)


def test_luq_of_a_zero_dimensional_tensor(kernel_device):
    assert run(quantize_luq, torch.tensor(-2.5), 4, seed=0, device=kernel_device).item() == -2.5


# --- properties over extreme values -------------------------------------------------------------------------
KERNEL_PROPERTY = kernel_property(60)


@st.composite
def extreme_tensors(draw) -> Tensor:
    """A 1-d tensor of a kernel dtype: magnitudes 2^e around a centre from subnormal to the largest value
    (the ends often), spread over up to 40 binades (often none), random signs, some zeros (and values the
    interpreter flushes)."""
    dtype = draw(st.sampled_from(DTYPES))
    info = torch.finfo(dtype)
    low, high = math.log2(subnormal(dtype)), math.log2(info.max)
    size = draw(st.integers(1, 24))
    centre = draw(st.sampled_from([low, high - 3, high]) | st.floats(low, high))
    spread = draw(st.just(0.0) | st.floats(0, 40))
    exponents = draw(st.lists(st.floats(-1, 1), min_size=size, max_size=size))
    signs = draw(st.lists(st.sampled_from([-1.0, 1.0, 0.0]), min_size=size, max_size=size))
    magnitudes = torch.tensor([centre + spread * e for e in exponents], dtype=torch.float64).clamp(low, high)
    x = (torch.tensor(signs, dtype=torch.float64) * torch.exp2(magnitudes).clamp(max=info.max)).to(dtype)
    return torch.where(kernel_can_hold(x), x, 0.0)


@KERNEL_PROPERTY
@given(
    x=extreme_tensors(),
    nm=st.sampled_from([(1, 2), (2, 4), (1, 4), (3, 8), (4, 16)]),
    seed=st.integers(0, 2**40),
)
def test_nm_keeps_its_pattern_and_overflows_only_beyond_the_dtype(kernel_device, x, nm, seed):
    """At most n non-zeros per block, at least one where the block has one; Inf only where |x| / p (the
    float32 p it samples with, the quotient exact) is beyond x's dtype."""
    n, m = nm
    out = run(nm_prune, x, n, m, seed=seed, device=kernel_device)
    padded = torch.nn.functional.pad(x, (0, -x.numel() % m)).view(-1, m)
    kept = (torch.nn.functional.pad(out, (0, -x.numel() % m)).view(-1, m) != 0).sum(1)
    assert (kept <= n).all() and (kept >= (padded != 0).any(1).long()).all()
    p = keep_probabilities(padded.float().abs(), n).view(-1)[: x.numel()]
    exact = torch.where(p > 0, x.double().abs() / p.double(), 0.0)
    assert (torch.isfinite(out) | ~torch.isfinite(exact.to(x.dtype))).all()


@KERNEL_PROPERTY
@given(x=extreme_tensors(), bits=st.integers(2, 8), samples=st.integers(1, 3), seed=st.integers(0, 2**40))
def test_luq_is_finite_and_lands_on_its_levels(kernel_device, x, bits, samples, seed):
    """Finite for finite x; one sample lands on 0, a level alpha * 2^k (k < 2^(bits-1)) or, below a
    2^24 / max alpha, x itself."""
    out = run(quantize_luq, x, bits, samples, seed=seed, device=kernel_device)
    assert torch.isfinite(out).all()
    if samples == 1:
        alpha = float(luq_alpha(x, bits))
        levels = {alpha * 2.0**k for k in range(2 ** (bits - 1))}
        for value, original in zip(out.abs().tolist(), x.abs().tolist(), strict=True):
            assert value in levels or value == 0 or (value == original and alpha < 2.0**24 / F32_MAX)
