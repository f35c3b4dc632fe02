"""Accuracy (and other per-run numbers) of run groups over seeds: table rows and paired comparisons."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gradcomp.analysis.runs import Run, RunGroup
from gradcomp.analysis.seeds import Comparison, Estimate, compare
from gradcomp.analysis.tables import Table


def run_row(group: RunGroup, **values: Callable[[Run], float | None]) -> dict[str, Any]:
    """One table row per run: name, label, seed count, and mean / sd / 95 % CI of each named per-run value
    (accuracy by default)."""
    values = values or {"accuracy": lambda run: run.accuracy}
    row: dict[str, Any] = {"run": group.name, "label": group.label, "seeds": len(group.runs)}
    for name, value in values.items():
        row |= group.estimate(value).columns(name)
    return row


def per_seed_table(groups: Sequence[RunGroup], **values: Callable[[Run], float | None]) -> Table:
    """Every seed's values (for figures that show each seed), kept out of the Markdown."""
    values = values or {"accuracy": lambda run: run.accuracy}
    rows = [
        {"run": group.name, "seed": seed, **{name: value(run) for name, value in values.items()}}
        for group in groups
        for seed, run in group.runs.items()
    ]
    return Table("Every seed", rows, markdown=False)


def compare_accuracy(pairs: Sequence[tuple[RunGroup, RunGroup]]) -> list[Comparison]:
    """Paired accuracy differences a - b in points (one experiment's comparisons, Holm-adjusted together)."""
    return compare([((a.label, a.accuracy), (b.label, b.accuracy)) for a, b in pairs])


def with_gaps(rows: list[dict], comparisons: Sequence[Comparison], reference: str) -> list[dict]:
    """Rows of the table with the paired gap (points) to `reference` and its verdict, where compared."""
    by_label = {comparison.a: comparison for comparison in comparisons if comparison.b == reference}
    for row in rows:
        comparison = by_label.get(row["label"])
        row["gap_pt"] = comparison.difference if comparison else None
        row["gap_verdict"] = comparison.verdict if comparison else None
    return rows


def noise_floor(group: RunGroup) -> dict[str, str | float | int]:
    """The baseline's accuracy over seeds, and its standard deviation in points (the noise floor)."""
    estimate = Estimate.of(list(group.accuracy.values()))
    return {
        "baseline": group.label,
        "baseline_accuracy": estimate.mean,
        "noise_floor_sd_pt": 100 * estimate.sd,
        "baseline_seeds": estimate.n,
    }
