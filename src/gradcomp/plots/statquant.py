"""B1-B4, X2: the integer gradient quantizers of the statistical FQT framework, drawn from their records."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.tables import Record
from gradcomp.plots.style import (
    errorbars,
    gap_points,
    paired_differences,
    per_seed,
    seed_points,
    subplots,
    value,
)

SCHEMES = ("ptq", "psq", "bhq")
COLOURS = {"ptq": "C3", "psq": "C0", "bhq": "C2"}
NAMES = {"ptq": "PTQ (per tensor)", "psq": "PSQ (per sample)", "bhq": "BHQ (block Householder)"}


def bin_usage(record: Record) -> Figure:
    ranges, codes, rows = record.rows("ranges"), record.rows("codes"), record.rows()
    layer, layers, bits = record.facts["layer"], record.facts["layers"], record.facts["bits"]
    usage = {row["scheme"]: row for row in rows if row["layer"] == layer}
    levels = 2**bits
    figure, axes = subplots(ncols=2, nrows=3, width=5.0, height=3.6)
    ax = axes[0][0]
    edges = [ranges[0]["left"], *(row["right"] for row in ranges)]
    ax.stairs([row["samples"] for row in ranges], edges, fill=True, color="C7")
    ax.axvline(ranges[0]["whole_tensor_range"], color="k", ls="--", label="whole-tensor range (PTQ)")
    samples, width = ranges[0]["shape"]
    ax.set(xscale="log", xlabel="per-sample range max - min of dL/dH", ylabel="samples")
    ax.set_title(
        f"(a) {layer}: {samples} samples x {width} values\n(histograms (b-d): first seed)", fontsize=9
    )
    ax.legend(fontsize=8)
    code_axes = (axes[0][1], axes[1][0], axes[1][1])
    for ax, scheme, letter in zip(code_axes, SCHEMES, "bcd", strict=True):
        counts = [row["elements"] for row in codes if row["scheme"] == scheme]
        ax.stairs(counts, np.arange(levels + 1) - 0.5, fill=True, baseline=0.5, color=COLOURS[scheme])
        ax.set(yscale="log", xlim=(-0.5, levels - 0.5), xlabel=f"code (0..{levels - 1})", ylabel="elements")
        row = usage[scheme]  # its numbers in the title: inside the axes they would cover a tall histogram
        ax.set_title(
            f"({letter}) {NAMES[scheme]}, {bits} bits: {value(row, 'distinct_bins'):.0f} bins used,\n"
            f"entropy {value(row, 'entropy_bits'):.2f} bits (mean of {row['seeds']} seeds)",
            fontsize=9,
        )
        ax.set_ylim(0.5, 2 * samples * width)  # one count scale, so that heights compare across schemes
    # (e) on the last row, across it: each scheme's code entropy on every layer, in network order
    grid = axes[2][0].get_subplotspec().get_gridspec()
    for ax in axes[2]:
        ax.remove()
    ax = figure.add_subplot(grid[2, :])
    positions = np.arange(len(layers))
    for scheme, offset in zip(SCHEMES, (-0.2, 0.0, 0.2), strict=True):
        mine = {row["layer"]: row for row in rows if row["scheme"] == scheme}
        errorbars(
            ax,
            [mine[name] for name in layers],
            "entropy_bits",
            positions + offset,
            fmt="o-",
            markersize=3,
            linewidth=0.8,
            capsize=2,
            color=COLOURS[scheme],
            label=NAMES[scheme],
        )
    detail = layers.index(layer)
    ax.axvspan(detail - 0.45, detail + 0.45, color="C7", alpha=0.2, linewidth=0, label=f"{layer}: (a-d)")
    ax.axhline(bits, color="k", ls=":", lw=1, label=f"{bits} bits: every code equally often")
    step = -(-len(layers) // 40)  # at most 40 names on the axis
    ax.set_xticks(positions[::step], layers[::step], rotation=90, fontsize=7)
    ax.set(
        xlim=(-0.6, len(layers) - 0.4),
        ylim=(0, 1.05 * bits),
        xlabel="quantized layer, in network order",
        ylabel="code entropy (bits)",
    )
    seeds = max(row["seeds"] for row in rows)
    ax.set_title(f"(e) every layer, {bits} bits: mean and 95 % CI over {seeds} seeds", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


def variance_vs_bits(record: Record) -> Figure:
    rows = record.rows()
    figure, axes = subplots(width=8.0, height=4.2)
    ax = axes[0][0]
    bit_list = sorted({row["bits"] for row in rows if row["bits"] is not None})
    for scheme in SCHEMES:
        mine = sorted((row for row in rows if row["scheme"] == scheme), key=lambda row: row["bits"])
        errorbars(
            ax,
            mine,
            "quantization_variance",
            [row["bits"] for row in mine],
            fmt="-",
            color=COLOURS[scheme],
            label=NAMES[scheme],
        )
        # filled: significantly below (better) or above (worse) the sampling variance; hollow: inconclusive
        for resolved in (True, False):
            points = [row for row in mine if (row.get("vs_sampling") in ("better", "worse")) == resolved]
            ax.plot(
                [row["bits"] for row in points],
                [value(row, "quantization_variance") for row in points],
                "o",
                color=COLOURS[scheme],
                markerfacecolor=COLOURS[scheme] if resolved else "w",
                zorder=3,
            )
    sampling = next(row for row in rows if row["bits"] is None)
    batches = record.facts.get("sampling_batches")
    ax.axhline(
        value(sampling, "quantization_variance"),
        color="k",
        ls="--",
        label=f"QAT sampling variance ({batches} batches)" if batches else "QAT sampling variance",
    )
    band = Estimate.read(sampling, "quantization_variance").interval
    if band is not None:
        ax.axhspan(*band, color="k", alpha=0.08, linewidth=0)
    anchor = next(
        value(row, "quantization_variance")
        for row in rows
        if row["scheme"] == "psq" and row["bits"] == bit_list[0]
    )
    ax.plot(
        bit_list, [anchor / 4 ** (b - bit_list[0]) for b in bit_list], ":", color="C7", label="1/4 per bit"
    )
    ax.plot([], [], "o", color="C7", label="significantly below or above sampling")
    ax.plot([], [], "o", color="C7", markerfacecolor="w", label="inconclusive against sampling")
    ax.set(yscale="log", xlabel="gradient bits", ylabel="weight-gradient variance")
    ax.set_xticks(bit_list)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


def unbiasedness(record: Record) -> Figure:
    rows = record.rows()
    figure, axes = subplots(width=8.6, height=4.2)
    ax = axes[0][0]
    curves = defaultdict(list)
    for row in rows:
        curves[row["policy"]].append(row)
    for name, mine in curves.items():
        mine.sort(key=lambda row: row["draws"])
        colour, label = (
            (COLOURS[name], NAMES[name])
            if name in NAMES
            else ("C7", "FP e3m0 stochastic, saturating (biased)")
        )
        errorbars(
            ax,
            mine,
            "relative_error",
            [row["draws"] for row in mine],
            fmt="o-",
            capsize=2,
            color=colour,
            label=label,
        )
    ks = sorted({row["draws"] for row in rows})
    start = float(
        np.exp(np.mean([np.log(value(curves[s][0], "relative_error")) for s in SCHEMES if s in curves]))
    )
    ax.plot(ks, [start / np.sqrt(k) for k in ks], ":", color="k", label="1/sqrt(K) reference")
    ax.set(xscale="log", yscale="log", xlabel="draws K averaged", ylabel="relative error to the QAT gradient")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.legend(
        fontsize=8,
        title="mean of K FQT gradients",
        title_fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    return figure


def accuracy_table(record: Record) -> Figure:
    """Bit widths as categories ("5 bits"), the schemes present side by side within each: a record may hold
    one bit width, which a numeric axis would show as a lone tick."""
    rows = record.rows()
    figure, axes = subplots(ncols=2, width=5.4, height=4.6)
    ax = axes[0][0]
    for setting, style in (("Exact", "--"), ("QAT", "-")):
        for row in (r for r in rows if r["setting"] == setting):
            estimate = Estimate.read(row, "accuracy")
            ax.axhline(100 * estimate.mean, color="k", ls=style, lw=1, label=setting)
            if estimate.interval is not None:
                ax.axhspan(*(100 * v for v in estimate.interval), color="k", alpha=0.06, linewidth=0)
    fqt = [row for row in rows if row["setting"] == "FQT"]
    qat = next(row for row in rows if row["setting"] == "QAT")
    bit_list = sorted({row["bits"] for row in fqt}, reverse=True)
    schemes = [scheme for scheme in SCHEMES if any(row["scheme"] == scheme for row in fqt)]
    offsets = {scheme: 0.25 * (index - (len(schemes) - 1) / 2) for index, scheme in enumerate(schemes)}
    for scheme in schemes:
        mine = sorted((row for row in fqt if row["scheme"] == scheme), key=lambda row: -row["bits"])
        positions = [bit_list.index(row["bits"]) + offsets[scheme] for row in mine]
        errorbars(
            ax, mine, "accuracy", positions, scale=100, fmt="o-", color=COLOURS[scheme], label=NAMES[scheme]
        )
        dots = [[100 * v for v in seeds] for seeds in per_seed(record, mine)]
        seed_points(ax, [p + 0.07 for p in positions], dots, spread=0.02, color=COLOURS[scheme], alpha=0.5)
        differences = paired_differences(record, [(row["run"], qat["run"]) for row in mine])
        gap_points(axes[0][1], mine, positions, color=COLOURS[scheme])
        seed_points(
            axes[0][1],
            [p + 0.07 for p in positions],
            differences,
            spread=0.02,
            color=COLOURS[scheme],
            alpha=0.5,
        )
    ax.scatter([], [], s=10, color="0.4", label="each seed")
    ax.set(ylabel="test accuracy (%)", title="(a) accuracy, every seed")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    ax.axhline(0, color="k", lw=1)
    margin = record.facts.get("margin")
    if margin:
        ax.axhspan(-margin, margin, color="C2", alpha=0.12, linewidth=0, label=f"±{margin:g} pt (margin)")
    ax.scatter([], [], s=10, color="0.4", label="each seed's difference")
    for fill, label in (("0.4", "mean, 95 % CI: better or worse"), ("white", "mean, 95 % CI: neither")):
        ax.plot([], [], "o", color="0.4", markerfacecolor=fill, label=label)
    ax.legend(fontsize=8)
    ax.set(ylabel="FQT - QAT (pt), paired by seed", title="(b) difference from QAT")
    for ax in axes[0]:
        ax.set_xticks(range(len(bit_list)), [f"{bits} bits" for bits in bit_list])
        ax.set(xlim=(-0.6, len(bit_list) - 0.4), xlabel="FQT gradient bits (activation-gradient path)")
    return figure


PREDICTORS = {"sigma_ln_range": "sigma of ln(per-sample range)", "bound_ratio": "N R(X)^2 / sum_i R(X_i)^2"}
GAINS = {"ptq_over_psq": "Var(PTQ) / Var(PSQ)", "psq_over_bhq": "Var(PSQ) / Var(BHQ)"}


def range_sigma_predictor(record: Record) -> Figure:
    rows = record.rows()
    bits = record.facts["bits"]
    figure, axes = subplots(ncols=2, nrows=2, width=5.0, height=3.8)
    for (predictor, xlabel), ax_row in zip(PREDICTORS.items(), axes, strict=True):
        for (gain, ylabel), ax, scheme in zip(GAINS.items(), ax_row, ("psq", "bhq"), strict=True):
            errorbars(
                ax,
                rows,
                gain,
                predictor,
                fmt="o",
                capsize=2,
                color=COLOURS[scheme],
            )
            ax.axhline(1.0, color="k", lw=0.8)
            log_x = predictor == "bound_ratio"
            ax.set(yscale="log", xscale="log" if log_x else "linear")
            for axis in (ax.xaxis, ax.yaxis) if log_x else (ax.yaxis,):  # plain numbers: about a decade each
                axis.set_major_formatter(LogFormatter())
                axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
            ax.set(xlabel=xlabel, ylabel=f"{ylabel}, {bits} bits")
            row = next(
                r for r in record.rows("correlations") if r["predictor"] == predictor and r["gain"] == gain
            )
            ax.set_title(f"Spearman rho {Estimate.read(row, 'rho').text()}", fontsize=10)
    return figure
