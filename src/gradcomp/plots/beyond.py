"""X1, X3: comparisons across compressor families, drawn from their records."""

from __future__ import annotations

from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import (
    accuracy_bars,
    baseline_band,
    errorbars,
    lowest_seed,
    subplots,
    value,
)


def accuracy_vs_bits(record: Record) -> Figure:
    rows = record.rows()
    figure, axes = subplots(width=7.5, height=4.8)
    ax = axes[0][0]
    for index, family in enumerate(sorted({r["family"] for r in rows})):
        mine = [r for r in rows if r["family"] == family]
        errorbars(
            ax,
            mine,
            "accuracy",
            "bits",
            fmt="osD^vP*X<>"[index % 10],
            markersize=6,
            capsize=2,
            label=family,
        )
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: value(r, "bits"))
    ax.plot([value(r, "bits") for r in front], [value(r, "accuracy") for r in front], color="grey", zorder=0)
    ax.set(xscale="log", xlabel="bits per gradient element (log scale)", ylabel="test accuracy")
    ax.set_xticks([1, 2, 4, 8, 16, 32], labels=["1", "2", "4", "8", "16", "32"])
    ax.legend(fontsize=7, loc="lower right")
    return figure


def prune_plus_fp(record: Record) -> Figure:
    baseline, *rows = record.rows()
    figure, axes = subplots(width=7.5, height=4.6)
    ax = axes[0][0]
    positions = accuracy_bars(ax, record, rows, "C0")
    for position, row in zip(positions, rows, strict=True):
        ax.annotate(
            f"{value(row, 'bits'):.2f} b",
            (position, 0.02),
            xycoords=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=8,
            color="w",
        )
    ax.set_xticks(positions, [row["label"].replace(" + ", "\n+ ") for row in rows], fontsize=8)
    baseline_band(ax, baseline, "accuracy", baseline["label"])
    ax.set(ylabel="test accuracy", ylim=(lowest_seed(record, [baseline, *rows]), None))
    ax.legend(fontsize=8)
    return figure
