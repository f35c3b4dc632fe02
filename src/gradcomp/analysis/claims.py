"""The papers' claims decided at this configuration's scale: shown, refuted or inconclusive.

A claim (registered with the experiment that tests it, `gradcomp.experiments.CLAIMS`) is decided from the
verdicts of that experiment's comparisons (`gradcomp.analysis.verdicts`), never from a mean alone:

* a claim of *no loss* (or of hitting a target) is shown where every deciding comparison is *equivalent*
  within its margin (or *better*), refuted where one is *worse*, inconclusive otherwise;
* a claim of a *difference* is shown where every deciding comparison has the claimed verdict, refuted where
  one is *equivalent* or has the opposite verdict, inconclusive otherwise;
* a claim about the theory is computed exactly (no seeds), shown or refuted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from gradcomp.analysis.verdicts import BETTER, EQUIVALENT, WORSE, Comparison

SHOWN, REFUTED, INCONCLUSIVE = "shown", "refuted", "inconclusive"


@dataclass(frozen=True)
class Decision:
    """A claim (by ID) decided: its status, what the configuration shows (numbers with their intervals),
    the seeds and the training scale behind it."""

    claim: str
    status: str
    evidence: str
    seeds: str
    scale: str

    def row(self) -> dict:
        return asdict(self)


def _evidence(comparisons: Sequence[Comparison]) -> tuple[str, str, str]:
    """The comparisons in words, their seed counts and their scales."""
    evidence = "; ".join(
        f"{c.a} vs {c.b}: {c.difference:+.3g} {c.unit} {c.interval}, {c.decision}".replace("  ", " ")
        for c in comparisons
    )
    counts = sorted({c.seeds for c in comparisons})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    scales = "; ".join(dict.fromkeys(c.scale for c in comparisons if c.scale))
    return evidence, f"{seeds} seeds", scales


def equivalent(claim: str, comparisons: Sequence[Comparison]) -> Decision:
    """A claim of no loss (or of hitting a target): every comparison within its margin, or better."""
    verdicts = {c.verdict for c in comparisons}
    if WORSE in verdicts:
        status = REFUTED
    elif comparisons and verdicts <= {EQUIVALENT, BETTER}:
        status = SHOWN
    else:
        status = INCONCLUSIVE
    return Decision(claim, status, *_evidence(comparisons))


def differs(claim: str, comparisons: Sequence[Comparison], expected: str) -> Decision:
    """A claim that every comparison comes out `expected` (better or worse)."""
    opposite = {BETTER: WORSE, WORSE: BETTER}[expected]
    verdicts = {c.verdict for c in comparisons}
    if verdicts & {EQUIVALENT, opposite}:
        status = REFUTED
    elif comparisons and verdicts == {expected}:
        status = SHOWN
    else:
        status = INCONCLUSIVE
    return Decision(claim, status, *_evidence(comparisons))


def computed(claim: str, holds: bool, evidence: str, scale: str) -> Decision:
    """A claim about the theory, decided by exact computation."""
    return Decision(claim, SHOWN if holds else REFUTED, evidence, "exact (no seeds)", scale)


def undecided(claim: str, why: str) -> Decision:
    """A claim this configuration's runs cannot decide (e.g. its deciding run is not trained)."""
    return Decision(claim, INCONCLUSIVE, why, "", "")
