"""F0: predicted against measured noise ratios, drawn from the record."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import subplots


def noise_ratios(record: Record) -> Figure:
    layers = record.rows("layers")
    kinds, margin, critical = record.facts["kinds"], record.facts["margin"], record.facts["critical"]
    models = list(dict.fromkeys(row["model"] for row in layers))
    policies = list(dict.fromkeys(row["policy"] for row in layers))
    figure, axes = subplots(nrows=len(kinds), ncols=len(models), width=3.0, height=2.8)
    for column, model in enumerate(models):
        mine = [row for row in layers if row["model"] == model]
        for line, kind in enumerate(kinds):
            ax = axes[line][column]
            for index, policy in enumerate(policies):
                points = [
                    (row["measured_ratio"], row[f"{kind}_ratio"])
                    for row in mine
                    if row["policy"] == policy
                    and _finite(row["measured_ratio"])
                    and _finite(row[f"{kind}_ratio"])
                ]
                if points:
                    x, y = zip(*points, strict=True)
                    ax.scatter(x, y, s=8, alpha=0.6, color=f"C{index}", label=policy)
            low, high = _limits(ax)
            ax.plot([low, high], [low, high], color="k", linewidth=0.8)
            for factor in (math.exp(margin), math.exp(-margin)):
                ax.plot([low, high], [low * factor, high * factor], color="k", linewidth=0.6, linestyle="--")
            ax.axvline(critical, color="grey", linewidth=0.6, linestyle=":")
            ax.axhline(critical, color="grey", linewidth=0.6, linestyle=":")
            ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
            ax.set(
                xlabel="measured R" if line == len(kinds) - 1 else "",
                ylabel=f"{kind} R" if column == 0 else "",
            )
            ax.set_title(f"{model}: {kind}", fontsize=8)
    axes[0][0].legend(fontsize=6, markerscale=2)
    return figure


def _finite(value) -> bool:
    return value is not None and 0 < value < math.inf


def _limits(ax) -> tuple[float, float]:
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    return max(min(x0, y0), 1e-3), max(x1, y1)
