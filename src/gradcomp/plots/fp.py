"""A4-A6, A10: low-bit floating-point gradients, drawn from their records."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import (
    accuracy_bars,
    baseline_band,
    errorbars,
    lowest_seed,
    per_seed,
    seed_points,
    subplots,
    value,
)

STYLES = {"ideal": "-", "saturate": "--", "inf": ":"}


def _series(rows: list[dict], key: str, x: str, y: str) -> dict:
    series = defaultdict(lambda: ([], []))
    for row in rows:
        xs, ys = series[row[key]]
        xs.append(row[x])
        ys.append(row[y])
    return series


def fp_mse_theory(record: Record) -> Figure:
    figure, axes = subplots(ncols=2, nrows=2, width=5.0, height=3.8)
    ax = axes[0][0]
    for sigma2, (xs, ys) in _series(
        record.rows("by_scale"), "sigma_log2", "log2_scale_minus_mu2", "relative_mse"
    ).items():
        ax.plot(xs, ys, label=f"sigma2 = {sigma2:g}")
    ax.set(yscale="log", xlabel="log2 scale - mu2  (binades)", ylabel="relative MSE", title="(a) FP6 [1,4,1]")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    for exp_bits, (xs, ys) in _series(
        record.rows("by_sigma"), "exp_bits", "sigma_log2", "relative_mse"
    ).items():
        ax.plot(xs, ys, label=f"[1,{exp_bits},{5 - exp_bits}]")
    ax.set(
        yscale="log", xlabel="sigma2 (binades)", ylabel="relative MSE at optimal scale", title="(b) 6 bits"
    )
    ax.legend(fontsize=8)
    ax = axes[1][0]
    optimum = record.rows("optimum")
    bit_list = list(dict.fromkeys(row["bits"] for row in optimum))
    grouped = defaultdict(lambda: ([], []))
    for row in optimum:
        xs, ys = grouped[row["bits"], row["grid"]]
        xs.append(row["sigma_log2"])
        ys.append(row["optimal_exp_bits"])
    for (bits, kind), (xs, ys) in grouped.items():
        colour = f"C{bit_list.index(bits)}"
        ax.step(xs, ys, where="mid", color=colour, linestyle=STYLES[kind], label=f"{bits}b {kind}")
    ax.set(xlabel="sigma2 (binades)", ylabel="optimal exponent bits E", title="(c) optimal split")
    ax.legend(fontsize=6, ncol=2)
    ax = axes[1][1]
    checks = record.rows()
    analytic = np.array([row["analytic_relative_mse"] for row in checks])
    errorbars(
        ax,
        checks,
        "monte_carlo_relative_mse",
        analytic,
        fmt="o",
        color="C0",
        label="Monte-Carlo, 95 % CI",
    )
    line = [analytic.min() / 2, analytic.max() * 2]
    ax.plot(line, line, color="grey", linestyle="--", label="y = x")
    ax.set(xscale="log", yscale="log", xlabel="analytic relative MSE", ylabel="Monte-Carlo relative MSE")
    ax.set_title("(d) theory vs measurement")
    ax.legend(fontsize=8)
    return figure


def _format_bars(ax, record: Record, rows: list[dict], colour: str) -> None:
    positions = accuracy_bars(ax, record, rows, colour)
    ax.set_xticks(positions, [row["format"] for row in rows], rotation=35, ha="right")


def fp_formats(record: Record) -> Figure:
    baseline, *rows = record.rows()
    figure, axes = subplots(width=7.0, height=4.2)
    ax = axes[0][0]
    _format_bars(ax, record, rows, "C0")
    baseline_band(ax, baseline, "accuracy", baseline["label"])
    ax.set(
        ylim=(lowest_seed(record, [baseline, *rows]), None), ylabel="test accuracy", xlabel="gradient format"
    )
    ax.legend(fontsize=8)
    return figure


def scaling_and_split(record: Record) -> Figure:
    rows = record.rows()
    parts = defaultdict(list)
    for row in rows:
        parts[row["part"]].append(row)
    figure, axes = subplots(ncols=2, width=5.2, height=4.2)
    ax = axes[0][0]
    sweep = parts["global sweep"]
    if sweep:
        errorbars(
            ax, sweep, "accuracy", [row["log2_global_scale"] for row in sweep], fmt="o-", label="global scale"
        )
        seed_points(ax, [row["log2_global_scale"] for row in sweep], per_seed(record, sweep))
    for row, style in zip(parts["per-layer"], ("-", ":", "-."), strict=False):
        mean = value(row, "accuracy")
        ax.axhline(mean, color="C2", linestyle=style, label=f"{row['scaling']} ({mean:.3f})")
    for row in parts["fp32"]:
        baseline_band(ax, row, "accuracy", row["label"])
    reference = parts["per-layer"][0]["format"] if parts["per-layer"] else ""
    ax.set(xlabel="log2 global loss scale", ylabel="test accuracy", title=f"(a) {reference}")
    ax.legend(fontsize=7)
    ax = axes[0][1]
    splits = sorted(parts["split"], key=lambda row: row["format"])
    if splits:
        _format_bars(ax, record, splits, "C1")
    for row in parts["fp32"]:
        baseline_band(ax, row, "accuracy", row["label"])
    ax.set(
        ylim=(lowest_seed(record, splits + parts["fp32"]), None),
        ylabel="test accuracy",
        xlabel="split, per-layer scale",
    )
    predicted, sigma2 = record.headline["predicted_exp_bits"], record.headline["mean_sigma2"]
    ax.set_title(f"(b) theory: E = {predicted} at sigma2 = {sigma2:.2f}" if sigma2 is not None else "(b)")
    ax.legend(fontsize=7)
    return figure


def failure_cases(record: Record) -> Figure:
    rows = record.rows()
    baseline = record.rows("baseline")[0]
    seeds = defaultdict(list)
    for row in record.rows("seeds"):
        seeds[row["run"]].append(row["accuracy"])
    figure, axes = subplots(ncols=2, width=5.8, height=4.6)
    ax = axes[0][0]
    labels, means, errors, colours, points = [], [], [], [], []
    for row in rows:
        for side, colour in (("failing", "C3"), ("fixing", "C2")):
            labels.append(row[side])
            means.append(row[f"{side}_accuracy_mean"])
            low, high = row[f"{side}_accuracy_ci_low"], row[f"{side}_accuracy_ci_high"]
            errors.append((0.0, 0.0) if low is None else (means[-1] - low, high - means[-1]))
            colours.append(colour)
            points.append(seeds[row[f"{side}_run"]])
    positions = np.arange(len(labels))
    ax.bar(positions, means, color=colours, alpha=0.85)
    ax.errorbar(positions, means, yerr=np.array(errors).T, fmt="none", ecolor="k", capsize=3)
    seed_points(ax, positions, points)
    ax.set_xticks(positions, labels=labels, rotation=30, ha="right", fontsize=8)
    baseline_band(ax, baseline, "accuracy", baseline["label"])
    ax.set(ylabel="test accuracy", ylim=(0, 1))
    ax.legend(fontsize=8)
    ax = axes[0][1]
    layers = defaultdict(list)
    for row in record.rows("layers"):
        layers[row["failing"]].append(row)
    for failing, mine in layers.items():
        (line,) = ax.plot(
            [r["index"] for r in mine], [r["flushed"] for r in mine], "o-", label=f"{failing}: flushed"
        )
        ax.plot(
            [r["index"] for r in mine],
            [r["clipped"] for r in mine],
            "s--",
            color=line.get_color(),
            label=f"{failing}: clipped",
        )
    ax.set(
        xlabel="layer index (input to output)",
        ylabel="predicted share of non-zero gradients",
        ylim=(-0.02, 1.02),
    )
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    return figure
