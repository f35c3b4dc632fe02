"""A4-A6: low-bit floating-point gradients (theory, formats, scaling); A10, where FP fails: `fp_failures`."""

from __future__ import annotations

import math

import numpy as np
import torch

from gradcomp.analysis.accuracy import (
    SCHEDULE,
    GapExperiment,
    WithinModels,
    claim_of,
    gap_cells,
    per_seed_table,
    run_row,
    scale_note,
)
from gradcomp.analysis.claims import computed
from gradcomp.analysis.runs import RunGroup, model_key, training_context
from gradcomp.analysis.seeds import POSITIVE, Estimate, PerSeed, number
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    FAMILIES,
    by_arm,
    compare,
    having,
    summarise,
)
from gradcomp.experiments import CompareWithinModels, FpTheory, Scaling
from gradcomp.formats import parse_format
from gradcomp.ops import quantize_fp
from gradcomp.theory import fp as fp_theory
from gradcomp.training.policies import FloatingPoint

_LN2 = math.log(2.0)
MONTE_CARLO_FORMATS = ("e5m2", "e4m3", "e4m1", "e3m1", "e3m0")
MONTE_CARLO_SIGMAS = (1.5, 3.0)
SCALE_SIGMAS = (1.0, 2.0, 3.0, 4.0)  # sigma2 of the curves of panel (a)
RULE, SPLIT, FIX = "rule", "split", "fix"  # A6: a scaling rule against the reference rule; the theory's split
# against the others; A10: a failing run against its fix
FP4 = 4  # the bit width of the claim's predicted format [1,3,0]


# --- A4 -----------------------------------------------------------------------------------------------------
def _monte_carlo_mse(fmt_name: str, sigma2: float, log2_scale: float, numel: int, seed: int) -> float:
    """Relative MSE E[(Q(x)-x)^2]/E[x^2] of quantize_fp (nearest, given scale) for log2|x| ~ N(0, sigma2^2).

    Samples come from the energy-tilted lognormal x^2 f(x)/E[x^2] (log2-mean 2 ln2 sigma2^2, same sigma),
    under which the relative MSE is the plain mean of ((Q(x)-x)/x)^2: the same quantity, but without the
    variance of plain sampling, whose error energy sits far out in the tail."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(numel, generator=generator, dtype=torch.float64)
    x = torch.exp2(sigma2 * z + 2 * _LN2 * sigma2 * sigma2).float()
    q = quantize_fp(x, parse_format(fmt_name), scale=2.0**log2_scale)
    return float((((q.double() - x.double()) / x.double()) ** 2).mean())


def _sigma_grid() -> torch.Tensor:
    return torch.linspace(0.25, 6.0, 47, dtype=torch.float64)


def _curves(settings: FpTheory) -> dict[str, Table]:
    """The figure's curves: MSE against the scale (a) and sigma (b), and the optimal E against sigma (c)."""
    sigmas = _sigma_grid()
    grid = parse_format("e4m1").positive_values()
    centres = torch.linspace(-30, 20, 201, dtype=torch.float64)
    by_scale = [
        {"sigma_log2": sigma2, "log2_scale_plus_mu2": float(centre), "relative_mse": float(mse)}
        for sigma2 in SCALE_SIGMAS
        for centre, mse in zip(centres, fp_theory.relative_mse(grid, sigma2, centres), strict=True)
    ]
    by_sigma = [
        {"exp_bits": exp_bits, "sigma_log2": float(sigma), "relative_mse": float(value)}
        for exp_bits, mse in fp_theory.mse_by_exp_bits(6, sigmas, "ideal").items()
        for sigma, value in zip(sigmas, mse, strict=True)
    ]
    optimum = [
        {"bits": bits, "grid": kind, "sigma_log2": float(sigma), "optimal_exp_bits": int(best)}
        for bits in settings.bits
        for kind in settings.kinds
        for sigma, best in zip(sigmas, fp_theory.optimal_exp_bits(bits, sigmas, kind), strict=True)
    ]
    return {
        "by_scale": Table("(a) relative MSE against the scale", by_scale, markdown=False),
        "by_sigma": Table("(b) relative MSE against sigma2, 6 bits", by_sigma, markdown=False),
        "optimum": Table("(c) optimal exponent bits against sigma2", optimum, markdown=False),
    }


