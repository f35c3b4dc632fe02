"""A7-A9: stochastic pruning of neural gradients, drawn from their records."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.tables import Record
from gradcomp.plots.style import baseline_band, errorbars, interval, subplots, value

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
    _misses(axes[0][2], overall, layers, models, by_model)
    return figure


def _rows_by_group(
    ax: Axes, groups: dict[str, list[dict]], label: Callable[[dict], str], colours: dict[str, str]
) -> dict[str, int]:
    """One row per run, top down, under a header row per group (its name, in its colour where `colours`
    gives one); returns each run's row position. The headers have rows of their own so that no data point
    sits under a group's name."""
    positions, ticks, names = {}, [], []
    row = 0
    for index, (group, rows) in enumerate(groups.items()):
        if index:
            ax.axhline(row + 0.5, color="grey", linewidth=0.8)
        ticks.append(row)
        names.append(group)
        row -= 1
        for member in rows:
            positions[member["run"]] = row
            ticks.append(row)
            names.append(label(member))
            row -= 1
    ax.set_yticks(ticks, names, fontsize=7)
    for tick, name in zip(ax.get_yticklabels(), names, strict=True):
        if name in groups:
            tick.set(fontweight="bold", fontstyle="italic", color=colours.get(name, "k"))
    ax.set_ylim(row + 0.5, 0.5)
    return positions


def _misses(
    ax: Axes, overall: list[dict], layers: list[dict], models: list[str], marker: Callable[[dict], str]
) -> None:
    """(c) Each run's achieved sparsity less its target (large, 95 % CI) and its layers' (small), grouped by
    model, with the attainable sparsity less the target (grey bar): a run whose layers had more zeros than
    the target before pruning misses the target by construction and is judged against that bar."""
    groups = {model: [row for row in overall if row["model"] == model] for model in models}
    positions = _rows_by_group(ax, groups, lambda row: row["run"], {})
    for row in overall:
        ax.plot(
            [value(row, "attainable") - row["target"]],
            [positions[row["run"]]],
            "|",
            color="0.45",
            markersize=14,
            markeredgewidth=2.5,
            zorder=1,
        )
        ax.errorbar(
            [value(row, "achieved") - row["target"]],
            [positions[row["run"]]],
            xerr=interval([row], "achieved"),
            fmt=marker(row),
            color=COLOURS[row["estimator"]],
            markersize=5,
            capsize=2,
            zorder=2,
        )
    for row in layers:
        ax.scatter(
            value(row, "achieved") - row["target"],
            positions[row["run"]] + 0.25,
            marker=marker(row),
            s=8,
            alpha=0.35,
            color=COLOURS[row["estimator"]],
        )
    ax.axvline(0.0, color="grey", linestyle="--")
    ax.set(xlabel="achieved sparsity - target", title="(c) miss by model: runs, layers")
    bar = Line2D([], [], color="0.45", marker="|", markersize=10, markeredgewidth=2, linestyle="none")
    ax.legend(
        [bar, Line2D([], [], color="grey", linestyle="--")],
        ["attainable - target", "on target"],
        fontsize=7,
        loc="lower right",
    )


def accuracy_vs_sparsity(record: Record) -> Figure:
    rows = record.rows()
    baselines = record.rows("baseline")
    # (a): the first model's arms at the scale most of them ran at, against fp32 of that scale
    first = max(
        (b for b in baselines if b["model"] == baselines[0]["model"]),
        key=lambda b: sum(row.get("reference") == b["run"] for row in rows),
    )
    figure, axes = subplots(ncols=2, width=6.2, height=4.8)
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
    ax.scatter([], [], s=8, color="k", alpha=0.4, linewidths=0, label="each seed")
    baseline_band(ax, first, "accuracy", f"no pruning: {first['label']}")
    ax.set(xlabel="achieved gradient sparsity", ylabel="test accuracy")
    ax.set_title(f"(a) {first['model']}, {first['scale']}", fontsize=8, wrap=True)
    ax.legend(fontsize=8, loc="lower left")
    _gaps(axes[0][1], record, baselines)
    return figure


