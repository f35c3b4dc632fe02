"""Shared figure style and helpers: seaborn, readable fonts, numbers over seeds drawn with their spread.

Estimates are read through `Estimate.read` (the columns protocol of `gradcomp.analysis.seeds`). Numbers from
training are drawn as points with their 95 % intervals and every seed's value, never as bars on a truncated
axis; paired differences as points with their intervals around 0."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.tables import Record
from gradcomp.analysis.verdicts import EQUIVALENCE, INCONCLUSIVE, NON_INFERIORITY, Comparison

sns.set_theme(context="paper", style="whitegrid", font_scale=1.25)

# what training showed against fp32 (`gradcomp.analysis.accuracy.outcome`): one colour each, in every figure
OUTCOMES = {"fails": "C3", "trains": "C2", "undecided": "0.55"}
MARGINS = {
    EQUIVALENCE: ("C2", "equivalent within ±{}"),
    NON_INFERIORITY: ("C1", "non-inferior above -{}"),
}


def subplots(
    ncols: int = 1,
    nrows: int = 1,
    width: float = 4.8,
    height: float = 3.6,
    width_ratios: Sequence[float] | None = None,
) -> tuple[Figure, np.ndarray]:
    """A grid of axes in a constrained layout (which keeps room for the title, labels and outer legends);
    `width_ratios` shares the width (`width` per column) out unevenly."""
    figure, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width * ncols, height * nrows),
        squeeze=False,
        layout="constrained",
        width_ratios=width_ratios,
    )
    return figure, axes


def titled(figure: Figure, title: str) -> Figure:
    """The figure under its experiment's title (before the lint and the save: both see the title)."""
    figure.suptitle(title, wrap=True)
    return figure


def save_figure(figure: Figure, prefix: Path) -> list[Path]:
    """Write the figure as <prefix>.png and .pdf (no creation date in the PDF: reruns are byte-equal)."""
    paths = [prefix.with_suffix(".png"), prefix.with_suffix(".pdf")]
    figure.savefig(paths[0], dpi=150)
    figure.savefig(paths[1], metadata={"CreationDate": None})
    plt.close(figure)
    return paths


def value(row: dict, name: str) -> float:
    """The mean of an estimate (NaN where the row has none)."""
    estimate = Estimate.read(row, name)
    return np.nan if estimate is None else estimate.mean


def interval(rows: Sequence[dict], name: str) -> np.ndarray:
    """[2, len(rows)] distances from each mean to its 95 % CI ends, for matplotlib's error bars (0 where a
    single seed leaves no interval)."""
    distances = []
    for row in rows:
        estimate = Estimate.read(row, name)
        bounds = None if estimate is None else estimate.interval
        distances.append(
            (0.0, 0.0) if bounds is None else (estimate.mean - bounds[0], bounds[1] - estimate.mean)
        )
    return np.array(distances, dtype=float).reshape(-1, 2).T


def errorbars(ax: Axes, rows: Sequence[dict], y: str, x: str | Sequence[float], scale: float = 1.0, **style):
    """The means of the estimate `y` (times `scale`) with their 95 % CI as error bars, at the positions `x`,
    or at the means of the estimate `x` with its CI as horizontal error bars."""
    estimated_x = isinstance(x, str)
    return ax.errorbar(
        [value(row, x) for row in rows] if estimated_x else x,
        [scale * value(row, y) for row in rows],
        xerr=interval(rows, x) if estimated_x else None,
        yerr=scale * interval(rows, y),
        **{"capsize": 3, **style},
    )


def seed_points(
    ax: Axes, positions: Sequence[float], per_seed: Sequence[Sequence[float]], spread: float = 0.05, **style
) -> None:
    """Every seed's value as a small dot at its arm's position, spread over +-`spread` horizontally."""
    style = {"s": 10, "color": "k", "alpha": 0.6, "zorder": 3, "linewidths": 0, **style}
    for position, values in zip(positions, per_seed, strict=True):
        jitter = np.linspace(-spread, spread, len(values)) if len(values) > 1 else np.zeros(len(values))
        ax.scatter(position + jitter, values, **style)


def baseline_band(ax: Axes, row: dict, name: str, label: str, scale: float = 1.0, colour: str = "k") -> None:
    """A dashed line at the baseline's mean and a band over its 95 % CI (`colour`: its line's, where
    several baselines share a panel)."""
    estimate = Estimate.read(row, name)
    ax.axhline(
        scale * estimate.mean,
        color=colour,
        linestyle="--",
        linewidth=1,
        label=f"{label} ({estimate.mean:.3f})",
    )
    if estimate.interval is not None:
        low, high = estimate.interval
        ax.axhspan(scale * low, scale * high, color="k", alpha=0.08, linewidth=0)


