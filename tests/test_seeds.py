"""Numbers over seeds and verdicts: estimates and paired tests against scipy, bounded intervals, TOST, Holm,
power, and which verdict each kind of difference gets."""

import math
import re
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from gradcomp.analysis.claims import INCONCLUSIVE as OPEN
from gradcomp.analysis.claims import REFUTED, SHOWN, decide, deciding
from gradcomp.analysis.seeds import CORRELATION, FRACTION, POSITIVE, Estimate, PerSeed, spearman
from gradcomp.analysis.verdicts import (
    BETTER,
    EQUIVALENT,
    INCONCLUSIVE,
    WORSE,
    Comparison,
    Pair,
    compare,
    holm,
    minimum_detectable_effect,
    one_sample,
    seeds_for_equivalence,
    summarise,
    tost_power,
)


def test_estimate_matches_scipy_and_round_trips_through_its_columns():
    values = [0.812, 0.845, 0.791, 0.833]
    estimate = Estimate.of(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert estimate.mean == pytest.approx(np.mean(values))
    assert estimate.sd == pytest.approx(np.std(values, ddof=1))
    assert (estimate.ci_low, estimate.ci_high) == pytest.approx((low, high))
    assert estimate.n == 4
    row = {"run": "a", **estimate.columns("accuracy"), "seeds": 4}
    assert Estimate.names(row) == ["accuracy"]
    assert Estimate.read(row, "accuracy") == estimate and Estimate.read(row, "sparsity") is None


def test_estimate_of_one_value_has_no_spread_and_none_is_nan():
    one = Estimate.of([0.5])
    assert one.mean == 0.5 and one.n == 1 and one.interval is None
    assert math.isnan(one.sd) and one.text() == "0.5 (1 seed)"
    assert Estimate.of([]).n == 0 and math.isnan(Estimate.of([]).mean)
    assert Estimate.of([1.0, None, 3.0]).n == 2  # a missing value (None) is left out


@pytest.mark.parametrize(
    ("bounds", "values"),
    [
        (FRACTION, [0.99, 0.999, 0.95]),  # a linear interval would pass 1
        (FRACTION, [0.01, 0.002, 0.05]),  # ... or 0
        (CORRELATION, [0.9, 0.99, 0.2]),
        (POSITIVE, [1e-3, 1e-2, 1e-1]),  # a variance: a linear interval would go negative
    ],
)
def test_bounded_intervals_stay_inside_their_bounds_and_hold_the_mean(bounds, values):
    linear = Estimate.of(values)
    bounded = Estimate.of(values, bounds)
    assert not (bounds.low <= linear.ci_low and linear.ci_high <= bounds.high)
    assert bounds.low <= bounded.ci_low <= bounded.mean <= bounded.ci_high <= bounds.high
    assert bounded.mean == pytest.approx(linear.mean)


def test_per_seed_record_aggregates_each_row_over_its_seeds():
    record = PerSeed(("layer",), {"sparsity": FRACTION})
    for seed, (a, b) in enumerate([(0.8, 0.5), (0.82, 0.52), (0.84, None)]):
        record.add(seed, {"layer": "a"}, sparsity=a)
        record.add(seed, {"layer": "b"}, sparsity=b)
    first, second = record.rows()
    assert (first["layer"], first["seeds"], second["seeds"]) == ("a", 3, 2)
    assert first["sparsity_mean"] == pytest.approx(0.82) and second["sparsity_n"] == 2
    assert record.values({"layer": "b"}, "sparsity") == {0: 0.5, 1: 0.52}


def test_paired_comparison_matches_scipy_ttest_rel():
    a = {0: 0.851, 1: 0.823, 2: 0.862, 3: 0.840}
    b = {0: 0.832, 1: 0.811, 2: 0.835, 3: 0.833}
    (comparison,) = compare([Pair("a", "b", a, b)])
    reference = stats.ttest_rel([a[s] for s in sorted(a)], [b[s] for s in sorted(a)])
    interval = reference.confidence_interval(0.95)
    assert comparison.p == pytest.approx(reference.pvalue)
    assert comparison.p_holm == pytest.approx(reference.pvalue)  # one comparison: nothing to adjust
    assert (comparison.ci_low, comparison.ci_high) == pytest.approx((100 * interval.low, 100 * interval.high))
    assert comparison.difference == pytest.approx(100 * np.mean([a[s] - b[s] for s in a]))
    assert (comparison.seeds, comparison.unit, comparison.agree) == (4, "pt", 4)


def test_arms_are_paired_on_the_seeds_they_share():
    a = {0: 0.80, 1: 0.82, 2: 0.81, 3: 0.90}
    b = {1: 0.80, 2: 0.80, 3: 0.85, 4: 0.10}
    (comparison,) = compare([Pair("a", "b", a, b, factor=1.0, unit="")])
    assert comparison.seeds == 3
    assert comparison.difference == pytest.approx(np.mean([0.02, 0.01, 0.05]))


def test_tost_matches_two_one_sided_t_tests():
    a = {s: 0.80 + d for s, d in enumerate([0.002, -0.004, 0.003, 0.001, -0.002, 0.0, 0.004, -0.001])}
    b = dict.fromkeys(range(8), 0.80)
    (comparison,) = compare([Pair("a", "b", a, b, margin=1.0)])
    differences = 100 * (np.array([a[s] for s in range(8)]) - 0.80)
    upper = stats.ttest_1samp(differences, -1.0, alternative="greater").pvalue
    lower = stats.ttest_1samp(differences, 1.0, alternative="less").pvalue
    assert comparison.p_within == pytest.approx(max(upper, lower))
    assert comparison.verdict == EQUIVALENT and "equivalent within ±1 pt" in comparison.statement


def test_each_kind_of_difference_gets_its_verdict():
    base = dict.fromkeys(range(8), 0.80)
    shift = [0.001, -0.002, 0.002, 0.0, 0.001, -0.001, 0.002, -0.001]
    same = {s: 0.80 + d for s, d in enumerate(shift)}  # within ±0.2 pt on every seed
    lower = {s: 0.75 + d for s, d in enumerate(shift)}  # -5 pt on every seed
    noisy = {s: 0.80 + (0.05 if s % 2 else -0.06) for s in range(8)}  # spread of 5 pt
    found = compare(
        [
            Pair("same", "base", same, base, margin=1.0),
            Pair("lower", "base", lower, base, margin=1.0),
            Pair("noisy", "base", noisy, base, margin=1.0),
            Pair("variance", "base", lower, base, higher_is_better=False),  # lower is better here
        ]
    )
    assert [c.verdict for c in found] == [EQUIVALENT, WORSE, INCONCLUSIVE, BETTER]
    noisy_comparison = found[2]
    assert noisy_comparison.seeds_needed > 8 and noisy_comparison.mde > 1.0
    needed = noisy_comparison.seeds_needed
    # its difference (-0.5 pt) lies within a standard error of the margin's edge: planned at no difference
    assert re.search(f"about {needed} seeds \\([0-9,]+ to [0-9,]+ over its 95 % interval; the planning sd "
                     "5.88 pt, 7 df\\) would show it within ±1 pt were the true difference 0 pt",
                     noisy_comparison.statement)  # fmt: skip
    assert "4 of 8 seeds lower" in noisy_comparison.statement
    # a large difference short of significance: what would decide it is finding it, not equivalence
    spread = {s: 0.75 + (0.04 if s % 2 else -0.05) for s in range(3)}
    nulls = [Pair(f"null{i}", "base", base, base, family="question") for i in range(9)]
    large = compare([Pair("large", "base", spread, base, margin=1.0, family="question"), *nulls])[0]
    assert large.verdict == INCONCLUSIVE and large.seeds_needed < 20
    assert re.search(f"about {large.seeds_needed} seeds .* would find it beyond ±1 pt at the observed "
                     "difference\\)$", large.statement)  # fmt: skip


def test_a_secondary_pair_has_one_verdict_whatever_is_compared_beside_it():
    base = dict.fromkeys(range(4), 0.80)
    arm = {s: 0.78 + d for s, d in enumerate([0.004, -0.003, 0.002, -0.001])}
    alone = compare([Pair("arm", "base", arm, base, margin=1.0)])[0]
    others = [Pair(f"other{i}", "base", base, base, margin=1.0) for i in range(20)]
    crowded = compare([*others, Pair("arm", "base", arm, base, margin=1.0)])[-1]
    assert alone.verdict == crowded.verdict == WORSE and alone.tests == crowded.tests == 1
    # in a named family (a claim's or a question's) the same pair is adjusted with its family: one
    # hypothesis per comparison (its two routes' nulls are complementary)
    family = [replace(pair, family="L0") for pair in [*others, Pair("arm", "base", arm, base, margin=1.0)]]
    assert compare(family)[-1].tests == 21


def test_a_small_significant_difference_inside_the_margin_is_equivalent():
    base = dict.fromkeys(range(8), 0.80)
    small = {s: 0.797 + 0.0002 * (s % 2) for s in range(8)}  # -0.3 pt on every seed
    (comparison,) = compare([Pair("small", "base", small, base, margin=1.0)])
    # significant against 0, but the test that decides "worse" is against the margin
    assert comparison.p == 1.0 and comparison.verdict == EQUIVALENT


def test_a_loss_inside_the_margin_is_never_worse_and_more_seeds_show_it():
    """One rule, monotone in evidence: a consistent loss of 0.8 pt with a 1 pt margin is inconclusive at 8
    seeds (its interval excludes 0 but reaches past -1 pt), and equivalent once the seeds narrow it, never
    worse; a loss of 1.5 pt is worse once its interval lies beyond -1 pt."""
    base = dict.fromkeys(range(64), 0.80)
    noise = [0.004 * ((7 * s) % 5 - 2) for s in range(64)]  # sd about 0.6 pt
    loss = {s: 0.792 + noise[s] for s in range(64)}
    few = compare([Pair("loss", "base", {s: loss[s] for s in range(8)}, base, margin=1.0)])[0]
    assert few.verdict == INCONCLUSIVE and few.ci_high < 0 and few.ci_low < -1.0
    assert "consistently lower, not shown beyond the margin" in few.statement
    many = compare([Pair("loss", "base", loss, base, margin=1.0)])[0]
    assert many.verdict == EQUIVALENT
    big = {s: 0.785 + noise[s] for s in range(64)}
    assert compare([Pair("big", "base", big, base, margin=1.0)])[0].verdict == WORSE


def test_seeds_to_decide_account_for_the_adjustment_and_exceed_the_seeds_used():
    base = dict.fromkeys(range(3), 0.80)
    edge = {0: 0.70, 1: 0.66, 2: 0.74}  # -10 pt, sd 4 pt: significant alone, not after Holm over 40
    nulls = [Pair(f"null{i}", "base", base, base, family="L0") for i in range(39)]
    alone = compare([Pair("edge", "base", edge, base)])[0]
    adjusted = compare([Pair("edge", "base", edge, base, family="L0"), *nulls])[0]
    assert alone.verdict == WORSE and adjusted.verdict == INCONCLUSIVE
    assert adjusted.seeds_needed > 3 and str(adjusted.seeds_needed) in adjusted.needed


def test_a_missed_target_is_worse_on_either_side():
    over = one_sample(
        "over", {s: 0.9 + 0.001 * s for s in range(4)}, 0.85, margin=0.01, higher_is_better=None
    )
    under = one_sample(
        "under", {s: 0.8 + 0.001 * s for s in range(4)}, 0.85, margin=0.01, higher_is_better=None
    )
    on = one_sample(
        "on", {s: 0.85 + 0.001 * (s - 1.5) for s in range(4)}, 0.85, margin=0.01, higher_is_better=None
    )
    assert [c.verdict for c in compare([over, under, on])] == [WORSE, WORSE, EQUIVALENT]


def test_one_seed_is_inconclusive_without_an_interval():
    (single,) = compare([Pair("a", "b", {0: 0.9}, {0: 0.8}, margin=1.0)])
    assert (
        single.verdict == INCONCLUSIVE and math.isnan(single.p) and single.interval == "no interval (1 seed)"
    )


def test_the_holm_adjustment_turns_a_lone_significant_difference_inconclusive_among_many():
    base = {seed: 0.80 for seed in range(4)}
    arm = {0: 0.82, 1: 0.815, 2: 0.83, 3: 0.812}
    (alone,) = compare([Pair("arm", "base", arm, base)])
    assert 0.005 < alone.p < 0.05 and alone.verdict == BETTER
    nulls = [
        Pair(f"null{i}", "base", {s: 0.80 + 0.01 * ((s + i) % 2) for s in range(4)}, base, family="L0")
        for i in range(20)
    ]
    crowded = compare([Pair("arm", "base", arm, base, family="L0"), *nulls])[0]
    assert crowded.p == pytest.approx(alone.p) and crowded.p_holm > 0.05 and crowded.tests == 21
    assert crowded.verdict == INCONCLUSIVE


def test_holm_adjustment():
    adjusted = holm([0.01, 0.04, 0.03, math.nan])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06])  # 3 x 0.01; max(2 x 0.03, 1 x 0.04) = 0.06
    assert math.isnan(adjusted[3])
    assert holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_power_of_the_paired_t_test_and_the_tost():
    """With 3 seeds the paired t-test finds 3.92 paired sds with 90 % power; the TOST's power at the seeds
    it asks for reaches 90 % (checked by simulation)."""
    assert minimum_detectable_effect(3, 1.0) == pytest.approx(3.923, abs=0.01)
    assert minimum_detectable_effect(8, 2.0) == pytest.approx(2 * minimum_detectable_effect(8, 1.0))
    n = seeds_for_equivalence(1.0, 1.0)
    assert tost_power(n, 1.0) >= 0.9 > tost_power(n - 1, 1.0)
    generator = np.random.default_rng(0)
    draws = generator.normal(0.0, 1.0, (20_000, n))
    mean, se = draws.mean(1), draws.std(1, ddof=1) / math.sqrt(n)
    t = stats.t.ppf(0.95, n - 1)
    simulated = np.mean(((mean + 1) / se > t) & ((mean - 1) / se < -t))
    assert simulated == pytest.approx(tost_power(n, 1.0), abs=0.02)


