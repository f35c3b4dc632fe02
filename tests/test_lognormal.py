import math

import pytest
import torch

from gradcomp import lognormal

# Appendix A.1 of the lognormal digest: alpha * exp(-mu) for sigma (rows) and target sparsity (columns)
TARGETS = [0.50, 0.70, 0.80, 0.85, 0.90, 0.95]
TABLE_A1 = {
    0.5: [2.200, 3.768, 5.665, 7.554, 11.33, 22.66],
    1.0: [2.401, 4.880, 7.822, 10.69, 16.31, 32.92],
    1.5: [2.511, 6.359, 11.45, 16.64, 27.12, 58.58],
    2.0: [2.575, 8.253, 16.99, 26.69, 47.66, 115.8],
    2.5: [2.614, 10.69, 25.38, 43.40, 85.91, 240.9],
    3.0: [2.640, 13.84, 38.06, 71.14, 157.1, 515.2],
}


def test_normalized_threshold_reproduces_table_a1_in_one_batched_call():
    sigma = torch.tensor(list(TABLE_A1), dtype=torch.float64)[:, None]
    target = torch.tensor(TARGETS, dtype=torch.float64)[None, :]
    got = lognormal.normalized_threshold(sigma, target)
    expected = torch.tensor(list(TABLE_A1.values()), dtype=torch.float64)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=0)
    # and it inverts the closed form
    torch.testing.assert_close(lognormal.expected_sparsity(torch.log(got), sigma), target.expand_as(got))


def test_expected_sparsity_matches_monte_carlo():
    generator = torch.Generator().manual_seed(0)
    sigma, alpha_n = 1.7, 9.0
    x = torch.exp(sigma * torch.randn(2_000_000, generator=generator, dtype=torch.float64))
    monte_carlo = torch.where(x < alpha_n, 1 - x / alpha_n, 0.0).mean()
    predicted = lognormal.expected_sparsity(torch.tensor(math.log(alpha_n)), torch.tensor(sigma))
    assert abs(monte_carlo - predicted) < 1e-3


def test_fit_lognormal_from_moments():
    values = torch.tensor([1.0, math.e, math.e**2], dtype=torch.float64)
    logs = torch.log(values)
    moments = torch.tensor([3.0, logs.sum(), (logs * logs).sum(), 5.0], dtype=torch.float64)
    mu, sigma = lognormal.fit_lognormal(moments)
    assert mu.item() == pytest.approx(1.0) and sigma.item() == pytest.approx(1.0)  # unbiased std


def test_degenerate_sigma_has_the_point_mass_limit():
    # all |g| equal: S(alpha) = 1 - 1/alpha_n, so alpha_n = 1/(1 - S)
    got = lognormal.normalized_threshold(torch.tensor(0.0), torch.tensor(0.8))
    assert got.item() == pytest.approx(5.0, rel=1e-4)


@pytest.mark.parametrize(
    ("sigma", "column", "expected"),
    [  # the truncated cosine table of section 2.6 (k = 2.7131), at the A.1 thresholds
        (1.0, 0.5, 0.934),
        (1.0, 0.8, 0.664),
        (1.0, 0.9, 0.468),
        (2.0, 0.5, 0.999),
        (2.0, 0.8, 0.967),
        (2.0, 0.9, 0.855),
        (2.5, 0.5, 0.9999),
        (2.5, 0.8, 0.994),
        (2.5, 0.9, 0.955),
    ],
)
def test_truncated_cosine_reference_values(sigma, column, expected):
    sigma_t = torch.tensor(sigma, dtype=torch.float64)
    alpha_n = lognormal.normalized_threshold(sigma_t, torch.tensor(column, dtype=torch.float64))
    got = lognormal.truncated_cosine_similarity(alpha_n, sigma_t, 2.7131)
    assert got.item() == pytest.approx(expected, abs=1.5e-3)


def test_untruncated_cosine_stays_high_for_wide_lognormals():
    sigma = torch.tensor(2.5, dtype=torch.float64)
    alpha_n = lognormal.normalized_threshold(sigma, torch.tensor(0.9, dtype=torch.float64))
    assert lognormal.cosine_similarity(alpha_n, sigma).item() >= 0.999


def test_untruncated_cosine_matches_monte_carlo():
    generator = torch.Generator().manual_seed(1)
    sigma, alpha_n = 1.0, 4.0
    g = torch.exp(sigma * torch.randn(4_000_000, generator=generator, dtype=torch.float64))
    second_moment_pruned = torch.where(g >= alpha_n, g * g, alpha_n * g).mean()
    monte_carlo = torch.sqrt((g * g).mean() / second_moment_pruned)
    predicted = lognormal.cosine_similarity(torch.tensor(alpha_n), torch.tensor(sigma))
    assert abs(monte_carlo - predicted) < 2e-3


