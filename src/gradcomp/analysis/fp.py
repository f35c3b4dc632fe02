"""A4-A6, A10: low-bit floating-point gradients (theory, formats, scaling, and where FP fails)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from gradcomp import fp_theory
from gradcomp.analysis.accuracy import (
    WithinModels,
    compare_accuracy,
    noise_floor,
    per_seed_table,
    run_row,
    with_gaps,
)
from gradcomp.analysis.runs import RunGroup, one_per_model, training_context
from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.tables import Result, Table
from gradcomp.compress import layer_log2_scale
from gradcomp.experiments import CompareWithinModels, FailurePairs, FpTheory, Scaling
from gradcomp.formats import FPFormat, parse_format
from gradcomp.ops import quantize_fp
from gradcomp.policies import FloatingPoint
from gradcomp.probe import load_probe

_LN2 = math.log(2.0)
MONTE_CARLO_FORMATS = ("e5m2", "e4m3", "e4m1", "e3m1", "e3m0")
MONTE_CARLO_SIGMAS = (1.5, 3.0)
SCALE_SIGMAS = (1.0, 2.0, 3.0, 4.0)  # sigma2 of the curves of panel (a)


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


def fp_mse_theory(settings: FpTheory, runs: dict[str, RunGroup]) -> Result:
    sigmas = torch.linspace(0.25, 6.0, 47, dtype=torch.float64)
    grid = parse_format("e4m1").positive_values()
    offsets = torch.linspace(-30, 20, 201, dtype=torch.float64)
    by_scale = [
        {"sigma_log2": sigma2, "log2_scale_minus_mu2": float(offset), "relative_mse": float(mse)}
        for sigma2 in SCALE_SIGMAS
        for offset, mse in zip(offsets, fp_theory.relative_mse(grid, sigma2, offsets), strict=True)
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
    named = [
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
    checks = []
    for name in MONTE_CARLO_FORMATS:
        for sigma2 in MONTE_CARLO_SIGMAS:
            fmt_grid = parse_format(name).positive_values()
            log2_scale, analytic = fp_theory.optimal_log2_scale(
                fmt_grid, torch.tensor(sigma2, dtype=torch.float64)
            )
            measured = [
                _monte_carlo_mse(
                    name, sigma2, float(log2_scale), settings.monte_carlo, 1000 * seed + len(checks)
                )
                for seed in settings.seeds
            ]
            checks.append(
                {
                    "format": name,
                    "sigma_log2": sigma2,
                    "optimal_log2_scale": float(log2_scale),
                    "analytic_relative_mse": float(analytic),
                    **Estimate.of(measured).columns("monte_carlo_relative_mse"),
                    "seeds": len(measured),
                    "ratio": float(np.mean(measured)) / float(analytic),
                }
            )

    def best_at(bits: int, kind: str, sigma2: float) -> int:
        return int(fp_theory.optimal_exp_bits(bits, torch.tensor([sigma2], dtype=torch.float64), kind)[0])

    headline = {
        "monte_carlo_max_relative_deviation": max(abs(row["ratio"] - 1) for row in checks),
        "optimal_exp_bits_sigma2_3": {
            f"{b}b {k}": best_at(b, k, 3.0) for b in settings.bits for k in settings.kinds
        },
        "named_relative_mse_sigma2_3": {
            row["format"]: row["relative_mse"] for row in named if row["sigma_log2"] == 3
        },
    }
    caption = f"""Exact relative MSE E[(Q(x)-x)^2]/E[x^2] of nearest rounding of a lognormal (log2|x| ~
        N(mu2, sigma2^2)) to FP grids, from gradcomp.fp_theory. (a) Against the scale for FP6 [1,4,1]
        (saturating, with subnormals): an optimum between underflow and overflow. (b) At the optimal scale
        against sigma2 for every exponent/mantissa split of 6 bits (idealised grid). (c) The optimal number
        of exponent bits against sigma2 for {", ".join(map(str, settings.bits))}-bit formats on the
        {", ".join(settings.kinds)} grids (idealised: 2^E binades of 2^M levels; saturate, inf and fn: real
        formats with subnormals, every code a number, IEEE-like, or only the all-ones code reserved as in
        float8_e4m3fn): the optimum moves. (d) Analytic MSE against
        Monte-Carlo estimates with quantize_fp at the optimal scale ({settings.monte_carlo:,} samples from
        the energy-tilted lognormal, which has the same relative MSE and a far smaller variance; mean and 95
        % CI over {len(settings.seeds)} seeds). Tables also give named formats ({", ".join(settings.formats)}:
        the ml_dtypes / OCP dtypes) at their own MSE-optimal scale; the theory clamps at the largest value
        whatever a format does on overflow (saturate, Inf or NaN)."""
    return Result(
        caption=caption,
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
            "by_scale": Table("(a) relative MSE against the scale", by_scale, markdown=False),
            "by_sigma": Table("(b) relative MSE against sigma2, 6 bits", by_sigma, markdown=False),
            "optimum": Table("(c) optimal exponent bits against sigma2", optimum, markdown=False),
        },
        headline=headline,
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
    """An FP run's row: its format and scaling, and its accuracy over seeds."""
    policy = group.policy
    return {
        **run_row(group),
        "format": policy.format_label,
        "bits": policy.fmt.bits,
        "scaling": policy.scaling_label,
    }


