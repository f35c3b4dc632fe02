"""A1-A3: what neural gradients look like, drawn from their records (the detailed model first, then the
other models, as the record's rows list them)."""

from __future__ import annotations

from collections import defaultdict

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.tables import Record
from gradcomp.plots.style import subplots, value

# the gradient populations as the records name them (analysis.distributions), by kind
POPULATIONS = {"gradient_active": "BN-output non-zero", "gradient": "all non-zero"}
KIND_LABELS = {
    "gradient_active": "gradient\nBN-output\nnon-zero",
    "gradient": "gradient\nall\nnon-zero",
    "weight": "weight",
    "activation": "activation",
}
BANDED_LAYERS = 12  # A3: per-layer CI bands only up to this many layers (more would hide the lines)
DASHES = {"BN-output non-zero": "-", "all non-zero": "--", "gradient_active": "-", "gradient": "--"}


def _short_names(models: list[str]) -> dict[str, str]:
    """Model description -> its timm name (the description itself where two share a name)."""
    short = {model: model.split(" (")[0] for model in models}
    counts = defaultdict(int)
    for name in short.values():
        counts[name] += 1
    return {model: name if counts[name] == 1 else model for model, name in short.items()}


def _models(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["model"] for row in rows))


# --- A1 -----------------------------------------------------------------------------------------------------
def _same(first: list[dict], second: list[dict]) -> bool:
    """Whether two populations' histograms and fits are one (all non-zero entries BatchNorm-output ones)."""
    keys = ("log2_centre", "count", "log2_mean", "log2_std")
    return [[row[key] for key in keys] for row in first] == [[row[key] for key in keys] for row in second]


def _log2_histogram(ax: Axes, layer: str, populations: dict[str, list[dict]]) -> None:
    """One layer's log2|g| histogram per population, each with its own normal fit; a population equal to the
    reference is drawn once, named as both (twice, it would be one picture under two legend entries)."""
    styles = {"BN-output non-zero": ("C0", "C3"), "all non-zero": ("0.6", "0.3")}  # bars, fit line
    reference = populations.get("BN-output non-zero")
    same = reference is not None and _same(reference, populations.get("all non-zero", []))
    limits, peaks = [], []
    for population, rows in populations.items():
        if same and population == "all non-zero":
            continue
        bars, line = styles[population]
        centres = np.array([row["log2_centre"] for row in rows])
        counts = np.array([row["count"] for row in rows])
        width = centres[1] - centres[0]
        mean, std = rows[0]["log2_mean"], rows[0]["log2_std"]
        label = population
        if rows is reference:
            label += f" ({rows[0]['share']:.0%}" + (" = all non-zero)" if same else ")")
        ax.stairs(
            counts,
            np.append(centres - width / 2, centres[-1] + width / 2),
            color=bars,
            fill=rows is reference,
            alpha=0.6,
            label=label,
        )
        peaks.append(counts.max())
        if std is not None and np.isfinite(std) and std > 0:  # null: a layer without a fit (one value)
            area = counts.sum() * width / (std * np.sqrt(2 * np.pi))  # the fit scaled to the histogram
            density = area * np.exp(-0.5 * ((centres - mean) / std) ** 2)
            ax.plot(
                centres,
                density,
                color=line,
                linestyle=DASHES[population],
                label=f"fit: mu2 {mean:.1f}, sigma2 {std:.2f}",
            )
            limits += [mean - 5 * std, mean + 4 * std]
            peaks.append(density.max())
    if limits:
        ax.set_xlim(min(limits), max(limits))
    ax.set_ylim(0, 1.5 * max(peaks))  # headroom: the legend sits above the bars, not over them
    ax.set(title=layer if len(layer) <= 32 else "..." + layer[-29:], xlabel="log2 |g|", ylabel="count")
    ax.legend(loc="upper left", fontsize=6)


