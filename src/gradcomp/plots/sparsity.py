"""A7-A9: stochastic pruning of neural gradients, drawn from their records."""

from __future__ import annotations

from collections import defaultdict

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gradcomp.analysis.tables import Record
from gradcomp.plots.style import baseline_band, errorbars, gap_points, interval, subplots, value

MARKERS = {"lognormal": "o", "gaussian": "s", "laplace": "^", "topk": "D"}
COLOURS = {estimator: f"C{index}" for index, estimator in enumerate(MARKERS)}
MODEL_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
JITTER = {"lognormal": -0.006, "gaussian": -0.002, "laplace": 0.002, "topk": 0.006}


def _calibration_panel(ax, title: str, rows: list[dict], points: list[dict], marker, models: list) -> None:
    """Achieved against target sparsity: `rows` (large, 95 % CI) and `points` (small), coloured by
    estimator, marked by `marker(row)`, nudged apart by estimator and model."""
    spread = [0.004 * (index - (len(models) - 1) / 2) for index in range(len(models))]
    for (estimator, model), mine in _grouped(rows).items():
        nudge = JITTER[estimator] + spread[models.index(model)]
        errorbars(
            ax,
            mine,
            "achieved",
            [row["target"] + nudge for row in mine],
            fmt=marker(mine[0]),
            color=COLOURS[estimator],
            markersize=5,
            alpha=0.8,
            capsize=2,
        )
    for (estimator, model), small in _grouped(points).items():
        nudge = 2 * JITTER[estimator] + spread[models.index(model)]
        ax.scatter(
            [row["target"] + nudge for row in small],
            [value(row, "achieved") for row in small],
            marker=marker(small[0]),
            s=8,
            alpha=0.35,
            color=COLOURS[estimator],
        )
    ax.plot([0.45, 1.0], [0.45, 1.0], color="grey", linestyle="--")
    ax.set(
        xlabel="target sparsity", ylabel="achieved sparsity", title=title, xlim=(0.45, 1.0), ylim=(0.45, 1.0)
    )


def _grouped(rows: list[dict]) -> dict[tuple[str, str | None], list[dict]]:
    """Rows by (estimator, model), estimators in the order of MARKERS."""
    groups = defaultdict(list)
    for row in sorted(rows, key=lambda row: list(MARKERS).index(row["estimator"])):
        groups[row["estimator"], row.get("model")].append(row)
    return groups


def _legend(ax, estimators: list[str], markers: dict[str, str], fontsize: float = 7) -> None:
    """Colour: estimator; marker: model (or, with no `markers`, estimator), as proxies; the target line."""
    handles = [
        Line2D([], [], color=COLOURS[e], marker="o" if markers else MARKERS[e], linestyle="none", label=e)
        for e in estimators
    ]
    handles += [Line2D([], [], color="grey", marker=m, linestyle="none", label=n) for n, m in markers.items()]
    handles.append(Line2D([], [], color="grey", linestyle="--", label="target"))
    ax.legend(handles=handles, fontsize=fontsize)


def target_vs_achieved_sparsity(record: Record) -> Figure:
    overall, layers, synthetic = record.rows(), record.rows("layers"), record.rows("synthetic")
    models = list(dict.fromkeys(row["model"] for row in overall))
    model_markers = {model: MODEL_MARKERS[index % len(MODEL_MARKERS)] for index, model in enumerate(models)}

    def by_model(row: dict) -> str:
        return model_markers[row["model"]] if len(models) > 1 else MARKERS[row["estimator"]]

    figure, axes = subplots(ncols=3, width=4.6, height=4.8)
    ax = axes[0][0]
    _calibration_panel(
        ax, "(a) synthetic lognormal", synthetic, [], lambda row: MARKERS[row["estimator"]], [None]
    )
    _legend(ax, list(dict.fromkeys(row["estimator"] for row in synthetic)), {})
    ax = axes[0][1]
    _calibration_panel(ax, "(b) training: layers (small), runs (large)", overall, layers, by_model, models)
    estimators = [e for e in MARKERS if any(row["estimator"] == e for row in overall)]
    _legend(ax, estimators, model_markers if len(models) > 1 else {})
    ax = axes[0][2]
    ordered = [row for model in models for row in overall if row["model"] == model]
    positions = {row["run"]: -index for index, row in enumerate(ordered)}
    for row in ordered:
        ax.errorbar(
            [value(row, "error")],
            [positions[row["run"]]],
            xerr=interval([row], "error"),
            fmt=by_model(row),
            color=COLOURS[row["estimator"]],
            markersize=5,
            capsize=2,
        )
    for row in layers:
        ax.scatter(
            value(row, "error"),
            positions[row["run"]] + 0.25,
            marker=by_model(row),
            s=8,
            alpha=0.35,
            color=COLOURS[row["estimator"]],
        )
    for index, model in enumerate(models):
        first = next(row for row in ordered if row["model"] == model)
        if index:
            ax.axhline(positions[first["run"]] + 0.5, color="grey", linewidth=0.8)
        ax.annotate(
            model,
            (0.99, positions[first["run"]] + 0.45),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="top",
            fontsize=7,
            style="italic",
        )
    ax.axvline(0.0, color="grey", linestyle="--")
    ax.set_yticks(list(positions.values()), list(positions), fontsize=7)
    ax.set_ylim(-len(ordered) + 0.4, 0.6)
    ax.set(xlabel="achieved - attainable sparsity", title="(c) error by model: runs, layers")
    return figure