def _baseline_row(group: RunGroup) -> dict:
    return {**run_row(group), "format": group.label, "bits": 32, "scaling": None}


def fp_formats(settings: CompareWithinModels, runs: dict[str, RunGroup]) -> Result:
    models = WithinModels.of(settings.baselines, settings.runs, runs, "experiments.A5.baseline")
    comparisons = models.gaps()
    gaps = {arm.name: gap for arm, gap in zip(models.arms, comparisons, strict=True)}
    rows, headline = [], {}
    for baseline in models.baselines:
        arms = models.arms_of(baseline)
        model = {"model": models.name(baseline)}
        ordered = sorted((_fp_row(arm) for arm in arms), key=lambda r: (-r["bits"], r["format"]))
        rows += [model | _baseline_row(baseline), *(model | row for row in ordered)]
        headline[models.name(baseline)] = models.headline(baseline, gaps)
    with_gaps(rows, gaps)
    rounding = "/".join(dict.fromkeys(arm.policy.rounding for arm in models.arms))
    scaling = "; ".join(dict.fromkeys(arm.policy.scaling_rule for arm in models.arms))
    panels = "one panel per model, each with" if models.several else "with"
    caption = f"""Final test accuracy when the gradient at every compression point of the model (below) is
        rounded ({rounding}) to an n-bit [1,E,M] format, scaled {scaling}, refreshed every step;
        {panels} the dashed line and band of the
        uncompressed run of {"its" if models.several else "the"} model (mean and 95 % CI). Bars: mean over
        seeds with 95 % CI; dots: each seed. Models ({models.caption()}). {training_context(runs)}. Each
        format is compared with the uncompressed run of its own model, paired by seed (same initialisation
        and data order) with a paired t-test; the headline gives, per model, the noise floor (the
        baseline's seed-to-seed sd) and each format's gap with its interval."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Accuracy with FP gradient formats", rows),
            "baseline": Table(
                "Uncompressed run of each model",
                [{"model": models.name(b), **run_row(b)} for b in models.baselines],
                markdown=False,
            ),
            "seeds": per_seed_table([*models.baselines, *models.arms]),
        },
        comparisons=comparisons,
        headline=headline,
    )


# --- A6 -----------------------------------------------------------------------------------------------------
def _log2_range(sweep: list[RunGroup]) -> str:
    scales = [math.log2(group.policy.global_scale) for group in sweep]
    return f"{min(scales):g} to 2^{max(scales):g}" if scales else "none"


def scaling_and_split(settings: Scaling, runs: dict[str, RunGroup]) -> Result:
    baseline = runs[settings.baseline]
    rules = [runs[name] for name in settings.rules]
    sweep = sorted((runs[name] for name in settings.sweep), key=lambda group: group.policy.global_scale)
    splits = [runs[name] for name in settings.splits]
    reference = rules[0]
    sigma2 = float(np.nanmean([_mean_sigma2(group) for group in splits])) if splits else math.nan
    bits = splits[0].policy.fmt.bits if splits else None
    predicted = (
        int(fp_theory.optimal_exp_bits(bits, torch.tensor([sigma2], dtype=torch.float64), "saturate")[0])
        if splits and math.isfinite(sigma2)
        else None
    )
    predicted_group = next((g for g in splits if g.policy.fmt.exp_bits == predicted), None)
    pairs = [(group, reference) for group in [*sweep, *rules[1:]]]
    if predicted_group is not None:
        pairs += [(group, predicted_group) for group in splits if group is not predicted_group]
    comparisons = compare_accuracy(pairs)
    rows = [
        {
            "part": part,
            **row(group),
            "log2_global_scale": math.log2(group.policy.global_scale) if part == "global sweep" else None,
            "mean_sigma2": _mean_sigma2(group),
        }
        for part, groups, row in (
            ("rule", rules, _fp_row),
            ("global sweep", sweep, _fp_row),
            ("split", splits, _fp_row),
            ("fp32", [baseline], _baseline_row),
        )
        for group in groups
    ]
    rule_text = "; ".join(f"{g.policy.scaling_label}: {g.policy.scaling_rule}" for g in rules)
    split_text = ", ".join(g.policy.format_label for g in splits)
    caption = f"""(a) Final test accuracy of {reference.policy.format_label} gradients with one fixed global
        loss scale for every layer, against log2 of that scale (2^{_log2_range(sweep)}; mean and 95 % CI over
        seeds), next to the other scaling rules (horizontal lines and bands: {rule_text}) and fp32
        (dashed). (b) The {bits}-bit splits {split_text} with the per-layer mean rule; the title gives the
        split the MSE theory (saturating grid with subnormals) predicts from the mean sigma2 measured in
        these runs (the mean over layers and seeds of each layer's last fit). {training_context(runs)}.
        Comparisons: each global scale and each other rule against the {reference.policy.scaling_label}
        rule, each split against the predicted one; paired by seed."""
    headline = {
        **noise_floor(baseline),
        "predicted_exp_bits": predicted,
        "mean_sigma2": sigma2,
    }
    return Result(
        caption=caption,
        tables={
            "main": Table("Loss scaling and exponent/mantissa split", rows),
            "seeds": per_seed_table([*rules, *sweep, *splits, baseline]),
        },
        comparisons=comparisons,
        headline=headline,
    )


# --- A10 ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layers:
    """A model's measured per-layer log2 statistics of its neural gradients (non-zero entries, last probed
    step of the uncompressed run, mean over its seeds) and element counts: what the theory predicts from."""

    names: list[str]
    mu2: torch.Tensor
    sigma2: torch.Tensor
    elements: torch.Tensor

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
                    )
                    by_layer.setdefault(str(probe["layer"][i]), []).append(tuple(map(float, values)))
        if not by_layer:
            raise ValueError(f"run {group.name!r}: its probe has no gradient statistics (set runs.*.probe)")
        columns = [torch.tensor([np.mean(c) for c in zip(*v, strict=True)]) for v in by_layer.values()]
        mu2, sigma2, elements = (torch.stack(column).double() for column in zip(*columns, strict=True))
        return cls(list(by_layer), mu2, sigma2, elements)

    def rule_scales(self, policy: FloatingPoint) -> torch.Tensor:
        """The per-layer log2 scales a fixed or per-layer rule gives these layers."""
        pairs = zip(self.mu2, self.sigma2, strict=True)
        return torch.stack([layer_log2_scale(policy, mu2, sigma2) for mu2, sigma2 in pairs])

    def predict(self, fmt: FPFormat, log2_scales: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per layer (last axis) at the given log2 scales (broadcast against the layers): the shares of
        non-zero values flushed to zero (below half the smallest subnormal) and clipped (beyond the largest
        value), and the relative MSE of nearest rounding (fp_theory)."""
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

    def spread(self, settings: FailurePairs) -> float:
        """The binades one global scale must cover for every layer to meet the failure criterion: from the
        lowest layer's max_flushed quantile of log2|g| to the highest layer's (1 - max_clipped) quantile.
        The every-layer window is open only where the format's range exceeds it."""
        normal = torch.distributions.Normal(0.0, 1.0)
        z_flushed = float(normal.icdf(torch.tensor(settings.max_flushed)))
        z_clipped = float(normal.icdf(torch.tensor(1 - settings.max_clipped)))
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
    return torch.stack(
        [layer_log2_scale(policy, m, s) for m, s in zip(layers.mu2, layers.sigma2, strict=True)]
    )


