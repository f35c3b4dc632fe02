"""A7-A9: stochastic pruning of neural gradients (threshold accuracy, accuracy vs sparsity, heterogeneity)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from gradcomp.analysis.accuracy import (
    ACCURACY,
    SCHEDULE,
    SPARSITY,
    GapExperiment,
    WithinModels,
    claim_of,
    distinct_labels,
    model_names,
    per_seed_table,
    run_row,
    scale_note,
)
from gradcomp.analysis.claims import decide, deciding, undecided
from gradcomp.analysis.runs import Run, RunGroup, training_context
from gradcomp.analysis.seeds import CORRELATION, FRACTION, POSITIVE, Estimate, PerSeed
from gradcomp.analysis.synthetic import synthetic_sparsity
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    FAMILIES,
    WORSE,
    Comparison,
    Pair,
    by_arm,
    compare,
    having,
    one_sample,
    summarise,
)
from gradcomp.experiments import Calibration, CompareWithinModels, Heterogeneous
from gradcomp.lognormal import truncated_cosine_similarity
from gradcomp.training.policies import Prune

TARGET, MATCHED = "target", "matched"  # A7: achieved against target sparsity; A8: an arm against the
# lognormal curve at the sparsity it achieved

# what a convolution is, read from the last part of its name (timm's MobileNet / EfficientNet blocks)
LAYER_KINDS = {"conv_dw": "depthwise", "conv_pwl": "projection", "conv_pw": "expansion", "conv_stem": "stem"}


def layer_kinds(names: list[str]) -> dict[str, str]:
    """Each layer's kind by the last part of its name; a block's pointwise convolution projects where the
    block has no separate projection (timm's depthwise-separable blocks), and expands otherwise."""
    kinds = {name: LAYER_KINDS.get(name.rsplit(".", 1)[-1], "other") for name in names}
    projected = {name.rsplit(".", 1)[0] for name, kind in kinds.items() if kind == "projection"}
    for name, kind in kinds.items():
        if kind == "expansion" and name.rsplit(".", 1)[0] not in projected:
            kinds[name] = "projection"
    return kinds


def _layer_sparsity(run: Run) -> dict[str, float]:
    return {
        name: layer["sparsity"]
        for name, layer in run.summary["layers"].items()
        if layer["sparsity"] is not None
    }


def _error(run: Run, target: float) -> float | None:
    """Achieved less target sparsity (None where the run's last epoch trained no step)."""
    return None if run.sparsity is None else run.sparsity - target


def _attainable(run: Run, target: float) -> tuple[dict[str, float], float]:
    """Per layer, the sparsity pruning can reach as the run measured it (at each step the target, or the
    share of zeros the gradient had before pruning where that is higher: pruning only adds zeros; the
    target where a run has no such count), and the run's overall figure (weighted by the layers'
    elements)."""
    layers, zeros, elements = {}, 0.0, 0.0
    for name, layer in run.summary["layers"].items():
        if layer["sparsity"] is None:
            continue
        reach = layer.get("attainable")
        layers[name] = target if reach is None else reach
        zeros += layers[name] * layer.get("elements", 0)
        elements += layer.get("elements", 0)
    return layers, zeros / elements if elements else target


def _kind_sparsity(run: Run) -> dict[str, float]:
    """Achieved sparsity of each layer kind (element-weighted over its layers), for models that have them."""
    zeros: dict[str, float] = {}
    elements: dict[str, float] = {}
    kinds = layer_kinds(list(run.summary["layers"]))
    for name, layer in run.summary["layers"].items():
        if layer["sparsity"] is not None and layer.get("elements"):
            kind = kinds[name]
            zeros[kind] = zeros.get(kind, 0.0) + layer["sparsity"] * layer["elements"]
            elements[kind] = elements.get(kind, 0.0) + layer["elements"]
    return {kind: zeros[kind] / elements[kind] for kind in zeros} if len(zeros) > 1 else {}


def _is_curve(group: RunGroup) -> bool:
    """A run on the lognormal accuracy-vs-sparsity curve: the lognormal threshold with the default fit and
    calibration, homogeneous, compressed from the first step."""
    policy = group.policy
    return (
        isinstance(policy, Prune)
        and policy.estimator == "lognormal"
        and policy.fit == Prune.fit
        and policy.calibrate
        and policy.min_cosine is None
        and not (group.config.get("compression") or {}).get("warmup_steps")
    )


# --- A7 -----------------------------------------------------------------------------------------------------
def _calibration(groups: list[RunGroup]) -> tuple[PerSeed, PerSeed, PerSeed]:
    """Per seed: each run's overall and per-layer achieved and attainable sparsity (`_attainable`), and the
    achieved sparsity per layer kind."""
    overall = PerSeed(("run",), {"achieved": FRACTION, "attainable": FRACTION})
    layers = PerSeed(("run", "layer"), {"achieved": FRACTION, "attainable": FRACTION})
    kinds = PerSeed(("run", "kind"), {"achieved": FRACTION})
    for group in groups:
        target = group.policy.sparsity
        for seed, run in group.runs.items():
            attainable, total = _attainable(run, target)
            error = _error(run, total)
            overall.add(seed, {"run": group.name}, achieved=run.sparsity, attainable=total, error=error)
            for layer, sparsity in _layer_sparsity(run).items():
                reach = attainable[layer]
                layers.add(
                    seed,
                    {"run": group.name, "layer": layer},
                    achieved=sparsity,
                    attainable=reach,
                    error=sparsity - reach,
                )
            for kind, sparsity in _kind_sparsity(run).items():
                kinds.add(seed, {"run": group.name, "kind": kind}, achieved=sparsity)
    return overall, layers, kinds


def _against_target(group: RunGroup, label: str, overall: PerSeed, settings: Calibration) -> Pair:
    """A run's achieved sparsity against its target, or against what it could attain where its layers'
    gradients had more zeros than the target before pruning (in some seed)."""
    target = group.policy.sparsity
    achieved = overall.values({"run": group.name}, "achieved")
    attainable = overall.values({"run": group.name}, "attainable")
    reference: float | dict[int, float] = target
    name = f"target {target:g}"
    if any(value > target + 1e-9 for value in attainable.values()):
        reference = attainable
        name = f"attainable {sum(attainable.values()) / len(attainable):.3g} (target {target:g})"
    return one_sample(
        label,
        achieved,
        reference,
        name,
        margin=settings.margin,
        higher_is_better=None,
        scale=group.scale,
        role=TARGET,
        arm=group.name,
    )


def _per_layer(layer_rows: Sequence[Mapping], claimed: Sequence[str], margin: float) -> str:
    """L4's per-layer criterion, stated beside the element-weighted total: the share of the named runs'
    layers whose mean achieved sparsity is within the margin of the target, and the worst miss."""
    mine = [row for row in layer_rows if row["run"] in claimed and row["error_mean"] is not None]
    if not mine:
        return ""
    within = sum(abs(row["error_mean"]) < margin for row in mine)
    worst = max(mine, key=lambda row: abs(row["error_mean"]))
    return (
        f"; per layer: {within} of {len(mine)} layers within ±{margin:g} (mean over seeds), worst miss "
        f"{worst['error_mean']:+.3g} ({worst['run']}, {worst.get('layer', '?')})"
    )


def _a7_caption(settings: Calibration, groups: list[RunGroup], names: Mapping[str, str], runs) -> str:
    models = list(dict.fromkeys(group.model for group in groups))
    points = "; ".join(
        f"{names[model]} ({model}): {next(g for g in groups if g.model == model).compression_points}"
        for model in models
    )
    legend = " (colour: estimator; marker: model)" if len(models) > 1 else ""
    synthetic = settings.synthetic
    return f"""Fraction of zeros after unbiased stochastic pruning against the target, when the threshold
        comes from the lognormal model (closed form, from mean and std of ln|g|), a Gaussian prior (Ye et
        al.), a Laplace prior, or the exact top-k threshold of the tensor (sorting). (a) Synthetic signed
        lognormal gradients ({synthetic.numel:,} values, sigma
        {", ".join(f"{s:g}" for s in synthetic.sigmas)}, with
        {" and ".join(f"{z:.0%}" for z in synthetic.zero_fractions)} exact zeros), mean and 95 % CI over
        {len(synthetic.seeds)} draws. (b) Training{legend}: each small point is one pruned layer's achieved
        sparsity over the last epoch (mean over seeds), each large point with error bars a run's overall
        sparsity (zeros over all its pruned elements, i.e. the layers weighted by their elements; mean and
        95 % CI over seeds). (c) Achieved sparsity - target of each run (large, 95 % CI) and of each of
        its layers (small), grouped by model, with each run's attainable sparsity - target (grey bar: above
        0 where its layers' gradients had more zeros than the target before pruning), against which the
        comparisons below judge it. Gradients pruned and measured at each model's compression
        points: {points}. Thresholds fitted as each run's policy says ({_fits(groups)}); "analytic" runs use
        the closed-form threshold alone (the paper's), the others correct it by each layer's last miss
        (calibration). {training_context(runs)}. Comparisons: each run's overall achieved sparsity against
        its target, or, where some layers' gradients had more zeros than the target before pruning (pruning
        only adds zeros), against the attainable sparsity (each layer at each step at the larger of the
        target and that share, counted over the same steps as the achieved sparsity); on target where two
        one-sided tests place it within ±{settings.margin:g}, missed where it differs significantly (Holm
        over the runs). Tables: each run's overall achieved sparsity, its layers' range, and each layer
        kind's achieved sparsity where a model has several kinds (depthwise, projection, expansion)."""


def _fits(groups: list[RunGroup]) -> str:
    return "; ".join(dict.fromkeys(f"fit={group.policy.fit}" for group in groups))


def _run_rows(
    overall: PerSeed, layer_rows: list[dict], runs: dict[str, RunGroup], names: dict, verdicts: dict
) -> list[dict]:
    """Each run's overall achieved sparsity with its settings, its verdict against the target and the
    lowest and highest of its layers' mean errors; the layer rows gain their run's model and target."""
    errors: dict[str, list[float]] = {}
    for row in layer_rows:
        group = runs[row["run"]]
        errors.setdefault(row["run"], []).append(row["error_mean"])
        row |= {
            "model": names[group.model],
            "estimator": group.policy.estimator,
            "target": group.policy.sparsity,
        }
    rows = []
    for row in overall.rows():
        group = runs[row["run"]]
        mine = errors.get(row["run"], [])
        rows.append(
            {
                **row,
                "label": group.label,
                "model": names[group.model],
                "compression_points": group.compression_points,
                "estimator": group.policy.estimator,
                "fit": group.policy.fit,
                "calibrated": group.policy.calibrated,
                "target": group.policy.sparsity,
                "layer_error_min": min(mine, default=None),
                "layer_error_max": max(mine, default=None),
                "verdict": verdicts[row["run"]].verdict,
            }
        )
    return rows


def target_vs_achieved_sparsity(settings: Calibration, runs: dict[str, RunGroup]) -> Result:
    """A7: achieved against target sparsity, synthetic and in training, each run on target or not."""
    groups = settings.present(settings.runs, runs)
    names = model_names(groups)
    labels = distinct_labels(groups, with_model=len(names) > 1)
    overall, layers, kinds = _calibration(groups)
    pairs = [_against_target(g, labels[g.name], overall, settings) for g in groups]
    # the claims' deciding comparisons: L4's named runs (the closed form alone), L5's Gaussian and Laplace
    priors = {g.name for g in groups if g.policy.estimator in ("gaussian", "laplace")}
    pairs = [
        deciding("L4", [pair])[0]
        if pair.arm in settings.claim
        else deciding("L5", [pair])[0]
        if pair.arm in priors
        else pair
        for pair in pairs
    ]
    comparisons = compare(pairs)
    on_target = by_arm(comparisons, TARGET)
    layer_rows = layers.rows()
    rows = _run_rows(overall, layer_rows, runs, names, on_target)
    claimed = [name for name in settings.claim if name in on_target]
    claims = [
        decide("L4", comparisons, _per_layer(layer_rows, claimed, settings.margin))
        if claimed
        else undecided("L4", "no run named by the settings' claim"),
        decide("L5", comparisons) if priors else undecided("L5", "no Gaussian or Laplace run"),
    ]
    findings = [
        f"{model}: {summarise([on_target[g.name] for g in groups if names[g.model] == model])}."
        for model in dict.fromkeys(names.values())
    ]
    groups_by_name = {g.name: g for g in groups}
    return Result(
        caption=_a7_caption(settings, groups, names, groups_by_name),
        tables={
            "main": Table(
                "Achieved sparsity of each training run (all pruned elements)",
                rows,
                note=scale_note(groups_by_name),
            ),
            **_kinds_table(kinds),
            "synthetic": Table("Synthetic lognormal gradients", synthetic_sparsity(settings.synthetic)),
            "layers": Table("Achieved sparsity per layer", layer_rows, markdown=False),
        },
        comparisons=comparisons,
        findings=findings + _layer_findings(rows),
        claims=claims,
    )


def _kinds_table(kinds: PerSeed) -> dict[str, Table]:
    """The achieved sparsity of each layer kind, where some model has several kinds (else no table)."""
    if not len(kinds):
        return {}
    return {
        "kinds": Table("Achieved sparsity per layer kind (element-weighted over its layers)", kinds.rows())
    }


def _layer_findings(rows: list[dict]) -> list[str]:
    """Where single layers stray from what they could attain most."""
    strays = [row for row in rows if row["layer_error_min"] is not None]
    if not strays:
        return []
    parts = [
        f"{row['label']} ({row['model']}) {row['layer_error_min']:+.3f} to {row['layer_error_max']:+.3f}"
        for row in strays
    ]
    return [f"Layers' mean achieved - attainable, lowest to highest per run: {'; '.join(parts)}."]


# --- A8 -----------------------------------------------------------------------------------------------------
def _matched(arm: RunGroup, curve: list[RunGroup]) -> dict[int, float]:
    """Per seed, the accuracy the lognormal curve of the arm's model (its runs at that seed, by achieved
    sparsity) has at the arm's achieved sparsity: linear between the neighbouring curve runs; seeds where
    the arm lands outside the curve are left out."""
    matched = {}
    for seed, run in arm.runs.items():
        points = sorted(
            (g.runs[seed].sparsity, g.runs[seed].accuracy)
            for g in curve
            if seed in g.runs and g.runs[seed].sparsity is not None
        )
        if len(points) < 2 or run.sparsity is None:
            continue
        xs, ys = zip(*points, strict=True)
        if xs[0] <= run.sparsity <= xs[-1]:
            matched[seed] = float(np.interp(run.sparsity, xs, ys))
    return matched


def _matched_pairs(models: WithinModels, margin: float) -> list[Pair]:
    """Every arm off the lognormal curve (another estimator or fit, a schedule) against the curve of its
    model at the sparsity it achieved, paired by seed."""
    pairs = []
    for baseline in models.baselines:
        arms = models.arms_of(baseline)
        curve = [arm for arm in arms if _is_curve(arm)]
        if len(curve) < 2:
            continue
        for arm in arms:
            matched = _matched(arm, curve) if not _is_curve(arm) else {}
            if len(matched) > 1:
                reference = (
                    f"lognormal at matched sparsity ({models.name(arm)})"
                    if models.several
                    else ("lognormal at matched sparsity")
                )
                pairs.append(
                    Pair(
                        models.label(arm), reference, arm.accuracy, matched, margin=margin, scale=arm.scale,
                        role=MATCHED, arm=arm.name,
                    )
                )  # fmt: skip
    return pairs


def _prune_row(group: RunGroup) -> dict:
    policy = group.policy
    return {
        **run_row(group, ACCURACY, SPARSITY),
        "estimator": policy.estimator,
        "fit": policy.fit,
        "target": policy.sparsity,
    }


def _prune_order(row: dict) -> tuple:
    """The lognormal threshold's runs first, then by estimator and target."""
    return row["estimator"] != "lognormal", row["estimator"], row["target"]


def _diagnosis(models: WithinModels, gaps: Mapping[str, Comparison], kinds: PerSeed) -> list[str]:
    """For each model whose arms differ in threshold rule or target: which arms fail against its fp32 and
    what the achieved sparsity of each layer kind was (what decides whether the sparsity level or the
    threshold breaks it)."""
    findings = []
    for baseline in models.baselines:
        arms = [arm for arm in models.arms_of(baseline) if isinstance(arm.policy, Prune)]
        if len(arms) < 2 or not kinds.rows():
            continue
        parts = []
        for arm in sorted(arms, key=lambda a: (a.policy.sparsity, a.label)):
            layers = [r for r in kinds.rows() if r["run"] == arm.name]
            by_kind = ", ".join(f"{r['kind']} {r['achieved_mean']:.3f}" for r in layers)
            overall = arm.estimate(lambda run: run.sparsity, FRACTION)
            gap = gaps[arm.name]
            parts.append(
                f"{arm.label}: achieved {overall.text()}{f' ({by_kind})' if by_kind else ''}, "
                f"{gap.difference:+.3g} pt {gap.interval} against fp32, {gap.decision}"
            )
        failing = [arm for arm in arms if gaps[arm.name].verdict == WORSE]
        if failing:
            lowest = min(arm.policy.sparsity for arm in failing)
            rules = [arm for arm in arms if arm.policy.sparsity == lowest]
            if all(gaps[arm.name].verdict == WORSE for arm in rules):
                what = f"every threshold rule tried at {lowest:g} fails, so the sparsity level breaks it"
            else:
                spared = [a.label for a in rules if gaps[a.name].verdict != WORSE]
                what = f"at {lowest:g} not every threshold rule fails ({', '.join(spared)} does not)"
            trains = sorted(a.policy.sparsity for a in arms if gaps[a.name].verdict != WORSE and _is_curve(a))
            below = (
                f"; the lognormal curve does not fail at {', '.join(f'{t:g}' for t in trains)}"
                if trains
                else ""
            )
            parts.append(f"lowest failing target {lowest:g}: {what}{below}")
        findings.append(f"Diagnosis, {models.name(baseline)}: " + "; ".join(parts) + ".")
    return findings


def _a8_caption(models: WithinModels, runs: dict[str, RunGroup]) -> str:
    targets = sorted({g.policy.sparsity for g in models.arms if _is_curve(g)})
    others = sorted({g.label for g in models.arms if not _is_curve(g)})
    return f"""Final test accuracy against the achieved gradient sparsity (fraction of zeros in the pruned
        gradients over the last epoch, at each model's compression points: below) for stochastic pruning
        with the lognormal threshold at targets {", ".join(f"{t:g}" for t in targets)}
        {f"and the other runs ({', '.join(others)})" if others else ""}; mean and 95 % CI over seeds on both
        axes; dots: each seed. (a) The first model's curve, with its uncompressed run (dashed line and
        band); (b) every arm's accuracy difference from the uncompressed run of its own model and scale
        (paired by seed, 95 % CI; filled: better or worse), one row per arm labelled with its achieved
        sparsity, grouped and coloured by model and scale. Models ({models.caption()}).
        {training_context(runs)}. Comparisons: each run against the uncompressed run of its own model;
        each other threshold, fit or schedule against the lognormal curve of its model at the sparsity it
        achieved (per seed, linear between the curve's runs); paired by seed, {FAMILIES}, equivalence by
        two one-sided tests at the settings' margin. A table gives the achieved sparsity of each layer kind
        (depthwise, projection, expansion) where a model has several: the diagnosis of a model that
        fails."""


def accuracy_vs_sparsity(settings: CompareWithinModels, runs: dict[str, RunGroup]) -> Result:
    """A8: accuracy against achieved sparsity; thresholds compared at matched sparsity; a failing model
    diagnosed from its threshold rules, targets and layer kinds."""
    models = WithinModels.of_settings(settings, runs, "A8")
    experiment = GapExperiment(
        models,
        compare(
            models.gap_pairs(settings.margin, {"L6": settings.claim})
            + _matched_pairs(models, settings.margin)
            + models.pairs(models.schedules(), settings.margin, SCHEDULE)
        ),
    )
    kinds = _calibration([a for a in models.arms if isinstance(a.policy, Prune)])[2]
    findings = [
        f"{what}: {summarise(having(experiment.comparisons, role))}."
        for role, what in ((MATCHED, "At matched achieved sparsity"), (SCHEDULE, "Schedules"))
        if having(experiment.comparisons, role)
    ]
    return experiment.result(
        _a8_caption(models, experiment.groups),
        "Accuracy vs gradient sparsity",
        experiment.rows(_prune_row, _prune_order, baselines=False),
        findings=[*findings, *_diagnosis(models, experiment.gaps, kinds)],
        tables=_kinds_table(kinds),
        claims=claim_of("L6", settings.claim, experiment.gaps),
        quantities=(ACCURACY, SPARSITY),
    )


# --- A9 -----------------------------------------------------------------------------------------------------
def _predicted_cosine(layer: dict) -> float | None:
    """The truncated-lognormal cosine of a layer's last fit (mu, sigma, its truncation k) at its threshold."""
    if not (layer.get("threshold") and layer.get("sigma") and layer.get("truncation")):
        return None
    alpha_n = torch.tensor(layer["threshold"] * math.exp(-layer["mu"]), dtype=torch.float64)
    sigma = torch.tensor(layer["sigma"], dtype=torch.float64)
    return float(truncated_cosine_similarity(alpha_n, sigma, layer["truncation"]))


def _limit(policy: Prune, name: str) -> float | None:
    """The cosine limit the layer named `name` was held to (per group, or the same for every layer)."""
    per_layer = getattr(policy, "cosine_limit", None)
    return per_layer(name) if per_layer is not None else policy.min_cosine


def _cosines(group: RunGroup) -> tuple[PerSeed, PerSeed]:
    """Per seed and layer: sparsity, predicted and measured cosine, their difference and the layer's limit;
    per seed over the layers: the mean and mean absolute difference and the layers below their limit."""
    layers = PerSeed(
        ("layer", "index"),
        {"sparsity": FRACTION, "predicted_cosine": CORRELATION, "measured_cosine": CORRELATION},
    )
    model = PerSeed(("run",), {"mean_abs_error": POSITIVE, "below_limit_share": FRACTION})
    for seed, run in group.runs.items():
        errors, below = [], []
        for index, (name, layer) in enumerate(run.summary["layers"].items()):
            predicted, measured = _predicted_cosine(layer), layer.get("cosine")
            limit = _limit(group.policy, name)
            error = None if predicted is None or measured is None else measured - predicted
            layers.add(
                seed,
                {"layer": name, "index": index},
                sparsity=layer["sparsity"],
                predicted_cosine=predicted,
                measured_cosine=measured,
                error=error,
                truncation=layer.get("truncation") if predicted is not None else None,
                limit=limit,
            )
            if error is not None:
                errors.append(error)
                below.append(limit is not None and measured < limit)
        if errors:
            model.add(
                seed,
                {"run": group.name},
                mean_error=float(np.mean(errors)),
                mean_abs_error=float(np.mean(np.abs(errors))),
                below_limit_share=float(np.mean(below)),
            )
    return layers, model


def _a9_caption(constrained: RunGroup, runs: dict[str, RunGroup]) -> str:
    policy = constrained.policy
    truncation = (
        "k measured per layer and fit (the standardised N/300-th largest ln|g|)"
        if policy.truncation is None
        else f"k = {policy.truncation:g}"
    )
    return f"""Heterogeneous pruning at overall target {policy.sparsity:g} with each layer's predicted
        cosine similarity between pruned and original gradient held at or above its limit
        ({constrained.label}; lognormal truncated at k sigmas, {truncation}): at each refresh one common
        sparsity is solved from the layers' last fits so that the layers, each held to its cosine limit,
        hit the target overall (weighted by their elements). (a) Per-layer achieved sparsity, (b)
        predicted and measured cosine at the last step, mean over seeds with 95 % CI (inside [-1, 1]),
        with each layer's limit; the error of the cosine model on these real gradients, measured -
        predicted, is tabulated per layer and over the layers. (c) Accuracy against overall sparsity (mean
        and 95 % CI on both axes) next to homogeneous pruning. {training_context(runs)}. Comparisons: the
        constrained run against each homogeneous run, paired by seed, {FAMILIES}, equivalence by two
        one-sided tests at the settings' margin."""


def heterogeneous_sparsity(settings: Heterogeneous, runs: dict[str, RunGroup]) -> Result:
    """A9: heterogeneous against homogeneous pruning, and the cosine model's error per layer."""
    constrained = runs[settings.constrained]
    homogeneous = sorted(settings.present(settings.homogeneous, runs), key=lambda g: g.policy.sparsity)
    comparisons = compare(
        [
            Pair(
                constrained.label,
                g.label,
                constrained.accuracy,
                g.accuracy,
                margin=settings.margin,
                scale=g.scale,
            )
            for g in homogeneous
        ]
    )
    layers, model = _cosines(constrained)
    rows = [
        {
            **run_row(group, ACCURACY, SPARSITY),
            "min_cosine": group.policy.min_cosine,
            "target": group.policy.sparsity,
            **group.estimate(lambda run, g=group: _error(run, g.policy.sparsity)).columns("error"),
        }
        for group in [constrained, *homogeneous]
    ]
    findings = [f"Against homogeneous pruning: {summarise(comparisons)}."] if comparisons else []
    for row in model.rows():
        findings.append(
            "The cosine model on these gradients: measured - predicted cosine, mean over layers "
            f"{_text(row, 'mean_error')}, mean absolute {_text(row, 'mean_abs_error')}; share of layers "
            f"measured below their limit {_text(row, 'below_limit_share')} ({row['seeds']} seeds)."
        )
    groups = {g.name: g for g in [constrained, *homogeneous]}
    return Result(
        caption=_a9_caption(constrained, groups),
        tables={
            "main": Table("Heterogeneous vs homogeneous sparsity", rows, note=scale_note(groups)),
            "layers": Table(
                "Per-layer sparsity, predicted and measured cosine (constrained run)", layers.rows()
            ),
            "cosine_model": Table("Error of the cosine model over the layers", model.rows()),
            "seeds": per_seed_table([constrained, *homogeneous], ACCURACY, SPARSITY),
        },
        comparisons=comparisons,
        findings=findings,
    )


def _text(row: dict, name: str) -> str:
    return Estimate.read(row, name).text()