def test_spearman_interval_stays_inside_minus_one_to_one():
    rho, low, high, n = spearman([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 6, 5])
    assert n == 6 and -1 <= low < rho < high <= 1
    assert math.isnan(spearman([1, 2, 3], [3, 2, 1])[0])


def test_a_comparison_reads_back_from_its_row_and_sentences_group_by_verdict():
    base = dict.fromkeys(range(4), 0.8)
    comparisons = compare(
        [
            Pair("a", "fp32", {s: 0.8 + 0.001 * s for s in range(4)}, base, margin=1.0),
            Pair("b", "fp32", {s: 0.6 + 0.001 * s for s in range(4)}, base, margin=1.0),
        ]
    )
    row = {**comparisons[0].row(), "ci_low": None}  # JSON writes NaN as null
    assert math.isnan(Comparison.from_row(row).ci_low)
    sentence = summarise(comparisons)
    assert (
        sentence.startswith("against fp32: equivalent within ±1 pt: a (")
        and "; worse: b (-19.9 pt" in sentence
    )


def _claim(claim: str, *pairs: Pair, secondary: Sequence[Pair] = ()):
    """`claim` decided from `pairs` as its deciding comparisons, beside secondary ones."""
    comparisons = compare([*deciding(claim, pairs), *secondary])
    return decide(claim, comparisons), comparisons