def _fp_member(group: RunGroup) -> FloatingPoint:
    policies = getattr(group.policy, "policies", (group.policy,))
    fp = [policy for policy in policies if isinstance(policy, FloatingPoint)]
    if len(fp) != 1 or len(policies) != 1:
        raise ValueError(f"A10 predicts FP runs only; run {group.name!r} is {group.policy.describe()}")
    return fp[0]


def _model_of(group: RunGroup, baselines: dict[str, RunGroup]) -> RunGroup:
    """The uncompressed run of `group`'s model."""
    own = one_per_model(list(baselines.values()), "experiments.A10.baselines").get(group.model)
    if own is None:
        raise ValueError(
            f"run {group.name!r} ({group.model}) has no baseline of its model among "
            f"{', '.join(baselines)}: add it to experiments.A10.baselines"
        )
    return own


def failure_cases(settings: FailurePairs, runs: dict[str, RunGroup]) -> Result:
    baselines = {name: runs[name] for name in settings.baselines}
    layers = {name: _Layers.of(group) for name, group in baselines.items()}
    arms = [runs[name] for name in dict.fromkeys([*(r for p in settings.pairs for r in p), *settings.arms])]
    own = {arm.name: _model_of(arm, baselines) for arm in arms}
    predicted = {
        arm.name: layers[own[arm.name].name].summarise(
            layers[own[arm.name].name].predict(
                _fp_member(arm).fmt, _log2_scales(arm, layers[own[arm.name].name])
            )
        )
        for arm in arms
    }
    gaps = compare_accuracy([(arm, own[arm.name]) for arm in arms])
    outcome = {
        arm.name: {
            "run": arm.name,
            "model": arm.model,
            "label": arm.label,
            "log2_global_scale": math.log2(_fp_member(arm).global_scale)
            if _fp_member(arm).scaling == "global"
            else None,
            **predicted[arm.name],
            **arm.estimate(lambda run: run.accuracy).columns("accuracy"),
            **{
                f"predicted_fails_{_column(scope)}": bool(_fails(predicted[arm.name], settings, scope))
                for scope in SCOPES
            },
            "gap_pt": gap.difference,
            "gap_ci_low": gap.ci_low,
            "gap_ci_high": gap.ci_high,
            "verdict": gap.verdict,
            "seeds": gap.seeds,
        }
        for arm, gap in zip(arms, gaps, strict=True)
    }
    recoveries = compare_accuracy([(runs[fixing], runs[failing]) for failing, fixing in settings.pairs])
    pairs = [
        {
            "failing": runs[failing].label,
            "fixing": runs[fixing].label,
            "model": runs[failing].model,
            "failing_predicted_relative_mse": predicted[failing]["predicted_relative_mse"],
            "fixing_predicted_relative_mse": predicted[fixing]["predicted_relative_mse"],
            "failing_predicted_flushed": predicted[failing]["predicted_flushed"],
            "failing_predicted_clipped": predicted[failing]["predicted_clipped"],
            **runs[failing].estimate(lambda run: run.accuracy).columns("failing_accuracy"),
            **runs[fixing].estimate(lambda run: run.accuracy).columns("fixing_accuracy"),
            "failing_run": failing,
            "fixing_run": fixing,
            "recovered_pt": comparison.difference,
            "verdict": comparison.verdict,
            "seeds": comparison.seeds,
        }
        for (failing, fixing), comparison in zip(settings.pairs, recoveries, strict=True)
    ]
    window, per_model, formats = _windows(settings, baselines, layers)
    order = [row for row in outcome.values() if row["gap_pt"] is not None and math.isfinite(row["gap_pt"])]
    correlation = (
        stats.spearmanr([row["predicted_relative_mse"] for row in order], [-row["gap_pt"] for row in order])
        if len(order) > 2
        else None
    )
    swept = FloatingPoint(settings.format).format_label
    caption = f"""Predictions of the lognormal theory from each model's measured gradients, next to trained
        outcomes. The theory reads, per layer, the mean and standard deviation of log2|g| (non-zero entries
        of the {"; ".join(f"{g.model}: {g.compression_points}" for g in baselines.values())}) at the last
        probed step of the uncompressed runs ({", ".join(baselines)}; mean over their seeds), and predicts
        for a format and per-layer scale the share of values flushed to zero (below half the smallest
        subnormal), clipped at the largest value, and the relative MSE of nearest rounding (mean over
        layers); a configuration is predicted to fail where more than {settings.max_clipped:g} of the
        non-zero values clip or more than {settings.max_flushed:g} flush (the settings' thresholds), counted
        over all values (element criterion) or in any one layer (every-layer criterion). (a) Each
        failing configuration (red) next to its fix (green): final test accuracy, mean and 95 % CI over seeds
        and every seed, with the uncompressed run of its model (band). (b) Predicted
        relative MSE of {swept} with one global scale for every layer, against log2 of that scale
        (2^{settings.log2_scales[0]} to 2^{settings.log2_scales[1]}), per model, next to the per-layer mean
        rule (dotted), with each model's predicted windows (light shading: element criterion passed; dark:
        every-layer criterion passed); circles: the trained global scales' measured accuracy loss, coloured by
        model (right axis).
        (c) Predicted relative MSE of every trained FP run against its measured accuracy loss from fp32 of
        its model (paired by seed; filled: significant). {training_context(runs)}."""
    no_window = [
        f"{row['format']} on {row['model']} (needs {row['spread']:.1f} binades, "
        f"has {row['format_range']:.1f})"
        for row in formats
        if row["every_layer_window_low"] is None
    ]
    notes = [_window_statement(row) for row in per_model]
    notes += [_agreement(list(outcome.values()), scope) for scope in SCOPES]
    notes.append(
        "The element criterion leaves a window of single global scales for every format on every model: "
        f"where the shares flushed ({settings.max_flushed:g}) and clipped ({settings.max_clipped:g}) meet at "
        "one quantile of the values, any format range above zero can place both edges around it. "
        + (
            "No single global scale serves every layer for: " + "; ".join(no_window) + "."
            if no_window
            else "Every format listed has a global scale that serves every layer on every model."
        )
    )
    if correlation is not None:
        notes.append(
            f"Across the {len(order)} trained FP runs, the predicted relative MSE and the measured accuracy "
            f"loss have Spearman rank correlation {correlation.statistic:.2f} (p = {correlation.pvalue:.2g})."
        )
    return Result(
        caption=caption,
        tables={
            "main": Table("Failures of low-bit FP gradients and their fixes: predicted and measured", pairs),
            "arms": Table(
                "Every trained FP run: predicted range losses and measured accuracy loss",
                list(outcome.values()),
            ),
            "models": Table(f"Global-scale window of {swept} per model (predicted)", per_model),
            "formats": Table("Predicted relative MSE of each format with the per-layer mean rule", formats),
            "window": Table("Predicted range losses against the global scale", window, markdown=False),
            "seeds": per_seed_table([*baselines.values(), *arms]),
            "baseline": Table(
                "fp32", [run_row(g) | {"model": g.model} for g in baselines.values()], markdown=False
            ),
        },
        comparisons=[*recoveries, *gaps],
        headline={
            "spearman_predicted_mse_vs_loss": None if correlation is None else float(correlation.statistic),
            "spearman_p": None if correlation is None else float(correlation.pvalue),
            "models": {row["model"]: row for row in per_model},
        },
        notes=notes,
    )


