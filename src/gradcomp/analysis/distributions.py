"""A1-A3: what neural gradients look like (log2 histograms, goodness of fit, statistics over training), from
the probe (`probe.npz`) of a run, at every seed it is read with."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from gradcomp.analysis.fit import DISTRIBUTIONS, ks_statistics
from gradcomp.analysis.runs import Run, RunGroup, seed_list, training_context
from gradcomp.analysis.seeds import Estimate, compare
from gradcomp.analysis.tables import Result, Table
from gradcomp.experiments import AtCheckpoint, GoodnessOfFit
from gradcomp.probe import load_probe

KINDS = ("gradient", "weight", "activation")
SHOWN_LAYERS = 4  # A1: histograms of this many layers, first to last


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
    order = {name: i for i, name in enumerate(dict.fromkeys(probe["layer"][probe["kind"] != "gradient"]))}
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


def _context(group: RunGroup) -> str:
    return f"of the {group.name} run ({training_context({group.name: group})})"


# --- A1 -----------------------------------------------------------------------------------------------------
def gradient_histograms(settings: AtCheckpoint, runs: dict[str, RunGroup]) -> Result:
    group = runs[settings.run]
    statistics: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    steps, sigma_medians = set(), []
    for run in group.runs.values():
        probe = _probe(run)
        last = int(probe["step"].max())
        steps.add(last)
        sigma_medians.append(float(np.median(probe["log2_std"][_rows(probe, "gradient", last)])))
        for kind in KINDS:
            for index in _rows(probe, kind, last):
                values = statistics[str(probe["layer"][index]), kind]
                values["log2_mean"].append(float(probe["log2_mean"][index]))
                values["log2_std"].append(float(probe["log2_std"][index]))
                values["zero_fraction"].append(float(probe["zeros"][index] / probe["count"][index]))
    rows = _aggregate(statistics, ("layer", "kind"))

    # the figure: the first seed's histograms (bins of the probe) and linear-scale samples
    seed, run = min(group.runs.items())
    probe = _probe(run)
    last = int(probe["step"].max())
    edges = probe["edges"]
    centres = (edges[1:] + edges[:-1]) / 2
    gradient_rows = _rows(probe, "gradient", last)
    shown = gradient_rows[np.unique(np.linspace(0, len(gradient_rows) - 1, SHOWN_LAYERS).round().astype(int))]
    middle = str(probe["layer"][gradient_rows[len(gradient_rows) // 2]])
    histograms = []
    for index in shown:
        histograms += [
            {
                "panel": "log2",
                "layer": str(probe["layer"][index]),
                "kind": "gradient",
                "log2_centre": float(c),
                "count": int(n),
                "log2_mean": float(probe["log2_mean"][index]),
                "log2_std": float(probe["log2_std"][index]),
                "zero_fraction": float(probe["zeros"][index] / probe["count"][index]),
            }
            for c, n in zip(centres, probe["hist"][index], strict=True)
        ]
    linear = []
    for kind in KINDS:
        match = np.flatnonzero((probe["kind"] == kind) & (probe["layer"] == middle) & (probe["step"] == last))
        if not len(match):
            continue
        histograms += [
            {"panel": "kinds", "layer": middle, "kind": kind, "log2_centre": float(c), "count": int(n)}
            for c, n in zip(centres, probe["hist"][match[0]], strict=True)
        ]
        samples = probe["samples"][match[0]]
        samples = samples[np.isfinite(samples)]
        if samples.size:
            counts, bin_edges = np.histogram(samples, bins=80)
            linear += [
                {"layer": middle, "kind": kind, "left": float(a), "right": float(b), "count": int(n)}
                for a, b, n in zip(bin_edges[:-1], bin_edges[1:], counts, strict=True)
            ]
    gradients = [row for row in rows if row["kind"] == "gradient"]
    headline = {
        "step": max(steps),
        "gradient_log2_sigma_median": Estimate.of(sigma_medians).columns("binades"),
        "gradient_log2_mean_range": [
            min(row["log2_mean_mean"] for row in gradients),
            max(row["log2_mean_mean"] for row in gradients),
        ],
    }
    caption = f"""Top: histograms of log2|g| of the neural gradients (loss gradient w.r.t. a convolution's
        output) of {len(shown)} layers, from the first to the last, at the last probed step (step {last}) of
        seed {seed} {_context(group)}, with the normal density of the same mean and standard deviation (the
        lognormal fit) overlaid; exact zeros are counted apart. Bottom: layer {middle}'s gradient, weights
        and activations in linear scale (reservoir samples) and their log2|x| distributions: gradients are
        spiky and heavy-tailed, weights and activations bell-shaped. Table: every layer's log2 mean, log2
        standard deviation and share of exact zeros at the last probed step, mean and 95 % CI over
        {seed_list(group.seeds)}."""
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
    group = runs[settings.run]
    families = list(settings.distributions)
    per_layer: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    mean_d: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)  # (kind, family) -> seed -> mean D
    best_counts: dict[str, list[int]] = defaultdict(list)
    for seed, run in group.runs.items():
        probe = _probe(run)
        last = int(probe["step"].max())
        seed_d: dict[tuple[str, str], list[float]] = defaultdict(list)
        best = []
        for kind in KINDS:
            chosen = families if kind == "gradient" else ["lognormal"]
            for index in _rows(probe, kind, last):
                samples = probe["samples"][index]
                fits = ks_statistics(np.abs(samples[np.isfinite(samples)]), chosen)
                for family, statistic in fits.items():
                    per_layer[kind, str(probe["layer"][index]), family]["ks_d"].append(statistic)
                    seed_d[kind, family].append(statistic)
                if kind == "gradient":
                    best.append(min(fits, key=fits.get))
        for key, values in seed_d.items():
            mean_d[key][seed] = float(np.mean(values))
        for family in families:
            best_counts[family].append(best.count(family))
    layers = _aggregate(per_layer, ("kind", "layer", "family"))
    rows = [
        {
            "kind": kind,
            "family": family,
            **Estimate.of(list(values.values())).columns("mean_ks_d"),
            "best_in_layers_mean": float(np.mean(best_counts[family])) if kind == "gradient" else None,
            "seeds": len(values),
        }
        for (kind, family), values in mean_d.items()
    ]
    comparisons = compare(
        [
            ((family, mean_d["gradient", family]), ("lognormal", mean_d["gradient", "lognormal"]))
            for family in families
            if family != "lognormal"
        ],
        scale=1.0,
        unit="D",
    )
    order = sorted(families, key=lambda f: np.mean(list(mean_d["gradient", f].values())))
    notes = []
    if order[0] != "lognormal":
        best_row = next(row for row in rows if row["kind"] == "gradient" and row["family"] == order[0])
        verdict = next(c for c in comparisons if c.a == order[0])
        notes.append(
            f"{order[0]} fits these gradients better than the lognormal on average (mean D "
            f"{best_row['mean_ks_d_mean']:.3f}; {verdict.statement}); both fit far better than the "
            f"linear-scale families (worst: {order[-1]}): 'near-lognormal', close to Gaussian in log space."
        )
    caption = f"""Kolmogorov-Smirnov statistic D (lower is better) of |x| against distributions fitted by
        maximum likelihood (location 0): {", ".join(families)}, per layer, on the reservoir samples (non-zero
        values) at the last probed step {_context(group)}. Left: neural gradients, every family (boxes over
        layers, dots: each layer's mean over seeds). Right: the lognormal D of gradients next to that of
        weights and activations of the same layers. Table: mean D over layers, mean and 95 % CI over
        {seed_list(group.seeds)}; comparisons: each family's mean D against the lognormal's, paired by seed
        (negative: fits better than the lognormal)."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Mean KS statistic over layers", rows),
            "layers": Table("KS statistic per layer", layers, markdown=False),
        },
        comparisons=comparisons,
        headline={
            "gradient_mean_ks_d": {
                family: float(np.mean(list(mean_d["gradient", family].values()))) for family in families
            },
            "best_family_counts_mean": {
                f: float(np.mean(best_counts[f])) for f in families if any(best_counts[f])
            },
        },
        notes=notes,
    )


