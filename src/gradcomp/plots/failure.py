"""F0-F2: noise ratios predicted against measured; time below sqrt(3) against accuracy lost; the late
switch. Drawn from the records."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.analysis.verdicts import Comparison
from gradcomp.plots.style import OUTCOMES, comparison_points, errorbars, subplots

BEYOND = 10.0  # F0: a prediction this far beyond the range of the measured R is drawn at the panel's edge
EDGE = {"s": 28, "clip_on": False, "edgecolors": "k", "linewidths": 0.5, "zorder": 4}  # F0: beyond the axis


def noise_ratios(record: Record) -> Figure:
    """F0: each panel spans the measured R (and the predictions near it); the few predictions far beyond,
    some astronomically large, are drawn at the panel's edge as triangles (counted in its title), so that
    they neither stretch the axis over the bulk nor vanish."""
    layers = record.rows("layers")
    kinds, margin, critical = record.facts["kinds"], record.facts["margin"], record.facts["critical"]
    models = list(dict.fromkeys(row["model"] for row in layers))
    colours = {policy: f"C{index}" for index, policy in enumerate(dict.fromkeys(r["policy"] for r in layers))}
    figure, axes = subplots(nrows=len(kinds), ncols=len(models), width=3.0, height=2.8)
    for column, model in enumerate(models):
        mine = [row for row in layers if row["model"] == model and _finite(row["measured_ratio"])]
        measured = [row["measured_ratio"] for row in mine]
        for line, kind in enumerate(kinds):
            ax = axes[line][column]
            points = [(row["policy"], row["measured_ratio"], _predicted(row, kind)) for row in mine]
            points = [point for point in points if point[2] is not None]
            near = [y for *_, y in points if min(measured) / BEYOND <= y <= max(measured) * BEYOND]
            low, high = min(measured + near) / 1.5, max(measured + near) * 1.5
            beyond = 0
            for policy, colour in colours.items():
                drawn = [(x, y) for name, x, y in points if name == policy]
                inside = [(x, y) for x, y in drawn if low <= y <= high]
                if inside:
                    ax.scatter(*zip(*inside, strict=True), s=8, alpha=0.6, color=colour, label=policy)
                above, below = [x for x, y in drawn if y > high], [x for x, y in drawn if y < low]
                for out, edge, marker in ((above, high, "^"), (below, low, "v")):
                    if out:
                        ax.scatter(out, [edge] * len(out), color=colour, marker=marker, **EDGE)
                beyond += len(above) + len(below)
            ax.plot([low, high], [low, high], color="k", linewidth=0.8, label="predicted = measured")
            for index, factor in enumerate((math.exp(margin), math.exp(-margin))):
                ax.plot([low, high], [low * factor, high * factor], color="k", linewidth=0.6, linestyle="--",
                        label=f"a factor of {math.exp(margin):.3g}" if index == 0 else None)  # fmt: skip
            ax.axvline(critical, color="grey", linewidth=0.6, linestyle=":")
            ax.axhline(critical, color="grey", linewidth=0.6, linestyle=":", label=f"R = {critical:.3g}")
            ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
            ax.set(
                xlabel="measured R" if line == len(kinds) - 1 else "",
                ylabel=f"{kind} R" if column == 0 else "",
            )
            title = f"{model}: {kind}" + (f"\n{beyond} beyond the axis" if beyond else "")
            ax.set_title(title, fontsize=8, pad=8)  # room for the triangles on the edge
    for marker, where in (("^", "above"), ("v", "below")):
        axes[0][0].scatter([], [], color="grey", label=f"predicted R {where} the axis (at its edge)",
                           marker=marker, **EDGE)  # fmt: skip
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat:  # every policy, whichever panel first drew it
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="outside lower center", ncol=6, fontsize=7, markerscale=1.5)
    return figure


def _predicted(row: dict, kind: str) -> float | None:
    """A layer's predicted R; a record keeps an infinite R (no predicted noise) as null."""
    ratio = row[f"{kind}_ratio"]
    if ratio is None and row[f"{kind}_noise"] == 0 and row[f"{kind}_signal"] > 0:
        return math.inf
    return ratio


