"""A7-A9: stochastic pruning of neural gradients, drawn from their records."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import baseline_band, errorbars, interval, subplots, value

MARKERS = {"lognormal": "o", "gaussian": "s", "laplace": "^", "topk": "D"}
JITTER = {"lognormal": -0.006, "gaussian": -0.002, "laplace": 0.002, "topk": 0.006}


def target_vs_achieved_sparsity(record: Record) -> Figure:
    figure, axes = subplots(ncols=2, width=5.0, height=4.6)
    panels = (
        ("(a) synthetic lognormal", record.rows("synthetic"), []),
        ("(b) training: layers (small), runs (large)", record.rows(), record.rows("layers")),
    )
    for ax, (title, rows, points) in zip(axes[0], panels, strict=True):
        for index, (estimator, marker) in enumerate(MARKERS.items()):
            mine = [row for row in rows if row["estimator"] == estimator]
            colour = f"C{index}"
            if mine:
                errorbars(
                    ax,
                    mine,
                    "achieved",
                    [row["target"] + JITTER[estimator] for row in mine],
                    fmt=marker,
                    color=colour,
                    markersize=5,
                    alpha=0.8,
                    capsize=2,
                    label=estimator,
                )
            small = [row for row in points if row["estimator"] == estimator]
            if small:
                ax.scatter(
                    [row["target"] + 2 * JITTER[estimator] for row in small],
                    [value(row, "achieved") for row in small],
                    marker=marker,
                    s=8,
                    alpha=0.35,
                    color=colour,
                )
        ax.plot([0.45, 1.0], [0.45, 1.0], color="grey", linestyle="--", label="target")
        ax.set(
            xlabel="target sparsity",
            ylabel="achieved sparsity",
            title=title,
            xlim=(0.45, 1.0),
            ylim=(0.45, 1.0),
        )
        ax.legend(fontsize=8)
    return figure


def accuracy_vs_sparsity(record: Record) -> Figure:
    rows = record.rows()
    figure, axes = subplots(width=6.2, height=4.6)
    ax = axes[0][0]
    for estimator, marker in MARKERS.items():
        mine = sorted((row for row in rows if row["estimator"] == estimator), key=lambda row: row["target"])
        if mine:
            errorbars(
                ax,
                mine,
                "accuracy",
                "sparsity",
                marker=marker,
                linestyle="-" if estimator == "lognormal" else "none",
                capsize=2,
                label=estimator,
            )
    seeds = defaultdict(list)
    for row in record.rows("seeds"):
        seeds[row["run"]].append((row["sparsity"], row["accuracy"]))
    for row in rows:
        points = [p for p in seeds[row["run"]] if p[0] is not None]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=8, color="k", alpha=0.4, linewidths=0)
    baseline = record.rows("baseline")[0]
    baseline_band(ax, baseline, "accuracy", f"no pruning: {baseline['label']}")
    ax.set(xlabel="achieved gradient sparsity", ylabel="test accuracy")
    ax.legend(fontsize=8)
    return figure


def heterogeneous_sparsity(record: Record) -> Figure:
    rows, layers = record.rows(), record.rows("layers")
    constrained = rows[0]
    figure, axes = subplots(ncols=3, width=4.8, height=4.4)
    compared = list(dict.fromkeys(row["run"] for row in layers))
    for offset, run in enumerate(compared):
        mine = [row for row in layers if row["run"] == run]
        label = "constrained" if run == constrained["run"] else "homogeneous"
        positions = np.array([row["index"] for row in mine]) + (offset - 0.5) * 0.4
        axes[0][0].bar(
            positions,
            [value(row, "sparsity") for row in mine],
            width=0.4,
            label=label,
            yerr=interval(mine, "sparsity"),
            capsize=1,
        )
        errorbars(
            axes[0][1],
            mine,
            "predicted_cosine",
            [row["index"] for row in mine],
            fmt="o-",
            capsize=2,
            label=label,
        )
    low = min((value(row, "sparsity") for row in layers), default=0.0)
    axes[0][0].set(
        xlabel="layer index (input to output)",
        ylabel="achieved sparsity",
        title="(a)",
        ylim=(max(0.0, low - 0.05), 1),
    )
    axes[0][1].axhline(constrained["min_cosine"], color="grey", linestyle="--", label="minimum cosine")
    axes[0][1].set(xlabel="layer index (input to output)", ylabel="predicted cosine similarity", title="(b)")
    for ax in axes[0][:2]:
        ax.legend(fontsize=8)
    ax = axes[0][2]
    homogeneous = rows[1:]
    errorbars(ax, homogeneous, "accuracy", "sparsity", fmt="o-", capsize=2, label="homogeneous")
    errorbars(
        ax,
        [constrained],
        "accuracy",
        "sparsity",
        fmt="*",
        color="C3",
        markersize=14,
        capsize=2,
        label="constrained",
    )
    seeds = defaultdict(list)
    for row in record.rows("seeds"):
        seeds[row["run"]].append(row)
    for row in rows:
        points = seeds[row["run"]]
        ax.scatter(
            [p["sparsity"] for p in points],
            [p["accuracy"] for p in points],
            s=8,
            color="k",
            alpha=0.4,
            linewidths=0,
        )
    ax.set(xlabel="overall achieved sparsity", ylabel="test accuracy", title="(c)")
    ax.legend(fontsize=8)
    return figure
