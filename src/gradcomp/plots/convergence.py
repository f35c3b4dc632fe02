"""X4: accuracy gaps against the training budget, and the fp32 learning curves, drawn from the record."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import errorbars, subplots, value


def training_budget(record: Record) -> Figure:
    rows, curves = record.rows(), record.rows("curves")
    margin = record.facts["margin"]
    figure, axes = subplots(ncols=2, width=4.6, height=3.8)
    ax = axes[0][0]
    arms = list(dict.fromkeys(row["arm"] for row in rows))
    for index, arm in enumerate(arms):
        mine = [row for row in rows if row["arm"] == arm]
        budgets = np.array([row["budget"] for row in mine], dtype=float)
        offset = 1 + 0.03 * (index - (len(arms) - 1) / 2)  # side by side on the log axis
        errorbars(
            ax, mine, "gap_pt", budgets * offset, fmt="o-", markersize=4, label=f"{arm} ({mine[0]['claim']})"
        )
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
    ax.legend(fontsize=7)
    ax = axes[0][1]
    for run in dict.fromkeys(row["run"] for row in curves):
        mine = sorted((row for row in curves if row["run"] == run), key=lambda row: row["epoch"])
        ax.plot(
            [row["epoch"] for row in mine],
            [value(row, "accuracy") for row in mine],
            "o-",
            markersize=3,
            label=run,
        )
    ax.set(xlabel="epoch", ylabel="test accuracy")
    ax.set_title("(b) fp32 test accuracy after each epoch, each budget", fontsize=9)
    ax.legend(fontsize=7)
    return figure