def _named_formats(settings: FpTheory) -> list[dict]:
    """Each named format at its own MSE-optimal scale, at every sigma of the settings."""
    chosen = torch.tensor(settings.sigmas, dtype=torch.float64)
    return [
        {
            "format": fmt.name,
            "bits": fmt.bits,
            "exp_bits": fmt.exp_bits,
            "man_bits": fmt.man_bits,
            "reserved": fmt.reserved,
            "max_value": fmt.max_value,
            "range_binades": math.log2(fmt.max_value / fmt.min_subnormal),
            "sigma_log2": sigma,
            "optimal_log2_scale": scale,
            "relative_mse": value,
        }
        for fmt in map(parse_format, settings.formats)
        for sigma, scale, value in zip(
            settings.sigmas, *(v.tolist() for v in fp_theory.optimal_log2_scale(fmt, chosen)), strict=True
        )
    ]


def _monte_carlo_checks(settings: FpTheory) -> list[dict]:
    """Analytic MSE against Monte-Carlo estimates with quantize_fp at the optimal scale, one per seed."""
    measured = PerSeed(("format", "sigma_log2"), {"monte_carlo_relative_mse": POSITIVE})
    analytic = {}
    for index, (name, sigma2) in enumerate(
        (name, sigma2) for name in MONTE_CARLO_FORMATS for sigma2 in MONTE_CARLO_SIGMAS
    ):
        grid = parse_format(name).positive_values()
        log2_scale, mse = fp_theory.optimal_log2_scale(grid, torch.tensor(sigma2, dtype=torch.float64))
        analytic[name, sigma2] = (float(log2_scale), float(mse))
        for seed in settings.seeds:
            value = _monte_carlo_mse(
                name, sigma2, float(log2_scale), settings.monte_carlo, 1000 * seed + index
            )
            measured.add(seed, {"format": name, "sigma_log2": sigma2}, monte_carlo_relative_mse=value)
    rows = []
    for row in measured.rows():
        log2_scale, mse = analytic[row["format"], row["sigma_log2"]]
        ratio = row["monte_carlo_relative_mse_mean"] / mse
        rows.append({**row, "optimal_log2_scale": log2_scale, "analytic_relative_mse": mse, "ratio": ratio})
    return rows


def _fp4_claim(settings: FpTheory, switch_points: list[dict]) -> list:
    """L2: the optimal E never falls as sigma grows (every grid and bit width), and 4 bits at the measured
    gradients' sigma2 are best split [1,3,0] on the idealised grid the claim's analysis uses."""
    sigmas = _sigma_grid()
    monotone = all(
        bool((fp_theory.optimal_exp_bits(bits, sigmas, kind).diff() >= 0).all())
        for bits in settings.bits
        for kind in settings.kinds
    )
    low, high = settings.gradient_sigma2
    span = torch.linspace(low, high, 9, dtype=torch.float64)
    fp4 = sorted({int(e) for e in fp_theory.optimal_exp_bits(FP4, span, "ideal")})
    points = "; ".join(
        f"{bits} bits: "
        + ", ".join(_switch(row) for row in switch_points if row["bits"] == bits and row["grid"] == "ideal")
        for bits in settings.bits
    )
    evidence = (
        f"optimal E non-decreasing in sigma2 on every grid: {'yes' if monotone else 'no'} (switch points on "
        f"the idealised grid, {points}); "
        f"4-bit optimum at sigma2 {low:g}-{high:g}: E = {', '.join(map(str, fp4))}"
    )
    return [computed("L2", monotone and fp4 == [3], evidence, "analytic (gradcomp.theory.fp), no training")]


def _switch(row: dict) -> str:
    return f"E={row['exp_bits']} from {row['from_sigma_log2']:.2g}"