def _windows(
    settings: FailurePairs, baselines: dict[str, RunGroup], layers: dict[str, _Layers]
) -> tuple[list[dict], list[dict], list[dict]]:
    """Per model: the predicted losses at every global scale of the sweep, a summary of that window against
    the per-layer mean rule, and every format's relative MSE with the per-layer mean rule."""
    fmt = parse_format(settings.format)
    scales = torch.arange(settings.log2_scales[0], settings.log2_scales[1] + 1, dtype=torch.float64)
    window, per_model, formats = [], [], []
    for name, group in baselines.items():
        mine = layers[name]
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
                "spread": mine.spread(settings),
                "format_range": _range(fmt),
                "per_layer_rule_relative_mse": per_layer["predicted_relative_mse"],
                "best_log2_global_scale": float(scales[best]),
                "best_global_relative_mse": float(mse[best]),
            }
            | _windows_of(scales, sweep, settings)
        )
        for fmt_name in settings.formats:
            candidate = FloatingPoint(fmt_name)
            formats.append(
                {"model": group.model, "format": candidate.format_label}
                | mine.summarise(mine.predict(candidate.fmt, mine.rule_scales(candidate)))
                | {"spread": mine.spread(settings), "format_range": _range(candidate.fmt)}
                | _windows_of(scales, mine.totals(mine.predict(candidate.fmt, scales[:, None])), settings)
            )
    return window, per_model, formats