def test_each_test_decides_its_claim_by_one_rule():
    base = dict.fromkeys(range(4), 0.8)
    same = Pair("same", "base", {s: 0.8 + 0.001 * s for s in range(4)}, base, margin=1.0)
    lost = Pair("lost", "base", {s: 0.7 + 0.001 * s for s in range(4)}, base, margin=1.0)
    noisy = Pair("noisy", "base", {0: 0.7, 1: 0.9, 2: 0.75, 3: 0.85}, base, margin=1.0)
    assert _claim("L6", same)[0].status == SHOWN  # non-inferiority
    assert _claim("L6", same, lost)[0].status == REFUTED
    assert _claim("L6", same, noisy)[0].status == OPEN
    assert _claim("L4", same)[0].status == SHOWN  # equivalence
    assert _claim("L5", lost)[0].status == SHOWN and _claim("L5", same)[0].status == REFUTED  # difference
    better = replace(lost, a_values={s: 0.9 + 0.001 * s for s in range(4)}, margin=None)
    assert _claim("S2", better)[0].status == SHOWN  # superiority (higher is better here)
    assert _claim("S2", replace(lost, margin=None))[0].status == REFUTED
    decision = _claim("L6", same)[0]
    assert decision.seeds == "4 seeds (seeds 0-3)" and "same vs base: +0.15 pt" in decision.evidence
    assert decision.seed_ids == (0, 1, 2, 3) and decision.used == 4 and decision.margin == "1 pt"


