"""A1-A3: what neural gradients look like (log2 histograms, goodness of fit, statistics over training), from
the probes (`probe.npz`) of one run shown in detail and of other architecture families' runs next to it
(`models`), at every seed each is read with. Every table row names its model (`RunGroup.model`)."""

from __future__ import annotations

import numpy as np

from gradcomp.analysis.claims import decide, deciding
from gradcomp.analysis.fit import DISTRIBUTIONS, ks_statistics
from gradcomp.analysis.runs import Run, RunGroup, training_context
from gradcomp.analysis.seeds import FRACTION, POSITIVE, Estimate, PerSeed
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import FAMILIES, Pair, compare, having, summarise
from gradcomp.experiments import AcrossModels, GoodnessOfFit
from gradcomp.training.probe import load_probe

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


def _groups(settings: AcrossModels, runs: dict[str, RunGroup]) -> list[RunGroup]:
    """The run shown in detail first, then the other models' runs (each a different model: rows are keyed by
    the model trained)."""
    groups = settings.present(settings.named_runs(list(runs)), runs)
    models = [group.model for group in groups]
    repeated = sorted({model for model in models if models.count(model) > 1})
    if repeated:
        raise ValueError(f"models: two runs train {repeated}; name one run per model")
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


def _note(groups: list[RunGroup]) -> str:
    """A table's note: the probed runs' training scale and seeds."""
    return f"Probed runs: {training_context({group.name: group for group in groups})}."


def _steps(steps: set[int]) -> str:
    return f"step {min(steps)}" if len(steps) == 1 else f"steps {min(steps)}-{max(steps)}, per model"


def _layer_order(probe: dict[str, np.ndarray]) -> dict[str, float]:
    """Layer -> relative depth (0: first layer probed, 1: last), from the gradient rows' forward order."""
    layers = list(dict.fromkeys(str(name) for name in probe["layer"][_rows(probe, "gradient")]))
    return {name: i / max(len(layers) - 1, 1) for i, name in enumerate(layers)}


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


# --- A1 -----------------------------------------------------------------------------------------------------
def _statistics(groups: list[RunGroup]) -> tuple[PerSeed, PerSeed, set[int]]:
    """Per seed: each model's and layer's log2 statistics per tensor kind at the last probed step, and per
    model and gradient population the median sigma2 over layers and the range of mu2."""
    layers = PerSeed(
        ("model", "layer", "kind"), {"log2_std": POSITIVE, "zero_fraction": FRACTION, "elements": POSITIVE}
    )
    models = PerSeed(("model", "population"), {"sigma2_median": POSITIVE})
    steps: set[int] = set()
    for group in groups:
        for seed, run in group.runs.items():
            probe = _probe(run)
            last = int(probe["step"].max())
            steps.add(last)
            for kind in (*KINDS, "gradient_active"):
                for index in _rows(probe, kind, last):
                    layers.add(
                        seed,
                        {"model": group.model, "layer": str(probe["layer"][index]), "kind": kind},
                        log2_mean=float(probe["log2_mean"][index]),
                        log2_std=float(probe["log2_std"][index]),
                        zero_fraction=float(probe["zeros"][index] / probe["count"][index]),
                        elements=float(probe["count"][index]),
                    )
            for population, name in POPULATIONS.items():
                rows = _rows(probe, population, last)
                means = probe["log2_mean"][rows]
                means = means[np.isfinite(means)]
                if len(rows) and means.size:
                    models.add(
                        seed,
                        {"model": group.model, "population": name},
                        sigma2_median=float(np.nanmedian(probe["log2_std"][rows])),
                        mu2_low=float(means.min()),
                        mu2_high=float(means.max()),
                    )
    return layers, models, steps


