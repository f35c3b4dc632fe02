"""A4-A6: low-bit floating-point gradients, drawn from their records (A10: `fp_failures`)."""

from __future__ import annotations

import textwrap
from collections import defaultdict

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gradcomp.analysis.tables import Record
from gradcomp.analysis.verdicts import Comparison
from gradcomp.plots.style import (
    accuracy_points,
    baseline_band,
    comparison_points,
    errorbars,
    gap_points,
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
        ax.step(xs, ys, where="mid", color=colour, linestyle=STYLES[kind])
    handles = [Line2D([], [], color=f"C{index}", label=f"{bits} bits") for index, bits in enumerate(bit_list)]
    grids = dict.fromkeys(kind for _, kind in grouped)  # 16 curves: colour the bits, line style the grid
    handles += [Line2D([], [], color="grey", linestyle=STYLES[kind], label=f"{kind} grid") for kind in grids]
    ax.set(xlabel="sigma2 (binades)", ylabel="optimal exponent bits E", title="(c) optimal split")
    ax.legend(handles=handles, fontsize=7, ncol=2, loc="lower right")
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
    """A5: per model and scale, each format's accuracy against fp32's (top), and below it the difference
    from fp32 paired by seed that its verdict decides (the seeds move together: two accuracies' intervals
    would hide it)."""
    models = _by_model(record)
    gaps = {row["arm"]: Comparison.from_row(row) for row in record.comparisons}
    widths = [max(3.0, 0.55 * len(arms) + 1.5) for _, arms in models]
    figure, axes = subplots(ncols=len(models), nrows=2, width=max(widths), height=3.4)
    for column, (baseline, arms) in enumerate(models):
        top, bottom = axes[0][column], axes[1][column]
        bottom.sharex(top)
        accuracy_points(top, record, arms, "C0")
        baseline_band(top, baseline, "accuracy", baseline["label"])
        top.set(ylabel="test accuracy", xlim=(-0.6, len(arms) - 0.4))
        top.tick_params(labelbottom=False)
        top.set_title(textwrap.fill(f"{baseline['model']}, {baseline['scale']}", 60), fontsize=8)
        top.legend(fontsize=8, loc="best")  # away from the error bars
        drawn = [gaps[row["run"]] for row in arms]
        comparison_points(bottom, drawn, np.arange(len(arms)))
        names = [f"{row['label']}\n{gap.verdict}" for row, gap in zip(arms, drawn, strict=True)]
        bottom.set_xticks(np.arange(len(arms)), names, rotation=35, ha="right", fontsize=8)
        bottom.set(ylabel=f"accuracy - {baseline['label']} (pt)", xlabel="gradient format")
    handles, labels = axes[1][0].get_legend_handles_labels()
    for ax in axes[1][1:]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8)
    return figure


def scaling_and_split(record: Record) -> Figure:
    """A6: the fixed global scales along their log2 axis; the rules that are no scale (dynamic loss scaling,
    the per-layer min-MSE rule) on a category axis of their own beside it, sharing its y axis."""
    rows = record.rows()
    figure, axes = subplots(ncols=3, width=4.0, height=4.6, width_ratios=[1.3, 0.8, 1.1])
    ax, rules = axes[0][0], axes[0][1]
    rules.sharey(ax)
    compared = [row for row in rows if row.get("versus")]
    series = defaultdict(list)
    for row in compared:
        series[row["model"], row["format"]].append(row)
    names = list(dict.fromkeys(row["scaling"] for row in compared if row["log2_global_scale"] is None))
    for index, ((model, fmt), mine) in enumerate(series.items()):
        colour = f"C{index}"
        fixed = sorted(
            (r for r in mine if r["log2_global_scale"] is not None), key=lambda r: r["log2_global_scale"]
        )
        gap_points(ax, fixed, [r["log2_global_scale"] for r in fixed], color=colour)
        ax.plot(
            [r["log2_global_scale"] for r in fixed],
            [value(r, "gap_pt") for r in fixed],
            color=colour,
            label=f"{model} {fmt}",
        )
        others = [r for r in mine if r["log2_global_scale"] is None]
        offset = 0.15 * (index - (len(series) - 1) / 2)  # side by side within a rule
        gap_points(rules, others, [names.index(r["scaling"]) + offset for r in others], color=colour)
    margin = record.facts.get("margin")
    for panel in (ax, rules):
        panel.axhline(0, color="k", linewidth=0.8)
        if margin:
            panel.axhspan(
                -margin, margin, color="C2", alpha=0.12, linewidth=0, label=f"±{margin:g} pt (margin)"
            )
    ax.set(
        xlabel="log2 global loss scale",
        ylabel="accuracy - per-layer mean rule (pt)",
        title="(a) one global scale",
    )
    rules.set_xticks(range(len(names)), [textwrap.fill(name, 10) for name in names])
    rules.set_xlim(-0.6, len(names) - 0.4)
    rules.tick_params(labelleft=False)
    rules.set(xlabel="other rule", title="(a) other rules")
    handles = ax.get_legend_handles_labels()[0]
    dot = {"marker": "o", "linestyle": "", "color": "grey"}
    handles += [
        Line2D([], [], **dot, label="filled: better or worse"),
        Line2D([], [], **dot, markerfacecolor="white", label="hollow: neither shown"),
    ]
    figure.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8)
    ax = axes[0][2]
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
