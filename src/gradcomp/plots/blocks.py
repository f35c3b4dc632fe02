"""C1, C2, C5: block-scaled gradient formats, drawn from their records; and `paired_gaps`, the accuracy
panel of C1, C3 and C4."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, NullLocator

from gradcomp.analysis.tables import Record
from gradcomp.analysis.verdicts import INCONCLUSIVE, Comparison, by_arm
from gradcomp.plots.style import comparison_points, subplots, value


def paired_gaps(ax: Axes, record: Record, arms: Sequence[dict], label: str, panel: str = "") -> None:
    """Each arm's accuracy minus its reference's, paired by seed, as its verdict was decided (C1, C3, C4;
    `style.comparison_points`), named by its `label` column (and its model where there are several) over
    its verdict; `panel` heads the title, e.g. "(a) "."""
    gaps = by_arm([Comparison.from_row(row) for row in record.comparisons])
    chosen = [gaps[row["run"]] for row in arms]
    comparison_points(ax, chosen, np.arange(len(arms)))
    several = len({row["model"] for row in arms}) > 1
    names = [
        textwrap.fill(row[label], 20)
        + (f"\n({row['model']})" if several else "")
        + f"\nverdict: {gap.verdict}"
        for row, gap in zip(arms, chosen, strict=True)
    ]
    arm_ticks(ax, names)
    _symmetric_log(ax, 2 * max((gap.margin for gap in chosen if gap.margin is not None), default=1.0))
    ax.set_title(f"{panel}accuracy against the uncompressed run, paired by seed", fontsize=9)
    handles, texts = ax.get_legend_handles_labels()
    ax.legend(handles, [textwrap.fill(text, 16) for text in texts], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1))  # fmt: skip


def arm_ticks(ax: Axes, names: Sequence[str]) -> None:
    """One tick per arm at 0, 1, ... (C1, C3, C4): upright under a few, slanted and smaller under many."""
    many = len(names) >= 8
    ax.set_xticks(np.arange(len(names)), names, fontsize=6 if many else 7, rotation=30 if many else 0,
                  ha="right" if many else "center")  # fmt: skip


def _symmetric_log(ax: Axes, linear: float) -> None:
    """A y axis of points, linear within ±`linear` (where the margins and verdicts lie) and logarithmic
    beyond (where one collapsed arm would otherwise flatten every other), ticked at 1, 2, 5, 10, ..."""
    ax.set_yscale("symlog", linthresh=linear, linscale=1.0)
    low, high = ax.get_ylim()
    steps = [sign * step * 10**power for power in range(4) for step in (1, 2, 5) for sign in (-1, 1)]
    ax.set_yticks(sorted(t for t in [0, *steps] if low <= t <= high))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set(ylabel=f"accuracy - uncompressed (pt;\nlogarithmic beyond ±{linear:g})")


def block_formats(record: Record) -> Figure:
    arms = [row for row in record.rows() if row["bits"] < 32]
    figure, axes = subplots(ncols=1, width=1.2 * len(arms) + 3.5, height=4.6)
    paired_gaps(axes[0][0], record, arms, "label")
    return figure


def block_theory(record: Record) -> Figure:
    rows = record.rows()
    figure, axes = subplots(ncols=3, width=4.2, height=4.0)
    colours = {model: f"C{index}" for index, model in enumerate(dict.fromkeys(row["model"] for row in rows))}
    for panel, (name, scale) in enumerate((("mse", "log"), ("flushed", "linear"))):
        ax = axes[0][panel]
        for row in rows:
            colour = colours[row["model"]]
            ax.scatter(
                value(row, name),
                value(row, f"predicted_{name}"),
                marker="s" if row["arm"].endswith("per layer") else "o",
                facecolors="none" if " H" in row["arm"] else colour,
                edgecolors=colour,
                s=28,
            )
        limits = [min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])]
        ax.plot(limits, limits, color="k", linewidth=0.8, linestyle=":")
        ax.set(xscale=scale, yscale=scale, xlabel=f"measured {name}", ylabel=f"predicted {name}")
        ax.set_title(
            f"({'ab'[panel]}) {'relative MSE' if name == 'mse' else 'share flushed to zero'}", fontsize=9
        )
    _versus(axes[0][2], record.rows("versus"), colours)

    def key(label: str, colour: str = "0.35", **style) -> Line2D:
        return Line2D([], [], color=colour, label=label, **{"marker": "o", "linestyle": "", **style})

    keys = [key(model, colour) for model, colour in colours.items()] + [
        key("(a, b) block format"),
        key("(a, b) after the Hadamard transform", markerfacecolor="none"),
        key("(a, b) one scale per layer", marker="s"),
        key("(a, b) dotted: predicted = measured", linestyle=":", marker=""),
        key("(c) measured, 95 % CI (hollow: inconclusive)"),
        key("(c) predicted", "k", marker="x"),
    ]
    figure.legend(handles=keys, loc="outside lower center", ncol=5, fontsize=7)
    return figure


def _versus(ax: Axes, versus: Sequence[dict], colours: dict[str, str]) -> None:
    """C2(c): each block format's ln MSE ratio to one scale per layer, in its model's colour, named by its
    format (each model's formats in the same order)."""
    positions = np.arange(len(versus))
    models = [next(model for model in colours if row["comparison"].startswith(f"{model} ")) for row in versus]
    for position, row, model in zip(positions, versus, models, strict=True):
        mean, low, high = row["measured_ln_ratio"], row["low"], row["high"]
        error = None if low is None else [[mean - low], [high - mean]]
        colour = colours[model]
        ax.errorbar([position], [mean], yerr=error, fmt="o", capsize=3, color=colour,
                    markerfacecolor="white" if row["verdict"] == INCONCLUSIVE else colour)  # fmt: skip
        if row["predicted_ln_ratio"] is not None:
            ax.scatter([position], [row["predicted_ln_ratio"]], marker="x", color="k", zorder=5)
    ax.axhline(0, color="k", linewidth=0.8, linestyle="--")
    names = [
        row["comparison"].removeprefix(f"{model} ").removesuffix(" MSE")
        for row, model in zip(versus, models, strict=True)
    ]
    ax.set_xticks(positions, names, fontsize=7, rotation=90)
    for label, model in zip(ax.get_xticklabels(), models, strict=True):
        label.set_color(colours[model])
    ax.set(ylabel="ln(MSE blocks / MSE per layer)")
    ax.set_title("(c) blocks against per-layer scaling (dashed: equal)", fontsize=9)


SCALE_MARKERS = "osvD"  # one per scale format, each smaller than the last: equal lines stay told apart
# what C5 checks (FP4 All the Way, figures 1-2)
PAPER_ORDER = "FP4 All the Way: E4M3 and E3M4 scales about equal and best, E8M0 worse; smaller blocks better"


def scale_formats(record: Record) -> Figure:
    rows = record.rows()
    models = list(dict.fromkeys(row["model"] for row in rows))
    scales = list(dict.fromkeys(row["scale"] for row in rows))
    element = next(row["arm"].split("/")[0] for row in rows if "/" in row["arm"])  # e.g. "E2M1/16 E4M3"
    ranks = {c.role: c for c in map(Comparison.from_row, record.comparisons) if c.arm == "iid"}
    figure, axes = subplots(ncols=len(models), width=3.2, height=3.6)
    for ax, model in zip(axes[0], models, strict=True):
        for index, scale in enumerate(scales):
            mine = sorted(
                (r for r in rows if r["model"] == model and r["scale"] == scale), key=lambda r: r["block"]
            )
            blocks = [r["block"] for r in mine]
            colour, marker = f"C{index}", SCALE_MARKERS[index % len(SCALE_MARKERS)]
            ax.plot(blocks, [value(r, "mse") for r in mine], color=colour, marker=marker,
                    markersize=7 - 1.2 * index, label=scale)  # fmt: skip
            ax.plot(blocks, [value(r, "predicted_mse") for r in mine], "--", color=colour, linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="block size", ylabel="relative MSE")
        ax.set_xticks(blocks, [str(b) for b in blocks])
        rank = ranks.get(model)
        spearman = (
            f"\nSpearman (iid): {rank.difference:+.2f} [{rank.ci_low:+.2f}, {rank.ci_high:+.2f}]"
            if rank
            else ""
        )
        ax.set_title(f"{model}{spearman}", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [Line2D([], [], color="0.35"), Line2D([], [], color="0.35", linestyle="--", linewidth=1)]
    title = f"scale of the {element} blocks ({PAPER_ORDER})"
    figure.legend(handles, [*labels, "measured", "iid theory"], loc="outside lower center", ncol=len(handles),
                  fontsize=7, title=title, title_fontsize=7)  # fmt: skip
    return figure
