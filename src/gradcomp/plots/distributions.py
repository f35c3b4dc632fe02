"""A1-A3: what neural gradients look like, drawn from their records."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import subplots, value


def gradient_histograms(record: Record) -> Figure:
    histograms = record.rows("histograms")
    figure, axes = subplots(ncols=4, nrows=2, width=3.6, height=3.0)
    by_layer = defaultdict(list)
    for row in histograms:
        if row["panel"] == "log2":
            by_layer[row["layer"]].append(row)
    for ax, (layer, rows) in zip(axes[0], by_layer.items(), strict=False):
        centres = np.array([row["log2_centre"] for row in rows])
        counts = np.array([row["count"] for row in rows])
        width = centres[1] - centres[0]
        mean, std = rows[0]["log2_mean"], rows[0]["log2_std"]
        ax.bar(centres, counts, width=width, color="C0", alpha=0.6, label="measured")
        fit = counts.sum() * width * np.exp(-0.5 * ((centres - mean) / std) ** 2) / (std * np.sqrt(2 * np.pi))
        ax.plot(centres, fit, color="C3", label="lognormal fit")
        ax.set_xlim(mean - 5 * std, mean + 4 * std)
        ax.set(title=layer, xlabel="log2 |g|", ylabel="count")
        ax.text(
            0.02, 0.95, f"zeros {rows[0]['zero_fraction']:.0%}", transform=ax.transAxes, va="top", fontsize=9
        )
    axes[0][0].legend(loc="upper right", fontsize=8)
    linear = defaultdict(list)
    for row in record.rows("linear"):
        linear[row["kind"]].append(row)
    for ax, kind in zip(axes[1][:3], ("gradient", "weight", "activation"), strict=True):
        rows = linear.get(kind, [])
        if rows:
            ax.stairs(
                [row["count"] for row in rows],
                [rows[0]["left"], *(row["right"] for row in rows)],
                fill=True,
                color="C2",
            )
            ax.set_yscale("log" if kind == "gradient" else "linear")
            ax.set_title(f"{rows[0]['layer']} {kind} (linear)")
        ax.set(xlabel=kind + " value", ylabel="count")
    ax = axes[1][3]
    occupied = []
    for kind, colour in (("gradient", "C0"), ("weight", "C1"), ("activation", "C4")):
        rows = [row for row in histograms if row["panel"] == "kinds" and row["kind"] == kind]
        if rows:
            centres = np.array([row["log2_centre"] for row in rows])
            counts = np.array([row["count"] for row in rows], dtype=float)
            ax.plot(centres, counts / max(counts.sum(), 1), color=colour, label=kind)
            occupied += list(centres[counts > 0])
            ax.set_title(f"{rows[0]['layer']}: log2 |x|")
    if occupied:
        ax.set_xlim(min(occupied) - 1, max(occupied) + 1)
    ax.set(xlabel="log2 |x|", ylabel="share of non-zeros")
    ax.legend(fontsize=8)
    return figure


def _box_with_points(ax, x: list, y: list, colour: str, order: list | None = None) -> None:
    sns.boxplot(x=x, y=y, order=order, ax=ax, color=colour, fliersize=0)
    sns.stripplot(x=x, y=y, order=order, ax=ax, color="k", size=3)


def goodness_of_fit(record: Record) -> Figure:
    layers = record.rows("layers")
    gradients = [row for row in layers if row["kind"] == "gradient"]
    families = list(dict.fromkeys(row["family"] for row in gradients))
    order = sorted(families, key=lambda f: np.mean([value(r, "ks_d") for r in gradients if r["family"] == f]))
    figure, axes = subplots(ncols=2, width=5.5, height=4.2)
    _box_with_points(
        axes[0][0], [r["family"] for r in gradients], [value(r, "ks_d") for r in gradients], "C0", order
    )
    axes[0][0].set(yscale="log", xlabel="fitted family (neural gradients)", ylabel="KS statistic D")
    axes[0][0].tick_params(axis="x", rotation=30)
    lognormal = [row for row in layers if row["family"] == "lognormal"]
    _box_with_points(axes[0][1], [r["kind"] for r in lognormal], [value(r, "ks_d") for r in lognormal], "C1")
    axes[0][1].set(yscale="log", xlabel="tensor", ylabel="KS D against a lognormal")
    return figure


def statistics_over_training(record: Record) -> Figure:
    curves = defaultdict(list)
    for row in record.rows("curves"):
        curves[row["layer"]].append(row)
    palette = sns.color_palette("viridis", len(curves))
    figure, axes = subplots(ncols=2, width=5.2, height=4.0)
    for colour, (layer, rows) in zip(palette, curves.items(), strict=True):
        rows.sort(key=lambda row: row["step"])
        steps = [row["step"] for row in rows]
        for ax, name in zip(axes[0], ("log2_mean", "log2_std"), strict=True):
            ax.plot(steps, [value(row, name) for row in rows], color=colour, label=layer)
            low = [row[f"{name}_ci_low"] for row in rows]
            if all(v is not None for v in low):
                ax.fill_between(
                    steps,
                    low,
                    [row[f"{name}_ci_high"] for row in rows],
                    color=colour,
                    alpha=0.15,
                    linewidth=0,
                )
    axes[0][0].set(xlabel="training step", ylabel="mu2 = mean log2 |g|  (binades)")
    axes[0][1].set(xlabel="training step", ylabel="sigma2 = std log2 |g|  (binades)")
    axes[0][1].legend(
        *axes[0][0].get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=6
    )
    return figure
