"""C3: the lognormal paper's sequels, LUQ and MVUE N:M, against stochastic pruning at the same density.

Accuracy: every arm against the uncompressed run of its model and scale (paired by seed). Variance: on each
baseline's trained model (eval mode, test batches), the variance each arm's policy adds (a) to the neural
gradients it compresses, relative to their energy, measured on the captured gradients and predicted by
`gradcomp.theory.unbiased` from each layer's lognormal fit, its share of zeros and its largest value, and
(b) to the weight gradient, relative to the weight gradient's energy (what SGD sees).
"""

from __future__ import annotations

import math
from dataclasses import replace

from torch import Tensor

from gradcomp.analysis.accuracy import (
    GAP_PANEL,
    GapExperiment,
    WithinModels,
    run_row,
)
from gradcomp.analysis.claims import decide, deciding, undecided
from gradcomp.analysis.gradients import (
    captured_gradients,
    fqt_weight_gradients,
    quantization_variance,
    weight_gradients,
)
from gradcomp.analysis.runs import RunGroup, eval_batches, trained_models, training_context
from gradcomp.analysis.seeds import LINEAR, POSITIVE, PerSeed
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    Comparison,
    Pair,
    compare,
    having,
    one_sample,
    prediction_pair,
    summarise,
)
from gradcomp.experiments import Successors
from gradcomp.training.compress import GradientCopy, LayerStats, compress
from gradcomp.training.config import CompressionConfig
from gradcomp.training.noise_monitor import gradient_fit, neural_error
from gradcomp.training.policies import NM, Luq, Policy, Prune

THEORY, NAIVE = "theory", "naive"  # an arm's variance against its prediction; N:M's against the naive one


def predicted_variance(policy: Policy, g: Tensor) -> float | None:
    """The theory's relative added variance for one layer's gradient g
    (`gradcomp.training.noise_monitor.neural_error`: from the lognormal fit of its non-zeros, its zero share
    and its largest value), over g's energy; None for policies other than the unbiased ones C3 compares, or
    a gradient without two non-zeros.

    The theory's variance is relative to the fitted lognormal's second moment exp(2 mu + 2 sigma^2), here
    times the non-zeros and over their measured energy, the denominator of the measurement. Real layers are
    not one lognormal (A1: two populations), and that moment, set by the upper tail, can differ from the
    measured one by orders of magnitude; the added variance comes mostly from the bulk the fit describes."""
    if not isinstance(policy, (Luq, NM, Prune)) or gradient_fit(g) is None:
        return None
    error = neural_error(policy, g)
    return None if error is None else error / float(g.detach().double().square().sum())


def _neural_variance(
    policy: Policy, captured: list[tuple], draws: int, seed: int
) -> tuple[float, float | None]:
    """(measured, predicted) added variance over energy of the captured gradients, element-weighted over
    the layers: measured over `draws` draws of the policy's compressor (a layer's statistics fitted on
    its own gradient), predicted by the theory for each layer."""
    added, energy, predicted = 0.0, 0.0, 0.0
    for index, (_, g, active, axis) in enumerate(captured):
        bn_output = None if active is None else active.to(g.dtype)
        for draw in range(draws):
            copy = GradientCopy(g, seed * 1000 + index * draws + draw, bn_output=bn_output, feature_axis=axis)
            added += (
                float((compress(policy, copy, LayerStats()).double() - g.double()).square().sum()) / draws
            )
        layer_energy = float(g.double().square().sum())
        energy += layer_energy
        layer_prediction = predicted_variance(policy, g)
        predicted = math.nan if layer_prediction is None else predicted + layer_prediction * layer_energy
    return added / energy, (None if math.isnan(predicted) else predicted / energy)


def _variances(settings: Successors, models: WithinModels) -> PerSeed:
    """Per seed of each baseline's trained model (the seeds the pipeline read): each arm's measured and
    predicted neural-gradient variance and its weight-gradient variance, relative to the energies."""
    variance = PerSeed(("run",), {"neural": POSITIVE, "predicted": POSITIVE, "weight": POSITIVE})
    for baseline in models.baselines:
        arms = models.arms_of(baseline)
        for seed, run, model in trained_models(baseline):
            batches = eval_batches(run, settings.batches)
            exact = [weight_gradients(model, images, labels) for images, labels in batches]  # shared by arms
            for arm in arms:
                config = CompressionConfig(**arm.config["compression"])
                neural, predicted, weight = [], [], []
                for index, (images, labels) in enumerate(batches):
                    captured = captured_gradients(model, config, images, labels)
                    measured, theory = _neural_variance(arm.policy, captured, settings.draws, seed + index)
                    neural.append(measured)
                    predicted.append(theory)
                    draws = fqt_weight_gradients(
                        model,
                        images,
                        labels,
                        config,
                        settings.draws,
                        seed=seed,
                        first_step=index * settings.draws,
                    )
                    energy = float(exact[index].double().square().sum())
                    weight.append(quantization_variance(exact[index][None], draws[None]) / energy)
                mean = sum(neural) / len(neural)
                theory = None if None in predicted else sum(predicted) / len(predicted)
                variance.add(
                    seed,
                    {"run": arm.name},
                    neural=mean,
                    predicted=theory,
                    ln_ratio=None if theory is None else math.log(mean / theory),
                    weight=sum(weight) / len(weight),
                )
    return variance


