"""C4: the block recipes side by side, drawn from its record."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from gradcomp.analysis.tables import Record
from gradcomp.plots.blocks import paired_gaps
from gradcomp.plots.style import subplots, value


def recipes(record: Record) -> Figure:
    # each recipe numbered in (a) and at its points in (b), whose scatter would otherwise not say whose
    recipes = [row for row in record.rows() if row["bits"] < 32]
    arms = [{**row, "recipe": f"{n}. {row['recipe']}"} for n, row in enumerate(recipes, 1)]
    figure, axes = subplots(ncols=2, width=max(5.5, 1.1 * len(arms) + 2.5), height=4.8)
    paired_gaps(axes[0][0], record, arms, "recipe", "(a) ")
    ax = axes[0][1]
    for marker, kind in (("o", "theory"), ("s", "carried")):
        ax.scatter([value(r, "measured_R") for r in arms], [value(r, f"{kind}_R") for r in arms],
                   marker=marker, facecolors="none", edgecolors="C1" if kind == "theory" else "C2",
                   label=f"predicted ({kind})")  # fmt: skip
    for row in arms:
        measured, carried = value(row, "measured_R"), value(row, "carried_R")
        if math.isfinite(measured) and math.isfinite(carried):
            number = row["recipe"].split(".")[0]
            ax.annotate(number, (measured, carried), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axvline(math.sqrt(3), color="k", linestyle=":", linewidth=1, label="sqrt(3)")
    shown = [value(r, key) for r in arms for key in ("measured_R", "theory_R", "carried_R")]
    ends = [np.nanmin(shown), np.nanmax(shown)]
    ax.plot(ends, ends, color="grey", linewidth=0.8, label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlabel="measured R (mean over noise steps)", ylabel="predicted R")
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers: the points span less than a decade
        axis.set_major_formatter(LogFormatter())
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    ax.set_title("(b) noise ratio of the weight gradients", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return figure
