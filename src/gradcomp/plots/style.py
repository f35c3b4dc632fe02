"""Shared figure style and helpers: seaborn, readable fonts, numbers over seeds drawn with their spread."""

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

from gradcomp.analysis.tables import Record

sns.set_theme(context="paper", style="whitegrid", font_scale=1.25)


def subplots(
    ncols: int = 1, nrows: int = 1, width: float = 4.8, height: float = 3.6
) -> tuple[Figure, np.ndarray]:
    figure, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return figure, axes


def save_figure(figure: Figure, title: str, prefix: Path) -> list[Path]:
    """Write the figure as <prefix>.png and .pdf (no creation date in the PDF: reruns are byte-equal)."""
    figure.suptitle(title, wrap=True)
    figure.tight_layout()
    paths = [prefix.with_suffix(".png"), prefix.with_suffix(".pdf")]
    figure.savefig(paths[0], dpi=150)
    figure.savefig(paths[1], metadata={"CreationDate": None})
    plt.close(figure)
    return paths


def value(row: dict, name: str) -> float:
    """The mean of an estimated column (NaN where missing)."""
    number = row.get(f"{name}_mean")
    return np.nan if number is None else float(number)


def interval(rows: Sequence[dict], name: str) -> np.ndarray:
    """[2, len(rows)] distances from each mean to its 95 % CI ends, for matplotlib's error bars (0 where a
    single seed leaves no interval)."""
    means = np.array([value(row, name) for row in rows])
    low = np.array([np.nan if row.get(f"{name}_ci_low") is None else row[f"{name}_ci_low"] for row in rows])
    high = np.array(
        [np.nan if row.get(f"{name}_ci_high") is None else row[f"{name}_ci_high"] for row in rows]
    )
    return np.nan_to_num(np.stack([means - low, high - means]), nan=0.0)


def errorbars(ax: Axes, rows: Sequence[dict], y: str, x: str | Sequence[float], scale: float = 1.0, **style):
    """The means of the estimated column `y` (times `scale`) with their 95 % CI as error bars, at the
    positions `x`, or at the means of the estimated column `x` with its CI as horizontal error bars."""
    estimated_x = isinstance(x, str)
    return ax.errorbar(
        [value(row, x) for row in rows] if estimated_x else x,
        [scale * value(row, y) for row in rows],
        xerr=interval(rows, x) if estimated_x else None,
        yerr=scale * interval(rows, y),
        **{"capsize": 3, **style},
    )


def seed_points(ax: Axes, positions: Sequence[float], per_seed: Sequence[Sequence[float]], **style) -> None:
    """Every seed's value as a small dot at its arm's position (horizontal jitter only)."""
    for position, values in zip(positions, per_seed, strict=True):
        jitter = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(position + jitter, values, s=10, color="k", alpha=0.6, zorder=3, linewidths=0, **style)


def baseline_band(ax: Axes, row: dict, name: str, label: str) -> None:
    """A dashed line at the baseline's mean and a band over its 95 % CI."""
    mean = value(row, name)
    ax.axhline(mean, color="k", linestyle="--", linewidth=1, label=f"{label} ({mean:.3f})")
    if row.get(f"{name}_ci_low") is not None:
        ax.axhspan(row[f"{name}_ci_low"], row[f"{name}_ci_high"], color="k", alpha=0.08, linewidth=0)


def per_seed(record: Record, rows: Sequence[dict], key: str = "accuracy") -> list[list[float]]:
    """Every seed's `key` of each row's run, from the record's "seeds" table."""
    seeds: dict[str, list[float]] = {}
    for row in record.rows("seeds"):
        if row[key] is not None:
            seeds.setdefault(row["run"], []).append(row[key])
    return [seeds.get(row["run"], []) for row in rows]


def accuracy_bars(ax: Axes, record: Record, rows: Sequence[dict], colour: str) -> np.ndarray:
    """Bars at each row's mean accuracy with 95 % CI error bars and every seed's point; returns the bar
    positions."""
    positions = np.arange(len(rows))
    ax.bar(positions, [value(row, "accuracy") for row in rows], color=colour, alpha=0.8)
    errorbars(ax, rows, "accuracy", positions, fmt="none", ecolor="k")
    seed_points(ax, positions, per_seed(record, rows))
    return positions


def lowest_seed(record: Record, rows: Sequence[dict], margin: float = 0.05) -> float:
    """A lower y limit for accuracy plots: the lowest seed's accuracy less a margin (at least 0)."""
    values = [v for seeds in per_seed(record, rows) for v in seeds]
    return max(0.0, min(values) - margin) if values else 0.0