def _a1_caption(groups: list[RunGroup], shown: int, last: int, seed: int, steps: set[int]) -> str:
    others = (
        f" Further rows: the same for {' / '.join(g.model for g in groups[1:])}, one row each (the first "
        f"seed each was read with)."
        if len(groups) > 1
        else ""
    )
    return f"""Histograms of log2|g| of neural gradients (the loss gradient w.r.t. a probed layer's output)
        at the last probed step, each population with the normal density of its own mean and standard
        deviation (its lognormal fit): the entries whose gradient at the following BatchNorm's output is
        non-zero (what the reference code fits; the label gives their share of the layer) and all non-zero
        entries, which add BatchNorm's small mean corrections where the activation zeroed the gradient. Top
        row: {shown} layers of {groups[0].model}, from the first to the last, at step {last} of seed {seed}.
        Second row: its middle layer's gradient, weights and activations in linear scale (reservoir samples)
        and their log2|x| distributions (gradients spiky and heavy-tailed, weights and activations
        bell-shaped).{others} {_context(groups)}. Table: every model's and layer's log2 mean, log2 standard
        deviation, share of exact zeros and elements per kind (gradient_active: BatchNorm-output non-zero
        entries) at the last probed step ({_steps(steps)}), mean and 95 % CI over the seeds; per model and
        population, the median over layers of sigma2 and the lowest and highest mu2 (per seed, then over
        seeds)."""


def gradient_histograms(settings: AcrossModels, runs: dict[str, RunGroup]) -> Result:
    """A1: log2 histograms of neural gradients per layer with their lognormal fit, in every model."""
    groups = _groups(settings, runs)
    layers, models, steps = _statistics(groups)
    histograms, linear = [], []
    for group in groups:  # the figure: each model's first seed; the detailed run's linear-scale samples too
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
    summary = models.rows()
    findings = [
        f"{row['model']}, {row['population']} entries: median sigma2 over layers "
        f"{Estimate.read(row, 'sigma2_median').text()} binades; mu2 from {row['mu2_low_mean']:.1f} to "
        f"{row['mu2_high_mean']:.1f} over layers ({row['seeds']} seeds)."
        for row in summary
    ]
    return Result(
        caption=_a1_caption(groups, *detail, steps),
        tables={
            "main": Table("Per-layer statistics at the last probed step", layers.rows(), note=_note(groups)),
            "models": Table("Per model and population: spread of the layers", summary),
            "histograms": Table("Histograms drawn (first seed)", histograms, markdown=False),
            "linear": Table("Linear-scale histograms drawn (first seed)", linear, markdown=False),
        },
        findings=findings,
    )


# --- A2 -----------------------------------------------------------------------------------------------------
def _fits(settings: GoodnessOfFit, groups: list[RunGroup]) -> tuple[PerSeed, PerSeed]:
    """Per seed: the KS statistic D of every layer, tensor kind and family; per model, kind and family the
    mean D over layers and the share of layers where the family fits best."""
    families = list(settings.distributions)
    per_layer = PerSeed(("model", "kind", "layer", "family"), {"ks_d": FRACTION})
    per_model = PerSeed(("model", "kind", "family"), {"mean_ks_d": FRACTION, "best_share": FRACTION})
    for group in groups:
        # every family on both gradient populations; the detailed run's weights and activations for contrast
        kinds = [*POPULATIONS, *(KINDS[1:] if group is groups[0] else ())]
        for seed, run in group.runs.items():
            probe = _probe(run)
            last = int(probe["step"].max())
            for kind in kinds:
                chosen = families if kind in POPULATIONS else ["lognormal"]
                fitted = []
                for index in _rows(probe, kind, last):
                    samples = probe["samples"][index]
                    fits = ks_statistics(np.abs(samples[np.isfinite(samples)]), chosen)
                    if not np.isfinite(list(fits.values())).all():
                        continue  # too few non-zero samples to fit
                    layer = str(probe["layer"][index])
                    for family, statistic in fits.items():
                        per_layer.add(
                            seed,
                            {"model": group.model, "kind": kind, "layer": layer, "family": family},
                            ks_d=statistic,
                        )
                    fitted.append(fits)
                for family in chosen:
                    if fitted:
                        best = sum(min(fits, key=fits.get) == family for fits in fitted) / len(fitted)
                        per_model.add(
                            seed,
                            {"model": group.model, "kind": kind, "family": family},
                            mean_ks_d=float(np.mean([fits[family] for fits in fitted])),
                            best_share=best if kind in POPULATIONS else None,
                            layers=len(fitted),
                        )
    return per_layer, per_model


