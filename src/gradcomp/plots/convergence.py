"""X4: accuracy gaps against the training budget, and the fp32 learning curves, drawn from the record."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from gradcomp.analysis.tables import Record
from gradcomp.analysis.verdicts import Comparison, by_arm
from gradcomp.plots.style import errorbars, subplots, value


def training_budget(record: Record) -> Figure:
    rows, curves = record.rows(), record.rows("curves")
    margin = record.facts["margin"]
    comparisons = [Comparison.from_row(row) for row in record.comparisons]
    gaps, trends = by_arm(comparisons), by_arm(comparisons, "trend")
    figure, axes = subplots(ncols=2, width=5.6, height=3.8)
    ax = axes[0][0]
    arms = list(dict.fromkeys(row["arm"] for row in rows))
    for index, arm in enumerate(arms):
        mine = [row for row in rows if row["arm"] == arm]
        budgets = np.array([row["budget"] for row in mine], dtype=float)
        offset = 1 + 0.03 * (index - (len(arms) - 1) / 2)  # side by side on the log axis
        reference = gaps[mine[0]["run"]].b.rsplit(", ", 1)[0]  # "fp32, 2 epochs": the budget is on the axis
        trend = trends[arm]
        label = (
            f"{mine[0]['label']} - {reference} ({mine[0]['claim']});\nslope {trend.difference:+.2f} "
            f"[{trend.ci_low:+.2f}, {trend.ci_high:+.2f}] pt per doubling"
        )
        errorbars(ax, mine, "gap_pt", budgets * offset, fmt="o-", markersize=4, label=label)
    for edge in (-margin, margin):
        ax.axhline(edge, color="k", linestyle="--", linewidth=0.8)
    ax.axhline(0, color="grey", linewidth=0.6)
    budgets = sorted({row["budget"] for row in rows})
    ax.set(
        xscale="log", xlabel="training budget (epochs, log scale)", ylabel="accuracy gap to reference (pt)"
    )
    ax.set_xticks(budgets, labels=[str(b) for b in budgets])
    ax.set_xticks([], minor=True)  # no log-axis minor labels between the budgets
    ax.set_title(f"(a) gap at each budget (dashed: ±{margin:g} pt)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), title="arm - reference (claim)",
              title_fontsize=7)  # fmt: skip
    ax = axes[0][1]
    for run in dict.fromkeys(row["run"] for row in curves):
        mine = sorted((row for row in curves if row["run"] == run), key=lambda row: row["epoch"])
        ax.plot(
            [row["epoch"] for row in mine],
            [value(row, "accuracy") for row in mine],
            "o-",
            markersize=3,
            label=f"{mine[-1]['epoch']} epochs",  # a run's last epoch is its budget
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel="test accuracy")
    ax.set_title("(b) fp32 test accuracy after each epoch of each budget", fontsize=9)
    ax.legend(fontsize=7, title="fp32 trained for", title_fontsize=7)
    return figure
