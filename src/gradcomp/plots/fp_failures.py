"""A10's figure: where low-bit floating-point gradients fail."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.tables import Record
from gradcomp.plots.style import (
    OUTCOMES,
    baseline_band,
    interval,
    seed_points,
    subplots,
    value,
)

MARKERS = "osD^vP"  # A10 (c): one marker per model
MODEL_COLOURS = ("C0", "C1", "C4", "C5", "C6", "C8", "C9")  # A10: a model's colour is never an outcome's


def failure_cases(record: Record) -> Figure:
    """A10: colour is what training showed against fp32 (fails, trains, undecided) in (a) and (c); a model is
    one colour in (b) and its fp32 line in (a), and one marker in (c)."""
    rows = record.rows()
    baselines = {row["model"]: row for row in record.rows("baseline")}
    outcomes = {row["run"]: row["measured"] for row in record.rows("arms")}
    seeds = defaultdict(list)
    for row in record.rows("seeds"):
        seeds[row["run"]].append(row["accuracy"])
    window = defaultdict(list)
    for row in record.rows("window"):
        window[row["model"]].append(row)
    models = list(dict.fromkeys([*window, *baselines]))
    colours = {model: MODEL_COLOURS[index % len(MODEL_COLOURS)] for index, model in enumerate(models)}
    short = {model: model.split(" ")[0] for model in models}
    figure, axes = subplots(ncols=3, width=5.2, height=4.8)

    ax = axes[0][0]
    several = len({row["model"] for row in rows}) > 1
    ticks, labels = [], []
    for index, row in enumerate(rows):
        positions = [2 * index, 2 * index + 1]
        means = []
        for side, position in zip(("failing", "fixing"), positions, strict=True):
            estimate = Estimate.read(row, f"{side}_accuracy")
            bounds = estimate.interval
            error = None if bounds is None else [[estimate.mean - bounds[0]], [bounds[1] - estimate.mean]]
            colour = OUTCOMES[outcomes[row[f"{side}_run"]]]
            ax.errorbar(
                [position], [estimate.mean], yerr=error, fmt="o", color=colour, capsize=3, markersize=7
            )
            seed_points(ax, [position + 0.15], [seeds[row[f"{side}_run"]]], s=8)
            means.append(estimate.mean)
            name = f"{short[row['model']]}: {row[side]}" if several else row[side]
            labels.append(name if side == "failing" else f"fix: {row[side]}")
        ax.plot(positions, means, color="grey", linewidth=0.8, zorder=1)  # the pair
        ticks += positions
    ax.set_xticks(ticks, labels=labels, rotation=35, ha="right", fontsize=7)
    for model in dict.fromkeys(row["model"] for row in rows):
        baseline_band(ax, baselines[model], "accuracy", f"{short[model]} fp32", colour=colours[model])
    ax.set(ylabel="test accuracy", title="(a) each failing configuration, then its fix")
    bands = ax.get_legend_handles_labels()  # drawn below the figure: inside, it would hide failing runs

    ax = axes[0][1]
    rules = {row["model"]: row for row in record.rows("models")}
    for model, mine in window.items():
        colour = colours[model]
        ax.plot([r["log2_scale"] for r in mine], [r["predicted_relative_mse"] for r in mine], color=colour)
        ax.axhline(rules[model]["per_layer_rule_relative_mse"], color=colour, linestyle=":", linewidth=1)
        for scope, alpha in (("element", 0.06), ("every_layer", 0.18)):
            if rules[model][f"{scope}_window_low"] is not None:
                low, high = rules[model][f"{scope}_window_low"], rules[model][f"{scope}_window_high"]
                ax.axvspan(low, high, color=colour, alpha=alpha)
    ax.set(
        yscale="log",
        xlabel="log2 global loss scale",
        ylabel="predicted relative MSE",
        title="(b) predicted window of one global scale\n(dotted: the per-layer rule)",
    )

    ax = axes[0][2]
    arms = record.rows("arms")
    for index, model in enumerate(models):
        mine = [r for r in arms if r["model"] == model and np.isfinite(value(r, "gap_pt"))]
        for outcome, colour in OUTCOMES.items():
            chosen = [r for r in mine if r["measured"] == outcome]
            if chosen:
                ax.errorbar(
                    [r["predicted_relative_mse"] for r in chosen],
                    [-value(r, "gap_pt") for r in chosen],
                    yerr=interval(chosen, "gap_pt")[::-1],
                    fmt=MARKERS[index % len(MARKERS)],
                    color=colour,
                    capsize=2,
                    markersize=5,
                )
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set(
        xscale="log",
        xlabel="predicted relative MSE (mean over layers)",
        ylabel="accuracy loss vs fp32 of its model (pt)",
        title="(c) prediction vs outcome",
    )
    present = set(outcomes.values())
    handles = [
        Line2D([], [], marker="o", linestyle="", color=colour, label=f"outcome: {outcome}")
        for outcome, colour in OUTCOMES.items()
        if outcome in present
    ] + [
        Line2D(
            [],
            [],
            marker=MARKERS[index % len(MARKERS)],
            color=colours[model],
            markerfacecolor="grey",
            markeredgecolor="grey",
            label=short[model],
        )
        for index, model in enumerate(models)
    ]
    figure.legend(handles=handles + bands[0], loc="outside lower center", ncol=6, fontsize=7)
    return figure
