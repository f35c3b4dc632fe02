"""A4-A6, A10: low-bit floating-point gradients (theory, formats, scaling, and where FP fails)."""

from __future__ import annotations

import math

import numpy as np
import torch

from gradcomp import fp_theory
from gradcomp.analysis.accuracy import compare_accuracy, noise_floor, per_seed_table, run_row, with_gaps
from gradcomp.analysis.runs import RunGroup, training_context
from gradcomp.analysis.seeds import Estimate
from gradcomp.analysis.tables import Result, Table
from gradcomp.compress import layer_log2_scale
from gradcomp.experiments import Compare, FailurePairs, FpTheory, Scaling
from gradcomp.formats import parse_format
from gradcomp.ops import quantize_fp
from gradcomp.policies import FloatingPoint

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
    }
    caption = f"""Exact relative MSE E[(Q(x)-x)^2]/E[x^2] of nearest rounding of a lognormal (log2|x| ~
        N(mu2, sigma2^2)) to FP grids, from gradcomp.fp_theory. (a) Against the scale for FP6 [1,4,1]
        (saturating, with subnormals): an optimum between underflow and overflow. (b) At the optimal scale
        against sigma2 for every exponent/mantissa split of 6 bits (idealised grid). (c) The optimal number
        of exponent bits against sigma2 for {", ".join(map(str, settings.bits))}-bit formats on the
        {", ".join(settings.kinds)} grids (idealised: 2^E binades of 2^M levels; saturate and inf: real
        formats with subnormals, saturating or IEEE-like): the optimum moves. (d) Analytic MSE against
        Monte-Carlo estimates with quantize_fp at the optimal scale ({settings.monte_carlo:,} samples from
        the energy-tilted lognormal, which has the same relative MSE and a far smaller variance; mean and 95
        % CI over {len(settings.seeds)} seeds)."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Analytic vs Monte-Carlo relative MSE at the optimal scale", checks),
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


def _scaling_context(policy: FloatingPoint) -> str:
    return {
        "per_layer_mean": "a per-layer power-of-two scale that puts the layer's log2 mean of |g| at 2^-3 "
        "(the reference code's rule)",
        "per_layer_optimal": "the per-layer power-of-two scale of minimum relative MSE",
        "global": "one global scale",
    }[policy.scaling]


def fp_formats(settings: Compare, runs: dict[str, RunGroup]) -> Result:
    baseline = runs[settings.baseline]
    arms = [runs[name] for name in settings.runs if name != settings.baseline]
    comparisons = compare_accuracy([(arm, baseline) for arm in arms])
    rows = [
        _baseline_row(baseline),
        *sorted((_fp_row(a) for a in arms), key=lambda r: (-r["bits"], r["format"])),
    ]
    with_gaps(rows, comparisons, baseline.label)
    rounding = {arm.policy.rounding for arm in arms}
    caption = f"""Final test accuracy when every convolution's output gradient is rounded
        ({"/".join(rounding)}) to an n-bit [1,E,M] format after {_scaling_context(arms[0].policy)}, refreshed
        every step; dashed line and band: the uncompressed run ({baseline.label}; mean and 95 % CI). Bars:
        mean over seeds with 95 % CI; dots: each seed. {training_context(runs)}. Gaps are paired by seed
        (same initialisation and data order) and tested with a paired t-test."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Accuracy with FP gradient formats", rows),
            "seeds": per_seed_table([baseline, *arms]),
        },
        comparisons=comparisons,
        headline=noise_floor(baseline),
    )


# --- A6 -----------------------------------------------------------------------------------------------------
def scaling_and_split(settings: Scaling, runs: dict[str, RunGroup]) -> Result:
    baseline = runs[settings.baseline]
    per_layer = [runs[name] for name in settings.per_layer]
    sweep = sorted((runs[name] for name in settings.sweep), key=lambda group: group.policy.global_scale)
    splits = [runs[name] for name in settings.splits]
    reference = per_layer[0]
    sigma2 = float(np.nanmean([_mean_sigma2(group) for group in splits])) if splits else math.nan
    bits = splits[0].policy.fmt.bits if splits else None
    predicted = (
        int(fp_theory.optimal_exp_bits(bits, torch.tensor([sigma2], dtype=torch.float64), "saturate")[0])
        if splits and math.isfinite(sigma2)
        else None
    )
    predicted_group = next((g for g in splits if g.policy.fmt.exp_bits == predicted), None)
    pairs = [(group, reference) for group in [*sweep, *per_layer[1:]]]
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
            ("per-layer", per_layer, _fp_row),
            ("global sweep", sweep, _fp_row),
            ("split", splits, _fp_row),
            ("fp32", [baseline], _baseline_row),
        )
        for group in groups
    ]
    caption = f"""(a) Final test accuracy of {reference.policy.format_label} gradients with one global loss
        scale for every layer, against log2 of that scale (mean and 95 % CI over seeds), next to the
        per-layer rules (horizontal lines and bands: {", ".join(g.policy.scaling_label for g in per_layer)})
        and fp32 (dashed). (b) The {bits}-bit splits {", ".join(g.policy.format_label for g in splits)} with
        the per-layer mean rule; the title gives the split the MSE theory (saturating grid with subnormals)
        predicts from the mean sigma2 measured in these runs (the mean over layers and seeds of each layer's
        last fit). {training_context(runs)}. Comparisons: each global scale and each other per-layer rule
        against the {reference.policy.scaling_label} rule, each split against the predicted one; paired by
        seed."""
    headline = {
        **noise_floor(baseline),
        "predicted_exp_bits": predicted,
        "mean_sigma2": sigma2,
    }
    return Result(
        caption=caption,
        tables={
            "main": Table("Loss scaling and exponent/mantissa split", rows),
            "seeds": per_seed_table([*per_layer, *sweep, *splits, baseline]),
        },
        comparisons=comparisons,
        headline=headline,
    )


