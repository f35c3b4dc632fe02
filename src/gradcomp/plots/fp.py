"""A4-A6, A10: low-bit floating-point gradients, drawn from their records."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.tables import Record
from gradcomp.plots.style import (
    accuracy_points,
    baseline_band,
    errorbars,
    gap_points,
    interval,
    seed_points,
    subplots,
    value,
)

STYLES = {"ideal": "-", "saturate": "--", "inf": ":", "fn": "-."}


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
        record.rows("by_scale"), "sigma_log2", "log2_scale_plus_mu2", "relative_mse"
    ).items():
        ax.plot(xs, ys, label=f"sigma2 = {sigma2:g}")
    ax.set(yscale="log", xlabel="log2 scale + mu2  (binades)", ylabel="relative MSE", title="(a) FP6 [1,4,1]")
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


def _format_points(ax, record: Record, rows: list[dict], colour: str) -> None:
    positions = accuracy_points(ax, record, rows, colour)
    ax.set_xticks(positions, [row["label"] for row in rows], rotation=35, ha="right")


def _by_model(record: Record) -> list[tuple[dict, list[dict]]]:
    """Each baseline row (the `baseline` table: one per model and scale) and the main rows of the compressed
    runs compared with it: one panel each, so that no panel mixes training scales."""
    rows = record.rows()
    baselines = {row["run"]: row for row in record.rows("baseline")}
    return [
        (row, [arm for arm in rows if arm.get("reference") == run and arm["run"] not in baselines])
        for run, row in baselines.items()
    ]


def fp_formats(record: Record) -> Figure:
    models = _by_model(record)
    widths = [max(3.0, 0.55 * len(arms) + 1.5) for _, arms in models]
    figure, axes = subplots(ncols=len(models), width=max(widths), height=4.6)
    for ax, (baseline, arms) in zip(axes[0], models, strict=True):
        _format_points(ax, record, arms, "C0")
        baseline_band(ax, baseline, "accuracy", baseline["label"])
        ax.set(ylabel="test accuracy", xlabel="gradient format")
        ax.set_title(f"{baseline['model']}, {baseline['scale']}", fontsize=8, wrap=True)
        ax.legend(fontsize=8, loc="lower left")
    return figure


def scaling_and_split(record: Record) -> Figure:
    rows = record.rows()
    figure, axes = subplots(ncols=2, width=5.4, height=4.4)
    ax = axes[0][0]
    compared = [row for row in rows if row.get("versus")]
    series = defaultdict(list)
    for row in compared:
        series[row["model"], row["format"]].append(row)
    sweep = sorted({row["log2_global_scale"] for row in compared if row["log2_global_scale"] is not None})
    right = (max(sweep) if sweep else 0) + 4
    for index, ((model, fmt), mine) in enumerate(series.items()):
        colour = f"C{index}"
        fixed = sorted(
            (r for r in mine if r["log2_global_scale"] is not None), key=lambda r: r["log2_global_scale"]
        )
        others = [r for r in mine if r["log2_global_scale"] is None]
        gap_points(ax, fixed, [r["log2_global_scale"] for r in fixed], color=colour)
        ax.plot(
            [r["log2_global_scale"] for r in fixed],
            [value(r, "gap_pt") for r in fixed],
            color=colour,
            label=f"{model} {fmt}",
        )
        positions = [right + 2 * i + 0.3 * index for i in range(len(others))]
        gap_points(ax, others, positions, color=colour, fmt="s")
        for row, position in zip(others, positions, strict=True):
            ax.annotate(
                row["scaling"],
                (position, value(row, "gap_pt")),
                fontsize=6,
                rotation=60,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.axhline(0, color="k", linewidth=0.8)
    margin = record.facts.get("margin")
    if margin:
        ax.axhspan(-margin, margin, color="C2", alpha=0.12, linewidth=0, label=f"±{margin:g} pt (margin)")
    ax.set(
        xlabel="log2 global loss scale (squares: other rules)",
        ylabel="accuracy - per-layer mean rule (pt)",
        title="(a) scaling rules",
    )
    ax.legend(fontsize=7, loc="best")
    ax = axes[0][1]
    splits = sorted((row for row in rows if row.get("split")), key=lambda row: row["format"])
    if splits:
        _format_points(ax, record, splits, "C1")
    for row in rows:
        if row["part"] == "fp32" and row["model"] == (splits[0]["model"] if splits else row["model"]):
            baseline_band(ax, row, "accuracy", row["label"])
    ax.set(ylabel="test accuracy", xlabel="split, per-layer scale")
    predicted, sigma2 = record.facts["predicted_exp_bits"], record.facts["mean_sigma2"]
    ax.set_title(f"(b) theory: E = {predicted} at sigma2 = {sigma2:.2f}" if sigma2 is not None else "(b)")
    ax.legend(fontsize=7)
    return figure


def failure_cases(record: Record) -> Figure:
    rows = record.rows()
    baselines = {row["model"]: row for row in record.rows("baseline")}
    seeds = defaultdict(list)
    for row in record.rows("seeds"):
        seeds[row["run"]].append(row["accuracy"])
    figure, axes = subplots(ncols=3, width=5.2, height=4.8)
    ax = axes[0][0]
    several = len({row["model"] for row in rows}) > 1
    position = 0
    ticks, labels = [], []
    for row in rows:
        for side, colour in (("failing", "C3"), ("fixing", "C2")):
            estimate = Estimate.read(row, f"{side}_accuracy")
            bounds = estimate.interval
            error = None if bounds is None else [[estimate.mean - bounds[0]], [bounds[1] - estimate.mean]]
            ax.errorbar(
                [position], [estimate.mean], yerr=error, fmt="o", color=colour, capsize=3, markersize=7
            )
            seed_points(ax, [position + 0.15], [seeds[row[f"{side}_run"]]], s=8)
            ticks.append(position)
            labels.append(f"{row['model'].split(' ')[0]}: {row[side]}" if several else row[side])
            position += 1
    ax.set_xticks(ticks, labels=labels, rotation=35, ha="right", fontsize=7)
    for model in dict.fromkeys(row["model"] for row in rows):
        baseline_band(ax, baselines[model], "accuracy", f"{model.split(' ')[0]} fp32")
    ax.set(ylabel="test accuracy", title="(a) failures (red) and fixes (green)")
    bands = ax.get_legend_handles_labels()  # drawn below the figure: inside, it would hide failing runs

    ax = axes[0][1]
    window = defaultdict(list)
    for row in record.rows("window"):
        window[row["model"]].append(row)
    rules = {row["model"]: row for row in record.rows("models")}
    for index, (model, mine) in enumerate(window.items()):
        colour = f"C{index}"
        ax.plot(
            [r["log2_scale"] for r in mine],
            [r["predicted_relative_mse"] for r in mine],
            color=colour,
            label=model.split(" ")[0],
        )
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
    handles, names = ax.get_legend_handles_labels()
    figure.legend(bands[0] + handles, bands[1] + names, loc="outside lower center", ncol=6, fontsize=7)

    ax = axes[0][2]
    arms = record.rows("arms")
    for index, model in enumerate(window):
        mine = [r for r in arms if r["model"] == model and np.isfinite(value(r, "gap_pt"))]
        for fails in (True, False):
            chosen = [r for r in mine if (r["measured"] == "fails") == fails]
            if not chosen:
                continue
            ax.errorbar(
                [r["predicted_relative_mse"] for r in chosen],
                [-value(r, "gap_pt") for r in chosen],
                yerr=interval(chosen, "gap_pt")[::-1],
                fmt="o",
                color=f"C{index}",
                markerfacecolor=f"C{index}" if fails else "white",
                capsize=2,
                markersize=5,
            )
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set(
        xscale="log",
        xlabel="predicted relative MSE (mean over layers)",
        ylabel="accuracy loss vs fp32 of its model (pt)",
        title="(c) prediction vs outcome (filled: fails)",
    )
    return figure