def per_seed(record: Record, rows: Sequence[dict], key: str = "accuracy") -> list[list[float]]:
    """Every seed's `key` of each row's run, from the record's "seeds" table."""
    seeds: dict[str, list[float]] = {}
    for row in record.rows("seeds"):
        if row[key] is not None:
            seeds.setdefault(row["run"], []).append(row[key])
    return [seeds.get(row["run"], []) for row in rows]


def accuracy_points(ax: Axes, record: Record, rows: Sequence[dict], colour: str) -> np.ndarray:
    """Each row's mean accuracy with its 95 % CI and every seed's point, at positions 0, 1, ...; returns the
    positions."""
    positions = np.arange(len(rows))
    errorbars(ax, rows, "accuracy", positions, fmt="o", color=colour, markersize=7, zorder=4)
    seed_points(ax, positions + 0.15, per_seed(record, rows), s=8)
    return positions


def gap_points(ax: Axes, rows: Sequence[dict], positions: Sequence[float], **style) -> None:
    """Each row's paired difference from its reference (the estimate "gap_pt") with its 95 % interval;
    filled where the verdict is better or worse, hollow otherwise (`style`: errorbar's, e.g. fmt="s")."""
    for row, position in zip(rows, positions, strict=True):
        gap = Estimate.read(row, "gap_pt")
        if gap is None or gap.n == 0:
            continue
        bounds = gap.interval
        error = None if bounds is None else [[gap.mean - bounds[0]], [bounds[1] - gap.mean]]
        decided = row.get("verdict") in ("better", "worse")
        fill = style.get("color", "C0") if decided else "white"
        ax.errorbar(
            [position], [gap.mean], yerr=error, **{"fmt": "o", "capsize": 3, "markerfacecolor": fill, **style}
        )


def paired_differences(record: Record, pairs: Sequence[tuple[str, str]], key: str = "accuracy") -> list:
    """Every seed's difference a - b (times 100: points) of each (run a, run b), from the "seeds" table."""
    seeds: dict[str, dict[int, float]] = {}
    for row in record.rows("seeds"):
        if row[key] is not None:
            seeds.setdefault(row["run"], {})[row["seed"]] = row[key]
    return [
        [100 * (seeds[a][s] - seeds[b][s]) for s in sorted(seeds.get(a, {})) if s in seeds.get(b, {})]
        for a, b in pairs
    ]


def comparison_points(ax: Axes, comparisons: Sequence[Comparison], positions: Sequence[float]) -> None:
    """Each comparison's paired difference a - b as its verdict was decided, at `positions` along x: every
    seed's difference (where the record keeps them; accuracies in points), the mean with its 95 % interval
    (hollow: inconclusive), the margin of its test around 0 (shaded; a non-inferiority margin bounds the
    difference from below only) and a dashed line at 0. Two marginal intervals would hide that the seeds
    move together."""
    bands, seeds_labelled = [], False
    for index, (comparison, position) in enumerate(zip(comparisons, positions, strict=True)):
        scale = 100.0 if comparison.unit == "pt" else 1.0  # accuracies are fractions, their gaps points
        if comparison.values:
            differences = [scale * (a - b) for _, a, b in comparison.values]
            seed_points(
                ax, [position + 0.15], [differences], s=12, label=None if seeds_labelled else "each seed"
            )
            seeds_labelled = True
        mean, low, high = comparison.difference, comparison.ci_low, comparison.ci_high
        error = None if np.isnan(low) else [[mean - low], [high - mean]]
        ax.errorbar([position], [mean], yerr=error, fmt="o", capsize=3, color="C0", markersize=7,
                    markerfacecolor="white" if comparison.verdict == INCONCLUSIVE else "C0", zorder=4,
                    label="mean, 95 % CI (hollow: inconclusive)" if index == 0 else None)  # fmt: skip
        if comparison.margin is not None and comparison.test in MARGINS:
            bands.append((position, comparison.test, comparison.margin, comparison.unit))
    ax.axhline(0, color="k", linestyle="--", linewidth=1, label="no difference")
    top, labelled = ax.get_ylim()[1], set()
    for position, test, margin, unit in bands:
        colour, text = MARGINS[test]
        label = None if (test, margin) in labelled else text.format(f"{margin:g} {unit}".strip())
        ax.fill_between([position - 0.4, position + 0.4], -margin, top if test == NON_INFERIORITY else margin,
                        color=colour, alpha=0.15, linewidth=0, label=label)  # fmt: skip
        labelled.add((test, margin))
    ax.set_ylim(top=top)
