"""Numbers over seeds: estimates and paired comparisons against scipy, and where the verdict flips."""

import math

import numpy as np
import pytest
from scipy import stats

from gradcomp.analysis.seeds import SIGNIFICANT, UNTESTED, WITHIN_NOISE, Estimate, compare, holm


def test_estimate_matches_scipy():
    values = [0.812, 0.845, 0.791, 0.833]
    estimate = Estimate.of(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert estimate.mean == pytest.approx(np.mean(values))
    assert estimate.sd == pytest.approx(np.std(values, ddof=1))
    assert (estimate.ci_low, estimate.ci_high) == pytest.approx((low, high))
    assert estimate.n == 4
    assert estimate.columns("accuracy") == {
        "accuracy_mean": estimate.mean,
        "accuracy_sd": estimate.sd,
        "accuracy_ci_low": estimate.ci_low,
        "accuracy_ci_high": estimate.ci_high,
    }


def test_estimate_of_one_value_has_no_spread_and_none_is_nan():
    one = Estimate.of([0.5])
    assert one.mean == 0.5 and one.n == 1
    assert math.isnan(one.sd) and math.isnan(one.ci_low) and math.isnan(one.ci_high)
    assert Estimate.of([]).n == 0 and math.isnan(Estimate.of([]).mean)
    assert Estimate.of([1.0, None, 3.0]).n == 2  # a missing value (None) is left out


def test_paired_comparison_matches_scipy_ttest_rel():
    a = {0: 0.851, 1: 0.823, 2: 0.862, 3: 0.840}
    b = {0: 0.832, 1: 0.811, 2: 0.835, 3: 0.833}
    (comparison,) = compare([(("a", a), ("b", b))])
    reference = stats.ttest_rel([a[s] for s in sorted(a)], [b[s] for s in sorted(a)])
    interval = reference.confidence_interval(0.95)
    assert comparison.p == pytest.approx(reference.pvalue)
    assert comparison.p_holm == pytest.approx(reference.pvalue)  # one comparison: nothing to adjust
    assert (comparison.ci_low, comparison.ci_high) == pytest.approx((100 * interval.low, 100 * interval.high))
    assert comparison.difference == pytest.approx(100 * np.mean([a[s] - b[s] for s in a]))
    assert (comparison.seeds, comparison.unit) == (4, "pt")


def test_arms_are_paired_on_the_seeds_they_share():
    a = {0: 0.80, 1: 0.82, 2: 0.81, 3: 0.90}
    b = {1: 0.80, 2: 0.80, 3: 0.85, 4: 0.10}
    (comparison,) = compare([(("a", a), ("b", b))], scale=1.0, unit="")
    assert comparison.seeds == 3
    assert comparison.difference == pytest.approx(np.mean([0.02, 0.01, 0.05]))


def test_the_verdict_flips_with_the_noise():
    steady = {seed: 0.80 for seed in range(3)}
    better = {seed: 0.82 + 0.001 * seed for seed in range(3)}  # +2 pt on every seed
    noisy = {0: 0.86, 1: 0.77, 2: 0.83}  # +2 pt on average, spread of several points
    found, missed = compare(
        [(("better", better), ("steady", steady)), (("noisy", noisy), ("steady", steady))]
    )
    assert found.verdict == SIGNIFICANT and "significant" in found.statement
    assert missed.verdict == WITHIN_NOISE and found.difference == pytest.approx(missed.difference, abs=0.2)
    assert missed.statement.startswith("noisy vs steady: +2 pt, within noise (±")
    (single,) = compare([(("a", {0: 0.9}), ("b", {0: 0.8}))])
    assert single.verdict == UNTESTED and math.isnan(single.p)


def test_identical_differences_on_every_seed_are_significant_and_identical_arms_are_not():
    same = {seed: 0.8 for seed in range(3)}
    shifted = {seed: 0.81 for seed in range(3)}
    shift, nothing = compare([(("shifted", shifted), ("same", same)), (("same", same), ("same", same))])
    assert shift.verdict == SIGNIFICANT and nothing.verdict == WITHIN_NOISE


def test_holm_adjustment():
    adjusted = holm([0.01, 0.04, 0.03, math.nan])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06])  # 3 x 0.01; max(2 x 0.03, 1 x 0.04) = 0.06
    assert math.isnan(adjusted[3])
    assert holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_each_comparison_is_tested_on_its_own_and_its_holm_adjustment_is_reported():
    """Among many null comparisons a difference stays significant on its own test, and its statement
    gives the Holm-adjusted p-value over all of them (here above 0.05)."""
    base = {seed: 0.80 for seed in range(4)}
    arm = {0: 0.82, 1: 0.815, 2: 0.83, 3: 0.812}
    (alone,) = compare([(("arm", arm), ("base", base))])
    assert 0.005 < alone.p < 0.05 and alone.verdict == SIGNIFICANT
    nulls = [
        ((f"null{i}", {s: 0.80 + 0.01 * ((s + i) % 2) for s in range(4)}), ("base", base)) for i in range(20)
    ]
    crowded = compare([(("arm", arm), ("base", base)), *nulls])[0]
    assert crowded.p == pytest.approx(alone.p) and crowded.verdict == SIGNIFICANT
    assert crowded.p_holm > 0.05 and crowded.tests == 21 and "after Holm over 21" in crowded.statement