def _a4_caption(settings: FpTheory) -> str:
    return f"""Exact relative MSE E[(Q(x)-x)^2]/E[x^2] of nearest rounding of a lognormal (log2|x| ~
        N(mu2, sigma2^2)) to FP grids, from gradcomp.theory.fp. (a) Against log2 scale + mu2 (the mean of
        log2|x·scale|) for FP6 [1,4,1] (saturating, with subnormals): an optimum between underflow and
        overflow. (b) At the optimal scale against sigma2 for every exponent/mantissa split of 6 bits
        (idealised grid). (c) The optimal number of exponent bits against sigma2 for
        {", ".join(map(str, settings.bits))}-bit formats on the {", ".join(settings.kinds)} grids (idealised:
        2^E binades of 2^M levels; saturate, inf and fn: real formats with subnormals, every code a number,
        IEEE-like, or only the all-ones code reserved as in float8_e4m3fn): the optimum moves. (d) Analytic
        MSE against Monte-Carlo estimates with quantize_fp at the optimal scale ({settings.monte_carlo:,}
        samples from the energy-tilted lognormal, which has the same relative MSE and a far smaller
        variance; mean and 95 % CI over {len(settings.seeds)} seeds). Tables also give named formats
        ({", ".join(settings.formats)}: the ml_dtypes / OCP dtypes) at their own MSE-optimal scale; the
        theory clamps at the largest value whatever a format does on overflow (saturate, Inf or NaN)."""


def fp_mse_theory(settings: FpTheory, runs: dict[str, RunGroup]) -> Result:
    """A4: the MSE theory of FP formats for lognormal values, checked by Monte-Carlo."""
    switch_points = [
        {"bits": bits, "grid": kind, "exp_bits": exp_bits, "from_sigma_log2": sigma}
        for bits in settings.bits
        for kind in settings.kinds
        for exp_bits, sigma in fp_theory.switch_points(bits, kind).items()
    ]
    chosen = torch.tensor(settings.sigmas, dtype=torch.float64)
    relative_mse = [
        {"bits": bits, "grid": kind, "sigma_log2": sigma, "exp_bits": exp_bits, "relative_mse": value}
        for bits in settings.bits
        for kind in settings.kinds
        for exp_bits, mse in fp_theory.mse_by_exp_bits(bits, chosen, kind).items()
        for sigma, value in zip(settings.sigmas, mse.tolist(), strict=True)
    ]
    checks = _monte_carlo_checks(settings)
    named = _named_formats(settings)
    worst = max(checks, key=lambda row: abs(row["ratio"] - 1))
    findings = [
        f"Monte-Carlo estimates with quantize_fp agree with the analytic MSE within "
        f"{abs(worst['ratio'] - 1):.1%} (largest deviation: {worst['format']} at sigma2 "
        f"{worst['sigma_log2']:g}, {Estimate.read(worst, 'monte_carlo_relative_mse').text()} against "
        f"{number(worst['analytic_relative_mse'])}).",
    ]
    return Result(
        caption=_a4_caption(settings),
        tables={
            "main": Table("Analytic vs Monte-Carlo relative MSE at the optimal scale", checks),
            "formats": Table("Relative MSE of named formats at their MSE-optimal scale", named),
            "switch_points": Table(
                "Sigma2 (binades) from which E exponent bits minimise the relative MSE at the optimal scale",
                switch_points,
            ),
            "relative_mse": Table(
                "Relative quantization MSE of a lognormal at the MSE-optimal scale", relative_mse
            ),
            **_curves(settings),
        },
        findings=findings,
        claims=_fp4_claim(settings, switch_points),
    )


# --- A5 -----------------------------------------------------------------------------------------------------
def _mean_sigma2(group: RunGroup) -> float:
    """Mean over layers and seeds of the fitted sigma of log2|g| (None where a layer has no fit)."""
    sigmas = [
        layer["sigma"] / _LN2
        for run in group.runs.values()
        for layer in run.summary["layers"].values()
        if layer.get("sigma") is not None and math.isfinite(layer["sigma"])
    ]
    return float(np.mean(sigmas)) if sigmas else math.nan


def _fp_row(group: RunGroup) -> dict:
    """A run's row: its format and scaling (fp32 for the uncompressed run), and its accuracy over seeds."""
    if group.policy.family == "none":
        return {**run_row(group), "format": group.label, "bits": 32, "scaling": None}
    policy = fp_member(group)
    return {
        **run_row(group),
        "format": policy.format_label,
        "bits": policy.fmt.bits,
        "scaling": policy.scaling_label,
    }