# --- A3 -----------------------------------------------------------------------------------------------------
def statistics_over_training(settings: AtCheckpoint, runs: dict[str, RunGroup]) -> Result:
    group = runs[settings.run]
    curves: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    spreads, sigmas, drifts, firsts = [], [], [], set()
    for run in group.runs.values():
        probe = _probe(run)
        rows = [
            (
                str(probe["layer"][i]),
                int(probe["step"][i]),
                float(probe["log2_mean"][i]),
                float(probe["log2_std"][i]),
            )
            for i in _rows(probe, "gradient")
            if np.isfinite(probe["log2_mean"][i])  # all-zero gradients (e.g. zero-initialised residual BN)
        ]
        for layer, step, mean, std in rows:
            curves[layer, step]["log2_mean"].append(mean)
            curves[layer, step]["log2_std"].append(std)
        layers = {row[0] for row in rows}
        complete = sorted(
            s for s in {row[1] for row in rows} if sum(row[1] == s for row in rows) == len(layers)
        )
        first, last = complete[0], complete[-1]
        firsts.add(first)
        means = {step: [row[2] for row in rows if row[1] == step] for step in (first, last)}
        spreads.append(max(means[last]) - min(means[last]))
        sigmas.append(float(np.mean([row[3] for row in rows if row[1] == last])))
        drifts.append(float(np.mean(means[last]) - np.mean(means[first])))
    table = _aggregate(curves, ("layer", "step"))
    last_step = max(row["step"] for row in table)
    final = [row for row in table if row["step"] == last_step]
    headline = {
        "layers": len(final),
        "mu2_spread_last_step_binades": Estimate.of(spreads).columns("binades"),
        "sigma2_mean_last_step": Estimate.of(sigmas).columns("binades"),
        "drift_from_step": min(firsts),
        "mu2_mean_drift_binades": Estimate.of(drifts).columns("binades"),
    }
    caption = f"""Mean (mu2) and standard deviation (sigma2) of log2|g| over the non-zero neural gradients of
        every probed layer, against the training step {_context(group)} (probe every few steps); lines: mean
        over {seed_list(group.seeds)}, bands: 95 % CI. Layers sit many binades apart and drift during
        training, which is why one global loss scale cannot suit them all; sigma2 sets the exponent bits an
        FP format needs. The table gives every layer at the last probed step; the headline's spread, mean
        sigma2 and drift are computed per seed, then averaged."""
    return Result(
        caption=caption,
        tables={
            "main": Table(f"Per-layer statistics at step {last_step}", final),
            "curves": Table("Per-layer statistics at every probed step", table, markdown=False),
        },
        headline=headline,
    )
