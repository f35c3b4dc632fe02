"""C1, C2, C5: block-scaled gradient formats, drawn from their records."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import accuracy_gaps, subplots, value


def block_formats(record: Record) -> Figure:
    arms = [row for row in record.rows() if row["bits"] < 32]
    figure, axes = subplots(ncols=1, width=max(5.0, 0.7 * len(arms) + 2), height=4.2)
    accuracy_gaps(axes[0][0], arms, "label", "accuracy against the uncompressed run (95 % CI)")
    return figure


def block_theory(record: Record) -> Figure:
    rows = record.rows()
    figure, axes = subplots(ncols=3, width=4.2, height=4.0)
    models = list(dict.fromkeys(row["model"] for row in rows))
    for panel, (name, scale) in enumerate((("mse", "log"), ("flushed", "linear"))):
        ax = axes[0][panel]
        for row in rows:
            colour = f"C{models.index(row['model'])}"
            per_layer = row["arm"].endswith("per layer")
            transformed = " H" in row["arm"]
            ax.scatter(
                value(row, name),
                value(row, f"predicted_{name}"),
                marker="s" if per_layer else "o",
                facecolors="none" if transformed else colour,
                edgecolors=colour,
                s=28,
            )
        limits = [min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])]
        ax.plot(limits, limits, color="k", linewidth=0.8, linestyle=":")
        ax.set(xscale=scale, yscale=scale, xlabel=f"measured {name}", ylabel=f"predicted {name}")
        ax.set_title(
            f"({'ab'[panel]}) {'relative MSE' if name == 'mse' else 'share flushed to zero'}", fontsize=9
        )
    for index, model in enumerate(models):
        axes[0][0].scatter([], [], color=f"C{index}", label=model)
    axes[0][0].legend(fontsize=7)
    ax = axes[0][2]
    versus = record.rows("versus")
    positions = np.arange(len(versus))
    for position, row in zip(positions, versus, strict=True):
        mean, low, high = row["measured_ln_ratio"], row["low"], row["high"]
        error = None if low is None else [[mean - low], [high - mean]]
        decided = row["verdict"] in ("better", "worse")
        ax.errorbar([position], [mean], yerr=error, fmt="o", capsize=3, color="C0",
                    markerfacecolor="C0" if decided else "white")  # fmt: skip
        if row["predicted_ln_ratio"] is not None:
            ax.scatter([position], [row["predicted_ln_ratio"]], marker="x", color="C3", zorder=5)
    ax.axhline(0, color="k", linewidth=0.8, linestyle="--")
    ax.set_xticks(
        positions, [row["comparison"].removesuffix(" MSE") for row in versus], fontsize=6, rotation=90
    )
    ax.set(ylabel="ln(MSE blocks / MSE per layer)")
    ax.set_title("(c) blocks against per-layer scaling", fontsize=9)
    return figure


def scale_formats(record: Record) -> Figure:
    rows = record.rows()
    models = list(dict.fromkeys(row["model"] for row in rows))
    scales = list(dict.fromkeys(row["scale"] for row in rows))
    figure, axes = subplots(ncols=len(models), width=3.2, height=3.4)
    for ax, model in zip(axes[0], models, strict=True):
        for index, scale in enumerate(scales):
            mine = sorted(
                (r for r in rows if r["model"] == model and r["scale"] == scale), key=lambda r: r["block"]
            )
            blocks = [r["block"] for r in mine]
            colour = f"C{index}"
            ax.plot(blocks, [value(r, "mse") for r in mine], "o-", color=colour, label=scale, markersize=4)
            ax.plot(blocks, [value(r, "predicted_mse") for r in mine], "--", color=colour, linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="block size", ylabel="relative MSE")
        ax.set_xticks(blocks, [str(b) for b in blocks])
        ax.set_title(model, fontsize=9)
    axes[0][0].legend(fontsize=7, title="scale (solid: measured,\ndashed: iid theory)", title_fontsize=6)
    return figure
