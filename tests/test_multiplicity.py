"""Simulations of the decision rule: the family-wise error of Holm over one hypothesis per comparison (the
partitioning principle) at the margin, and each probability the tables print against its simulated rate:
the power of a claim's plan (replicates at the planned seeds reaching the claim's conclusion) and the power
behind the minimum detectable effect.

Each simulated family draws per-seed paired differences (normal, sd 1 in the comparison's unit) and goes
through the rule's own steps: each comparison's two routes (`_routes`), then Holm and the verdicts
(`_decide`), as `compare` does; a check at the end ties `compare` itself to those steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from gradcomp.analysis.claims import CLAIMED, _status
from gradcomp.analysis.verdicts import (
    ALPHA,
    BETTER,
    EQUIVALENCE,
    EQUIVALENT,
    NON_INFERIORITY,
    NONINFERIOR,
    POWER,
    SUPERIORITY,
    WORSE,
    Pair,
    _decide,
    _route_at,
    _route_power,
    _routes,
    compare,
    minimum_detectable_effect,
    planned_seeds,
)
from gradcomp.experiments import CLAIMS

FAMILIES = 10_000
# the simulated rate's Monte Carlo error: 2 standard errors of a rate of 0.05 over FAMILIES
TOLERANCE = 2 * math.sqrt(ALPHA * (1 - ALPHA) / FAMILIES)


def _verdicts(pairs: list[Pair], draws: np.ndarray) -> list[list[str]]:
    """The verdicts of each simulated family: `draws` (families, comparisons, seeds) of paired differences,
    one per pair (its test, margin and better side)."""
    out = []
    for family in draws:
        routes, means = [], []
        for pair, differences in zip(pairs, family, strict=True):
            mean, sd = float(differences.mean()), float(differences.std(ddof=1))
            routes.append(_routes(pair.test, pair.margin, pair.higher_is_better, len(differences), mean, sd))
            means.append(mean)
        out.append([verdict for verdict, _, _ in _decide([0] * len(pairs), pairs, routes, means)])
    return out


def _pair(test: str, margin: float | None, higher_is_better: bool | None = True) -> Pair:
    return Pair(
        "a", "b", {}, 0.0, unit="", factor=1.0, margin=margin, higher_is_better=higher_is_better, test=test
    )


# (test, margin, true differences (one per comparison), the verdicts that are errors at each)
AT_THE_MARGIN = {
    # on the margin's edge: "inside" is not true there, so concluding it is an error
    "equivalence, every comparison on the margin": (EQUIVALENCE, 1.0, [1.0, -1.0, 1.0, 1.0], {EQUIVALENT}),
    # just inside the margin: concluding "beyond" is the error
    "equivalence, every comparison just inside": (EQUIVALENCE, 1.0, [0.999] * 4, {BETTER, WORSE}),
    "equivalence, two on the edge and two at 0": (EQUIVALENCE, 1.0, [1.0, 1.0, 0.0, 0.0], None),
    "non-inferiority, every comparison on -m": (NON_INFERIORITY, 1.0, [-1.0] * 4, {NONINFERIOR}),
    "superiority without a margin, every comparison at 0": (SUPERIORITY, None, [0.0] * 4, {BETTER}),
}


@pytest.mark.parametrize(
    ("case", "seeds"),
    [(case, 3) for case in AT_THE_MARGIN] + [(next(iter(AT_THE_MARGIN)), 6)],
    ids=[f"{case}, 3 seeds" for case in AT_THE_MARGIN] + [f"{next(iter(AT_THE_MARGIN))}, 6 seeds"],
)
def test_the_family_wise_error_stays_at_alpha_at_the_margin(case, seeds):
    test, margin, truths, errors = AT_THE_MARGIN[case]
    pairs = [_pair(test, margin) for _ in truths]
    generator = np.random.default_rng(seeds)
    draws = generator.normal(0.0, 1.0, (FAMILIES, len(truths), seeds)) + np.asarray(truths)[:, None]

    def wrong(truth: float, verdict: str) -> bool:
        if errors is not None:
            return verdict in errors
        return verdict == EQUIVALENT if abs(truth) >= margin else verdict in (BETTER, WORSE)

    rate = np.mean(
        [any(wrong(t, v) for t, v in zip(truths, family, strict=True)) for family in _verdicts(pairs, draws)]
    )
    print(f"{case}, {seeds} seeds: family-wise error {rate:.4f}")
    assert rate <= ALPHA + TOLERANCE, f"{case}: family-wise error {rate:.4f} at {seeds} seeds"


def test_counting_both_routes_would_halve_the_level():
    """Why one hypothesis per comparison: at the margin the rule's error is near 0.05 (it uses its level),
    while Holm over both routes (twice the divisor) would keep it near 0.025."""
    pairs = [_pair(EQUIVALENCE, 1.0)]
    draws = np.random.default_rng(7).normal(1.0, 1.0, (FAMILIES, 1, 6))
    rate = np.mean([family[0] == EQUIVALENT for family in _verdicts(pairs, draws)])
    assert ALPHA - 3 * TOLERANCE < rate <= ALPHA + TOLERANCE


# plans simulated: registered claims' (test, margin, better side, comparisons), one of each test kind the
# registered plans use, and TOST plans whose power at the planned seeds is not trivially 1
PLANNED = {
    "S5": (NON_INFERIORITY, 1.0, True, 1),  # the paper's -0.5 pt loss against a 1 pt margin
    "Q1": (NON_INFERIORITY, 1.1, True, 1),
    "L4": (EQUIVALENCE, 0.01, None, 3),  # achieved sparsity equals target within 0.01, three models
    "L1": (SUPERIORITY, None, False, 8),  # 8 comparisons: lower KS distance is better
}
SYNTHETIC = {"TOST at 0": (0.0, 0.5), "TOST at 0.3 of the margin": (0.3, 0.4)}  # (effect, sd), margin 1


@pytest.mark.parametrize("claim", [*PLANNED, *SYNTHETIC])
def test_a_plans_printed_power_is_the_rate_replicates_reach_the_claim(claim):
    """At the planned seeds, simulated replicates (at the plan's sd and stated effect) reach the claimed
    conclusion at the predicted rate (within 0.05), and at least at the plan's power less that tolerance."""
    if claim in SYNTHETIC:
        (effect, sd), (test, margin, higher_is_better, comparisons) = (
            SYNTHETIC[claim],
            (EQUIVALENCE, 1.0, True, 1),
        )
    else:
        test, margin, higher_is_better, comparisons = PLANNED[claim]
        effect, sd = CLAIMS[claim].plan.effect, CLAIMS[claim].plan.sd
    spec = _pair(test, margin, higher_is_better)
    n = planned_seeds(spec, effect, sd, comparisons)
    route = _route_at(spec, effect)
    # every comparison of the family planned alike: the claim is shown when all reach their conclusion
    predicted = _route_power(spec, effect, sd, ALPHA / comparisons, route, n) ** comparisons
    families = FAMILIES // comparisons
    draws = np.random.default_rng(1).normal(effect, sd, (families, comparisons, n))
    shown = np.mean([_status(test, family) == "shown" for family in _verdicts([spec] * comparisons, draws)])
    print(f"{claim}: {n} seeds, predicted {predicted:.3f}, simulated {shown:.3f}")
    assert abs(shown - predicted) <= 0.05, f"{claim}: simulated {shown:.3f}, predicted {predicted:.3f} at {n}"
    assert predicted >= POWER - 0.05 and shown >= POWER - 0.05


def test_the_simulated_steps_are_the_rule_compare_applies():
    generator = np.random.default_rng(3)
    for _ in range(20):
        truths = generator.normal(0.0, 1.5, 4)
        values = generator.normal(0.0, 1.0, (4, 3)) + truths[:, None]
        pairs = [
            Pair(f"a{i}", "b", dict(enumerate(row)), 0.0, unit="", factor=1.0, margin=1.0, family="F")
            for i, row in enumerate(values)
        ]
        expected = _verdicts(pairs, values[None])[0]
        assert [c.verdict for c in compare(pairs)] == expected
    assert set(CLAIMED) == {EQUIVALENCE, "difference", NON_INFERIORITY, SUPERIORITY} and WORSE


@pytest.mark.parametrize("seeds", [3, 6])
def test_the_printed_detectable_effect_is_found_at_its_stated_power(seeds):
    """The tables' "detectable (90 % power)": at that true difference the paired t-test at 0.05 finds it at
    the stated rate (within 0.05), simulated."""
    effect = minimum_detectable_effect(seeds, 1.0)
    draws = np.random.default_rng(seeds).normal(effect, 1.0, (FAMILIES, seeds))
    found = np.mean(stats.ttest_1samp(draws, 0.0, axis=1).pvalue < ALPHA)
    assert abs(found - POWER) <= 0.05, f"{seeds} seeds: found {found:.3f} at {effect:.3f} sd"