def gradient_histograms(record: Record) -> Figure:
    histograms = record.rows("histograms")
    by_layer: dict[str, dict[str, dict[str, list]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for row in histograms:
        if row["panel"] == "log2":
            by_layer[row["model"]][row["layer"]][row["population"]].append(row)
    models = list(by_layer)
    short = _short_names(models)
    figure, axes = subplots(ncols=4, nrows=len(models) + 1, width=3.6, height=3.0)
    # rows: the detailed model's histograms, its kinds panels, then one row per other model
    for panels, model in zip([axes[0], *axes[2:]], models, strict=True):
        for ax, (layer, populations) in zip(panels, by_layer[model].items(), strict=False):
            _log2_histogram(
                ax,
                layer,
                dict(sorted(populations.items(), key=lambda p: list(POPULATIONS.values()).index(p[0]))),
            )
        panels[0].set_ylabel(f"{short[model]}\ncount", fontweight="bold")
        for ax in panels[len(by_layer[model]) :]:
            ax.set_visible(False)
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
            # gradients of order 1e-4 in plain decimals overprint each other: a power-of-ten offset instead
            ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
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


# --- A2 -----------------------------------------------------------------------------------------------------
def _boxes(
    ax: Axes, rows: list[dict], x: str, order: list, hue: str | None = None, labels: dict | None = None
):
    """Boxes of each row's KS D over layers (by `x`, split by `hue`), every layer's value as a dot."""
    data = {
        "x": [row[x] for row in rows],
        "D": [value(row, "ks_d") for row in rows],
        "hue": [row[hue] for row in rows] if hue else None,
    }
    hue_order = [k for k in KIND_LABELS if k in set(data["hue"])] if hue else None
    palette = dict(zip(hue_order, ("C0", "0.7"), strict=False)) if hue else None
    common = {"x": data["x"], "y": data["D"], "order": order, "ax": ax}
    if hue:
        common |= {"hue": data["hue"], "hue_order": hue_order}
        sns.boxplot(**common, palette=palette, fliersize=0)
        sns.stripplot(**common, dodge=True, palette={k: "k" for k in hue_order}, size=2.5, legend=False)
        handles, names = ax.get_legend_handles_labels()
        ax.legend(handles, [f"gradient, {POPULATIONS[name]}" for name in names], fontsize=8)
    else:
        sns.boxplot(**common, color="C1", fliersize=0)
        sns.stripplot(**common, color="k", size=2.5)
    if labels:
        ax.set_xticks(range(len(order)), [labels[item] for item in order])
    ax.set(yscale="log")


def goodness_of_fit(record: Record) -> Figure:
    layers = record.rows("layers")
    models = _models(layers)
    short = _short_names(models)
    main = [row for row in layers if row["model"] == models[0]]
    gradients = [row for row in main if row["kind"] in ("gradient", "gradient_active")]
    families = list(dict.fromkeys(row["family"] for row in gradients))
    order = sorted(families, key=lambda f: np.mean([value(r, "ks_d") for r in gradients if r["family"] == f]))
    figure, axes = subplots(ncols=2, nrows=2, width=6.2, height=4.4)
    _boxes(axes[0][0], gradients, "family", order, hue="kind")
    axes[0][0].set(xlabel=f"fitted family ({short[models[0]]} gradients)", ylabel="KS statistic D")
    axes[0][0].tick_params(axis="x", rotation=30)
    lognormal = [row for row in main if row["family"] == "lognormal"]
    kinds = [kind for kind in KIND_LABELS if any(row["kind"] == kind for row in lognormal)]
    _boxes(axes[0][1], lognormal, "kind", kinds, labels=KIND_LABELS)
    axes[0][1].set(xlabel=f"tensor ({short[models[0]]})", ylabel="KS D against a lognormal")
    lognormal = [row for row in layers if row["family"] == "lognormal" and row["kind"] in DASHES]
    _boxes(axes[1][0], lognormal, "model", models, hue="kind", labels=short)
    axes[1][0].set(xlabel="model", ylabel="KS D of gradients against a lognormal")
    plt.setp(axes[1][0].get_xticklabels(), rotation=20, ha="right")
    # the share of layers where each family fits best, per model and population
    shares, names = [], []
    for model in models:
        for kind in ("gradient_active", "gradient"):
            rows = {
                row["family"]: row
                for row in record.rows()
                if row["model"] == model and row["kind"] == kind and row.get("best_share_mean") is not None
            }
            if rows:
                shares.append([value(rows[f], "best_share") if f in rows else 0 for f in order])
                names.append(f"{short[model]}: {POPULATIONS[kind]}")
    sns.heatmap(
        np.array(shares),
        ax=axes[1][1],
        annot=True,
        fmt=".0%",
        cmap="Blues",
        vmin=0,
        vmax=1,
        cbar=False,
        xticklabels=order,
        yticklabels=names,
        annot_kws={"fontsize": 8},
    )
    axes[1][1].set(xlabel="fitted family", title="share of layers where the family fits best")
    axes[1][1].tick_params(axis="x", rotation=30)
    axes[1][1].tick_params(axis="y", labelsize=8)
    return figure


# --- A3 -----------------------------------------------------------------------------------------------------
def _band(ax: Axes, x: list, rows: list[dict], name: str, colour, linestyle: str, band: bool = True):
    """The means of `name` over x, with their 95 % CI as a band where there is one (and `band`)."""
    ax.plot(x, [value(row, name) for row in rows], color=colour, linestyle=linestyle)
    intervals = [Estimate.read(row, name).interval for row in rows]
    if band and all(bounds is not None for bounds in intervals):
        low, high = zip(*intervals, strict=True)
        ax.fill_between(x, low, high, color=colour, alpha=0.15, linewidth=0)


def statistics_over_training(record: Record) -> Figure:
    models = _models(record.rows())
    short = _short_names(models)
    curves: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in record.rows("curves"):
        if row["model"] == models[0]:
            curves[row["population"]][row["layer"]].append(row)
    layers = list(dict.fromkeys(layer for population in curves.values() for layer in population))
    depth_map = plt.get_cmap("viridis")
    palette = {layer: depth_map(i / max(len(layers) - 1, 1)) for i, layer in enumerate(layers)}
    figure, axes = subplots(ncols=2, nrows=len(curves) + 2, width=5.6, height=3.6)
    for panels, (population, by_layer) in zip(axes, curves.items(), strict=False):
        for layer, rows in by_layer.items():
            rows.sort(key=lambda row: row["step"])
            steps = [row["step"] for row in rows]
            for ax, name in zip(panels, ("log2_mean", "log2_std"), strict=True):
                _band(ax, steps, rows, name, palette[layer], "-", band=len(layers) <= BANDED_LAYERS)
        title = f"{short[models[0]]}: {population}"
        panels[0].set(xlabel="training step", ylabel="mu2 = mean log2 |g|  (binades)", title=title)
        panels[1].set(xlabel="training step", ylabel="sigma2 = std log2 |g|  (binades)", title=title)
    # one colour per layer along a sequential map, read off a colour bar of the layers' order (a legend of
    # twenty near-identical colours could not be told apart)
    bar = figure.colorbar(
        ScalarMappable(Normalize(0, max(len(layers) - 1, 1)), depth_map), ax=axes[: len(curves)], shrink=0.9
    )
    ticks = sorted({0, len(layers) // 2, len(layers) - 1})
    bar.set_ticks(ticks, labels=[layers[i] for i in ticks], fontsize=7)
    bar.set_label("layer, input to output", fontsize=8)
    colours = dict(zip(models, sns.color_palette("tab10", len(models)), strict=True))
    depth, training = axes[len(curves)], axes[len(curves) + 1]
    profiles = defaultdict(list)
    for row in record.rows():
        profiles[row["model"], row["population"]].append(row)
    for (model, population), rows in profiles.items():
        rows.sort(key=lambda row: row["depth"])
        x = [row["depth"] for row in rows]
        for ax, name in zip(depth, ("log2_mean", "log2_std"), strict=True):
            ax.plot(
                x,
                [value(row, name) for row in rows],
                color=colours[model],
                linestyle=DASHES[population],
                lw=1,
            )
            ax.plot(x, [value(row, name) for row in rows], ".", color=colours[model], markersize=3)
    for ax, name in zip(depth, ("mu2", "sigma2"), strict=True):
        ax.set(
            xlabel="relative depth of the layer (0: first, 1: last)",
            ylabel=f"{name} at the last step (binades)",
            title=f"{name} per layer, last probed step",
        )
    summaries = defaultdict(list)
    for row in record.rows("over_training"):
        summaries[row["model"], row["population"]].append(row)
    for (model, population), rows in summaries.items():
        rows.sort(key=lambda row: row["step"])
        steps = [row["step"] for row in rows]
        for ax, name in zip(training, ("mu2_spread", "sigma2_mean"), strict=True):
            _band(ax, steps, rows, name, colours[model], DASHES[population])
    training[0].set(
        xlabel="training step", ylabel="max - min of mu2 (binades)", title="spread of mu2 over layers"
    )
    training[1].set(xlabel="training step", ylabel="mean sigma2 (binades)", title="mean sigma2 over layers")
    legend = [Line2D([], [], color=colours[model], label=short[model]) for model in models]
    legend += [Line2D([], [], color="k", linestyle=DASHES[p], label=p) for p in POPULATIONS.values()]
    depth[1].legend(handles=legend, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    return figure