def _theory_pairs(settings: Successors, models: WithinModels, variance: PerSeed) -> list[Pair]:
    """ln(measured / predicted) of every arm the theory covers, against 0."""
    return [
        prediction_pair(
            f"{models.label(arm)} measured/predicted",
            variance.values({"run": arm.name}, "ln_ratio"),
            "theory",
            settings.theory_margin,
            scale=arm.scale,
            role=THEORY,
            arm=arm.name,
        )
        for arm in models.arms
        if variance.values({"run": arm.name}, "ln_ratio")
    ]


def _mvue_pairs(models: WithinModels, variance: PerSeed) -> list[Pair]:
    """Each N:M arm's measured neural-gradient variance against that of the naive unbiased n:m estimator
    (n of m kept at random, times m/n: relative variance m/n - 1 whatever the gradient)."""
    return [
        one_sample(
            f"{models.label(arm)} variance",
            {seed: math.log(v) for seed, v in variance.values({"run": arm.name}, "neural").items()},
            math.log(arm.policy.m / arm.policy.n - 1),
            f"naive unbiased {arm.policy.n}:{arm.policy.m} (ln {arm.policy.m / arm.policy.n - 1:g})",
            higher_is_better=False,
            unit="ln",
            bounds=LINEAR,
            scale=arm.scale,
            role=NAIVE,
            arm=arm.name,
        )
        for arm in models.arms
        if isinstance(arm.policy, NM) and variance.values({"run": arm.name}, "neural")
    ]


def _prediction_miss(models: WithinModels, theory: list[Comparison]) -> str:
    """Q2's evidence beside its ordering: how far each N:M arm's measured variance is from its own
    prediction (a ratio, from the ln-ratio comparison against the theory)."""
    nm = {arm.name for arm in models.arms if isinstance(arm.policy, NM)}
    misses = [
        f"{c.a}: {math.exp(c.difference):.3g}x [{math.exp(c.ci_low):.3g}x, {math.exp(c.ci_high):.3g}x], "
        f"{c.decision}"
        for c in having(theory, THEORY)
        if c.arm in nm and not math.isnan(c.ci_low)
    ]
    return f"; measured against its own prediction: {'; '.join(misses)}" if misses else ""


def _c3_row(group: RunGroup) -> dict:
    return {"policy": group.policy.describe(), **run_row(group)}


def _c3_caption(settings: Successors, models: WithinModels, groups: dict[str, RunGroup]) -> str:
    return f"""(a) {GAP_PANEL}: LUQ (4-bit logarithmic, alpha
        from the tensor's maximum; SMP: the mean of several draws), MVUE N:M (blocks along the output
        features), stochastic pruning with the lognormal threshold. {models.caption()}.
        {training_context(groups)}. (b) The variance each arm's policy adds, relative to the energy of what
        it compresses: on the neural gradients (measured over {settings.draws} draws on each of
        {settings.batches} test batches of the baseline's trained model, in eval mode; predicted by the
        lognormal theory from each layer's fit, zero share and largest value, element-weighted) and on the
        weight gradient. Comparisons: each arm against its baseline (paired by seed, Holm, equivalence
        within ±{settings.margin:g} pt, or the test and margin of the claim it decides); measured against
        predicted variance (ln ratio, equivalence within ±{settings.theory_margin:g}); each N:M arm's
        variance against the naive unbiased estimator's (these two verdicts under each arm's name in
        (b))."""


def successors(settings: Successors, runs: dict[str, RunGroup]) -> Result:
    """C3: accuracy and added variance of LUQ, MVUE N:M and stochastic pruning against fp32."""
    models = WithinModels.of_settings(settings, runs, "C3")
    variance = _variances(settings, models)
    theory, mvue = _theory_pairs(settings, models, variance), _mvue_pairs(models, variance)
    # Q1's deciding comparisons: single-sample LUQ against fp32, non-inferior within the paper's own loss
    luq = {a.name for a in models.arms if isinstance(a.policy, Luq) and a.policy.samples == 1}
    gap = [
        deciding("Q1", [replace(pair, margin=settings.luq_margin)])[0] if pair.arm in luq else pair
        for pair in models.gap_pairs(settings.margin)
    ]
    experiment = GapExperiment(models, compare(gap + theory + deciding("Q2", mvue)))
    comparisons = experiment.comparisons
    claims = [
        decide("Q1", comparisons) if luq else undecided("Q1", "no single-sample LUQ run"),
        decide("Q2", comparisons, _prediction_miss(models, comparisons))
        if mvue
        else undecided("Q2", "no N:M run"),
    ]
    findings = []
    if theory:
        findings.append(f"Variance, measured against the theory: {summarise(having(comparisons, THEORY))}.")
    if mvue:
        naive = summarise(having(comparisons, NAIVE))
        findings.append(f"Variance of MVUE N:M against the naive unbiased estimator: {naive}.")
    groups = experiment.groups
    variance_table = Table(
        "Added variance relative to the energy (neural gradients: measured and predicted; weight gradient: "
        "measured)",
        [{"label": groups[r["run"]].label, **r} for r in variance.rows()],
    )
    return experiment.result(
        _c3_caption(settings, models, groups),
        "Accuracy of the sequels' compressors",
        experiment.rows(_c3_row),
        findings=findings,
        tables={"variance": variance_table},
        claims=claims,
    )