def _finite(value) -> bool:
    return value is not None and 0 < value < math.inf


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
    outcomes = {row["run"]: row["outcome"] for row in rows}
    measured = [row for row in history if row["kind"] == "measured" and _finite(row["ratio"])]
    for run in dict.fromkeys(row["run"] for row in measured if row["run"] in outcomes):
        points: dict[int, list[float]] = {}
        for row in measured:
            if row["run"] == run:
                points.setdefault(row["step"], []).append(row["ratio"])
        steps = sorted(points)
        means = [float(np.exp(np.mean(np.log(points[s])))) for s in steps]  # geometric mean over seeds
        trivial = run in by_construction
        ax.plot(steps, means, color=OUTCOMES[outcomes[run]], linewidth=0.8, alpha=0.8,
                linestyle="--" if trivial else "-")  # fmt: skip
    for outcome, colour in OUTCOMES.items():
        if outcome in outcomes.values():
            ax.plot([], [], color=colour, label=outcome)
    if by_construction:
        ax.plot([], [], color="grey", linestyle="--", linewidth=0.8, label="R = 1 by construction")
    ax.axhline(threshold, color="k", linestyle=":", linewidth=1, label=f"R = {threshold:.3g}")
    ax.set(yscale="log", xlabel="step", ylabel="model-wide measured R")
    title = "(b) R over training, every run (geometric mean over seeds),\ncoloured by what training showed"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), title="against fp32", title_fontsize=7)
    return figure


ROLES = ("fp32", "throughout", "guard", "late")  # F2's arms, in the order of its table


def late_switch(record: Record) -> Figure:
    """F2: each arm's accuracy, and beside it the paired differences its verdicts decide (each arm against
    fp32 and against the format throughout; the share of the gap recovered apart, being no accuracy), which
    the arms' own intervals, wide from seed to seed, would hide."""
    rows = record.rows()
    role = {row["run"]: name for row, name in zip(rows, ROLES, strict=True)}
    comparisons = [Comparison.from_row(row) for row in record.comparisons]
    gaps = sorted(
        (c for c in comparisons if c.unit == "pt"),
        key=lambda c: (ROLES.index(role[c.baseline]), ROLES.index(role[c.arm])),
    )
    shares = [c for c in comparisons if c.unit != "pt"]
    ratios = [1.0, 1.4] + [0.45] * bool(shares)
    figure, axes = subplots(ncols=len(ratios), width=4.2, height=4.0, width_ratios=ratios)
    ax = axes[0][0]
    positions = np.arange(len(rows))
    errorbars(ax, rows, "accuracy", positions, fmt="o", color="C0")
    bits = ["" if row["average_bits"] is None else f"\n{row['average_bits']:.1f} bits" for row in rows]
    ax.set_xticks(
        positions, [f"{role[row['run']]}{b}" for row, b in zip(rows, bits, strict=True)], fontsize=8
    )
    ax.set(ylabel="final test accuracy")
    fmt = rows[1]["label"].removesuffix(f" [{rows[1]['run']}]")
    ax.set_title(f"(a) each arm: fp32, {fmt} throughout,\nwith the guard, switched late", fontsize=9)
    panels = [(axes[0][1], gaps, [f"{role[c.arm]}\nminus\n{role[c.baseline]}" for c in gaps])]
    if shares:  # F3's share of the gap to fp32 the late switch recovers
        panels.append((axes[0][2], shares, ["late"] * len(shares)))
    for ax, drawn, names in panels:
        comparison_points(ax, drawn, np.arange(len(drawn)))
        verdicts = [f"{c.family}: {c.verdict}" if c.family else c.verdict for c in drawn]
        ax.set_xticks(
            np.arange(len(drawn)), [f"{n}\n{v}" for n, v in zip(names, verdicts, strict=True)], fontsize=7
        )
        ax.set_xlim(-0.6, len(drawn) - 0.4)
    axes[0][1].set(ylabel="difference, paired by seed (pt)")
    axes[0][1].set_title("(b) the paired differences the verdicts decide", fontsize=9)
    if shares:
        axes[0][2].set(ylabel="share of the gap to fp32 recovered")
        axes[0][2].set_title("(c) (late - throughout)\n/ (fp32 - throughout)", fontsize=9)
    legend = {}
    for ax, *_ in panels:
        legend |= {label: handle for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    figure.legend(legend.values(), legend.keys(), loc="outside lower center", ncol=5, fontsize=7)
    return figure