def test_a_loss_inside_the_margin_does_not_refute_a_no_loss_claim():
    """L6's case: a consistent loss of 0.94 pt [0.48, 1.39] (8 seeds) against a 1 pt margin is inconclusive,
    not refuted; with the same loss on 512 seeds it is shown non-inferior; a 1.2 pt loss is refuted."""
    base = dict.fromkeys(range(512), 0.85)
    noise = [0.00275 * (-3, -2, -1, 0, 0, 1, 2, 3)[s % 8] for s in range(512)]  # mean 0, sd 0.55 pt
    few = {s: 0.85 - 0.0094 + noise[s] for s in range(8)}
    decision, (gap,) = _claim("L6", Pair("prune", "fp32", few, base, margin=1.0))
    assert decision.status == OPEN and gap.ci_high < 0 and gap.ci_low < -1.0 < gap.ci_high
    # planned at the claim's stated effect (no loss), not at the observed loss near the margin
    assert (
        gap.planned_at == 0.0 and gap.seeds_needed <= 8 and "the 8 seeds used give 90 % power" in gap.needed
    )
    many = {s: 0.85 - 0.0094 + noise[s] for s in range(512)}
    assert _claim("L6", Pair("prune", "fp32", many, base, margin=1.0))[0].status == SHOWN
    worse = {s: 0.85 - 0.012 + noise[s] for s in range(512)}
    assert _claim("L6", Pair("prune", "fp32", worse, base, margin=1.0))[0].status == REFUTED


