"""A1-A3: what neural gradients look like (log2 histograms, goodness of fit, statistics over training), from
the probes (`probe.npz`) of one run shown in detail and of other architecture families' runs next to it
(`models`), at every seed each is read with. Every table row names its model (`RunGroup.model`)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from gradcomp.analysis.fit import DISTRIBUTIONS, ks_statistics
from gradcomp.analysis.runs import Run, RunGroup, one_per_model, training_context
from gradcomp.analysis.seeds import Estimate, compare
from gradcomp.analysis.tables import Result, Table
from gradcomp.experiments import AcrossModels, GoodnessOfFit
from gradcomp.probe import load_probe

KINDS = ("gradient", "weight", "activation")
SHOWN_LAYERS = 4  # A1: histograms of this many layers per model, first to last
# the two populations of a layer's gradient the probe records: what the reference code fits (entries whose
# gradient at the following BatchNorm's output is non-zero) and every non-zero entry (the mixture)
POPULATIONS = {"gradient_active": "BN-output non-zero", "gradient": "all non-zero"}


def _probe(run: Run) -> dict[str, np.ndarray]:
    path = run.folder / "probe.npz"
    if not path.exists():
        raise FileNotFoundError(f"{path}: run {run.name!r} was trained without a probe (set runs.*.probe)")
    return load_probe(path)


def _rows(probe: dict[str, np.ndarray], kind: str, step: int | None = None) -> np.ndarray:
    """Row indices of one tensor kind (at one step), in forward layer order (gradients arrive backwards)."""
    mask = probe["kind"] == kind
    if step is not None:
        mask &= probe["step"] == step
    forward = ~np.isin(probe["kind"], list(POPULATIONS))
    names = probe["layer"][forward] if forward.any() else probe["layer"][::-1]  # gradients only: reversed
    order = {name: i for i, name in enumerate(dict.fromkeys(names))}
    rows = np.flatnonzero(mask)
    return rows[np.argsort([order.get(name, len(order)) for name in probe["layer"][rows]], kind="stable")]


def _aggregate(per_seed: dict[tuple, dict[str, list[float]]], keys: tuple[str, ...]) -> list[dict]:
    """Rows keyed by `keys`, each statistic as mean / sd / 95 % CI over seeds, and the seed count."""
    rows = []
    for key, statistics in per_seed.items():
        row = dict(zip(keys, key, strict=True))
        for name, values in statistics.items():
            row |= Estimate.of(values).columns(name)
        row["seeds"] = max(len(values) for values in statistics.values())
        rows.append(row)
    return rows


def _groups(settings: AcrossModels, runs: dict[str, RunGroup]) -> list[RunGroup]:
    """The run shown in detail first, then the other models' runs (each a different model: rows are keyed by
    the model trained)."""
    groups = [runs[name] for name in settings.runs_read(list(runs))]
    one_per_model(groups, "models")
    return groups


def _models(groups: list[RunGroup]) -> str:
    """Caption text from the runs: each model, where its gradients were captured, which populations it has."""
    parts = []
    for group in groups:
        probe = _probe(group.first)
        last = int(probe["step"].max())
        layers, followed = len(_rows(probe, "gradient", last)), len(_rows(probe, "gradient_active", last))
        populations = (
            f"{followed} of them followed by a BatchNorm (both populations)"
            if followed
            else "none followed by a BatchNorm (all non-zero entries only)"
        )
        parts.append(
            f"{group.model} (run {group.name}): gradients at its {group.compression_points}, {layers} "
            f"layers, {populations}"
        )
    return "; ".join(parts)


def _context(groups: list[RunGroup]) -> str:
    """Caption text: the models with their compression points, then how they were trained."""
    return f"Models: {_models(groups)}. Trained as {training_context({g.name: g for g in groups})}"


def _steps(steps: set[int]) -> str:
    return f"step {min(steps)}" if len(steps) == 1 else f"steps {min(steps)}-{max(steps)}, per model"


def _layer_order(probe: dict[str, np.ndarray]) -> dict[str, float]:
    """Layer -> relative depth (0: first layer probed, 1: last), from the gradient rows' forward order."""
    layers = list(dict.fromkeys(str(name) for name in probe["layer"][_rows(probe, "gradient")]))
    return {name: i / max(len(layers) - 1, 1) for i, name in enumerate(layers)}


