"""The papers' claims decided at this configuration's scale: shown, refuted or inconclusive.

A claim (registered with the experiment that tests it, `gradcomp.experiments.CLAIMS`) states its test, the
source of its margin and its plan (`gradcomp.experiments.Plan`, fixed before the runs); its deciding
comparisons are declared with it (`deciding`: they form the claim's own Holm family in
`gradcomp.analysis.verdicts.compare`, apart from the experiment's secondary comparisons, and their seeds to
decide are planned at the claim's stated effect) and decide it by one rule (`decide`):

* *shown* where every deciding comparison has the verdict the test claims (equivalence: equivalent within
  the margin; non-inferiority: non-inferior within it; superiority: better; difference: beyond the margin);
* *refuted* where one has the contrary verdict (its interval lies on the wrong side of the margin);
* *inconclusive* otherwise, with what was seen and the seeds that would decide it.

Each decision carries its plan (the seeds planned from the plan's like-arm sd at its stated effect, power
0.9 at 0.05 over the deciding comparisons, against the seeds used), the seeds it used, and where the plan
names a second margin its status there (the sensitivity line). Robustness is not computed here: it is the
same claim decided on other seeds (`gradcomp.analysis.summary` cites them). A claim about the theory is
computed exactly (no seeds), shown or refuted.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from gradcomp.analysis.seeds import number
from gradcomp.analysis.verdicts import (
    ALPHA,
    BETTER,
    DIFFERENCE,
    EQUIVALENCE,
    EQUIVALENT,
    INCONCLUSIVE,
    NON_INFERIORITY,
    NONINFERIOR,
    POWER,
    SUPERIORITY,
    WORSE,
    Comparison,
    Pair,
    at_margin,
    planned_seeds,
)
from gradcomp.experiments import CLAIMS

LISTED = 8  # a claim's evidence lists this many comparisons; beyond, it counts them
SHOWN, REFUTED = "shown", "refuted"
OUT_OF_REGIME = "not tested in its regime"  # the configuration's runs are not where the paper's claim applies
STATUSES = (SHOWN, REFUTED, INCONCLUSIVE, OUT_OF_REGIME)
# each test's claimed verdicts
CLAIMED = {
    EQUIVALENCE: {EQUIVALENT},
    DIFFERENCE: {BETTER, WORSE},
    NON_INFERIORITY: {NONINFERIOR},
    SUPERIORITY: {BETTER},
}


@dataclass(frozen=True)
class Decision:
    """A claim (by ID) decided: its status, what the configuration shows (numbers with their intervals),
    the seeds (`seed_ids`) and the training scale behind it, its plan against the seeds used, and its status
    at the plan's second margin."""

    claim: str
    status: str
    evidence: str
    seeds: str
    scale: str
    decidable: bool = True  # whether its design could reach shown or refuted (seeds >= 2 per comparison)
    planned: int | None = None  # the seeds its plan asks for (None: exact, or none would do)
    used: int | None = None  # the fewest seeds of a deciding comparison
    plan: str = ""
    sensitivity: str = ""
    seed_ids: tuple[int, ...] = ()
    margin: str = ""  # the deciding comparisons' margin, e.g. "1 pt" (empty: none declared)
    headline: str = ""  # the least decided deciding comparison's difference, e.g. "-0.6 pt [-1.2, -0.1]"

    def row(self) -> dict:
        return asdict(self)


def deciding(claim: str, pairs: Sequence[Pair], family: str | None = None) -> list[Pair]:
    """`pairs` as the deciding comparisons of `claim`: its own family (named `family` where one experiment
    decides the claim more than once, e.g. at several budgets), its test, its stated effect."""
    plan = CLAIMS[claim].plan
    effect = None if plan is None else plan.effect
    return [replace(pair, family=family or claim, test=CLAIMS[claim].test, effect=effect) for pair in pairs]


def _status(test: str, verdicts: Sequence[str]) -> str:
    claimed = CLAIMED[test]
    if any(v != INCONCLUSIVE and v not in claimed for v in verdicts):
        return REFUTED
    return SHOWN if all(v in claimed for v in verdicts) else INCONCLUSIVE


def _evidence(comparisons: Sequence[Comparison], claimed: set[str]) -> tuple[str, str, str, tuple[int, ...]]:
    """The comparisons in words (beyond LISTED of them, the count of each verdict and those not of a claimed
    one), their seed counts, their scales and their seeds."""

    def text(c: Comparison) -> str:
        needed = f" ({c.needed})" if c.verdict == INCONCLUSIVE else ""
        return f"{c.a} vs {c.b}: {c.difference:+.3g} {c.unit} {c.interval}, {c.decision}{needed}"

    if len(comparisons) <= LISTED:
        evidence = "; ".join(map(text, comparisons))
    else:
        counts = Counter(c.verdict for c in comparisons)
        others = [c for c in comparisons if c.verdict not in claimed]
        evidence = (
            f"{len(comparisons)} comparisons: "
            + ", ".join(f"{n} {verdict}" for verdict, n in counts.most_common())
            + "".join(f"; {text(c)}" for c in others[:LISTED])
            + (f"; and {len(others) - LISTED} more" if len(others) > LISTED else "")
            + " (every one in the experiment's table)"
        )
    evidence = evidence.replace("  ", " ")
    ids = tuple(sorted({seed for c in comparisons for seed, *_ in c.values}))
    counts = sorted({c.seeds for c in comparisons})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    scales = "; ".join(dict.fromkeys(c.scale for c in comparisons if c.scale))
    return evidence, f"{seeds} seeds" + (f" ({seed_text(ids)})" if ids else ""), scales, ids


