"""A7-A9: stochastic pruning of neural gradients (threshold accuracy, accuracy vs sparsity, heterogeneity)."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from gradcomp.analysis.accuracy import (
    WithinModels,
    compare_accuracy,
    model_names,
    per_seed_table,
    run_row,
    with_gaps,
)
from gradcomp.analysis.runs import Run, RunGroup, training_context
from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.synthetic import ESTIMATORS, synthetic_sparsity
from gradcomp.analysis.tables import Result, Table
from gradcomp.experiments import Calibration, CompareWithinModels, Heterogeneous
from gradcomp.lognormal import truncated_cosine_similarity


# --- A7 -----------------------------------------------------------------------------------------------------
def _layer_sparsity(run: Run) -> dict[str, float]:
    return {
        name: layer["sparsity"]
        for name, layer in run.summary["layers"].items()
        if layer["sparsity"] is not None
    }


def target_vs_achieved_sparsity(settings: Calibration, runs: dict[str, RunGroup]) -> Result:
    synthetic = synthetic_sparsity(settings.synthetic)
    groups = [runs[name] for name in settings.runs]
    names = model_names(groups)
    layers, overall, per_model = [], [], defaultdict(dict)
    for group in groups:
        policy = group.policy
        where = {"model": names[group.model], "compression_points": group.compression_points}
        per_layer = defaultdict(list)
        for run in group.runs.values():
            for name, sparsity in _layer_sparsity(run).items():
                per_layer[name].append(sparsity)
        layer_errors = {}
        for name, values in per_layer.items():
            layers.append(
                {
                    "run": group.name,
                    **where,
                    "estimator": policy.estimator,
                    "target": policy.sparsity,
                    "layer": name,
                    **Estimate.of(values).columns("achieved"),
                    **Estimate.of([v - policy.sparsity for v in values]).columns("error"),
                    "seeds": len(values),
                }
            )
            layer_errors[name] = layers[-1]["error_mean"]
        overall.append(
            {
                "run": group.name,
                **where,
                "estimator": policy.estimator,
                "fit": policy.fit,
                "target": policy.sparsity,
                **group.estimate(lambda run: run.sparsity).columns("achieved"),
                **group.estimate(lambda run, p=policy.sparsity: run.sparsity - p).columns("error"),
                "layer_error_min": min(layer_errors.values(), default=None),
                "layer_error_max": max(layer_errors.values(), default=None),
                "layers": len(layer_errors),
                "seeds": len(group.runs),
            }
        )
        largest = max(layer_errors, key=lambda name: abs(layer_errors[name]), default=None)
        per_model[names[group.model]][group.name] = {
            "target": policy.sparsity,
            "overall_error": overall[-1]["error_mean"],
            "largest_layer_error": layer_errors[largest] if largest else None,
            "largest_layer": largest,
        }

    def worst(rows: list[dict], estimator: str) -> float | None:
        errors = [abs(row["achieved_mean"] - row["target"]) for row in rows if row["estimator"] == estimator]
        return max(errors) if errors else None

    headline = {
        f"max_abs_error_{source}": {
            estimator: worst(rows, estimator)
            for estimator in ESTIMATORS
            if worst(rows, estimator) is not None
        }
        for source, rows in (
            ("synthetic", synthetic),
            ("training_per_layer", layers),
            ("training_overall", overall),
        )
    }
    headline |= {f"errors {model} (mean over seeds)": errors for model, errors in per_model.items()}
    models = list(dict.fromkeys(group.model for group in groups))
    points = "; ".join(
        f"{names[model]} ({model}): {next(g for g in groups if g.model == model).compression_points}"
        for model in models
    )
    legend = " (colour: estimator; marker: model)" if len(models) > 1 else ""
    synthetic_settings = settings.synthetic
    caption = f"""Fraction of zeros after unbiased stochastic pruning against the target, when the threshold
        comes from the lognormal model (closed form, from mean and std of ln|g|), a Gaussian prior (Ye et
        al.), a Laplace prior, or the exact top-k threshold of the tensor (sorting). (a) Synthetic signed
        lognormal gradients ({synthetic_settings.numel:,} values, sigma
        {", ".join(f"{s:g}" for s in synthetic_settings.sigmas)}, with
        {" and ".join(f"{z:.0%}" for z in synthetic_settings.zero_fractions)} exact zeros), mean and 95 % CI
        over {len(synthetic_settings.seeds)} draws. (b) Training{legend}: each small point is one pruned
        layer's achieved sparsity over the last epoch (mean over seeds), each large point with error bars
        a run's overall sparsity (zeros over all its pruned elements, i.e. the layers weighted by their
        elements; mean and 95 % CI over seeds).
        (c) Achieved - target of each run (large, 95 % CI) and of each of its layers (small), grouped by
        model. Gradients pruned and measured at each model's compression points: {points}. Thresholds
        fitted as each run's policy says ({_fits(groups)}). {training_context(runs)}. The table gives each
        run's overall error and the range of its layers' mean errors; the headline the largest |mean
        achieved - target| per estimator (on synthetic data, per layer, and overall) and, per model and
        run, the overall error and the layer whose mean error is largest in magnitude."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Achieved sparsity of each training run (all pruned elements)", overall),
            "synthetic": Table("Synthetic lognormal gradients", synthetic),
            "layers": Table("Achieved sparsity per layer", layers, markdown=False),
        },
        headline=headline,
    )


