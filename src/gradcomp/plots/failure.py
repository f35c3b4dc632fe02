"""F0-F2: noise ratios predicted against measured; time below sqrt(3) against accuracy lost; the late
switch. Drawn from the records."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import errorbars, subplots


def noise_ratios(record: Record) -> Figure:
    layers = record.rows("layers")
    kinds, margin, critical = record.facts["kinds"], record.facts["margin"], record.facts["critical"]
    models = list(dict.fromkeys(row["model"] for row in layers))
    policies = list(dict.fromkeys(row["policy"] for row in layers))
    figure, axes = subplots(nrows=len(kinds), ncols=len(models), width=3.0, height=2.8)
    for column, model in enumerate(models):
        mine = [row for row in layers if row["model"] == model]
        for line, kind in enumerate(kinds):
            ax = axes[line][column]
            for index, policy in enumerate(policies):
                points = [
                    (row["measured_ratio"], row[f"{kind}_ratio"])
                    for row in mine
                    if row["policy"] == policy
                    and _finite(row["measured_ratio"])
                    and _finite(row[f"{kind}_ratio"])
                ]
                if points:
                    x, y = zip(*points, strict=True)
                    ax.scatter(x, y, s=8, alpha=0.6, color=f"C{index}", label=policy)
            low, high = _limits(ax)
            ax.plot([low, high], [low, high], color="k", linewidth=0.8)
            for factor in (math.exp(margin), math.exp(-margin)):
                ax.plot([low, high], [low * factor, high * factor], color="k", linewidth=0.6, linestyle="--")
            ax.axvline(critical, color="grey", linewidth=0.6, linestyle=":")
            ax.axhline(critical, color="grey", linewidth=0.6, linestyle=":")
            ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
            ax.set(
                xlabel="measured R" if line == len(kinds) - 1 else "",
                ylabel=f"{kind} R" if column == 0 else "",
            )
            ax.set_title(f"{model}: {kind}", fontsize=8)
    axes[0][0].legend(fontsize=6, markerscale=2)
    return figure


def _finite(value) -> bool:
    return value is not None and 0 < value < math.inf


def _limits(ax) -> tuple[float, float]:
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    return max(min(x0, y0), 1e-3), max(x1, y1)


def stalls(record: Record) -> Figure:
    rows, runs, history = record.rows(), record.rows("runs"), record.rows("history")
    threshold = record.facts["threshold"]
    figure, axes = subplots(ncols=2, width=4.6, height=3.8)
    ax = axes[0][0]
    model_of = {row["run"]: row["model"] for row in runs}
    models = list(dict.fromkeys(model_of.values()))
    by_construction = set(record.facts.get("by_construction", ()))
    for index, model in enumerate(models):
        mine = [row for row in rows if model_of[row["run"]] == model]
        for trivial in (False, True):  # runs whose R is 1 by construction: hollow, they decide nothing
            drawn = [row for row in mine if (row["run"] in by_construction) == trivial]
            if drawn:
                face = "none" if trivial else f"C{index}"
                errorbars(ax, drawn, "gap_pt", "measured_below", fmt="o", color=f"C{index}", markersize=4,
                          markerfacecolor=face, label=None if trivial else model)  # fmt: skip
    if by_construction:
        ax.plot(
            [], [], "o", color="grey", markerfacecolor="none", markersize=4, label="R = 1 by construction"
        )
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.set(
        xlabel=f"share of noise steps with measured R < {threshold:.3g}", ylabel="accuracy gap to fp32 (pt)"
    )
    ax.set_title("(a) time below the threshold against accuracy lost", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    measured = [row for row in history if row["kind"] == "measured" and _finite(row["ratio"])]
    for index, model in enumerate(models):
        for run in dict.fromkeys(row["run"] for row in measured if row["model"] == model):
            points: dict[int, list[float]] = {}
            for row in measured:
                if row["run"] == run:
                    points.setdefault(row["step"], []).append(row["ratio"])
            steps = sorted(points)
            means = [float(np.exp(np.mean(np.log(points[s])))) for s in steps]  # geometric mean over seeds
            ax.plot(steps, means, color=f"C{index}", linewidth=0.8, alpha=0.7)
    ax.axhline(threshold, color="k", linestyle=":", linewidth=1)
    ax.set(yscale="log", xlabel="step", ylabel="model-wide measured R")
    ax.set_title("(b) R over training, every run (geometric mean over seeds)", fontsize=9)
    return figure


def late_switch(record: Record) -> Figure:
    rows = record.rows()
    figure, axes = subplots(ncols=1, width=5.2, height=3.6)
    ax = axes[0][0]
    positions = np.arange(len(rows))
    errorbars(ax, rows, "accuracy", positions, fmt="o", color="C0")
    labels = [
        row["label"].replace("] [", "]\n[")
        + ("" if row["average_bits"] is None else f"\n{row['average_bits']:.1f} bits")
        for row in rows
    ]
    ax.set_xticks(positions, labels, fontsize=7)
    ax.set(ylabel="final test accuracy")
    ax.set_title("fp32, one format throughout, with the guard, switched late", fontsize=9)
    return figure