def _a2_caption(settings: GoodnessOfFit, groups: list[RunGroup]) -> str:
    return f"""Kolmogorov-Smirnov statistic D (lower is better) of |g| against distributions fitted by
        maximum likelihood (location 0): {", ".join(settings.distributions)}, per layer, on the reservoir
        samples (non-zero values) at the last probed step, for both gradient populations (entries whose
        gradient at the following BatchNorm's output is non-zero, what the reference code fits, and all
        non-zero entries). Top left: {groups[0].model}, every family (boxes over layers, dots: each layer's
        mean over seeds). Top right: its lognormal D of gradients next to that of weights and activations of
        the same layers. Bottom left: the lognormal D per model and population; bottom right: the share of
        layers where each family fits best (mean over seeds), per model and population. {_context(groups)}.
        Table: mean D over layers, mean and 95 % CI over the seeds; comparisons, on all non-zero entries
        paired by seed, {FAMILIES}: on every model the lognormal's mean D against each other family's
        (better: the lognormal fits better); the claim holds where it fits better than each light-tailed
        family ({", ".join(settings.light_tailed)}) on every model."""


def goodness_of_fit(settings: GoodnessOfFit, runs: dict[str, RunGroup]) -> Result:
    """A2: how well a lognormal and its alternatives fit |g|, per layer, population and model."""
    unknown = sorted(set(settings.distributions) - set(DISTRIBUTIONS))
    if unknown:
        raise ValueError(
            f"experiments.A2.distributions: unknown {unknown}; choose from {sorted(DISTRIBUTIONS)}"
        )
    groups = _groups(settings, runs)
    per_layer, per_model = _fits(settings, groups)
    others = [family for family in settings.distributions if family != "lognormal"]
    pairs = []
    for group in groups:
        short = group.config["model"]
        lognormal = per_model.values(
            {"model": group.model, "kind": "gradient", "family": "lognormal"}, "mean_ks_d"
        )
        for family in others:
            pairs.append(
                Pair(
                    f"lognormal ({short})",
                    f"{family} ({short})",
                    lognormal,
                    per_model.values(
                        {"model": group.model, "kind": "gradient", "family": family}, "mean_ks_d"
                    ),
                    unit="D",
                    factor=1.0,
                    higher_is_better=False,
                    scale=group.scale,
                    role=group.model,
                    arm="lognormal",
                    baseline=family,
                )
            )
    # L1's deciding comparisons: the lognormal against each light-tailed family
    pairs = [deciding("L1", [pair])[0] if pair.baseline in settings.light_tailed else pair for pair in pairs]
    comparisons = compare(pairs)
    findings = [
        f"{group.model}, mean D on all non-zero entries, {summarise(having(comparisons, group.model))}."
        for group in groups
    ]
    return Result(
        caption=_a2_caption(settings, groups),
        tables={
            "main": Table("Mean KS statistic over layers", per_model.rows(), note=_note(groups)),
            "layers": Table("KS statistic per layer", per_layer.rows(), markdown=False),
        },
        comparisons=comparisons,
        findings=findings,
        claims=[decide("L1", comparisons)],
    )


# --- A3 -----------------------------------------------------------------------------------------------------
def _trajectories(groups: list[RunGroup]) -> tuple[PerSeed, PerSeed, PerSeed, dict]:
    """Per seed: every layer's (mu2, sigma2) at every probed step; per step the spread of mu2 over the
    layers and their mean sigma2; per model and population the last step's spread and mean sigma2 and the
    drift of the layers' mean mu2 from the first step where every layer has a finite fit."""
    curves = PerSeed(("model", "population", "layer", "step"), {"log2_std": POSITIVE})
    over_training = PerSeed(
        ("model", "population", "step"), {"mu2_spread": POSITIVE, "sigma2_mean": POSITIVE}
    )
    final = PerSeed(("model", "population"), {"mu2_spread": POSITIVE, "sigma2_mean": POSITIVE})
    depths: dict[tuple[str, str], float] = {}
    for group in groups:
        for seed, run in group.runs.items():
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
                    curves.add(
                        seed,
                        {"model": group.model, "population": name, "layer": layer, "step": step},
                        log2_mean=mean,
                        log2_std=std,
                    )
                count = len({row[0] for row in rows})
                complete = sorted(
                    s for s in {row[1] for row in rows} if sum(row[1] == s for row in rows) == count
                )
                means = {}
                for step in complete:
                    mine = [row for row in rows if row[1] == step]
                    means[step] = float(np.mean([row[2] for row in mine]))
                    spread = max(row[2] for row in mine) - min(row[2] for row in mine)
                    sigma = float(np.nanmean([row[3] for row in mine]))
                    over_training.add(
                        seed,
                        {"model": group.model, "population": name, "step": step},
                        mu2_spread=spread,
                        sigma2_mean=sigma,
                    )
                first, last = complete[0], complete[-1]
                key = {"model": group.model, "population": name}
                final.add(
                    seed,
                    key,
                    mu2_spread=over_training.values(key | {"step": last}, "mu2_spread")[seed],
                    sigma2_mean=over_training.values(key | {"step": last}, "sigma2_mean")[seed],
                    mu2_drift=means[last] - means[first],
                    drift_from_step=first,
                )
    return curves, over_training, final, depths


