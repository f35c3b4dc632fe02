"""C3: the sequels' compressors, drawn from their record."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import errorbars, gap_points, subplots, value


def successors(record: Record) -> Figure:
    arms = [row for row in record.rows() if row["policy"] != "none"]
    variance = {row["run"]: row for row in record.rows("variance")}
    figure, axes = subplots(ncols=2, width=5.2, height=4.6)
    several = len({row["model"] for row in arms}) > 1
    labels = [f"{row['label']}\n({row['model']})" if several else row["label"] for row in arms]
    ax = axes[0][0]
    positions = np.arange(len(arms))
    gap_points(ax, arms, positions, fmt="o", color="C0")
    ax.axhline(0, color="k", linestyle="--", linewidth=1, label="uncompressed run of the model")
    ax.set_xticks(positions, labels, fontsize=7, rotation=20)
    ax.set(ylabel="accuracy - uncompressed (pt)")
    ax.set_title("(a) accuracy against the uncompressed run (95 % CI)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
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
    ax.set_xticks(positions, labels, fontsize=7, rotation=20)
    ax.set(yscale="log", ylabel="added variance / energy")
    ax.set_title("(b) variance added to neural and weight gradients", fontsize=9)
    ax.legend(fontsize=7)
    return figure