# --- A1 -----------------------------------------------------------------------------------------------------
def _log2_histograms(model: str, probe: dict[str, np.ndarray], last: int) -> tuple[list[dict], list[str]]:
    """Rows of the drawn log2 histograms of `SHOWN_LAYERS` layers (first to last), both populations."""
    centres = (probe["edges"][1:] + probe["edges"][:-1]) / 2
    gradient_rows = _rows(probe, "gradient", last)
    picked = np.unique(np.linspace(0, len(gradient_rows) - 1, SHOWN_LAYERS).round().astype(int))
    shown = [str(probe["layer"][gradient_rows[i]]) for i in picked]
    totals = {str(probe["layer"][index]): int(probe["count"][index]) for index in gradient_rows}
    histograms = []
    for population, name in POPULATIONS.items():
        for index in _rows(probe, population, last):
            layer = str(probe["layer"][index])
            if layer in shown:
                histograms += [
                    {
                        "panel": "log2",
                        "model": model,
                        "layer": layer,
                        "population": name,
                        "log2_centre": float(c),
                        "count": int(n),
                        "log2_mean": float(probe["log2_mean"][index]),
                        "log2_std": float(probe["log2_std"][index]),
                        "share": float(probe["count"][index] / totals[layer]),
                    }
                    for c, n in zip(centres, probe["hist"][index], strict=True)
                ]
    return histograms, shown


def _kinds_histograms(model: str, probe: dict[str, np.ndarray], last: int, layer: str) -> tuple[list, list]:
    """One layer's gradient, weight and activation: log2 histograms and linear-scale reservoir histograms."""
    centres = (probe["edges"][1:] + probe["edges"][:-1]) / 2
    histograms, linear = [], []
    for kind in KINDS:
        match = np.flatnonzero((probe["kind"] == kind) & (probe["layer"] == layer) & (probe["step"] == last))
        if not len(match):
            continue
        histograms += [
            {
                "panel": "kinds",
                "model": model,
                "layer": layer,
                "kind": kind,
                "log2_centre": float(c),
                "count": n,
            }
            for c, n in zip(centres, probe["hist"][match[0]].tolist(), strict=True)
        ]
        samples = probe["samples"][match[0]]
        samples = samples[np.isfinite(samples)]
        if samples.size:
            counts, bin_edges = np.histogram(samples, bins=80)
            linear += [
                {
                    "model": model,
                    "layer": layer,
                    "kind": kind,
                    "left": float(a),
                    "right": float(b),
                    "count": int(n),
                }
                for a, b, n in zip(bin_edges[:-1], bin_edges[1:], counts, strict=True)
            ]
    return histograms, linear