def _a3_caption(groups: list[RunGroup], last_steps: set[int]) -> str:
    models = "every model" if len(groups) > 1 else groups[0].model
    return f"""Mean (mu2) and standard deviation (sigma2) of log2|g| of each probed layer's neural
        gradient (probe every few steps), for two populations: the entries whose gradient at the following
        BatchNorm's output is non-zero (what the reference code fits) and all non-zero entries (with
        BatchNorm's small mean corrections where the activation zeroed the gradient). Top rows: every layer
        of {groups[0].model} against the training step, one row per population, coloured by the layer's
        depth (colour bar); lines: mean over the seeds, bands: 95 % CI (left out where many layers would
        overlap). Bottom rows, {models}: mu2 and sigma2 of each layer at its last probed step against the
        layer's relative depth (0: first probed layer, 1: last) and, over training, the spread of mu2 over
        layers (max - min) and the mean sigma2; solid: BatchNorm-output non-zero entries, dashed: all
        non-zero. {_context(groups)}. Layers sit binades apart and drift during training, which is why one
        global loss scale may not suit them all; sigma2 sets the exponent bits an FP format needs. The table
        gives the layers of {models} at the last probed step ({_steps(last_steps)}); the spread of mu2 over
        layers, mean sigma2 and drift of the mean mu2 are computed per model, seed and population (the drift
        from each model's first step at which every layer has a finite fit: its own drift_from_step), then
        averaged over seeds."""


def statistics_over_training(settings: AcrossModels, runs: dict[str, RunGroup]) -> Result:
    """A3: per-layer mu2 and sigma2 over training, and their spread over layers, in every model."""
    groups = _groups(settings, runs)
    curves, over_training, final, depths = _trajectories(groups)
    table = curves.rows()
    last_steps: dict[str, int] = {}
    for row in table:
        last_steps[row["model"]] = max(row["step"], last_steps.get(row["model"], row["step"]))
    at_last = [
        {**row, "depth": depths[row["model"], row["layer"]]}
        for row in table
        if row["step"] == last_steps[row["model"]]
    ]
    summary = final.rows()
    findings = [
        f"{row['model']}, {row['population']} entries, at the last probed step: mu2 spread over layers "
        f"{Estimate.read(row, 'mu2_spread').text()} binades, mean sigma2 "
        f"{Estimate.read(row, 'sigma2_mean').text()}; "
        f"the layers' mean mu2 moved {Estimate.read(row, 'mu2_drift').text()} binades from step "
        f"{row['drift_from_step_mean']:g} ({row['seeds']} seeds)."
        for row in summary
    ]
    return Result(
        caption=_a3_caption(groups, set(last_steps.values())),
        tables={
            "main": Table("Per-layer statistics at the last probed step", at_last, note=_note(groups)),
            "models": Table("Per model and population: spread, mean sigma2 and drift", summary),
            "curves": Table("Per-layer statistics at every probed step", table, markdown=False),
            "over_training": Table(
                "Spread of mu2 over layers and mean sigma2, per step", over_training.rows(), markdown=False
            ),
        },
        findings=findings,
    )