def _a5_caption(models: WithinModels, runs: dict[str, RunGroup]) -> str:
    rounding = "/".join(dict.fromkeys(arm.policy.rounding for arm in models.arms))
    scaling = "; ".join(dict.fromkeys(arm.policy.scaling_rule for arm in models.arms))
    panels = "one panel per model, each with" if models.several else "with"
    return f"""Final test accuracy when the gradient at every compression point of the model (below) is
        rounded ({rounding}) to an n-bit [1,E,M] format, scaled {scaling}, refreshed every step;
        {panels} the dashed line and band of the uncompressed run of {"its" if models.several else "the"}
        model (mean and 95 % CI). Points: mean over seeds with 95 % CI; dots: each seed. Below, each format's
        difference from that run paired by seed, as its verdict (under its name) was decided: each seed's,
        the mean with its 95 % interval (hollow: inconclusive), the margin of its test shaded. Models
        ({models.caption()}). {training_context(runs)}. Each format is compared with the uncompressed run of
        its own model and scale, paired by seed (same initialisation and data order), and an arm that only
        starts compressing later with the same arm at the default schedule; verdicts after {FAMILIES},
        equivalence by two one-sided tests at the settings' margin."""


def fp_formats(settings: CompareWithinModels, runs: dict[str, RunGroup]) -> Result:
    """A5: accuracy with FP gradient formats, each arm against fp32 of its own model and scale."""
    models = WithinModels.of_settings(settings, runs, "A5")
    experiment = GapExperiment(
        models,
        compare(
            models.gap_pairs(settings.margin, {"L3": settings.claim})
            + models.pairs(models.schedules(), settings.margin, SCHEDULE)
        ),
    )
    schedules = having(experiment.comparisons, SCHEDULE)
    return experiment.result(
        _a5_caption(models, experiment.groups),
        "Accuracy with FP gradient formats",
        experiment.rows(_fp_row, lambda r: (-r["bits"], r["format"])),
        findings=[f"Schedules: {summarise(schedules)}."] if schedules else [],
        claims=claim_of("L3", settings.claim, experiment.gaps),
    )


# --- A6 -----------------------------------------------------------------------------------------------------
def _part(group: RunGroup) -> str:
    """How a run of A6 scales its gradients: per-layer rule, dynamic, or one fixed global scale."""
    scaling = fp_member(group).scaling
    return {"global": "global", "dynamic": "dynamic"}.get(scaling, "per layer")


def _reference_rules(models: WithinModels) -> dict[tuple, RunGroup]:
    """(model and scale, format) -> the run with the per-layer mean rule: what the other scalings of that
    format are compared with."""
    references: dict[tuple, RunGroup] = {}
    for group in models.arms:
        policy = fp_member(group)
        if policy.scaling == "per_layer_mean" and not (group.config.get("compression") or {}).get(
            "warmup_steps"
        ):
            references.setdefault((model_key(group), policy.format_label), group)
    return references


def _predicted_split(splits: list[RunGroup]) -> tuple[float, int | None, RunGroup | None]:
    """The mean sigma2 measured in the split runs, the exponent bits the theory (saturating grid with
    subnormals) predicts for it, and the split run with those bits."""
    sigma2 = float(np.nanmean([_mean_sigma2(group) for group in splits])) if splits else math.nan
    if not math.isfinite(sigma2):
        return sigma2, None, None
    bits = fp_member(splits[0]).fmt.bits
    tensor = torch.tensor([sigma2], dtype=torch.float64)
    predicted = int(fp_theory.optimal_exp_bits(bits, tensor, "saturate")[0])
    return sigma2, predicted, next((g for g in splits if fp_member(g).fmt.exp_bits == predicted), None)