def _gaps(ax: Axes, record: Record, baselines: list[dict]) -> None:
    """(b) Every arm's paired accuracy difference from the fp32 run of its model and scale, one row per arm
    (its achieved sparsity in its label, a claim's arm marked), grouped and coloured by that fp32 run."""
    claims = {decision["claim"] for decision in record.claims}
    claimed = {
        c["arm"]: c["family"].split()[0]
        for c in record.comparisons
        if c.get("family") and c["family"].split()[0] in claims
    }
    groups, colours = {}, {}
    for index, baseline in enumerate(baselines):
        name = f"{baseline['model']}, {baseline['scale'].split(', ')[-1]}"
        groups[name] = sorted(
            (r for r in record.rows() if r.get("reference") == baseline["run"]),
            key=lambda r: value(r, "sparsity"),
        )
        colours[name] = f"C{index}"

    def label(row: dict) -> str:
        claim = f" (claim {claimed[row['run']]})" if row["run"] in claimed else ""
        return f"{row['label']}{claim}: sparsity {value(row, 'sparsity'):.2f}"

    positions = _rows_by_group(ax, groups, label, colours)
    for name, arms in groups.items():
        for row in arms:
            gap = Estimate.read(row, "gap_pt")
            if gap is None or gap.n == 0:
                continue
            low, high = gap.interval if gap.interval is not None else (gap.mean, gap.mean)
            decided = row.get("verdict") in ("better", "worse")
            ax.errorbar(
                [gap.mean],
                [positions[row["run"]]],
                xerr=[[gap.mean - low], [high - gap.mean]],
                fmt="o",
                capsize=3,
                color=colours[name],
                markerfacecolor=colours[name] if decided else "white",
            )
    ax.axvline(0, color="k", linewidth=0.8)
    ax.set_xlabel("accuracy - fp32 of its model and scale (pt)")
    ax.set_title("(b) each arm against fp32, paired (filled: better or worse)", fontsize=9)


def heterogeneous_sparsity(record: Record) -> Figure:
    rows, layers = record.rows(), record.rows("layers")
    constrained = rows[0]
    figure, axes = subplots(ncols=3, width=4.8, height=4.4)
    ax = axes[0][0]
    errorbars(
        ax,
        layers,
        "sparsity",
        [row["index"] for row in layers],
        fmt="o",
        color="C3",
        capsize=2,
        label="constrained, per layer",
    )
    ax.axhline(constrained["target"], color="grey", linestyle="--", label="overall target")
    ax.axhline(value(constrained, "sparsity"), color="k", linestyle=":", label="achieved overall")
    ax.set(xlabel="layer index (input to output)", ylabel="achieved sparsity", title="(a)")
    ax = axes[0][1]
    limited = [row for row in layers if Estimate.read(row, "limit") is not None]  # the layers with a limit
    index = [row["index"] for row in limited]
    for key, fmt, label in (
        ("predicted_cosine", "o-", "predicted (fit)"),
        ("measured_cosine", "s--", "measured"),
    ):
        errorbars(ax, limited, key, index, fmt=fmt, capsize=2, label=label)
    ax.step(
        index,
        [value(row, "limit") for row in limited],
        where="mid",
        color="grey",
        linestyle="--",
        label="cosine limit",
    )
    ax.set(
        xlabel="layer index (input to output)", ylabel="cosine similarity", title="(b) layers with a limit"
    )
    ax.set_xlim(axes[0][0].get_xlim())  # the same layers under each other's index
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
        markerfacecolor="none",  # hollow: a homogeneous run at the same sparsity shows through
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
            label="each seed" if row is constrained else None,
        )
    ax.set(xlabel="overall achieved sparsity", ylabel="test accuracy", title="(c)")
    ax.legend(fontsize=8)
    return figure