def accuracy_vs_sparsity(record: Record) -> Figure:
    rows = record.rows()
    baselines = record.rows("baseline")
    # (a): the first model's arms at the scale most of them ran at, against fp32 of that scale
    first = max(
        (b for b in baselines if b["model"] == baselines[0]["model"]),
        key=lambda b: sum(row.get("reference") == b["run"] for row in rows),
    )
    figure, axes = subplots(ncols=2, width=5.8, height=4.8)
    ax = axes[0][0]
    mine = [row for row in rows if row.get("reference") == first["run"]]
    seeds = defaultdict(list)
    for row in record.rows("seeds"):
        seeds[row["run"]].append((row["sparsity"], row["accuracy"]))
    for estimator, marker in MARKERS.items():
        arms = sorted((row for row in mine if row["estimator"] == estimator), key=lambda row: row["target"])
        if arms:
            errorbars(
                ax,
                arms,
                "accuracy",
                "sparsity",
                marker=marker,
                linestyle="-" if estimator == "lognormal" else "none",
                capsize=2,
                label=estimator,
            )
    for row in mine:
        points = [p for p in seeds[row["run"]] if p[0] is not None]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=8, color="k", alpha=0.4, linewidths=0)
    baseline_band(ax, first, "accuracy", f"no pruning: {first['label']}")
    ax.set(xlabel="achieved gradient sparsity", ylabel="test accuracy")
    ax.set_title(f"(a) {first['model']}, {first['scale']}", fontsize=8, wrap=True)
    ax.legend(fontsize=8, loc="lower left")
    ax = axes[0][1]
    for index, baseline in enumerate(baselines):
        arms = sorted(
            (r for r in rows if r.get("reference") == baseline["run"]), key=lambda r: value(r, "sparsity")
        )
        x = [value(r, "sparsity") for r in arms]
        gap_points(ax, arms, x, color=f"C{index}")
        for row, position in zip(arms, x, strict=True):
            if baseline is first and row.get("verdict") not in ("better", "worse"):
                continue  # (a) names these arms; label only their decided ones here
            ax.annotate(
                row["label"],
                (position, value(row, "gap_pt")),
                fontsize=6,
                xytext=(4, 2),
                textcoords="offset points",
            )
        ax.plot(
            [], [], "o", color=f"C{index}", label=f"{baseline['model']}, {baseline['scale'].split(', ')[-1]}"
        )
    ax.axhline(0, color="k", linewidth=0.8)
    ax.set(
        xlabel="achieved gradient sparsity",
        ylabel="accuracy - fp32 of its model and scale (pt)",
        title="(b) every arm against fp32 (filled: better or worse)",
    )
    ax.legend(fontsize=8, loc="lower left")
    return figure


def heterogeneous_sparsity(record: Record) -> Figure:
    rows, layers = record.rows(), record.rows("layers")
    constrained = rows[0]
    figure, axes = subplots(ncols=3, width=4.8, height=4.4)
    index = [row["index"] for row in layers]
    axes[0][0].bar(
        index,
        [value(row, "sparsity") for row in layers],
        yerr=interval(layers, "sparsity"),
        capsize=1,
        color="C3",
        label="constrained, per layer",
    )
    axes[0][0].axhline(constrained["target"], color="grey", linestyle="--", label="overall target")
    axes[0][0].axhline(value(constrained, "sparsity"), color="k", linestyle=":", label="achieved overall")
    for key, fmt, label in (
        ("predicted_cosine", "o-", "predicted (fit)"),
        ("measured_cosine", "s--", "measured"),
    ):
        errorbars(axes[0][1], layers, key, index, fmt=fmt, capsize=2, label=label)
    low = min((value(row, "sparsity") for row in layers), default=0.0)
    axes[0][0].set(
        xlabel="layer index (input to output)",
        ylabel="achieved sparsity",
        title="(a)",
        ylim=(max(0.0, low - 0.05), 1),
    )
    limits = [value(row, "limit") for row in layers]
    axes[0][1].step(index, limits, where="mid", color="grey", linestyle="--", label="cosine limit")
    axes[0][1].set(xlabel="layer index (input to output)", ylabel="cosine similarity", title="(b)")
    for ax in axes[0][:2]:
        ax.legend(fontsize=8)
    ax = axes[0][2]
    homogeneous = rows[1:]
    errorbars(ax, homogeneous, "accuracy", "sparsity", fmt="o-", capsize=2, label="homogeneous")
    errorbars(
        ax,
        [constrained],
        "accuracy",
        "sparsity",
        fmt="*",
        color="C3",
        markersize=14,
        capsize=2,
        label="constrained",
    )
    seeds = defaultdict(list)
    for row in record.rows("seeds"):
        seeds[row["run"]].append(row)
    for row in rows:
        points = seeds[row["run"]]
        ax.scatter(
            [p["sparsity"] for p in points],
            [p["accuracy"] for p in points],
            s=8,
            color="k",
            alpha=0.4,
            linewidths=0,
        )
    ax.set(xlabel="overall achieved sparsity", ylabel="test accuracy", title="(c)")
    ax.legend(fontsize=8)
    return figure
