"""C4: the block recipes side by side, drawn from its record."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import accuracy_gaps, subplots, value


def recipes(record: Record) -> Figure:
    arms = [row for row in record.rows() if row["bits"] < 32]
    figure, axes = subplots(ncols=2, width=max(4.5, 0.6 * len(arms) + 2), height=4.2)
    accuracy_gaps(axes[0][0], arms, "recipe", "(a) accuracy against the uncompressed run (95 % CI)")
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
