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


def _by_model(record: Record) -> list[tuple[dict, list[dict]]]:
    """Each model's baseline row (the `baseline` table) and the main rows of its compressed runs."""
    rows = record.rows()
    baselines = {row["run"]: row for row in record.rows("baseline")}
    return [
        (row, [arm for arm in rows if arm.get("model") == row["model"] and arm["run"] not in baselines])
        for row in baselines.values()
    ]


def fp_formats(record: Record) -> Figure:
    models = _by_model(record)
    widths = [max(3.0, 0.55 * len(arms) + 1.5) for _, arms in models]
    figure, axes = subplots(ncols=len(models), width=max(widths), height=4.4)
    for ax, (baseline, arms) in zip(axes[0], models, strict=True):
        _format_bars(ax, record, arms, "C0")
        baseline_band(ax, baseline, "accuracy", baseline["label"])
        ax.set(
            ylim=(lowest_seed(record, [baseline, *arms]), None),
            ylabel="test accuracy",
            xlabel="gradient format",
        )
        if len(models) > 1:
            ax.set_title(baseline["model"], fontsize=10)
        ax.legend(fontsize=8, loc="lower left")
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
    for row, style in zip(parts["rule"], ("-", ":", "-."), strict=False):
        mean = value(row, "accuracy")
        ax.axhline(mean, color="C2", linestyle=style, label=f"{row['scaling']} ({mean:.3f})")
    for row in parts["fp32"]:
        baseline_band(ax, row, "accuracy", row["label"])
    reference = parts["rule"][0]["format"] if parts["rule"] else ""
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
    baselines = {row["model"]: row for row in record.rows("baseline")}
    seeds = defaultdict(list)
    for row in record.rows("seeds"):
        seeds[row["run"]].append(row["accuracy"])
    figure, axes = subplots(ncols=3, width=5.4, height=4.6)
    ax = axes[0][0]
    labels, means, errors, colours, points = [], [], [], [], []
    several = len({row["model"] for row in rows}) > 1
    for row in rows:
        for side, colour in (("failing", "C3"), ("fixing", "C2")):
            labels.append(f"{row['model'].split(' ')[0]}: {row[side]}" if several else row[side])
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
    for model in dict.fromkeys(row["model"] for row in rows):
        baseline_band(ax, baselines[model], "accuracy", f"{model.split(' ')[0]} fp32")
    ax.set(ylabel="test accuracy", ylim=(0, 1), title="(a) failures and fixes")
    ax.legend(fontsize=8)

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
            label=model,
        )
        ax.axhline(rules[model]["per_layer_rule_relative_mse"], color=colour, linestyle=":", linewidth=1)
        for scope, alpha in (("element", 0.06), ("every_layer", 0.18)):
            if rules[model][f"{scope}_window_low"] is not None:
                low, high = rules[model][f"{scope}_window_low"], rules[model][f"{scope}_window_high"]
                ax.axvspan(low, high, color=colour, alpha=alpha)
    ax.set(
        yscale="log",
        xlabel="log2 global loss scale",
        ylabel="predicted relative MSE (dotted: per-layer)",
        title="(b) predicted window of one global scale",
    )
    ax.legend(fontsize=6, loc="upper center")
    trained = [r for r in record.rows("arms") if r["log2_global_scale"] is not None]
    if trained:
        twin = ax.twinx()
        for index, model in enumerate(window):
            mine = [r for r in trained if r["model"] == model]
            twin.errorbar(
                [r["log2_global_scale"] for r in mine],
                [-r["gap_pt"] for r in mine],
                yerr=[
                    [r["gap_ci_high"] - r["gap_pt"] for r in mine],
                    [r["gap_pt"] - r["gap_ci_low"] for r in mine],
                ],
                fmt="o",
                color=f"C{index}",
                mfc="none",
                capsize=2,
            )
        twin.set_ylabel("measured accuracy loss vs fp32 (pt)")

    ax = axes[0][2]
    for index, model in enumerate(window):
        mine = [r for r in record.rows("arms") if r["model"] == model]
        for significant in (True, False):
            chosen = [r for r in mine if (r["verdict"] == "significant") == significant]
            ax.scatter(
                [r["predicted_relative_mse"] for r in chosen],
                [-r["gap_pt"] for r in chosen],
                edgecolors=f"C{index}",
                facecolors=f"C{index}" if significant else "none",
                s=30,
                label=model if significant else None,
            )
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set(
        xscale="log",
        xlabel="predicted relative MSE (mean over layers)",
        ylabel="measured accuracy loss vs fp32 of its model (pt)",
        title="(c) prediction vs outcome",
    )
    ax.legend(fontsize=6)
    return figure
