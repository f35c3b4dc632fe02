import math

import numpy as np
import pytest
import torch
from helpers import lognormal_gradient, same_bits

from gradcomp import (
    gaussian_threshold,
    laplace_threshold,
    log_moments,
    lognormal_threshold,
    lognormal_threshold_from_moments,
    stochastic_prune,
    topk_threshold,
)
from gradcomp.analysis.synthetic import signed_lognormal


def test_pruning_semantics():
    x = lognormal_gradient(20000, sigma=2.0, mu=0.0)
    alpha = 1.5
    out = stochastic_prune(x, alpha, seed=0)
    finite = torch.isfinite(x)
    large = x.abs() >= alpha
    assert same_bits(out[large | ~finite], x[large | ~finite])  # large, NaN and Inf untouched
    small = finite & ~large
    assert torch.all((out[small] == 0) | (out[small].abs() == alpha))
    assert torch.all(out[small & (out != 0)].sign() == x[small & (out != 0)].sign())
    assert torch.all(out[x == 0] == 0)


def test_pruning_is_unbiased():
    values = torch.tensor([0.05, 0.3, 0.5, 0.9, -0.2])
    draws = 40000
    out = stochastic_prune(values.repeat(draws, 1), 1.0, seed=3)
    p = values.abs().double()
    bound = 5 * torch.sqrt(p * (1 - p) / draws)
    assert torch.all((out.double().mean(0) - values.double()).abs() < bound)


