"""The papers' claims decided at this configuration's scale: shown, refuted or inconclusive.

A claim (registered with the experiment that tests it, `gradcomp.experiments.CLAIMS`) states its test and
the reason for its margin; its deciding comparisons are declared with it (`deciding`: they form the claim's
own Holm family in `gradcomp.analysis.verdicts.compare`, apart from the experiment's secondary comparisons)
and decide it by one rule (`decide`):

* *shown* where every deciding comparison has the verdict the test claims (equivalence: equivalent within
  the margin; non-inferiority: non-inferior within it; superiority: better; difference: beyond the margin);
* *refuted* where one has the contrary verdict (its interval lies on the wrong side of the margin);
* *inconclusive* otherwise, with what was seen and the seeds that would decide it.

Each decision carries how likely an independent replicate with as many seeds is to reach it, were the observed
differences the truth and each sd the upper end of its pooled interval (each deciding comparison's routes at
0.05 over the family's tests, comparisons taken as independent): below 80 % it is flagged *knife-edge*. A
claim about the theory is computed exactly (no seeds), shown or refuted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from gradcomp.analysis.verdicts import (
    BETTER,
    DIFFERENCE,
    EQUIVALENCE,
    EQUIVALENT,
    NON_INFERIORITY,
    NONINFERIOR,
    REPLICATES,
    SUPERIORITY,
    WORSE,
    Comparison,
    Pair,
)
from gradcomp.experiments import CLAIMS

SHOWN, REFUTED, INCONCLUSIVE = "shown", "refuted", "inconclusive"
# each test's claimed verdicts, and the route of `Comparison.route_powers` that reaches them
CLAIMED = {
    EQUIVALENCE: ({EQUIVALENT}, 1),
    DIFFERENCE: ({BETTER, WORSE}, 0),
    NON_INFERIORITY: ({NONINFERIOR}, 1),
    SUPERIORITY: ({BETTER}, 0),
}


@dataclass(frozen=True)
class Decision:
    """A claim (by ID) decided: its status, what the configuration shows (numbers with their intervals),
    the seeds and the training scale behind it, and how likely a replicate is to reach the same status
    (None: computed exactly, or not estimable)."""

    claim: str
    status: str
    evidence: str
    seeds: str
    scale: str
    replicates: float | None = None
    decidable: bool = True  # whether its design could reach shown or refuted (seeds >= 2 per comparison)

    @property
    def knife_edge(self) -> bool:
        return self.replicates is not None and self.replicates < REPLICATES

    @property
    def replication(self) -> str:
        """e.g. "knife-edge: a replicate reaches it with probability 0.55", "robust (0.97)"."""
        if self.replicates is None:
            return "exact" if self.seeds.startswith("exact") else "not estimable"
        if self.knife_edge:
            return f"knife-edge: a replicate at these seeds reaches it with probability {self.replicates:.2f}"
        return f"robust: a replicate at these seeds reaches it with probability {self.replicates:.2f}"

    def row(self) -> dict:
        return asdict(self) | {"replication": self.replication}


def deciding(claim: str, pairs: Sequence[Pair], family: str | None = None) -> list[Pair]:
    """`pairs` as the deciding comparisons of `claim`: its own family (named `family` where one experiment
    decides the claim more than once, e.g. at several budgets), its test."""
    return [replace(pair, family=family or claim, test=CLAIMS[claim].test) for pair in pairs]


def _evidence(comparisons: Sequence[Comparison]) -> tuple[str, str, str]:
    """The comparisons in words, their seed counts and their scales."""
    evidence = "; ".join(
        f"{c.a} vs {c.b}: {c.difference:+.3g} {c.unit} {c.interval}, {c.decision}"
        + (f" ({c.needed})" if c.verdict == "inconclusive" else "")
        for c in comparisons
    ).replace("  ", " ")
    counts = sorted({c.seeds for c in comparisons})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    scales = "; ".join(dict.fromkeys(c.scale for c in comparisons if c.scale))
    return evidence, f"{seeds} seeds", scales


def decide(
    claim: str, comparisons: Sequence[Comparison], note: str = "", family: str | None = None
) -> Decision:
    """The claim from its deciding comparisons among `comparisons` (those of its family, `deciding`), by its
    test; `note` is appended to the evidence (e.g. a per-layer criterion)."""
    mine = [c for c in comparisons if c.family == (family or claim)]
    if not mine:
        return undecided(claim, "no deciding comparison among this configuration's runs")
    claimed, route = CLAIMED[CLAIMS[claim].test]
    verdicts = [c.verdict for c in mine]
    if any(v != "inconclusive" and v not in claimed for v in verdicts):
        status = REFUTED
    elif all(v in claimed for v in verdicts):
        status = SHOWN
    else:
        status = INCONCLUSIVE
    evidence, seeds, scale = _evidence(mine)
    replicates = _replicates(mine, route, status)
    return Decision(claim, status, evidence + note, seeds, scale, replicates, all(c.seeds >= 2 for c in mine))


def _replicates(comparisons: Sequence[Comparison], route: int, status: str) -> float | None:
    """The probability that a replicate reaches `status` (see the module)."""
    powers = [c.route_powers for c in comparisons]
    if any(p is None for p in powers):
        return None
    shown = math.prod(p[route] for p in powers)
    refuted = 1 - math.prod(1 - p[1 - route] for p in powers)
    return {SHOWN: shown, REFUTED: refuted}.get(status, max(0.0, 1 - shown - refuted))


def computed(claim: str, holds: bool, evidence: str, scale: str) -> Decision:
    """A claim about the theory, decided by exact computation."""
    return Decision(claim, SHOWN if holds else REFUTED, evidence, "exact (no seeds)", scale)


def undecided(claim: str, why: str) -> Decision:
    """A claim this configuration's runs cannot decide (e.g. its deciding run is not trained)."""
    return Decision(claim, INCONCLUSIVE, why, "", "", decidable=False)
