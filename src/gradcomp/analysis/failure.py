"""F0: the noise ratio R = ||g_W|| / ||noise in g_W|| of each layer's weight gradient (FP4 All the Way,
section 4: training stalls below sqrt(3)), measured with the weight-gradient GEMMs and predicted without
them (`gradcomp.noise_monitor`), on the trained models of every family under every lossy policy."""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import nn

from gradcomp.analysis.runs import RunGroup, training_context
from gradcomp.analysis.seeds import LINEAR, PerSeed
from gradcomp.analysis.statquant import eval_batches, trained_models
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import EQUIVALENT, compare, one_sample
from gradcomp.attachment import attach
from gradcomp.config import CompressionConfig
from gradcomp.experiments import NoiseRatios
from gradcomp.noise_monitor import PREDICTIONS
from gradcomp.policies import parse_policy
from gradcomp.theory.noise import CRITICAL_RATIO, noise_ratio

KINDS = (*PREDICTIONS, "measured")


def _ratios(model: nn.Module, spec: str, batches: list) -> list[dict]:
    """Every compressed layer's noise-ratio rows, one noise step per batch (eval mode: no statistics move)."""
    config = CompressionConfig(
        parse_policy(spec), layer_types=("conv", "linear"), noise_every=1, measure_noise=True
    )
    with attach(model, config) as handle:
        for images, labels in batches:
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images), labels).backward()
        rows = handle.noise_ratios()
    model.zero_grad(set_to_none=True)
    return rows


def _model_ratio(rows: list[dict], kind: str) -> float | None:
    """R over the model's compressed layers: the energies of signal and noise summed over layers."""
    pairs = [(row[f"{kind}_signal"], row[f"{kind}_noise"]) for row in rows]
    if any(signal is None or noise is None for signal, noise in pairs):
        return None
    return noise_ratio(sum(s for s, _ in pairs), sum(n for _, n in pairs))


def _measure(settings: NoiseRatios, groups: list[RunGroup]) -> tuple[PerSeed, list[dict]]:
    """Per (family, policy) and seed: the model-wide R of each kind and the ln of each prediction over the
    measurement; and every layer's rows (for the figure)."""
    per_seed = PerSeed(("model", "policy"), {f"{kind}_ratio": LINEAR for kind in KINDS})
    layers = []
    for group in groups:
        for seed, run, model in trained_models(group):
            batches = eval_batches(run, settings.batches)
            for spec in settings.policies:
                label = parse_policy(spec).label
                rows = _ratios(model, spec, batches)
                ratios = {kind: _model_ratio(rows, kind) for kind in KINDS}
                measured = ratios["measured"]
                logs = {
                    f"ln_{kind}": math.log(ratios[kind] / measured)
                    for kind in PREDICTIONS
                    if ratios[kind] is not None and 0 < measured < math.inf
                }
                key = {"model": group.model, "policy": label}
                per_seed.add(seed, key, **{f"{k}_ratio": v for k, v in ratios.items()}, **logs)
                layers.extend({**key, "seed": seed, **row} for row in rows)
    return per_seed, layers


def _pairs(settings: NoiseRatios, per_seed: PerSeed) -> list:
    return [
        one_sample(
            f"{row['model']} {row['policy']}: {kind} R / measured R",
            per_seed.values(row, f"ln_{kind}"),
            0.0,
            "measured",
            margin=settings.margin,
            higher_is_better=None,
            unit="ln",
            bounds=LINEAR,
            role=kind,
            arm=f"{row['model']} {row['policy']}",
        )
        for row in per_seed.rows()
        for kind in PREDICTIONS
        if per_seed.values(row, f"ln_{kind}")
    ]


def _layer_shares(layers: list[dict], margin: float) -> dict[str, str]:
    """Per prediction: the share of layer rows whose predicted R is within the margin of the measured."""
    shares = {}
    for kind in PREDICTIONS:
        usable = [
            row
            for row in layers
            if row[f"{kind}_ratio"] and row["measured_ratio"] and 0 < row["measured_ratio"] < math.inf
        ]
        within = sum(abs(math.log(row[f"{kind}_ratio"] / row["measured_ratio"])) <= margin for row in usable)
        shares[kind] = f"{within} of {len(usable)} layer measurements"
    return shares


def noise_ratios(settings: NoiseRatios, runs: dict[str, RunGroup]) -> Result:
    """F0: measured and predicted noise ratios of every family and policy, and whether each prediction
    holds within the margin."""
    groups = [runs[name] for name in settings.named_runs(list(runs))]
    torch.manual_seed(0)
    per_seed, layers = _measure(settings, groups)
    comparisons = compare(_pairs(settings, per_seed))
    findings = []
    shares = _layer_shares(layers, settings.margin)
    for kind in PREDICTIONS:
        mine = [c for c in comparisons if c.role == kind]
        held = [c.arm for c in mine if c.verdict == EQUIVALENT]
        missed = [f"{c.arm} ({math.exp(c.difference):.2g}x)" for c in mine if c.verdict != EQUIVALENT]
        findings.append(
            f"{kind} prediction: within a factor of {math.exp(settings.margin):.3g} of the measured R, "
            f"model-wide, for {len(held)} of {len(mine)} (family, policy) pairs; not shown for "
            f"{', '.join(missed) or 'none'}; per layer, {shares[kind]} within it."
        )
    below = defaultdict(set)
    for row in per_seed.rows():
        if row.get("measured_ratio") is not None and row["measured_ratio"] < CRITICAL_RATIO:
            below[row["model"]].add(row["policy"])
    findings.append(
        "Model-wide measured R below sqrt(3) (mean over seeds): "
        + ("; ".join(f"{model}: {', '.join(sorted(p))}" for model, p in below.items()) or "none")
        + "."
    )
    named = {group.name: group for group in groups}
    return Result(
        caption=_caption(settings, named),
        tables={
            "main": Table("Model-wide noise ratio R, measured and predicted", per_seed.rows()),
            "layers": Table("Every layer's noise ratio, per seed and batch", layers, markdown=False),
        },
        comparisons=comparisons,
        findings=findings,
        facts={"margin": settings.margin, "critical": CRITICAL_RATIO, "kinds": list(PREDICTIONS)},
    )


def _caption(settings: NoiseRatios, groups: dict[str, RunGroup]) -> str:
    policies = ", ".join(parse_policy(spec).label for spec in settings.policies)
    return f"""The noise ratio R = ||g_W|| / ||noise in g_W|| of every convolution and linear layer's weight
        gradient (FP4 All the Way, section 4: training stalls below sqrt(3), dotted) under {policies}, on
        the trained models ({training_context(groups)}; eval mode, {settings.batches} test batch(es)):
        measured with the weight-gradient GEMMs of the exact neural gradient and of the compression's
        error (x axis), against its prediction without a GEMM (y axis): "theory" carries the error the
        lognormal theory predicts from the layer's fit, "carried" the error the compression made on the
        neural gradient, each through the energy of the layer's input patches, with ||g_W||^2 the
        compressed gradient's energy less the predicted noise. One panel per family and prediction;
        dashed: a factor of {math.exp(settings.margin):.3g}. Comparisons: per family and policy, the ln of
        the model-wide predicted over measured R against 0, equivalent within ±{settings.margin:.3g}."""