def _fits(groups: list[RunGroup]) -> str:
    names = {
        "bn_nonzero": "on the entries whose BatchNorm-output gradient is non-zero, target (p - s0)/(1 - s0); "
        "on all non-zero entries where no BatchNorm follows the layer (e.g. linear layers)",
        "all": "on all non-zero entries",
    }
    fits = dict.fromkeys(group.policy.fit for group in groups)
    return "; ".join(f"fit={fit}: {names[fit]}" for fit in fits)


# --- A8 -----------------------------------------------------------------------------------------------------
def _prune_row(group: RunGroup) -> dict:
    policy = group.policy
    return {
        **run_row(group, accuracy=lambda run: run.accuracy, sparsity=lambda run: run.sparsity),
        "estimator": policy.estimator,
        "target": policy.sparsity,
    }


def accuracy_vs_sparsity(settings: CompareWithinModels, runs: dict[str, RunGroup]) -> Result:
    models = WithinModels.of(settings.baselines, settings.runs, runs, "experiments.A8.baseline")
    lognormal: dict[tuple[str, float], RunGroup] = {}
    for group in models.arms:
        if group.policy.estimator == "lognormal":
            lognormal.setdefault((group.model, group.policy.sparsity), group)
    priors = [
        (group, lognormal[group.model, group.policy.sparsity])
        for group in models.arms
        if group.policy.estimator != "lognormal" and (group.model, group.policy.sparsity) in lognormal
    ]
    comparisons = models.gaps(priors)
    gaps = {arm.name: gap for arm, gap in zip(models.arms, comparisons[: len(models.arms)], strict=True)}
    rows, headline = [], {}
    for baseline in models.baselines:
        arms = models.arms_of(baseline)
        rows += sorted(
            ({"model": models.name(baseline), **_prune_row(arm)} for arm in arms),
            key=lambda r: (r["estimator"] != "lognormal", r["estimator"], r["target"]),
        )
        headline[models.name(baseline)] = models.headline(baseline, gaps)
    with_gaps(rows, gaps)
    targets = sorted({g.policy.sparsity for g in models.arms if g.policy.estimator == "lognormal"})
    others = sorted({g.policy.estimator for g in models.arms} - {"lognormal"})
    panels = "one panel per model, each with" if models.several else "with"
    caption = f"""Final test accuracy against the achieved gradient sparsity (fraction of zeros in the pruned
        gradients over the last epoch, at each model's compression points: below) for stochastic pruning
        with the lognormal threshold at targets {", ".join(f"{t:g}" for t in targets)}
        {f"and with the other thresholds ({', '.join(others)}) at their targets" if others else ""}; mean
        and 95 % CI over seeds on both axes; dots: each seed; {panels} the dashed line and band of the
        uncompressed run of {"its" if models.several else "the"} model. A prior's run lands at another
        sparsity than it asked for. Models ({models.caption()}). {training_context(runs)}. Comparisons:
        each run against the uncompressed run of its own model, and each other threshold against the
        lognormal one of the same model at the same target; paired by seed. The headline gives, per
        model, the noise floor (the baseline's seed-to-seed sd) and each run's gap with its interval."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Accuracy vs gradient sparsity", rows),
            "baseline": Table(
                "Uncompressed run of each model",
                [{"model": models.name(b), **run_row(b)} for b in models.baselines],
                markdown=False,
            ),
            "seeds": per_seed_table(
                [*models.baselines, *models.arms],
                accuracy=lambda run: run.accuracy,
                sparsity=lambda run: run.sparsity,
            ),
        },
        comparisons=comparisons,
        headline=headline,
    )


# --- A9 -----------------------------------------------------------------------------------------------------
def _predicted_cosine(layer: dict) -> float | None:
    """The truncated-lognormal cosine of a layer's last fit (mu, sigma, its truncation k) at its threshold."""
    if not (layer.get("threshold") and layer.get("sigma") and layer.get("truncation")):
        return None
    alpha_n = torch.tensor(layer["threshold"] * math.exp(-layer["mu"]), dtype=torch.float64)
    sigma = torch.tensor(layer["sigma"], dtype=torch.float64)
    return float(truncated_cosine_similarity(alpha_n, sigma, layer["truncation"]))