def test_alpha_zero_prunes_nothing():
    x = lognormal_gradient(100, sigma=1.0)
    assert same_bits(stochastic_prune(x, 0.0, seed=1), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_precision_alpha_is_rounded_to_the_dtype_and_stays_unbiased(dtype):
    x = torch.full((40000,), 0.3, dtype=dtype)
    alpha = 1.0001  # not representable in float16/bfloat16
    out = stochastic_prune(x, alpha, seed=2)
    assert out.dtype == dtype
    kept = out[out != 0]
    assert torch.all(kept == torch.tensor(alpha, dtype=torch.float64).to(dtype))  # float64: alpha itself
    expected = x[0].double()
    bound = 5 * math.sqrt(0.3 * 0.7 / x.numel()) * alpha
    assert abs(out.double().mean() - expected) < bound


def test_non_contiguous_empty_scalar():
    x = lognormal_gradient((50, 40), sigma=2.0)
    assert same_bits(
        stochastic_prune(x.t(), 0.01, seed=5), stochastic_prune(x.t().contiguous(), 0.01, seed=5)
    )
    assert stochastic_prune(torch.empty(0), 1.0).numel() == 0
    assert stochastic_prune(torch.tensor(2.0), 1.0).item() == 2.0


@pytest.mark.parametrize("sigma", [1.0, 2.0, 3.0])
@pytest.mark.parametrize("zero_fraction", [0.0, 0.3])
def test_lognormal_threshold_hits_the_target_within_half_a_point(sigma, zero_fraction):
    g = signed_lognormal(1 << 18, sigma, zero_fraction, seed=int(sigma * 10))
    for target in (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95):
        achieved = (stochastic_prune(g, lognormal_threshold(g, target), seed=1) == 0).double().mean()
        assert abs(achieved - target) < 0.005, (target, achieved)


def test_zeros_beyond_the_target_mean_no_pruning():
    g = signed_lognormal(10000, 2.0, zero_fraction=0.6)
    assert lognormal_threshold(g, 0.5).item() == 0.0
    assert topk_threshold(g, 0.5).item() == 0.0
    assert lognormal_threshold(torch.zeros(100), 0.9).item() == 0.0


def test_thresholds_ignore_non_finite_values_and_handle_empty_input():
    g = signed_lognormal(10000, 2.0, seed=3)
    poisoned = g.clone()
    poisoned[:10] = torch.tensor([math.nan, math.inf, -math.inf] * 3 + [math.nan])
    for estimator in (lognormal_threshold, gaussian_threshold, laplace_threshold, topk_threshold):
        # NaN/Inf are neither pruned nor counted as zeros, so the finite part is pruned a bit harder
        assert torch.isfinite(estimator(poisoned, 0.8)) and estimator(poisoned, 0.8) > 0
        assert estimator(torch.empty(0), 0.8).item() == 0.0
        assert estimator(torch.zeros(7), 0.8).item() == 0.0
    pruned = stochastic_prune(poisoned, lognormal_threshold(poisoned, 0.8), seed=0)
    assert ((pruned == 0).double().mean() - 0.8).abs() < 0.01
    assert torch.isnan(pruned[:10]).sum() == 4 and torch.isinf(pruned[:10]).sum() == 6


def test_topk_threshold_is_exact_on_the_tensor():
    g = signed_lognormal(5000, 2.5, zero_fraction=0.2).double()
    for target in (0.5, 0.9):
        alpha = topk_threshold(g, target)
        magnitude = g.abs()
        expected_zeros = torch.where(magnitude < alpha, 1 - magnitude / alpha, 0.0).sum()
        assert expected_zeros.item() / g.numel() == pytest.approx(target, abs=1e-9)


@pytest.mark.parametrize(("sigma", "expected"), [(1.5, 0.84), (2.5, 0.98), (3.5, 0.995)])
def test_gaussian_prior_overshoots_as_in_appendix_a3(sigma, expected):
    g = signed_lognormal(1 << 18, sigma, seed=4)
    achieved = (stochastic_prune(g, gaussian_threshold(g, 0.5), seed=1) == 0).double().mean()
    assert achieved.item() == pytest.approx(expected, abs=0.02)


def test_batched_thresholds_from_moments():
    tensors = [signed_lognormal(4096, sigma, seed=i) for i, sigma in enumerate((1.0, 2.0, 3.0))]
    moments = torch.stack([log_moments(t) for t in tensors])
    batched = lognormal_threshold_from_moments(moments, 4096, 0.8)
    single = torch.stack([lognormal_threshold(t, 0.8) for t in tensors]).double()
    torch.testing.assert_close(batched, single, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "moments",
    [
        [4096.0, -30000.0, 250000.0, 0.0],  # an ordinary layer
        [1000.0, -8000.0, 64000.0, 3096.0],  # mostly zeros already, still something to prune
        [100.0, -800.0, 6400.0, 3996.0],  # zeros beyond the target: no pruning
        [1.0, -5.0, 25.0, 4095.0],  # one non-zero
        [2000.0, -4000.0, 8000.0, 0.0],  # sigma 0: all magnitudes equal
        [0.0, 0.0, 0.0, 4096.0],  # no non-zero at all
        [0.0, 0.0, 0.0, 0.0],  # nothing finite
    ],
)
def test_one_layer_threshold_on_the_cpu_is_the_batched_one(moments):
    one = lognormal_threshold_from_moments(torch.tensor(moments, dtype=torch.float64), 4096, 0.85)
    batched = lognormal_threshold_from_moments(torch.tensor([moments], dtype=torch.float64), 4096, 0.85)
    assert one.shape == () and one.dtype == torch.float64
    torch.testing.assert_close(one, batched[0], rtol=1e-12, atol=0)


def test_log_moments_counts_and_sums():
    x = torch.tensor([0.0, -0.0, math.e, -1.0, math.nan, math.inf, math.exp(2)])
    moments = log_moments(x)
    torch.testing.assert_close(moments, torch.tensor([3.0, 3.0, 5.0, 2.0], dtype=torch.float64))
    assert torch.equal(log_moments(torch.empty(0)), torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_prune_is_bit_exact(kernel_device, dtype):
    x = lognormal_gradient(3000, sigma=2.0, mu=-1.0).to(dtype)
    alpha = torch.tensor(0.4)
    expected = stochastic_prune(x, alpha, seed=8, backend="torch")
    got = stochastic_prune(x.to(kernel_device), alpha.to(kernel_device), seed=8, backend="triton")
    assert same_bits(got.cpu(), expected)


def test_constant_over_divides_once_as_numpy_and_the_kernels_do():
    from gradcomp._backend import constant_over

    values = torch.cat([torch.rand(10000) * 10 + 0.1, torch.tensor([9e37, 2e38, 3.4e38, 1e-30])])
    for constant in (2.0**24, 2688.0, 15.0):
        expected = torch.from_numpy(np.float32(constant) / values.numpy())
        assert same_bits(constant_over(constant, values), expected)
    assert (2688.0 / values != constant_over(2688.0, values)).any()  # torch's own reads differently


@pytest.mark.parametrize("alpha", [9e37, 2e38, 3.4e38])
def test_triton_prune_is_bit_exact_for_alpha_near_float32s_largest(kernel_device, alpha):
    """Pruning thresholds near float32's largest value: the same decisions on both paths (the keep scale 2^24
    / alpha is one rounded division on both: torch's `2.0**24 / alpha` took a reciprocal first, subnormal
    above 2^126, `gradcomp._backend.constant_over`)."""
    x = torch.linspace(-3.3e38, 3.3e38, 4096)
    for given in (alpha, torch.tensor(alpha)):
        expected = stochastic_prune(x, given, seed=3, backend="torch")
        on_device = given.to(kernel_device) if isinstance(given, torch.Tensor) else given
        got = stochastic_prune(x.to(kernel_device), on_device, seed=3, backend="triton")
        assert same_bits(got.cpu(), expected)


def test_triton_prune_block_size_independent(kernel_device):
    from gradcomp.kernels.prune import stochastic_prune_triton

    x = lognormal_gradient(2500, sigma=2.0).to(kernel_device)
    alpha = torch.tensor(0.01, device=kernel_device)
    keep_scale = 2.0**24 / alpha
    assert same_bits(
        stochastic_prune_triton(x, alpha, keep_scale, 1, block=128),
        stochastic_prune_triton(x, alpha, keep_scale, 1, block=4096),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_log_moments_and_threshold(kernel_device, dtype):
    x = lognormal_gradient(40000, sigma=2.0).to(dtype)
    expected = log_moments(x, backend="torch")
    got = log_moments(x.to(kernel_device), backend="triton").cpu()
    assert torch.equal(got[[0, 3]], expected[[0, 3]])  # counts are exact
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-3)
    alpha = lognormal_threshold(x.to(kernel_device), 0.85, backend="triton").cpu()
    torch.testing.assert_close(alpha, lognormal_threshold(x, 0.85, backend="torch"), rtol=1e-5, atol=0)


def test_float64_alpha_keeps_float64_precision():
    """1e-300 and 1e300 are far outside float32: alpha must not pass through it."""
    generator = torch.Generator().manual_seed(0)
    for scale in (1e-300, 1e300):
        x = torch.rand(20000, generator=generator, dtype=torch.float64) * scale
        out = stochastic_prune(x, scale, seed=4)
        assert torch.all((out == 0) | (out == scale))
        assert 0.4 < (out == 0).double().mean() < 0.6
        mean_error = ((out - x) / scale).mean().abs()
        assert mean_error < 5 * math.sqrt(0.25 / x.numel())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_tensor_alpha_beyond_the_dtype_acts_as_its_largest_value(dtype):
    x = lognormal_gradient(2000, sigma=2.0, mu=0.0).to(dtype)
    largest = torch.finfo(dtype).max
    expected = stochastic_prune(x, largest, seed=3)
    for alpha in (torch.tensor(math.inf), torch.tensor(largest, dtype=torch.float64) * 2):
        got = stochastic_prune(x, alpha, seed=3)
        assert same_bits(got, expected)
    finite = torch.isfinite(x)
    assert torch.all((got[finite] == 0) | (got[finite].abs() == largest))


def test_tensor_alpha_below_the_resolvable_range_prunes_nothing():
    """2^24/alpha would overflow: every value below alpha would be promoted, none may be."""
    for dtype, alpha in ((torch.float32, 1e-40), (torch.float64, 1e-305)):
        x = lognormal_gradient(500, sigma=1.0).to(dtype) * (alpha / 100)  # all below alpha
        assert same_bits(stochastic_prune(x, torch.tensor(alpha, dtype=dtype), seed=1), x)


def test_nan_or_negative_tensor_alpha_gives_nan():
    x = lognormal_gradient(300, sigma=2.0)
    for alpha in (torch.tensor(math.nan), torch.tensor(-1.0)):
        out = stochastic_prune(x, alpha, seed=0)
        assert torch.isnan(out).all()


def test_inputs_that_require_grad_are_detached():
    x = lognormal_gradient(1000, sigma=2.0, specials=False).requires_grad_()
    out = stochastic_prune(x, 0.01, seed=2)
    assert not out.requires_grad and same_bits(out, stochastic_prune(x.detach(), 0.01, seed=2))
    moments = log_moments(x)
    assert not moments.requires_grad and torch.equal(moments, log_moments(x.detach()))
    for estimator in (lognormal_threshold, gaussian_threshold, laplace_threshold, topk_threshold):
        alpha = estimator(x, 0.8)
        assert not alpha.requires_grad and torch.equal(alpha, estimator(x.detach(), 0.8))


def test_triton_prune_matches_on_alpha_edge_cases(kernel_device):
    x = lognormal_gradient(600, sigma=2.0, mu=0.0).half()
    for alpha in (torch.tensor(1e5), torch.tensor(0.0), torch.tensor(1e-40), torch.tensor(0.5)):
        expected = stochastic_prune(x, alpha, seed=5, backend="torch")
        got = stochastic_prune(x.to(kernel_device), alpha.to(kernel_device), seed=5, backend="triton")
        assert same_bits(got.cpu(), expected)
    for alpha in (torch.tensor(math.nan), torch.tensor(-2.0)):
        expected = stochastic_prune(x, alpha, seed=5, backend="torch")
        got = stochastic_prune(x.to(kernel_device), alpha.to(kernel_device), seed=5, backend="triton").cpu()
        assert torch.isnan(got).all() and torch.isnan(expected).all()


def test_one_layer_threshold_of_a_huge_spread_is_no_pruning_as_in_the_batched_form():
    x = torch.tensor([1.0, 1.4553e160, math.nan], dtype=torch.float64)  # sigma ~ 260
    moments = log_moments(x)
    assert lognormal_threshold(x, 0.75).item() == 0.0
    assert lognormal_threshold_from_moments(moments[None], 3, 0.75).item() == 0.0