def test_cosine_threshold_inverts_the_truncated_cosine():
    sigma = torch.tensor([1.0, 2.0, 2.5], dtype=torch.float64)
    alpha_n = lognormal.cosine_threshold(sigma, torch.tensor(0.95, dtype=torch.float64), 2.7131)
    got = lognormal.truncated_cosine_similarity(alpha_n, sigma, 2.7131)
    torch.testing.assert_close(got, torch.full_like(got, 0.95))


def test_truncation_k_is_2_7_for_a_normal():
    generator = torch.Generator().manual_seed(2)
    z = torch.randn(3_000_000, generator=generator, dtype=torch.float64)
    k = lognormal.truncation_k(z, z.mean(), z.std())
    assert k.item() == pytest.approx(2.713, abs=0.01)


@pytest.mark.parametrize(
    ("solver", "curve"),
    [
        (lognormal.gaussian_normalized_threshold, lognormal.gaussian_sparsity),
        (lognormal.laplace_normalized_threshold, lognormal.laplace_sparsity),
    ],
)
def test_prior_thresholds_invert_their_curves(solver, curve):
    target = torch.tensor(TARGETS, dtype=torch.float64)
    torch.testing.assert_close(curve(solver(target)), target)


@pytest.mark.parametrize(
    "solver", [lognormal.gaussian_normalized_threshold, lognormal.laplace_normalized_threshold]
)
def test_prior_thresholds_reach_float64_precision_in_four_steps_from_their_table(solver):
    sparsity = torch.cat(
        [
            torch.logspace(-6, -1, 45, dtype=torch.float64),  # below, the curves cancel to noise in float64
            torch.linspace(0.1, 0.9, 81, dtype=torch.float64),
            1 - torch.logspace(-1, -9, 45, dtype=torch.float64),
        ]
    )
    converged = solver(sparsity, iterations=80)
    torch.testing.assert_close(solver(sparsity), converged, rtol=1e-10, atol=0)  # the curves' float64 noise


def test_gaussian_prior_curve_matches_monte_carlo():
    generator = torch.Generator().manual_seed(3)
    g = torch.randn(2_000_000, generator=generator, dtype=torch.float64).abs()
    t = 1.3
    monte_carlo = torch.where(g < t, 1 - g / t, 0.0).mean()
    assert abs(monte_carlo - lognormal.gaussian_sparsity(torch.tensor(t))) < 1e-3


def test_threshold_solver_reaches_float64_precision_over_a_wide_range():
    sigma = torch.linspace(0.01, 12, 300, dtype=torch.float64)[:, None]
    target = torch.tensor([1e-5, 1e-3, 0.1, 0.5, 0.85, 0.99, 0.99999], dtype=torch.float64)[None, :]
    alpha_n = lognormal.normalized_threshold(sigma, target)
    assert (lognormal.expected_sparsity(torch.log(alpha_n), sigma) - target).abs().max() < 1e-12


def test_float_solver_is_the_tensor_solver():
    sigma = torch.linspace(0.0, 20, 41, dtype=torch.float64)[:, None]
    target = torch.tensor([1e-12, 1e-3, 0.5, 0.85, 0.99, 1 - 1e-9], dtype=torch.float64)[None, :]
    batched = lognormal.normalized_threshold(sigma, target)
    one_by_one = [
        [lognormal.normalized_threshold_float(s, t) for t in target[0].tolist()] for s in sigma[:, 0].tolist()
    ]
    one_by_one = torch.tensor(one_by_one, dtype=torch.float64)
    sigma = sigma.clamp_min(lognormal.MIN_SIGMA)
    residual = lognormal.expected_sparsity(torch.log(one_by_one), sigma) - target
    assert residual.abs().max() < 1e-12
    # the same root where it is well conditioned (at extreme sparsities S hardly moves with alpha)
    torch.testing.assert_close(one_by_one[:, 1:-1], batched[:, 1:-1], rtol=1e-10, atol=0)
    moments = [3.0, 3.0, 5.0, 2.0]
    mu, sigma_fit = lognormal.fit_lognormal(torch.tensor(moments, dtype=torch.float64))
    assert lognormal.fit_lognormal_float(moments) == pytest.approx((mu.item(), sigma_fit.item()), rel=1e-15)
    for bad_sigma, bad_sparsity in ((math.nan, 0.5), (1.0, 1.0), (1.0, -0.1)):
        with pytest.raises(ValueError, match="sigma"):
            lognormal.normalized_threshold_float(bad_sigma, bad_sparsity)
