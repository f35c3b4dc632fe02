"""A7-A9: stochastic pruning of neural gradients (threshold accuracy, accuracy vs sparsity, heterogeneity)."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from gradcomp.analysis.accuracy import compare_accuracy, noise_floor, per_seed_table, run_row, with_gaps
from gradcomp.analysis.runs import Run, RunGroup, training_context
from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.synthetic import ESTIMATORS, synthetic_sparsity
from gradcomp.analysis.tables import Result, Table
from gradcomp.experiments import Calibration, Compare, Heterogeneous
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
    layers, overall = [], []
    for group in groups:
        policy = group.policy
        per_layer = defaultdict(list)
        for run in group.runs.values():
            for name, sparsity in _layer_sparsity(run).items():
                per_layer[name].append(sparsity)
        for name, values in per_layer.items():
            layers.append(
                {
                    "run": group.name,
                    "estimator": policy.estimator,
                    "target": policy.sparsity,
                    "layer": name,
                    **Estimate.of(values).columns("achieved"),
                    "seeds": len(values),
                }
            )
        overall.append(
            {
                "run": group.name,
                "estimator": policy.estimator,
                "target": policy.sparsity,
                **group.estimate(lambda run: run.sparsity).columns("achieved"),
                "seeds": len(group.runs),
            }
        )

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
    synthetic_settings = settings.synthetic
    caption = f"""Fraction of zeros after unbiased stochastic pruning against the target, when the threshold
        comes from the lognormal model (closed form, from mean and std of ln|g|), a Gaussian prior (Ye et
        al.), a Laplace prior, or the exact top-k threshold of the tensor (sorting). (a) Synthetic signed
        lognormal gradients ({synthetic_settings.numel:,} values, sigma
        {", ".join(f"{s:g}" for s in synthetic_settings.sigmas)}, with
        {" and ".join(f"{z:.0%}" for z in synthetic_settings.zero_fractions)} exact zeros), mean and 95 % CI
        over {len(synthetic_settings.seeds)} draws. (b) Training: each small point is one convolution's
        achieved sparsity over the last epoch (mean over seeds), each large point with error bars a run's
        overall sparsity (all convolution-output elements; mean and 95 % CI over seeds).
        {training_context(runs)}. The headline gives the largest |mean achieved - target| per estimator: on
        synthetic data, per layer, and overall."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Achieved sparsity of each training run (all pruned elements)", overall),
            "synthetic": Table("Synthetic lognormal gradients", synthetic),
            "layers": Table("Achieved sparsity per layer", layers, markdown=False),
        },
        headline=headline,
    )


# --- A8 -----------------------------------------------------------------------------------------------------
def _prune_row(group: RunGroup) -> dict:
    policy = group.policy
    return {
        **run_row(group, accuracy=lambda run: run.accuracy, sparsity=lambda run: run.sparsity),
        "estimator": policy.estimator,
        "target": policy.sparsity,
    }


