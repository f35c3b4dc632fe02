import math

import pytest
import torch

from gradcomp import DTYPE_FORMATS, E2M1FN, E4M3FN, E4M3FNUZ, E8M0FNU, FPFormat, quantize_fp
from gradcomp.theory.fp import (
    grid_for,
    ideal_grid,
    min_exp_bits,
    mse_by_exp_bits,
    optimal_exp_bits,
    optimal_log2_scale,
    relative_mse,
    switch_points,
)

# Appendix A.2b of the lognormal digest: relative MSE at the optimal scale, per (bits, sigma_log2, E), for the
# grids ideal / saturate+sub / IEEE-inf+sub (computed there by numerical integration, a few percent accurate)
TABLE_A2B = [
    (4, 1, {1: (6.94e-2, 3.57e-2, None), 2: (1.87e-2, 2.23e-2, 4.52e-2), 3: (3.82e-2, 3.83e-2, 3.88e-2)}),
    (5, 2, {2: (1.33e-1, 8.77e-2, 1.39e-1), 3: (2.62e-2, 2.73e-2, 4.14e-2), 4: (3.82e-2, 3.83e-2, 3.84e-2)}),
    (6, 1, {2: (6.27e-3, 2.32e-3, 5.47e-3), 3: (2.78e-3, 2.79e-3, 2.84e-3), 4: (1.07e-2, 1.07e-2, 1.07e-2)}),
    (6, 3, {3: (9.26e-2, 6.82e-2, 9.53e-2), 4: (1.37e-2, 1.39e-2, 1.60e-2), 5: (3.82e-2, 3.82e-2, 3.82e-2)}),
    (8, 1, {2: (5.12e-3, 2.85e-4, 7.52e-4), 3: (1.79e-4, 1.77e-4, 1.85e-4), 4: (7.02e-4, 7.02e-4, 7.02e-4)}),
    (8, 3, {3: (8.61e-2, 2.95e-2, 4.36e-2), 4: (3.29e-3, 1.64e-3, 2.37e-3), 5: (2.78e-3, 2.78e-3, 2.78e-3)}),
]
KINDS = ("ideal", "saturate", "inf")


@pytest.mark.parametrize(("bits", "sigma", "expected"), TABLE_A2B)
def test_relative_mse_reproduces_table_a2b(bits, sigma, expected):
    for kind_index, kind in enumerate(KINDS):
        for exp_bits, values in expected.items():
            if values[kind_index] is None:
                continue
            grid = grid_for(kind, exp_bits, bits - 1 - exp_bits)
            mse = optimal_log2_scale(grid, float(sigma))[1].item()
            assert mse == pytest.approx(values[kind_index], rel=0.06), (kind, exp_bits)


@pytest.mark.parametrize(
    ("bits", "sigma", "best"),
    [  # optimal E on ideal / saturate+sub / IEEE-inf+sub grids (A.2b): subnormals move the optimum
        (4, 1.0, (2, 2, 3)),
        (5, 2.0, (3, 3, 4)),
        (6, 1.0, (3, 2, 3)),
        (6, 4.0, (4, 4, 5)),
        (8, 3.0, (5, 4, 4)),
        (8, 4.0, (5, 5, 5)),
    ],
)
def test_optimal_exponent_bits(bits, sigma, best):
    assert tuple(int(optimal_exp_bits(bits, sigma, kind)) for kind in KINDS) == best


def test_switch_points_match_the_recomputation_and_the_reference_code():
    # digest section 2.10.4: recomputed (ideal grid) switch points E-1 -> E, and the reference code's table
    recomputed = {4: {2: 0.65, 3: 1.3}, 5: {2: 0.55, 3: 1.05, 4: 2.25}, 6: {2: 0.45, 3: 0.9, 4: 1.85, 5: 4.1}}
    code_table = {5: {3: 1.0, 4: 2.4}, 6: {3: 0.9, 4: 2.0, 5: 4.9}}
    for bits, expected in recomputed.items():
        ours = switch_points(bits, "ideal", sigma_max=8.0)
        for exp_bits, sigma in expected.items():
            assert ours[exp_bits] == pytest.approx(sigma, rel=0.1), (bits, exp_bits)
        for exp_bits, sigma in code_table.get(bits, {}).items():
            assert ours[exp_bits] == pytest.approx(sigma, rel=0.25), (bits, exp_bits)


def test_optimal_scale_centres_the_energy_not_the_median():
    # digest A.2: the MSE-optimal scaled log2-mean for [1,4,1] (IEEE-like grid)
    grid = grid_for("inf", 4, 1)
    expected = {1.0: -0.60, 1.5: -2.40, 2.0: -4.90, 2.5: -8.00, 3.0: -11.75}
    for sigma, log2_mean in expected.items():
        assert optimal_log2_scale(grid, sigma)[0].item() == pytest.approx(log2_mean, abs=0.1)


def test_in_range_rounding_noise_closed_form():
    # wide range, sigma large enough: relative MSE -> 0.0451 * 2^-2M (the exact values of section 2.10.2)
    for man_bits, expected in ((3, 7.0e-4), (2, 2.8e-3), (1, 1.07e-2), (0, 3.8e-2)):
        mse = optimal_log2_scale(ideal_grid(6, man_bits), 2.0)[1].item()
        assert mse == pytest.approx(expected, rel=0.03)