def _windows_of(scales: torch.Tensor, sweep: dict[str, torch.Tensor], settings: FailurePairs) -> dict:
    """The window of single global scales under each scope of the failure criterion, as table columns."""
    columns = {}
    for scope in SCOPES:
        low, high = _window(scales, sweep, settings, scope)
        columns |= {f"{_column(scope)}_window_low": low, f"{_column(scope)}_window_high": high}
    return columns


def _window(
    scales: torch.Tensor, sweep: dict[str, torch.Tensor], settings: FailurePairs, scope: str
) -> tuple[float | None, float | None]:
    """The lowest and highest global log2 scale whose predicted `totals` the failure criterion (of `scope`)
    spares (None: none does)."""
    good = scales[~_fails(sweep, settings, scope)]
    return (float(good.min()), float(good.max())) if good.numel() else (None, None)


SCOPES = {"element": "predicted", "every-layer": "predicted_worst_layer"}


def _column(scope: str) -> str:
    return scope.replace("-", "_")


def _fails(prediction: dict, settings: FailurePairs, scope: str):
    """The failure criterion on predicted `totals` (numbers, or tensors over global scales), applied to the
    shares of all non-zero values ("element") or to each layer's own shares ("every-layer": the worst one
    decides)."""
    prefix = SCOPES[scope]
    return (prediction[f"{prefix}_clipped"] > settings.max_clipped) | (
        prediction[f"{prefix}_flushed"] > settings.max_flushed
    )


def _agreement(rows: list[dict], scope: str) -> str:
    """How often the predicted failure (of `scope`) matches the measured verdict (a significant loss)."""
    key = f"predicted_fails_{_column(scope)}"
    lost = [row["verdict"] == "significant" and row["gap_pt"] < 0 for row in rows]
    agree = sum(row[key] == loss for row, loss in zip(rows, lost, strict=True))
    named = [f"{row['label']} ({row['run']})" for row in rows]
    missed = [name for name, row, loss in zip(named, rows, lost, strict=True) if loss and not row[key]]
    false = [name for name, row, loss in zip(named, rows, lost, strict=True) if row[key] and not loss]
    return (
        f"The {scope} criterion matches the measured verdict (a significant loss against fp32 of its model) "
        f"for {agree} of {len(rows)} trained FP runs; losses not predicted: {', '.join(missed) or 'none'}; "
        f"predicted failures that trained within noise: {', '.join(false) or 'none'}."
    )


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