def test_a_claim_is_its_own_family_apart_from_the_secondary_comparisons():
    base = dict.fromkeys(range(4), 0.8)
    same = Pair("same", "base", {s: 0.8 + 0.001 * (s % 2) for s in range(4)}, base, margin=1.0)
    nulls = [
        Pair(f"null{i}", "base", {s: 0.8 + 0.001 * s for s in range(4)}, base, margin=1.0) for i in range(9)
    ]
    decision, comparisons = _claim("L6", same, secondary=nulls)
    assert comparisons[0].family == "L6" and comparisons[0].tests == 1  # one hypothesis per comparison
    # each secondary comparison is a family of its own
    assert {c.tests for c in comparisons[1:]} == {1} and decision.status == SHOWN


def test_seeds_to_decide_plan_with_the_like_arm_sd_and_never_the_seeds_used():
    """Arms of one kind (declared) share a planning sd; unlike arms never do; no count at or below the seeds
    used is printed."""
    base = dict.fromkeys(range(3), 0.80)
    arms = [Pair(f"arm{i}", "base", {0: 0.795 + 0.002 * i, 1: 0.81, 2: 0.80 - 0.001 * i}, base, margin=1.0,
                 family="Q", kind="fp") for i in range(6)]  # fmt: skip
    like = compare(arms)
    for c in like:
        assert c.verdict == INCONCLUSIVE and c.sd_pooled == pytest.approx(like[0].sd_pooled) and c.sd_df == 12
        low, high = c.seeds_range
        assert c.seeds_needed is None or (c.seeds_needed > 3 and low <= c.seeds_needed <= (high or 10**9))
        assert c.seeds_needed is None or re.search(
            r"about [0-9,]+ seeds \([0-9,]+ to [0-9,]+ over its 95 %", c.needed
        )
    unlike = compare([replace(pair, kind=None) for pair in arms])
    assert {c.sd_df for c in unlike} == {2} and unlike[0].sd_pooled == pytest.approx(unlike[0].sd)


