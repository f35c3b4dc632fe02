"""A4-A6, A10: low-bit floating-point gradients (theory, formats, scaling, and where FP fails)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from gradcomp.analysis.accuracy import (
    FAILS,
    SCHEDULE,
    TRAINS,
    UNDECIDED,
    GapExperiment,
    WithinModels,
    claim_of,
    gap_cells,
    held_out_pair,
    outcome,
    per_seed_table,
    run_row,
    scale_note,
)
from gradcomp.analysis.claims import computed
from gradcomp.analysis.runs import RunGroup, accuracy_estimate, model_key, training_context
from gradcomp.analysis.seeds import POSITIVE, Estimate, PerSeed, number, spearman
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    FAMILIES,
    Comparison,
    Pair,
    by_arm,
    compare,
    having,
    summarise,
)
from gradcomp.compress import layer_log2_scale
from gradcomp.experiments import CompareWithinModels, FailurePairs, FpTheory, Scaling
from gradcomp.formats import FPFormat, parse_format
from gradcomp.ops import quantize_fp
from gradcomp.policies import FloatingPoint
from gradcomp.probe import load_probe
from gradcomp.theory import fp as fp_theory

_LN2 = math.log(2.0)
MONTE_CARLO_FORMATS = ("e5m2", "e4m3", "e4m1", "e3m1", "e3m0")
MONTE_CARLO_SIGMAS = (1.5, 3.0)
SCALE_SIGMAS = (1.0, 2.0, 3.0, 4.0)  # sigma2 of the curves of panel (a)
RULE, SPLIT, FIX = "rule", "split", "fix"  # A6: a scaling rule against the reference rule; the theory's split
HELD_OUT = "held_out"  # A10: the MSE rule's held-out runs predicted to train against those predicted to fail
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
    policy = _fp_member(group)
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
    scaling = _fp_member(group).scaling
    return {"global": "global", "dynamic": "dynamic"}.get(scaling, "per layer")


def _reference_rules(models: WithinModels) -> dict[tuple, RunGroup]:
    """(model and scale, format) -> the run with the per-layer mean rule: what the other scalings of that
    format are compared with."""
    references: dict[tuple, RunGroup] = {}
    for group in models.arms:
        policy = _fp_member(group)
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
    bits = _fp_member(splits[0]).fmt.bits
    tensor = torch.tensor([sigma2], dtype=torch.float64)
    predicted = int(fp_theory.optimal_exp_bits(bits, tensor, "saturate")[0])
    return sigma2, predicted, next((g for g in splits if _fp_member(g).fmt.exp_bits == predicted), None)


def _a6_caption(models: WithinModels, references: dict, splits: list[RunGroup], runs) -> str:
    rules = "; ".join(
        dict.fromkeys(
            f"{policy.scaling_label}: {policy.scaling_rule}"
            for policy in map(_fp_member, models.arms)
            if policy.scaling != "global"
        )
    )
    split_text = ", ".join(_fp_member(g).format_label for g in splits)
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
    own = {g.name: references.get((model_key(g), _fp_member(g).format_label)) for g in scaled}
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
            f"{_fp_member(chosen).format_label}; {summarise(having(comparisons, SPLIT))}."
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
    if group.policy.family == "none" or _fp_member(group).scaling != "global":
        return None
    return math.log2(_fp_member(group).global_scale)


# --- A10 ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layers:
    """A model's measured per-layer log2 statistics of its neural gradients (non-zero entries, last probed
    step of the uncompressed run, mean over its seeds), element counts and largest magnitudes (the probe's
    exact absmax, its log2 averaged over the seeds, as mu2 is): what the theory predicts from, and what
    bounds the per-layer min-MSE rule's scale (`compress.scale_bound`), as in training."""

    names: list[str]
    mu2: torch.Tensor
    sigma2: torch.Tensor
    elements: torch.Tensor
    amax: torch.Tensor

    @classmethod
    def of(cls, group: RunGroup) -> _Layers:
        by_layer: dict[str, list[tuple[float, float, float]]] = {}
        for run in group.runs.values():
            probe = load_probe(run.folder / "probe.npz")
            last = probe["step"].max()
            rows = np.flatnonzero((probe["kind"] == "gradient") & (probe["step"] == last))
            for i in rows:
                if np.isfinite(probe["log2_std"][i]) and probe["log2_std"][i] > 0:
                    values = (
                        probe["log2_mean"][i],
                        probe["log2_std"][i],
                        probe["count"][i] - probe["zeros"][i],
                        np.log2(probe["absmax"][i]),
                    )
                    by_layer.setdefault(str(probe["layer"][i]), []).append(tuple(map(float, values)))
        if not by_layer:
            raise ValueError(f"run {group.name!r}: its probe has no gradient statistics (set runs.*.probe)")
        columns = [torch.tensor([np.mean(c) for c in zip(*v, strict=True)]) for v in by_layer.values()]
        mu2, sigma2, elements, log2_amax = (
            torch.stack(column).double() for column in zip(*columns, strict=True)
        )
        return cls(list(by_layer), mu2, sigma2, elements, torch.exp2(log2_amax))

    def rule_scales(self, policy: FloatingPoint) -> torch.Tensor:
        """The per-layer log2 scales a fixed or per-layer rule gives these layers (`compress.
        layer_log2_scale`, the training rule, with each layer's amax read in float32 as training reads it)."""
        layers = zip(self.mu2, self.sigma2, self.amax.float(), strict=True)
        return torch.stack([layer_log2_scale(policy, mu2, sigma2, amax) for mu2, sigma2, amax in layers])

    def predict(self, fmt: FPFormat, log2_scales: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per layer (last axis) at the given log2 scales (broadcast against the layers): the shares of
        non-zero values flushed to zero (below half the smallest subnormal) and clipped (beyond the largest
        value), and the relative MSE of nearest rounding (gradcomp.theory.fp)."""
        centre = self.mu2 + log2_scales
        low, high = math.log2(fmt.min_subnormal / 2), math.log2(fmt.max_value)
        normal = torch.distributions.Normal(centre, self.sigma2)
        return {
            "flushed": normal.cdf(torch.tensor(low, dtype=torch.float64)),
            "clipped": 1 - normal.cdf(torch.tensor(high, dtype=torch.float64)),
            "relative_mse": fp_theory.relative_mse(fmt.positive_values(), self.sigma2, centre),
        }

    def totals(self, prediction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Over the layers (last axis): element-weighted flushed and clipped shares, the relative MSE averaged
        over layers (each layer's error relative to its own gradient's energy), and the worst layer's of
        each."""
        weights = self.elements / self.elements.sum()
        return {
            "predicted_flushed": (prediction["flushed"] * weights).sum(-1),
            "predicted_clipped": (prediction["clipped"] * weights).sum(-1),
            "predicted_relative_mse": prediction["relative_mse"].mean(-1),
        } | {f"predicted_worst_layer_{key}": values.max(-1).values for key, values in prediction.items()}

    def summarise(self, prediction: dict[str, torch.Tensor]) -> dict[str, float]:
        """`totals` of one configuration as numbers."""
        return {key: float(value) for key, value in self.totals(prediction).items()}

    def spread(self, criterion: _Criterion) -> float:
        """The binades one global scale must cover for every layer to meet the failure criterion: from the
        lowest layer's max_flushed quantile of log2|g| to the highest layer's (1 - max_clipped) quantile.
        The every-layer window is open only where the format's range exceeds it."""
        normal = torch.distributions.Normal(0.0, 1.0)
        z_flushed = float(normal.icdf(torch.tensor(criterion.max_flushed)))
        z_clipped = float(normal.icdf(torch.tensor(1 - criterion.max_clipped)))
        return float((self.mu2 + z_clipped * self.sigma2).max() - (self.mu2 + z_flushed * self.sigma2).min())


def _range(fmt: FPFormat) -> float:
    """The binades a format covers, from half its smallest subnormal (below: flushed) to its largest value."""
    return math.log2(fmt.max_value) - math.log2(fmt.min_subnormal / 2)


def _log2_scales(group: RunGroup, layers: _Layers) -> torch.Tensor:
    """The per-layer log2 scales `group`'s FP policy applies to these gradients: the rule's own for fixed and
    per-layer rules; for dynamic loss scaling the scale its runs settled at (mean over seeds)."""
    policy = _fp_member(group)
    if policy.scaling == "dynamic":
        settled = [
            math.log2(layer["scale"])
            for run in group.runs.values()
            for layer in run.summary["layers"].values()
            if layer.get("scale")
        ]
        return torch.full_like(layers.mu2, float(np.mean(settled)))
    return layers.rule_scales(policy)


def _is_min_mse(group: RunGroup) -> bool:
    policies = getattr(group.policy, "policies", (group.policy,))
    return any(getattr(policy, "scaling", None) == "per_layer_optimal" for policy in policies)


def _fp_member(group: RunGroup) -> FloatingPoint:
    policies = getattr(group.policy, "policies", (group.policy,))
    fp = [policy for policy in policies if isinstance(policy, FloatingPoint)]
    if len(fp) != 1 or len(policies) != 1:
        raise ValueError(f"an FP run is needed here; run {group.name!r} is {group.policy.describe()}")
    return fp[0]


SCOPES = {"element": "predicted", "every-layer": "predicted_worst_layer"}


@dataclass(frozen=True)
class _Criterion:
    """The predicted failure: more of the non-zero values clipped than `max_clipped`, or flushed to zero
    than `max_flushed`, counted over all values ("element") or in any one layer ("every-layer")."""

    max_clipped: float
    max_flushed: float
    scope: str = "element"

    def fails(self, prediction: dict):
        """On predicted `totals` (numbers, or tensors over global scales)."""
        prefix = SCOPES[self.scope]
        return (prediction[f"{prefix}_clipped"] > self.max_clipped) | (
            prediction[f"{prefix}_flushed"] > self.max_flushed
        )

    @property
    def text(self) -> str:
        return (
            f"more than {self.max_clipped:g} clipped or {self.max_flushed:g} flushed ({self.scope} criterion)"
        )


def flush_clip_failures(
    arms: Sequence[RunGroup], own: Mapping[str, RunGroup], max_clipped: float, max_flushed: float
) -> dict[str, bool] | None:
    """A10's criterion on FP runs of other experiments: per run, whether the lognormal theory predicts more
    of its non-zero gradient values clipped than `max_clipped` or flushed than `max_flushed` (element
    criterion), from the probe of its model's uncompressed run (`own`); None where a baseline has no probe."""
    layers: dict[str, _Layers] = {}
    failing = {}
    for arm in arms:
        baseline = own[arm.name]
        try:
            mine = layers.setdefault(baseline.name, _Layers.of(baseline))
        except (FileNotFoundError, ValueError):
            return None
        prediction = mine.summarise(mine.predict(_fp_member(arm).fmt, _log2_scales(arm, mine)))
        failing[arm.name] = bool(_Criterion(max_clipped, max_flushed).fails(prediction))
    return failing


def _agreement(rows: list[dict], criterion: _Criterion) -> tuple[int, int, int]:
    """Over the runs training decided: (criterion right, "nothing fails" right, decided runs)."""
    decided = [row for row in rows if row["measured"] != UNDECIDED]
    right = sum(bool(criterion.fails(row["prediction"])) == (row["measured"] == FAILS) for row in decided)
    trivial = sum(row["measured"] == TRAINS for row in decided)
    return right, trivial, len(decided)


def _sensitivity(settings: FailurePairs, rows: list[dict]) -> list[dict]:
    """The agreement of every criterion of the settings' grids, on every decided run."""
    table = []
    for scope in SCOPES:
        for clipped in settings.clipped_grid:
            for flushed in settings.flushed_grid:
                right, trivial, decided = _agreement(rows, _Criterion(clipped, flushed, scope))
                table.append(
                    {
                        "scope": scope,
                        "max_clipped": clipped,
                        "max_flushed": flushed,
                        "agree": right,
                        "nothing_fails_agrees": trivial,
                        "decided_runs": decided,
                    }
                )
    return table


def _fit_and_test(settings: FailurePairs, rows: list[dict], fit_model: str) -> tuple[_Criterion, dict]:
    """The criterion of the grids that agrees best on `fit_model`'s runs (the settings' own on a tie), and
    how it does on the other models' runs against "nothing fails" (an exact sign test on the runs where
    exactly one of the two is right)."""
    fit = [row for row in rows if row["model"] == fit_model]
    held_out = [row for row in rows if row["model"] != fit_model and row["measured"] != UNDECIDED]
    default = _Criterion(settings.max_clipped, settings.max_flushed)
    candidates = [default] + [
        _Criterion(c, f, scope)
        for scope in SCOPES
        for c in settings.clipped_grid
        for f in settings.flushed_grid
    ]
    best = max(candidates, key=lambda criterion: _agreement(fit, criterion)[0])
    right, trivial, decided = _agreement(held_out, best)
    # "nothing fails" is wrong exactly on the failing runs, the criterion wherever it errs: they disagree on
    # the runs the criterion predicts to fail
    alarmed = [row["measured"] for row in held_out if bool(best.fails(row["prediction"]))]
    only_criterion, only_trivial = alarmed.count(FAILS), alarmed.count(TRAINS)
    discordant = only_criterion + only_trivial
    p = float(stats.binomtest(only_criterion, discordant).pvalue) if discordant else math.nan
    return best, {
        "fit_agree": _agreement(fit, best),
        "right": right,
        "trivial": trivial,
        "decided": decided,
        "only_criterion": only_criterion,
        "only_trivial": only_trivial,
        "p": p,
    }


def _arm_rows(
    arms: list[RunGroup], own: dict[str, RunGroup], layers: dict[str, _Layers], gaps: dict[str, Comparison]
) -> list[dict]:
    """Every trained FP run: its predicted range losses from its model's gradients, and what training
    showed against fp32 of that model."""
    rows = []
    for arm in arms:
        mine = layers[own[arm.name].name]
        policy = _fp_member(arm)
        prediction = mine.summarise(mine.predict(policy.fmt, _log2_scales(arm, mine)))
        rows.append(
            {
                "run": arm.name,
                "model": arm.model,
                "label": arm.label,
                "log2_global_scale": math.log2(policy.global_scale) if policy.scaling == "global" else None,
                **prediction,
                **run_row(arm),
                **gap_cells(gaps[arm.name]),
                "measured": outcome(gaps[arm.name]),
                "prediction": prediction,
            }
        )
    return rows


def _windows(
    settings: FailurePairs, baselines: list[RunGroup], layers: dict[str, _Layers]
) -> tuple[list[dict], list[dict], list[dict]]:
    """Per model: the predicted losses at every global scale of the sweep, a summary of that window against
    the per-layer mean rule, and every format's relative MSE with the per-layer mean rule."""
    fmt = parse_format(settings.format)
    criterion = _Criterion(settings.max_clipped, settings.max_flushed)
    scales = torch.arange(settings.log2_scales[0], settings.log2_scales[1] + 1, dtype=torch.float64)
    window, per_model, formats = [], [], []
    for group in baselines:
        mine = layers[group.name]
        sweep = mine.totals(mine.predict(fmt, scales[:, None]))
        mse = sweep["predicted_relative_mse"]
        for index, scale in enumerate(scales.tolist()):
            window.append(
                {"model": group.model, "log2_scale": scale}
                | {key: float(values[index]) for key, values in sweep.items()}
            )
        rule = FloatingPoint(settings.format)
        per_layer = mine.summarise(mine.predict(fmt, mine.rule_scales(rule)))
        best = int(torch.argmin(mse))
        per_model.append(
            {
                "model": group.model,
                "layers": len(mine.names),
                "mu2_spread": float(mine.mu2.max() - mine.mu2.min()),
                "sigma2_mean": float(mine.sigma2.mean()),
                "spread": mine.spread(criterion),
                "format_range": _range(fmt),
                "per_layer_rule_relative_mse": per_layer["predicted_relative_mse"],
                "best_log2_global_scale": float(scales[best]),
                "best_global_relative_mse": float(mse[best]),
            }
            | _windows_of(scales, sweep, criterion)
        )
        for fmt_name in settings.formats:
            candidate = FloatingPoint(fmt_name)
            formats.append(
                {"model": group.model, "format": candidate.format_label}
                | mine.summarise(mine.predict(candidate.fmt, mine.rule_scales(candidate)))
                | {"spread": mine.spread(criterion), "format_range": _range(candidate.fmt)}
                | _windows_of(scales, mine.totals(mine.predict(candidate.fmt, scales[:, None])), criterion)
            )
    return window, per_model, formats


def _windows_of(scales: torch.Tensor, sweep: dict[str, torch.Tensor], criterion: _Criterion) -> dict:
    """The window of single global scales under each scope of the failure criterion, as table columns: the
    lowest and highest global log2 scale whose predicted `totals` the criterion spares (None: none does)."""
    columns = {}
    for scope in SCOPES:
        passed = ~_Criterion(criterion.max_clipped, criterion.max_flushed, scope).fails(sweep)
        good = scales[passed]
        low, high = (float(good.min()), float(good.max())) if good.numel() else (None, None)
        columns |= {f"{_column(scope)}_window_low": low, f"{_column(scope)}_window_high": high}
    return columns


def _column(scope: str) -> str:
    return scope.replace("-", "_")


def _agreement_finding(rows: list[dict], criterion: _Criterion) -> str:
    """How often a criterion matches what training decided, next to the trivial "nothing fails"."""
    right, trivial, decided = _agreement(rows, criterion)
    undecided = len(rows) - decided
    missed = [r["label"] for r in rows if r["measured"] == FAILS and not criterion.fails(r["prediction"])]
    false = [r["label"] for r in rows if r["measured"] == TRAINS and criterion.fails(r["prediction"])]
    return (
        f"Predicted failure ({criterion.text}): right for {right} of the {decided} runs training decided "
        f"(fails: worse than fp32 of its model; trains: equivalent within the margin), against {trivial} for "
        f'"nothing fails"; {undecided} runs inconclusive; failures not predicted: '
        f"{', '.join(missed) or 'none'}; predicted failures that train: {', '.join(false) or 'none'}."
    )


def _ranking_finding(rows: list[dict]) -> str:
    """Whether predicted relative MSE ranks the measured accuracy loss, over all runs and over those that
    train (plainly: a rank correlation whose interval excludes 0, or not)."""
    parts = []
    for name, chosen in (
        ("every trained FP run", [r for r in rows if (r["gap_pt_n"] or 0) > 1]),
        (
            "the runs that train (not worse than fp32)",
            [r for r in rows if r["measured"] != FAILS and (r["gap_pt_n"] or 0) > 1],
        ),
    ):
        rho, low, high, n = spearman(
            [r["predicted_relative_mse"] for r in chosen], [-r["gap_pt_mean"] for r in chosen]
        )
        if math.isnan(rho):
            parts.append(f"over {name}: too few runs ({n}) for a rank correlation")
            continue
        ranks = "ranks" if low > 0 else "ranks it inversely" if high < 0 else "does not rank"
        parts.append(
            f"over {name} it {ranks} the accuracy loss (Spearman {rho:+.2f}, 95 % CI "
            f"[{low:+.2f}, {high:+.2f}], "
            f"{n} runs)"
        )
    return "Predicted relative MSE: " + "; ".join(parts) + "."


def _fit_finding(best: _Criterion, test: dict, fit_model: str) -> str:
    fit_right, _, fit_decided = test["fit_agree"]
    if not test["decided"]:
        held = "no run of another model was decided, so it is not tested"
    else:
        p = (
            ""
            if math.isnan(test["p"])
            else f", exact sign test on the {test['only_criterion'] + test['only_trivial']} runs where they "
            f"differ p = {test['p']:.2g}"
        )
        held = (
            f"on the other models' {test['decided']} decided runs it is right for {test['right']}, "
            f'"nothing fails" for {test["trivial"]}{p}'
        )
    return (
        f"Thresholds fixed on {fit_model} ({best.text}: right for {fit_right} of its {fit_decided} decided "
        f"runs), then tested: {held}."
    )


def _held_out_pair(
    best: _Criterion, rows: list[dict], models: WithinModels, fit_model: str, margin: float
) -> Pair | None:
    """The MSE rule on the models it was not fitted on: the held-out runs it predicts to train against
    those it predicts to fail (`held_out_pair`)."""
    held = [row for row in rows if row["model"] != fit_model]
    fails = {row["run"] for row in held if bool(best.fails(row["prediction"]))}
    return held_out_pair(models, [row["run"] for row in held], fails, margin, HELD_OUT)


def _window_statement(row: dict) -> str:
    """One model's windows of single global scales for the swept format, under both scopes."""
    spread = f"mu2 spread {row['mu2_spread']:.1f} binades, mean sigma2 {row['sigma2_mean']:.2f}"
    windows = []
    for scope in SCOPES:
        low, high = (row[f"{_column(scope)}_window_{end}"] for end in ("low", "high"))
        windows.append(
            f"{scope} criterion: {'none' if low is None else f'2^{low:g} to 2^{high:g}'}"
            + (
                f" (every layer needs {row['spread']:.1f} binades, the format has {row['format_range']:.1f})"
                if scope == "every-layer"
                else ""
            )
        )
    return (
        f"{row['model']} ({spread}): single global scales predicted to pass: {'; '.join(windows)}; least "
        f"relative MSE at 2^{row['best_log2_global_scale']:g} ({row['best_global_relative_mse']:.3g}, "
        f"per-layer mean rule {row['per_layer_rule_relative_mse']:.3g})."
    )


def _a10_caption(settings: FailurePairs, baselines: list[RunGroup], runs: dict[str, RunGroup]) -> str:
    swept = FloatingPoint(settings.format).format_label
    optimal = [g.label for g in runs.values() if _is_min_mse(g)]
    bounded = (
        f" A per-layer rule's scales are those training applies: the min-MSE rule's ({', '.join(optimal)}) "
        "is at least the largest scale that keeps each layer's largest |g| (the probe's, its log2 averaged "
        "over the seeds) within the format's largest value, never the lognormal optimum alone, which can lie "
        "below every value of a real gradient; at that scale the theory, whose lognormal has no largest "
        "value, predicts a layer's tail beyond it to clip, which the layer does not have (C2 predicts the "
        "same rule for each tensor below its largest value)."
        if optimal
        else ""
    )
    return f"""Predictions of the lognormal theory from each model's measured gradients, next to trained
        outcomes. The theory reads, per layer, the mean and standard deviation of log2|g| (non-zero entries
        of the {"; ".join(f"{g.model}: {g.compression_points}" for g in baselines)}) at the last probed step
        of the uncompressed runs ({", ".join(g.name for g in baselines)}; mean over their seeds), and
        predicts for a format and per-layer scale the share of values flushed to zero (below half the
        smallest subnormal), clipped at the largest value, and the relative MSE of nearest rounding (mean
        over layers).{bounded} A configuration is predicted to fail where more than
        {settings.max_clipped:g} of the non-zero values clip or more than {settings.max_flushed:g} flush
        (the settings' thresholds; their sensitivity over the grids
        {", ".join(map(str, settings.clipped_grid))} and {", ".join(map(str, settings.flushed_grid))} is
        tabulated), counted over all values (element
        criterion) or in any one layer (every-layer criterion). Training decides a run: it fails when
        significantly worse than fp32 of its model (paired by seed, {FAMILIES}), trains when
        equivalent within ±{settings.margin:g} pt (two one-sided tests), and is undecided otherwise. (a) Each
        failing configuration next to its fix (joined), coloured by what training showed (red: fails, green:
        trains, grey: undecided): final test accuracy, mean and 95 % CI over seeds and every seed, with the
        uncompressed run of its model (band). (b) Predicted relative MSE of {swept}
        with one global scale for every layer, against log2 of that scale (2^{settings.log2_scales[0]} to
        2^{settings.log2_scales[1]}), per model, next to the per-layer mean rule (dotted), with each model's
        predicted windows (light shading: element criterion passed; dark: every-layer criterion passed). (c)
        Predicted relative MSE of every trained FP run against its measured accuracy loss from fp32 of its
        model (95 % CI; coloured as in (a), one marker per model). {training_context(runs)}."""


def _pair_rows(fixes: list[tuple[RunGroup, RunGroup]], comparisons: list[Comparison]) -> list[dict]:
    """Each (failing, fixing) pair: both runs' accuracies and the fix's paired gain."""
    gains = {(c.arm, c.baseline): c for c in having(comparisons, FIX)}
    return [
        {
            "failing": failing.label,
            "fixing": fixing.label,
            "model": failing.model,
            "failing_run": failing.name,
            "fixing_run": fixing.name,
            **accuracy_estimate(failing).columns("failing_accuracy"),
            **accuracy_estimate(fixing).columns("fixing_accuracy"),
            **gap_cells(gains[fixing.name, failing.name]),
        }
        for failing, fixing in fixes
    ]


def _a10_findings(settings: FailurePairs, rows: list[dict], fitted: tuple, per_model, formats) -> list[str]:
    """Agreement of the settings' criterion (both scopes) next to "nothing fails", the fitted criterion's
    test on the other models, whether predicted MSE ranks accuracy, and the windows of global scales."""
    no_window = [
        f"{row['format']} on {row['model']} (needs {row['spread']:.1f} binades, "
        f"has {row['format_range']:.1f})"
        for row in formats
        if row["every_layer_window_low"] is None
    ]
    return [
        *(
            _agreement_finding(rows, _Criterion(settings.max_clipped, settings.max_flushed, s))
            for s in SCOPES
        ),
        _fit_finding(*fitted),
        _ranking_finding(rows),
        *(_window_statement(row) for row in per_model),
        "No single global scale serves every layer for: " + "; ".join(no_window) + "."
        if no_window
        else "Every format listed has a global scale that serves every layer on every model.",
    ]


def failure_cases(settings: FailurePairs, runs: dict[str, RunGroup]) -> Result:
    """A10: the theory's failure predictions from measured gradients against trained outcomes: agreement
    next to "nothing fails", threshold sensitivity, thresholds fitted on one model and tested on the others,
    whether predicted MSE ranks accuracy, and each model's window of single global scales."""
    baselines = settings.present(settings.baselines, runs)
    layers = {group.name: _Layers.of(group) for group in baselines}
    fixes = [(runs[a], runs[b]) for a, b in settings.pairs if a in runs and b in runs]  # (failing, fixing)
    arms = settings.present([*(run for pair in settings.pairs for run in pair), *settings.arms], runs)
    models = WithinModels.of(baselines, arms, "experiments.A10.baselines")
    pairs = models.pairs([(fixing, failing) for failing, fixing in fixes], settings.margin, FIX)
    comparisons = compare(pairs + models.gap_pairs(settings.margin))
    rows = _arm_rows(models.arms, models.own, layers, by_arm(comparisons))
    fit_model = runs[settings.fit_on or settings.baselines[0]].model
    best, test = _fit_and_test(settings, rows, fit_model)
    pair = _held_out_pair(best, rows, models, fit_model, settings.margin)
    held_out = [] if pair is None else compare([pair])
    window, per_model, formats = _windows(settings, baselines, layers)
    groups = {group.name: group for group in [*baselines, *models.arms]}
    swept = FloatingPoint(settings.format).format_label
    return Result(
        caption=_a10_caption(settings, baselines, groups),
        tables={
            "main": Table(
                "Failures of low-bit FP gradients and their fixes",
                _pair_rows(fixes, comparisons),
                note=scale_note(groups),
            ),
            "arms": Table(
                "Every trained FP run: predicted range losses and what training showed",
                [{k: v for k, v in row.items() if k != "prediction"} for row in rows],
            ),
            "sensitivity": Table(
                "Agreement of each threshold pair with what training decided", _sensitivity(settings, rows)
            ),
            "models": Table(f"Global-scale window of {swept} per model (predicted)", per_model),
            "formats": Table("Predicted relative MSE of each format with the per-layer mean rule", formats),
            "window": Table("Predicted range losses against the global scale", window, markdown=False),
            "seeds": per_seed_table([*baselines, *models.arms]),
            "baseline": Table("fp32", [run_row(g) | {"model": g.model} for g in baselines], markdown=False),
        },
        comparisons=comparisons + held_out,
        findings=[
            *_a10_findings(settings, rows, (best, test, fit_model), per_model, formats),
            _held_out_finding(held_out, best, fit_model),
        ],
    )


def _held_out_finding(held_out: list[Comparison], best: _Criterion, fit_model: str) -> str:
    """The MSE rule's held-out test in words (claim L7 is decided by F1, on the noise ratio)."""
    fitted = f"The MSE rule fitted on {fit_model} ({best.text}) on the other models' runs"
    if not held_out:
        return f"{fitted}: it predicts every held-out run alike, nothing to compare."
    (c,) = held_out
    return f"{fitted}: {c.a} vs {c.b}: {c.difference:+.3g} pt {c.interval}, {c.decision}."
