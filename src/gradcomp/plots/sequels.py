"""C3: the sequels' compressors, drawn from their record."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.analysis.verdicts import BETTER, WORSE, Comparison, by_arm
from gradcomp.plots.blocks import arm_ticks, paired_gaps
from gradcomp.plots.style import errorbars, subplots, value


def successors(record: Record) -> Figure:
    arms = [row for row in record.rows() if row["policy"] != "none"]
    variance = {row["run"]: row for row in record.rows("variance")}
    figure, axes = subplots(ncols=2, width=max(5.6, 1.1 * len(arms) + 2.5), height=4.6)
    paired_gaps(axes[0][0], record, arms, "label", "(a) ")
    ax = axes[0][1]
    rows = [variance.get(row["run"], {}) for row in arms]
    shown = [i for i, row in enumerate(rows) if row]
    for key, offset, style in (("neural", -0.15, {"fmt": "o", "color": "C0"}),
                               ("weight", 0.15, {"fmt": "s", "color": "C2"})):  # fmt: skip
        errorbars(
            ax, [rows[i] for i in shown], key, [i + offset for i in shown], label=f"measured, {key}", **style
        )
    predicted = [
        (i - 0.15, value(rows[i], "predicted")) for i in shown if np.isfinite(value(rows[i], "predicted"))
    ]
    if predicted:
        ax.scatter(
            *zip(*predicted, strict=True), marker="x", color="C3", s=40, zorder=5, label="predicted, neural"
        )
    arm_ticks(ax, _variance_labels(record, arms))
    ax.set(yscale="log", ylabel="added variance / energy")
    ax.set_title("(b) variance added to neural and weight gradients", fontsize=9)
    ax.legend(fontsize=7)
    return figure


def _variance_labels(record: Record, arms: list[dict]) -> list[str]:
    """Each arm's name over the verdicts on its neural-gradient variance: measured against predicted (the
    crosses; a target, so missed on either side), and an N:M arm's against the naive unbiased estimator's
    (lower is better; not drawn)."""
    comparisons = [Comparison.from_row(row) for row in record.comparisons]
    theory, naive = by_arm(comparisons, "theory"), by_arm(comparisons, "naive")
    several = len({row["model"] for row in arms}) > 1
    labels = []
    for row in arms:
        lines = [row["label"] + (f" ({row['model']})" if several else "")]
        if row["run"] in theory:
            found = theory[row["run"]]
            missed = found.verdict in (BETTER, WORSE)
            lines.append(f"theory: {f'beyond ±{found.margin:g}' if missed else found.verdict}")
        if row["run"] in naive:
            lines.append(f"vs naive: {naive[row['run']].verdict}")
        labels.append("\n".join(lines))
    return labels