def test_a_claim_shows_its_plan_against_the_seeds_it_used_and_its_second_margin():
    """S5's plan: the paper's 0.5 pt loss as the true difference, 90 % power at the registered sd; three
    seeds are under-powered; at the paper's own number as the margin a 0.27 pt loss is inconclusive."""
    base = dict.fromkeys(range(3), 0.80)
    arm = {0: 0.795, 1: 0.800, 2: 0.797}
    decision, _ = _claim("S5", Pair("a", "base", arm, base, margin=1.0))
    assert decision.status == SHOWN and decision.used == 3 and decision.planned > 3
    assert (
        "at a true difference of -0.5 pt, the paper's own loss" in decision.plan and "5 df" in decision.plan
    )
    assert decision.sensitivity.startswith("at 0.5 pt (the paper's own number") and "inconclusive" in (
        decision.sensitivity
    )
    assert not hasattr(decision, "replicates") and "knife" not in str(decision.row())


def test_an_equivalence_names_its_interval_and_its_adjustment():
    """The TOST decides by the 90 % interval, at the level the Holm adjustment over the family leaves."""
    base = dict.fromkeys(range(4), 0.80)
    arm = {0: 0.798, 1: 0.800, 2: 0.802, 3: 0.800}  # 0 pt, sd 0.16 pt
    (comparison,) = compare([Pair("arm", "base", arm, base, margin=1.0)])
    assert comparison.verdict == EQUIVALENT and comparison.tests == 1
    low, high = (float(v) for v in comparison.tost_interval.split("[")[1].rstrip("]").split(", "))
    assert -1.0 < low < high < 1.0
    assert comparison.p_holm == pytest.approx(comparison.p_within)
    assert comparison.decision == (
        f"equivalent within ±1 pt ({comparison.tost_interval}; Holm p = {comparison.p_holm:.2g} over 1)"
    )


def test_a_claim_with_many_comparisons_counts_them_and_names_those_that_fall_short():
    base = dict.fromkeys(range(4), 0.8)
    better = [Pair(f"arm{i}", "base", {s: 0.9 + 0.001 * s for s in range(4)}, base) for i in range(9)]
    short = Pair("flat", "base", {0: 0.7, 1: 0.9, 2: 0.75, 3: 0.85}, base)
    decision, _ = _claim("S2", *better, short)
    assert decision.status == OPEN
    assert decision.evidence.startswith("10 comparisons: 9 better, 1 inconclusive; flat vs base:")
    assert "arm0 vs" not in decision.evidence and decision.evidence.endswith(
        "(every one in the experiment's table)"
    )