# --- A10 ----------------------------------------------------------------------------------------------------
def _range_losses(stats: RunGroup, policy: FloatingPoint) -> list[dict]:
    """Per layer (input to output): the lognormal's predicted shares of non-zero gradients that `policy`
    flushes to zero (below half the smallest subnormal after scaling) and clips at its largest value, from
    the (mu, sigma) measured in `stats` (mean over its seeds)."""
    low, high = math.log2(policy.fmt.min_subnormal / 2), math.log2(policy.fmt.max_value)
    shares: dict[str, list[tuple[float, float]]] = {}
    for run in stats.runs.values():
        for name, layer in run.summary["layers"].items():
            if not (layer.get("sigma") and math.isfinite(layer["sigma"])):
                continue
            mu2, sigma2 = layer["mu"] / _LN2, layer["sigma"] / _LN2
            scale = layer_log2_scale(policy, *(torch.tensor(v, dtype=torch.float64) for v in (mu2, sigma2)))
            centre = mu2 + float(scale)
            flushed = 0.5 * math.erfc(-(low - centre) / sigma2 / math.sqrt(2))
            clipped = 0.5 * math.erfc((high - centre) / sigma2 / math.sqrt(2))
            shares.setdefault(name, []).append((flushed, clipped))
    return [
        {
            "layer": name,
            "index": index,
            "flushed": float(np.mean([f for f, _ in values])),
            "clipped": float(np.mean([c for _, c in values])),
        }
        for index, (name, values) in enumerate(shares.items())
    ]


def failure_cases(settings: FailurePairs, runs: dict[str, RunGroup]) -> Result:
    baseline = runs[settings.baseline]
    pairs = [(runs[failing], runs[fixing]) for failing, fixing in settings.pairs]
    comparisons = compare_accuracy([(fixing, failing) for failing, fixing in pairs])
    rows, layers = [], []
    for (failing, fixing), comparison in zip(pairs, comparisons, strict=True):
        losses = _range_losses(fixing, failing.policy)
        layers += [{"failing": failing.label, "fixing": fixing.label, **loss} for loss in losses]
        rows.append(
            {
                "failing_run": failing.name,
                "failing": failing.label,
                **failing.estimate(lambda run: run.accuracy).columns("failing_accuracy"),
                "fixing_run": fixing.name,
                "fixing": fixing.label,
                **fixing.estimate(lambda run: run.accuracy).columns("fixing_accuracy"),
                "seeds": comparison.seeds,
                "recovered_pt": comparison.difference,
                "verdict": comparison.verdict,
                "mean_predicted_flushed_share": float(np.mean([x["flushed"] for x in losses]))
                if losses
                else None,
                "mean_predicted_clipped_share": float(np.mean([x["clipped"] for x in losses]))
                if losses
                else None,
                **failing.estimate(lambda run: run.sparsity).columns("failing_sparsity"),
            }
        )
    caption = f"""(a) Final test accuracy of each failing configuration (red) next to the change that fixes
        it (green), mean and 95 % CI over seeds with every seed's point, and fp32 (dashed, band: 95 % CI),
        for the pairs the config lists. Mechanisms of the lognormal analysis: one global loss scale for
        layers whose mu2 lie many binades apart, so that some layers clip or flush (fix: per-layer scaling);
        a per-layer scale chosen for minimum relative MSE, which at large sigma2 keeps the high-energy tail
        and flushes most values to zero (fix: the mean rule); too few exponent bits for the gradients' sigma2
        (fix: the same bit budget with more exponent bits). (b) Why: per layer, the lognormal's predicted
        share of non-zero gradients each failing configuration flushes to zero (solid) or clips at the
        format's largest value (dashed), from the layers' (mu, sigma) measured in the fixing run (mean over
        seeds). {training_context(runs)}. Recoveries are paired by seed and tested with a paired t-test."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Failures of low-bit FP gradients and their fixes", rows),
            "layers": Table("Predicted flushed and clipped shares per layer", layers, markdown=False),
            "seeds": per_seed_table([baseline, *(g for pair in pairs for g in pair)]),
            "baseline": Table("fp32", [run_row(baseline)], markdown=False),
        },
        comparisons=comparisons,
        headline=noise_floor(baseline),
    )