def gradient_histograms(settings: AcrossModels, runs: dict[str, RunGroup]) -> Result:
    groups = _groups(settings, runs)
    statistics: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    steps: set[int] = set()
    histograms, linear = [], []
    sigma_medians: dict[tuple[str, str], list[float]] = defaultdict(list)  # (model, population) -> per seed
    for group in groups:
        for run in group.runs.values():
            probe = _probe(run)
            last = int(probe["step"].max())
            steps.add(last)
            for population in POPULATIONS:
                rows = _rows(probe, population, last)
                if len(rows):
                    sigma_medians[group.model, population].append(
                        float(np.nanmedian(probe["log2_std"][rows]))
                    )
            for kind in (*KINDS, "gradient_active"):
                for index in _rows(probe, kind, last):
                    values = statistics[group.model, str(probe["layer"][index]), kind]
                    values["log2_mean"].append(float(probe["log2_mean"][index]))
                    values["log2_std"].append(float(probe["log2_std"][index]))
                    values["zero_fraction"].append(float(probe["zeros"][index] / probe["count"][index]))
                    values["elements"].append(float(probe["count"][index]))
        # the figure: each model's first seed (bins of the probe); the detailed run's linear-scale samples too
        probe = _probe(group.first)
        last = int(probe["step"].max())
        drawn, shown = _log2_histograms(group.model, probe, last)
        histograms += drawn
        if group is groups[0]:
            gradient_rows = _rows(probe, "gradient", last)
            middle = str(probe["layer"][gradient_rows[len(gradient_rows) // 2]])
            drawn, linear = _kinds_histograms(group.model, probe, last, middle)
            histograms += drawn
            detail = (len(shown), last, min(group.seeds))
    rows = _aggregate(statistics, ("model", "layer", "kind"))
    headline: dict = {"step": max(steps)}
    for group in groups:
        numbers = {}
        for population in POPULATIONS:
            chosen = [row for row in rows if row["model"] == group.model and row["kind"] == population]
            if chosen:
                numbers[f"{population}_sigma2_median"] = Estimate.of(
                    sigma_medians[group.model, population]
                ).columns("binades")
                means = [row["log2_mean_mean"] for row in chosen if np.isfinite(row["log2_mean_mean"])]
                numbers[f"{population}_mu2_range"] = [min(means), max(means)] if means else None
        headline[group.model] = numbers
    shown, last, seed = detail
    others = (
        f" Further rows: the same for {' / '.join(g.model for g in groups[1:])}, one row each (the first "
        f"seed each was read with)."
        if len(groups) > 1
        else ""
    )
    caption = f"""Histograms of log2|g| of neural gradients (the loss gradient w.r.t. a probed layer's output)
        at the last probed step, each population with the normal density of its own mean and standard
        deviation (its lognormal fit): the entries whose gradient at the following BatchNorm's output is
        non-zero (what the reference code fits; the label gives their share of the layer) and all non-zero
        entries, which add BatchNorm's small mean corrections where the activation zeroed the gradient. Top
        row: {shown} layers of {groups[0].model}, from the first to the last, at step {last} of seed {seed}.
        Second row: its middle layer's gradient, weights and activations in linear scale (reservoir samples)
        and their log2|x| distributions (gradients spiky and heavy-tailed, weights and activations
        bell-shaped).{others} {_context(groups)}. Table: every model's and layer's log2 mean, log2 standard
        deviation, share of exact zeros and elements per kind (gradient_active: BatchNorm-output non-zero
        entries) at the last probed step ({_steps(steps)}), mean and 95 % CI over the seeds; headline: per
        model and population, the median over layers of sigma2 (per seed, then over seeds) and the range of
        mu2 over layers."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Per-layer statistics at the last probed step", rows),
            "histograms": Table("Histograms drawn (first seed)", histograms, markdown=False),
            "linear": Table("Linear-scale histograms drawn (first seed)", linear, markdown=False),
        },
        headline=headline,
    )


# --- A2 -----------------------------------------------------------------------------------------------------
def goodness_of_fit(settings: GoodnessOfFit, runs: dict[str, RunGroup]) -> Result:
    unknown = sorted(set(settings.distributions) - set(DISTRIBUTIONS))
    if unknown:
        raise ValueError(
            f"experiments.A2.distributions: unknown {unknown}; choose from {sorted(DISTRIBUTIONS)}"
        )
    groups = _groups(settings, runs)
    families = list(settings.distributions)
    per_layer: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    mean_d: dict[tuple, dict[int, float]] = defaultdict(dict)  # (model, kind, family) -> seed -> mean D
    best_counts: dict[tuple, list[int]] = defaultdict(list)  # (model, population, family) -> per seed
    layer_counts: dict[tuple, int] = {}  # (model, population) -> layers fitted
    for group in groups:
        # every family on both gradient populations; the detailed run's weights and activations for contrast
        kinds = [*POPULATIONS, *(KINDS[1:] if group is groups[0] else ())]
        for seed, run in group.runs.items():
            probe = _probe(run)
            last = int(probe["step"].max())
            seed_d: dict[tuple, list[float]] = defaultdict(list)
            for kind in kinds:
                best = []
                for index in _rows(probe, kind, last):
                    samples = probe["samples"][index]
                    chosen = families if kind in POPULATIONS else ["lognormal"]
                    fits = ks_statistics(np.abs(samples[np.isfinite(samples)]), chosen)
                    if not np.isfinite(list(fits.values())).all():
                        continue  # too few non-zero samples to fit
                    for family, statistic in fits.items():
                        per_layer[group.model, kind, str(probe["layer"][index]), family]["ks_d"].append(
                            statistic
                        )
                        seed_d[kind, family].append(statistic)
                    best.append(min(fits, key=fits.get))
                if kind in POPULATIONS and best:
                    layer_counts[group.model, kind] = len(best)
                    for family in families:
                        best_counts[group.model, kind, family].append(best.count(family))
            for (kind, family), values in seed_d.items():
                mean_d[group.model, kind, family][seed] = float(np.mean(values))
    layers = _aggregate(per_layer, ("model", "kind", "layer", "family"))
    rows = [
        {
            "model": model,
            "kind": kind,
            "family": family,
            **Estimate.of(list(values.values())).columns("mean_ks_d"),
            "best_in_layers_mean": (
                float(np.mean(best_counts[model, kind, family])) if kind in POPULATIONS else None
            ),
            "layers": layer_counts.get((model, kind)),
            "seeds": len(values),
        }
        for (model, kind, family), values in mean_d.items()
    ]

    def average(model: str, kind: str, family: str) -> float:
        return float(np.mean(list(mean_d[model, kind, family].values())))

    # paired by seed, on all non-zero entries (every model has them): on the detailed run every family
    # against the lognormal, on each other model its best alternative against the lognormal
    pairs, notes = [], []
    for group in groups:
        fitted = [f for f in families if (group.model, "gradient", f) in mean_d]
        if "lognormal" not in fitted:
            continue
        order = sorted(fitted, key=lambda f: average(group.model, "gradient", f))
        short = group.config["model"]
        chosen = [f for f in order if f != "lognormal"][: None if group is groups[0] else 1]
        pairs += [
            (
                (f"{family} D ({short})", mean_d[group.model, "gradient", family]),
                (f"lognormal D ({short})", mean_d[group.model, "gradient", "lognormal"]),
            )
            for family in chosen
        ]
        if order[0] != "lognormal":
            notes.append(
                f"{group.model}: {order[0]} fits all non-zero gradient entries better than the lognormal on "
                f"average (mean D {average(group.model, 'gradient', order[0]):.3f} against "
                f"{average(group.model, 'gradient', 'lognormal'):.3f}; the comparison below says whether "
                f"beyond seed noise); worst: {order[-1]}."
            )
    comparisons = compare(pairs, scale=1.0, unit="D")
    headline: dict = {}
    for group in groups:
        numbers = {}
        for kind in POPULATIONS:
            fitted = {f: average(group.model, kind, f) for f in families if (group.model, kind, f) in mean_d}
            if fitted:
                numbers[f"{kind}_mean_ks_d"] = fitted
                counts = {f: float(np.mean(best_counts[group.model, kind, f])) for f in families}
                numbers[f"{kind}_best_family_counts_mean"] = {f: n for f, n in counts.items() if n}
        headline[group.model] = numbers
    caption = f"""Kolmogorov-Smirnov statistic D (lower is better) of |g| against distributions fitted by
        maximum likelihood (location 0): {", ".join(families)}, per layer, on the reservoir samples (non-zero
        values) at the last probed step, for both gradient populations (entries whose gradient at the
        following BatchNorm's output is non-zero, what the reference code fits, and all non-zero entries).
        Top left: {groups[0].model}, every family (boxes over layers, dots: each layer's mean over seeds).
        Top right: its lognormal D of gradients next to that of weights and activations of the same layers.
        Bottom left: the lognormal D per model and population; bottom right: the share of layers where each
        family fits best (mean over seeds), per model and population. {_context(groups)}. Table: mean D over
        layers, mean and 95 % CI over the seeds; comparisons, on all non-zero entries paired by seed: on
        {groups[0].model} every family against the lognormal, on each other model its best alternative
        against the lognormal (negative: fits better than the lognormal)."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Mean KS statistic over layers", rows),
            "layers": Table("KS statistic per layer", layers, markdown=False),
        },
        comparisons=comparisons,
        headline=headline,
        notes=notes,
    )


# --- A3 -----------------------------------------------------------------------------------------------------
def statistics_over_training(settings: AcrossModels, runs: dict[str, RunGroup]) -> Result:
    groups = _groups(settings, runs)
    curves: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    summary: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    per_seed: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    depths: dict[tuple[str, str], float] = {}
    firsts = set()
    for group in groups:
        for run in group.runs.values():
            probe = _probe(run)
            depths |= {(group.model, layer): d for layer, d in _layer_order(probe).items()}
            for population, name in POPULATIONS.items():
                rows = [
                    (
                        str(probe["layer"][i]),
                        int(probe["step"][i]),
                        float(probe["log2_mean"][i]),
                        float(probe["log2_std"][i]),
                    )
                    for i in _rows(probe, population)
                    if np.isfinite(probe["log2_mean"][i])  # all-zero gradients (zero-initialised residual BN)
                ]
                if not rows:
                    continue
                for layer, step, mean, std in rows:
                    curves[group.model, name, layer, step]["log2_mean"].append(mean)
                    curves[group.model, name, layer, step]["log2_std"].append(std)
                layers = {row[0] for row in rows}
                complete = sorted(
                    s for s in {row[1] for row in rows} if sum(row[1] == s for row in rows) == len(layers)
                )
                for step in complete:
                    means = [row[2] for row in rows if row[1] == step]
                    summary[group.model, name, step]["mu2_spread"].append(max(means) - min(means))
                    summary[group.model, name, step]["sigma2_mean"].append(
                        float(np.nanmean([row[3] for row in rows if row[1] == step]))
                    )
                first, last = complete[0], complete[-1]
                firsts.add(first)
                final = summary[group.model, name, last]
                per_seed[group.model, name]["spread"].append(final["mu2_spread"][-1])
                per_seed[group.model, name]["sigma"].append(final["sigma2_mean"][-1])
                means = {step: np.mean([row[2] for row in rows if row[1] == step]) for step in (first, last)}
                per_seed[group.model, name]["drift"].append(float(means[last] - means[first]))
    table = _aggregate(curves, ("model", "population", "layer", "step"))
    over_training = _aggregate(summary, ("model", "population", "step"))
    last_steps: dict[str, int] = {}
    for row in table:
        last_steps[row["model"]] = max(row["step"], last_steps.get(row["model"], row["step"]))
    final = [
        {**row, "depth": depths[row["model"], row["layer"]]}
        for row in table
        if row["step"] == last_steps[row["model"]]
    ]
    headline: dict = {"drift_from_step": min(firsts)}
    for group in groups:
        numbers = {"layers": len({row["layer"] for row in final if row["model"] == group.model})}
        for name in POPULATIONS.values():
            values = per_seed.get((group.model, name))
            if values:
                numbers[name] = {
                    "mu2_spread_last_step": Estimate.of(values["spread"]).columns("binades"),
                    "sigma2_mean_last_step": Estimate.of(values["sigma"]).columns("binades"),
                    "mu2_mean_drift": Estimate.of(values["drift"]).columns("binades"),
                }
        headline[group.model] = numbers
    caption = f"""Mean (mu2) and standard deviation (sigma2) of log2|g| of each probed layer's neural
        gradient (probe every few steps), for two populations: the entries whose gradient at the following
        BatchNorm's output is non-zero (what the reference code fits) and all non-zero entries (with
        BatchNorm's small mean corrections where the activation zeroed the gradient). Top rows: every layer
        of {groups[0].model} against the training step, one row per population; lines: mean over the seeds,
        bands: 95 % CI (left out where many layers would overlap). Bottom rows, every model: mu2 and sigma2
        of each layer at its last probed step against the layer's relative depth (0: first probed layer, 1:
        last) and, over training, the spread of mu2 over layers (max - min) and the mean sigma2; solid:
        BatchNorm-output non-zero entries, dashed: all non-zero. {_context(groups)}. Layers sit binades
        apart and drift during training, which is why one global loss scale may not suit them all; sigma2
        sets the exponent bits an FP format needs.
        The table gives every model's layers at the last probed step ({_steps(set(last_steps.values()))});
        the headline's spread of mu2 over layers, mean sigma2 and drift (from step {min(firsts)}) are
        computed per model, seed and population, then averaged over seeds."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Per-layer statistics at the last probed step", final),
            "curves": Table("Per-layer statistics at every probed step", table, markdown=False),
            "over_training": Table(
                "Spread of mu2 over layers and mean sigma2, per step", over_training, markdown=False
            ),
        },
        headline=headline,
    )