def _a6_caption(models: WithinModels, references: dict, splits: list[RunGroup], runs) -> str:
    rules = "; ".join(
        dict.fromkeys(
            f"{policy.scaling_label}: {policy.scaling_rule}"
            for policy in map(fp_member, models.arms)
            if policy.scaling != "global"
        )
    )
    split_text = ", ".join(fp_member(g).format_label for g in splits)
    formats = ", ".join(dict.fromkeys(f"{models.name(g)} {label}" for (_, label), g in references.items()))
    return f"""(a) Accuracy difference from the per-layer mean rule of the same model and format
        ({formats}), paired by seed (mean and 95 % CI), of one fixed global loss scale for every layer
        against log2 of that scale, and of dynamic loss scaling and the per-layer min-MSE rule (at the
        right); the band is the settings' equivalence margin. Rules: {rules}; global 2^k: one fixed scale
        2^k for every layer. (b) The splits {split_text} of one bit budget with the per-layer mean rule
        (points: mean and 95 % CI; dots: each seed) against fp32 (band); the title gives the split the MSE
        theory (saturating grid with subnormals) predicts from the mean sigma2 measured in these runs (the
        mean over layers and seeds of each layer's last fit). Models ({models.caption()}).
        {training_context(runs)}. Comparisons: each other scaling against the per-layer mean rule of its
        model and format, each split against the predicted one; paired by seed, verdicts after {FAMILIES},
        equivalence by two one-sided tests at the margin."""


def scaling_and_split(settings: Scaling, runs: dict[str, RunGroup]) -> Result:
    """A6: one global scale (swept), dynamic loss scaling and the per-layer rules, per model and format;
    the exponent/mantissa split of one bit budget against the theory's choice."""
    scaled = settings.present([*settings.rules, *settings.sweep], runs)
    splits = settings.present(settings.splits, runs)
    models = WithinModels.of(
        settings.present(settings.baselines, runs), [*scaled, *splits], "experiments.A6.baseline"
    )
    references = _reference_rules(models)
    own = {g.name: references.get((model_key(g), fp_member(g).format_label)) for g in scaled}
    versus = [(g, own[g.name]) for g in scaled if own[g.name] is not None and own[g.name] is not g]
    sigma2, predicted, chosen = _predicted_split(splits)
    split_pairs = [(g, chosen) for g in splits if chosen is not None and g is not chosen]
    comparisons = compare(
        models.pairs(versus, settings.margin, RULE) + models.pairs(split_pairs, settings.margin, SPLIT)
    )
    against = by_arm(comparisons, RULE)
    split_names = {group.name for group in splits}
    rows = [
        {
            "part": _part_of(group),
            "split": group.name in split_names,
            "model": models.name(group),
            **_fp_row(group),
            "log2_global_scale": _global_log2(group),
            "mean_sigma2": _mean_sigma2(group) if group.policy.family != "none" else None,
            "versus": own[group.name].label if group.name in against else None,
            **gap_cells(against.get(group.name)),
        }
        for group in {g.name: g for g in [*scaled, *splits, *models.baselines]}.values()
    ]
    by_reference = {
        key: [c for name, c in against.items() if own[name] is reference]
        for key, reference in references.items()
    }
    findings = [
        f"{models.name(references[key])} {key[1]}: {summarise(mine)}."
        for key, mine in by_reference.items()
        if mine
    ]
    if chosen is not None:
        findings.append(
            f"From the mean sigma2 {sigma2:.2f} measured in the split runs the theory predicts "
            f"{fp_member(chosen).format_label}; {summarise(having(comparisons, SPLIT))}."
        )
    groups = {group.name: group for group in [*models.baselines, *models.arms]}
    return Result(
        caption=_a6_caption(models, references, splits, groups),
        tables={
            "main": Table("Loss scaling and exponent/mantissa split", rows, note=scale_note(groups)),
            "seeds": per_seed_table([*models.baselines, *models.arms]),
        },
        comparisons=comparisons,
        findings=findings,
        facts={"predicted_exp_bits": predicted, "mean_sigma2": sigma2, "margin": settings.margin},
    )


def _part_of(group: RunGroup) -> str:
    return "fp32" if group.policy.family == "none" else _part(group)


def _global_log2(group: RunGroup) -> float | None:
    if group.policy.family == "none" or fp_member(group).scaling != "global":
        return None
    return math.log2(fp_member(group).global_scale)


def fp_member(group: RunGroup) -> FloatingPoint:
    """The run's one FP policy (A5, A6, A10)."""
    policies = getattr(group.policy, "policies", (group.policy,))
    fp = [policy for policy in policies if isinstance(policy, FloatingPoint)]
    if len(fp) != 1 or len(policies) != 1:
        raise ValueError(f"an FP run is needed here; run {group.name!r} is {group.policy.describe()}")
    return fp[0]