def accuracy_vs_sparsity(settings: Compare, runs: dict[str, RunGroup]) -> Result:
    baseline = runs[settings.baseline]
    arms = [runs[name] for name in settings.runs if name != settings.baseline]
    lognormal = {g.policy.sparsity: g for g in arms if g.policy.estimator == "lognormal"}
    priors = [
        (g, lognormal[g.policy.sparsity])
        for g in arms
        if g.policy.estimator != "lognormal" and g.policy.sparsity in lognormal
    ]
    comparisons = compare_accuracy([(arm, baseline) for arm in arms] + priors)
    rows = sorted(
        (_prune_row(arm) for arm in arms),
        key=lambda r: (r["estimator"] != "lognormal", r["estimator"], r["target"]),
    )
    with_gaps(rows, comparisons, baseline.label)
    caption = f"""Final test accuracy against the achieved gradient sparsity (fraction of zeros in the pruned
        convolution-output gradients over the last epoch) for stochastic pruning with the lognormal threshold
        at targets {", ".join(f"{t:g}" for t in sorted(lognormal))}, and with the other thresholds
        ({", ".join(sorted({g.policy.estimator for g in arms} - {"lognormal"}))}) at their targets; mean and
        95 % CI over seeds on both axes; dashed line and band: the uncompressed run. A prior's run lands at
        another sparsity than it asked for. {training_context(runs)}. Comparisons: each run against the
        uncompressed one, and each other threshold against the lognormal one at the same target; paired by
        seed."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Accuracy vs gradient sparsity", rows),
            "baseline": Table("Uncompressed", [run_row(baseline)], markdown=False),
            "seeds": per_seed_table(
                [baseline, *arms], accuracy=lambda run: run.accuracy, sparsity=lambda run: run.sparsity
            ),
        },
        comparisons=comparisons,
        headline=noise_floor(baseline),
    )


# --- A9 -----------------------------------------------------------------------------------------------------
def _predicted_cosine(layer: dict, truncation: float) -> float | None:
    if not (layer.get("threshold") and layer.get("sigma")):
        return None
    alpha_n = torch.tensor(layer["threshold"] * math.exp(-layer["mu"]), dtype=torch.float64)
    sigma = torch.tensor(layer["sigma"], dtype=torch.float64)
    return float(truncated_cosine_similarity(alpha_n, sigma, truncation))


def heterogeneous_sparsity(settings: Heterogeneous, runs: dict[str, RunGroup]) -> Result:
    constrained = runs[settings.constrained]
    homogeneous = sorted((runs[name] for name in settings.homogeneous), key=lambda g: g.policy.sparsity)
    policy = constrained.policy
    same_target = [g for g in homogeneous if g.policy.sparsity == policy.sparsity]
    comparisons = compare_accuracy([(constrained, group) for group in homogeneous])
    layers = []
    for group in [constrained, *same_target]:
        per_layer = defaultdict(lambda: ([], []))
        for run in group.runs.values():
            for name, layer in run.summary["layers"].items():
                sparsity, cosine = per_layer[name]
                if layer["sparsity"] is not None:
                    sparsity.append(layer["sparsity"])
                predicted = _predicted_cosine(layer, policy.truncation)
                if predicted is not None:
                    cosine.append(predicted)
        for index, (name, (sparsity, cosine)) in enumerate(per_layer.items()):
            layers.append(
                {
                    "run": group.name,
                    "label": group.label,
                    "layer": name,
                    "index": index,
                    **Estimate.of(sparsity).columns("sparsity"),
                    **Estimate.of(cosine).columns("predicted_cosine"),
                    "seeds": len(sparsity),
                }
            )
    rows = [
        {
            **run_row(group, accuracy=lambda run: run.accuracy, sparsity=lambda run: run.sparsity),
            "min_cosine": group.policy.min_cosine,
            "target": group.policy.sparsity,
        }
        for group in [constrained, *homogeneous]
    ]
    mine = [row for row in layers if row["run"] == constrained.name]
    caption = f"""Pruning with a per-layer constraint: a layer whose predicted cosine similarity between
        pruned and original gradient (lognormal truncated at {policy.truncation:g} sigmas, from the layer's
        mu, sigma and threshold) would fall below {policy.min_cosine:g} gets a smaller threshold, at target
        {policy.sparsity:g}. (a) Per-layer achieved sparsity and (b) predicted cosine at the last fit, mean
        over seeds with 95 % CI, for the constrained run and the homogeneous run at the same target. (c)
        Accuracy against overall sparsity (mean and 95 % CI on both axes): the constrained run next to the
        homogeneous runs. {training_context(runs)}. Comparisons: the constrained run against each homogeneous
        run, paired by seed."""
    headline = {
        "constrained_layer_sparsity_range": [
            min(row["sparsity_mean"] for row in mine),
            max(row["sparsity_mean"] for row in mine),
        ]
        if mine
        else None,
        "constrained_min_predicted_cosine": min(
            (
                row["predicted_cosine_mean"]
                for row in mine
                if row["predicted_cosine_mean"] is not None and math.isfinite(row["predicted_cosine_mean"])
            ),
            default=None,
        ),
    }
    return Result(
        caption=caption,
        tables={
            "main": Table("Heterogeneous vs homogeneous sparsity", rows),
            "layers": Table("Per-layer sparsity and predicted cosine", layers),
            "seeds": per_seed_table(
                [constrained, *homogeneous],
                accuracy=lambda run: run.accuracy,
                sparsity=lambda run: run.sparsity,
            ),
        },
        comparisons=comparisons,
        headline=headline,
    )