def seed_text(ids: Sequence[int]) -> str:
    """e.g. "seeds 0-2", "seeds 8-13", "seeds 0, 2, 5"."""
    ids = sorted(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"seeds {ids[0]}-{ids[-1]}"
    return ("seed " if len(ids) == 1 else "seeds ") + ", ".join(map(str, ids))


def decide(
    claim: str, comparisons: Sequence[Comparison], note: str = "", family: str | None = None
) -> Decision:
    """The claim from its deciding comparisons among `comparisons` (those of its family, `deciding`), by its
    test, with its plan; `note` is appended to the evidence (e.g. a per-layer criterion)."""
    mine = [c for c in comparisons if c.family == (family or claim)]
    if not mine:
        return undecided(claim, "no deciding comparison among this configuration's runs")
    test = CLAIMS[claim].test
    status = _status(test, [c.verdict for c in mine])
    evidence, seeds, scale, ids = _evidence(mine, CLAIMED[test])
    planned, plan = _plan(claim, mine)
    used = min(c.seeds for c in mine)
    return Decision(
        claim,
        status,
        evidence + note,
        seeds,
        scale,
        decidable=all(c.seeds >= 2 for c in mine),
        planned=planned,
        used=used,
        plan=plan,
        sensitivity=_sensitivity(claim, mine),
        seed_ids=ids,
        margin="" if mine[0].margin is None else f"{mine[0].margin:g} {mine[0].unit}".rstrip(),
        headline=_headline(mine),
    )


def _headline(mine: Sequence[Comparison]) -> str:
    """The deciding comparison with the largest adjusted p (the least decided), its difference and 95 %
    interval rounded to what the interval supports (the half-width's first significant digit, its second
    where the first is 1 or 2), e.g. "+0.1 pt [-0.6, +0.8]"."""
    c = max(mine, key=lambda c: c.p_holm if c.p_holm == c.p_holm else math.inf)
    unit = f" {c.unit}" if c.unit else ""
    half = (c.ci_high - c.ci_low) / 2
    if not half > 0:  # no interval (NaN) or none wide enough to round by
        return f"{c.difference:+.2g}{unit}"
    digit = math.floor(math.log10(half))
    decimals = max(0, -digit + (half / 10**digit < 3))
    return f"{c.difference:+.{decimals}f}{unit} [{c.ci_low:+.{decimals}f}, {c.ci_high:+.{decimals}f}]"


def _plan(claim: str, mine: Sequence[Comparison]) -> tuple[int | None, str]:
    """The claim's planned seeds and its plan in words."""
    plan = CLAIMS[claim].plan
    if plan is None:
        raise ValueError(f"claim {claim} is decided by computation (`computed`), not by seeds")
    spec = mine[0]
    planned = planned_seeds(spec, plan.effect, plan.sd, len(mine))
    unit = f" {spec.unit}" if spec.unit else ""
    count = "no seed count" if planned is None else f"{planned} seeds"
    over = f"over {len(mine)} comparisons" if len(mine) > 1 else "one comparison"
    effect = f"{plan.effect:+g}" if plan.effect else "0"
    return planned, (
        f"{count} (power {POWER:g} at {ALPHA:g}, {over}; at a true difference of {effect}{unit}, "
        f"{plan.effect_source}; sd {number(plan.sd)}{unit} with {plan.df} df: {plan.source})"
    )


def _sensitivity(claim: str, mine: Sequence[Comparison]) -> str:
    """The claim's status at its plan's second margin, e.g. "at 0.5 pt (the paper's number): shown"."""
    plan = CLAIMS[claim].plan
    if plan is None or plan.sensitivity is None:
        return ""
    margin, why = plan.sensitivity
    unit = f" {mine[0].unit}" if mine[0].unit else ""
    return f"at {margin:g}{unit} ({why}): {_status(CLAIMS[claim].test, at_margin(mine, margin))}"


def computed(claim: str, holds: bool, evidence: str, scale: str) -> Decision:
    """A claim about the theory, decided by exact computation."""
    return Decision(claim, SHOWN if holds else REFUTED, evidence, "exact (no seeds)", scale, plan="exact")


def undecided(claim: str, why: str) -> Decision:
    """A claim this configuration's runs cannot decide (e.g. its deciding run is not trained)."""
    return Decision(claim, INCONCLUSIVE, why, "", "", decidable=False)