@pytest.mark.parametrize("fmt", [FPFormat(4, 1), FPFormat(3, 2), FPFormat(5, 2, overflow="inf")], ids=str)
@pytest.mark.parametrize("sigma", [1.0, 2.5])
def test_analytic_mse_matches_monte_carlo_of_quantize_fp(fmt, sigma):
    log2_scale = optimal_log2_scale(fmt.positive_values(), sigma)[0].item()
    # E[(x_hat - x)^2] / E[x^2] = E over the energy-tilted lognormal (log2-mean 2 ln2 sigma^2) of the squared
    # relative error (section 2.10.3): sampling there avoids the heavy tail of x^2
    generator = torch.Generator().manual_seed(0)
    log2_x = 2 * math.log(2) * sigma**2 + sigma * torch.randn(
        1_000_000, generator=generator, dtype=torch.float64
    )
    x = torch.exp2(log2_x).float()
    x_hat = quantize_fp(x * 2.0**log2_scale, fmt).double() / 2.0**log2_scale
    if fmt.overflow == "inf":  # the theory clamps at the top grid point
        x_hat = torch.where(torch.isinf(x_hat), fmt.max_value / 2.0**log2_scale, x_hat)
    monte_carlo = ((x_hat / x.double() - 1) ** 2).mean()
    analytic = relative_mse(fmt.positive_values(), sigma, log2_scale)
    assert monte_carlo.item() == pytest.approx(analytic.item(), rel=0.03)


def test_relative_mse_is_invariant_to_the_log_mean():
    grid = grid_for("saturate", 4, 2)
    shifted = relative_mse(grid * 8.0, 1.5, 3.0)  # the grid 8x larger, the scale 8x larger
    assert shifted.item() == pytest.approx(relative_mse(grid, 1.5, 0.0).item(), rel=1e-9)


def test_mse_table_covers_every_split_and_rejects_bad_input():
    table = mse_by_exp_bits(5, torch.tensor([1.0, 2.0]), "saturate")
    assert sorted(table) == [1, 2, 3, 4] and all(v.shape == (2,) for v in table.values())
    with pytest.raises(ValueError, match="sigma"):
        relative_mse(ideal_grid(3, 2), 0.0, 0.0)
    with pytest.raises(ValueError, match="grid kind must be 'ideal', 'saturate', 'inf' or 'fn'"):
        grid_for("bf16", 3, 2)
    assert math.isfinite(relative_mse(ideal_grid(3, 2), 20.0, -300.0).item())


@pytest.mark.parametrize("name", list(DTYPE_FORMATS))
def test_theory_takes_every_dtype_format(name):
    fmt = DTYPE_FORMATS[name]
    log2_scale, mse = optimal_log2_scale(fmt, torch.tensor([1.0, 3.0]))
    assert torch.isfinite(log2_scale).all() and torch.all((mse > 0) & (mse < 1))
    if fmt.zero:  # a format is its positive values plus zero
        assert torch.equal(
            relative_mse(fmt, 2.0, log2_scale), relative_mse(fmt.positive_values(), 2.0, log2_scale)
        )


def test_a_format_without_zero_rounds_small_values_up():
    # far below float8_e8m0fnu's range every value becomes its smallest, 2^-127: the error is that value,
    # (2^-127 / 2^-200)^2 / E[x^2]; a plain grid of its values has zero, which flushes them: relative MSE 1
    expected = 2.0**146 / math.exp(2 * (math.log(2)) ** 2)  # E[x^2] = exp(2 (ln 2 sigma)^2) for sigma = 1
    assert relative_mse(E8M0FNU, 1.0, -200.0).item() == pytest.approx(expected, rel=1e-9)
    assert relative_mse(E8M0FNU.positive_values(), 1.0, -200.0).item() == pytest.approx(1.0)


@pytest.mark.parametrize("fmt", [E4M3FN, E4M3FNUZ, E2M1FN, E8M0FNU], ids=str)
def test_analytic_mse_matches_monte_carlo_for_dtype_formats(fmt):
    sigma = 1.5
    log2_scale = optimal_log2_scale(fmt, sigma)[0].item()
    generator = torch.Generator().manual_seed(1)
    log2_x = 2 * math.log(2) * sigma**2 + sigma * torch.randn(
        400_000, generator=generator, dtype=torch.float64
    )
    x = torch.exp2(log2_x).float()
    x_hat = quantize_fp(x * 2.0**log2_scale, fmt).double()
    x_hat = torch.where(torch.isfinite(x_hat), x_hat, fmt.max_value) / 2.0**log2_scale  # the theory clamps
    monte_carlo = ((x_hat / x.double() - 1) ** 2).mean()
    assert monte_carlo.item() == pytest.approx(relative_mse(fmt, sigma, log2_scale).item(), rel=0.03)


def test_fn_grids_lose_the_all_ones_code():
    saturate, fn = grid_for("saturate", 4, 3), grid_for("fn", 4, 3)
    assert torch.equal(fn, saturate[:-1]) and fn[-1] == E4M3FN.max_value
    assert min_exp_bits("fn") == 1
    table = mse_by_exp_bits(6, torch.tensor([2.0]), "fn")
    assert sorted(table) == [1, 2, 3, 4, 5]  # E = 5, M = 0: the all-ones code takes the whole top binade
    assert int(optimal_exp_bits(8, 3.0, "fn")) == int(optimal_exp_bits(8, 3.0, "saturate"))
