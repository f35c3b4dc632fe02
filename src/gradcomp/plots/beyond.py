"""X1, X3: comparisons across compressor families, drawn from their records."""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import accuracy_points, baseline_band, errorbars, subplots, value


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
            markersize=7,
            markerfacecolor="none",  # hollow: runs at the same bits (fp32 and QAT at 32) all show
            markeredgewidth=1.5,
            capsize=2,
            label=family,
        )
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: value(r, "bits"))
    ax.plot(
        [value(r, "bits") for r in front],
        [value(r, "accuracy") for r in front],
        color="grey",
        zorder=0,
        label="Pareto front of the means",
    )
    ax.set(xscale="log", xlabel="bits per gradient element (log scale)", ylabel="test accuracy")
    low, high = ax.get_xlim()  # powers of two inside the data's range (fixed ticks would widen the axis)
    ticks = [2.0**power for power in range(-3, 8) if low <= 2.0**power <= high]
    if len(ticks) > 1:  # else matplotlib's own ticks: one would leave the axis without a scale
        ax.set_xticks(ticks, labels=[f"{tick:g}" for tick in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: no run under it
    return figure


def _wrapped(label: str, width: int) -> str:
    """A bar label broken at " + " and then at spaces so that no line is wider than `width` characters."""
    return "\n+ ".join("\n".join(textwrap.wrap(part, width) or [part]) for part in label.split(" + "))


def prune_plus_fp(record: Record) -> Figure:
    baseline, *rows = record.rows()
    mechanism = record.rows("mechanism") if "mechanism" in record.tables else []
    ncols = 2 if mechanism else 1
    figure, axes = subplots(ncols=ncols, width=7.0 if mechanism else 7.5, height=5.0)
    ax = axes[0][0]
    positions = accuracy_points(ax, record, rows, "C0")
    width = 12 if len(rows) > 4 else 16
    labels = [f"{_wrapped(row['label'], width)}\n{value(row, 'bits'):.2f} bits" for row in rows]
    ax.set_xticks(positions, labels, fontsize=7)
    baseline_band(ax, baseline, "accuracy", baseline["label"])
    ax.plot([], [], "o", color="C0", label="mean over seeds, 95 % CI")
    ax.scatter([], [], s=8, color="k", alpha=0.6, linewidths=0, label="each seed")
    ax.set(ylabel="test accuracy")
    ax.set_title("(a) accuracy; bits per gradient element under each label", fontsize=9)
    ax.legend(fontsize=8, loc="lower left")
    if mechanism:
        ax = axes[0][1]
        formats = list(dict.fromkeys(row["fp"] for row in mechanism))
        arms = {"alone": ("FP alone", "C3"), "chain": ("after pruning (scale refitted)", "C2")}
        bar = 0.38
        for offset, (arm, (name, colour)) in zip((-bar / 2, bar / 2), arms.items(), strict=True):
            mine = [next(r for r in mechanism if r["fp"] == fp and r["arm"] == arm) for fp in formats]
            x = [i + offset for i in range(len(formats))]
            saturated = [100 * r["saturated_share"] for r in mine]
            flushed = [100 * r["flushed_share"] for r in mine]
            ax.bar(x, saturated, bar, color=colour, label=f"{name}: saturated")
            ax.bar(
                x,
                flushed,
                bar,
                bottom=saturated,
                color=colour,
                alpha=0.45,
                hatch="//",
                label=f"{name}: flushed",
            )
            for position, top in zip(x, np.add(saturated, flushed), strict=True):
                ax.annotate(f"{top:.1f}%", (position, top), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(formats)), formats, fontsize=8)
        tops = [100 * (r["saturated_share"] + r["flushed_share"]) for r in mechanism]
        ax.set(ylabel="share of the |g| mass (%)", ylim=(0, 1.5 * max(max(tops), 1.0)))
        ax.set_title("(b) FP stage on lognormal gradients of the measured sigma", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    return figure