def heterogeneous_sparsity(settings: Heterogeneous, runs: dict[str, RunGroup]) -> Result:
    constrained = runs[settings.constrained]
    homogeneous = sorted((runs[name] for name in settings.homogeneous), key=lambda g: g.policy.sparsity)
    policy = constrained.policy
    comparisons = compare_accuracy([(constrained, group) for group in homogeneous])
    layers = []
    per_layer = defaultdict(lambda: defaultdict(list))
    for run in constrained.runs.values():
        for name, layer in run.summary["layers"].items():
            values = per_layer[name]
            if layer["sparsity"] is not None:
                values["sparsity"].append(layer["sparsity"])
            predicted = _predicted_cosine(layer)
            if predicted is not None and layer.get("cosine") is not None:
                values["predicted_cosine"].append(predicted)
                values["measured_cosine"].append(layer["cosine"])
                values["truncation"].append(layer["truncation"])
    for index, (name, values) in enumerate(per_layer.items()):
        row = {"layer": name, "index": index}
        for key in ("sparsity", "predicted_cosine", "measured_cosine", "truncation"):
            row |= Estimate.of(values.get(key, [])).columns(key)
        layers.append(row | {"seeds": len(values.get("sparsity", []))})
    rows = [
        {
            **run_row(group, accuracy=lambda run: run.accuracy, sparsity=lambda run: run.sparsity),
            "min_cosine": group.policy.min_cosine,
            "target": group.policy.sparsity,
            **group.estimate(lambda run, g=group: run.sparsity - g.policy.sparsity).columns("error"),
        }
        for group in [constrained, *homogeneous]
    ]
    gaps = [
        gap
        for row in layers
        if math.isfinite(gap := row["measured_cosine_mean"] - row["predicted_cosine_mean"])
    ]
    below = [row["layer"] for row in layers if row["measured_cosine_mean"] < policy.min_cosine]
    truncation = (
        "k measured per layer and fit (the standardised N/300-th largest ln|g|)"
        if policy.truncation is None
        else f"k = {policy.truncation:g}"
    )
    caption = f"""Heterogeneous pruning at overall target {policy.sparsity:g} with every layer's predicted
        cosine similarity between pruned and original gradient at least {policy.min_cosine:g} (lognormal
        truncated at k sigmas, {truncation}): at each refresh one common sparsity is solved from the layers'
        last fits so that the layers, each held to its cosine limit, hit the target overall (weighted by their
        elements). (a) Per-layer achieved sparsity, (b) predicted and measured cosine at the last step, mean
        over seeds with 95 % CI; the truncation leaves the largest values' energy out of the prediction, so on
        lognormal data the measured cosine lies between it and the untruncated closed form (tested). (c)
        Accuracy against overall sparsity (mean and 95 % CI on both axes) next to homogeneous pruning.
        {training_context(runs)}. Comparisons: the constrained run against each homogeneous run, paired by
        seed."""
    overall = rows[0]
    headline = {
        "overall_sparsity": {key: overall[f"sparsity_{key}"] for key in ("mean", "ci_low", "ci_high")},
        "overall_error": overall["error_mean"],
        "layer_sparsity_range": [
            min(row["sparsity_mean"] for row in layers),
            max(row["sparsity_mean"] for row in layers),
        ]
        if layers
        else None,
        "measured_minus_predicted_cosine_range": [min(gaps), max(gaps)] if gaps else None,
        "layers_measured_below_min_cosine": below,
    }
    return Result(
        caption=caption,
        tables={
            "main": Table("Heterogeneous vs homogeneous sparsity", rows),
            "layers": Table("Per-layer sparsity, predicted and measured cosine (constrained run)", layers),
            "seeds": per_seed_table(
                [constrained, *homogeneous],
                accuracy=lambda run: run.accuracy,
                sparsity=lambda run: run.sparsity,
            ),
        },
        comparisons=comparisons,
        headline=headline,
    )
