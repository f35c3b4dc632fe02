"""C4: the block recipes side by side, drawn from its record."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import gap_points, subplots, value


def recipes(record: Record) -> Figure:
    arms = [row for row in record.rows() if row["bits"] < 32]
    figure, axes = subplots(ncols=2, width=max(4.5, 0.6 * len(arms) + 2), height=4.2)
    ax = axes[0][0]
    several = len({row["model"] for row in arms}) > 1
    labels = [f"{row['recipe']}\n({row['model']})" if several else row["recipe"] for row in arms]
    positions = np.arange(len(arms))
    gap_points(ax, arms, positions, fmt="o", color="C0")
    ax.axhline(0, color="k", linestyle="--", linewidth=1, label="uncompressed run of the model")
    ax.set_xticks(positions, labels, fontsize=6, rotation=30, ha="right")
    ax.set(ylabel="accuracy - uncompressed (pt)")
    ax.set_title("(a) accuracy against the uncompressed run (95 % CI)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    ax = axes[0][1]
    for marker, kind in (("o", "theory"), ("s", "carried")):
        ax.scatter([value(r, "measured_R") for r in arms], [value(r, f"{kind}_R") for r in arms],
                   marker=marker, facecolors="none", edgecolors="C1" if kind == "theory" else "C2",
                   label=f"predicted ({kind})")  # fmt: skip
    ax.axvline(math.sqrt(3), color="k", linestyle=":", linewidth=1)
    ax.set(xscale="log", yscale="log", xlabel="measured R (mean over noise steps)", ylabel="predicted R")
    ax.set_title("(b) noise ratio of the weight gradients", fontsize=9)
    ax.legend(fontsize=7)
    return figure
