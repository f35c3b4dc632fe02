"""A4-A6, A10: low-bit floating-point gradients (theory, formats, scaling, and where FP fails)."""

from __future__ import annotations

import math

import numpy as np
import torch

from gradcomp import fp_theory
from gradcomp.analysis.runs import Run, load_runs
from gradcomp.formats import parse_format
from gradcomp.ops import quantize_fp
from gradcomp.plots import FigureInputs, experiment
from gradcomp.plots.style import save, subplots
from gradcomp.policies import FloatingPoint, NoCompression

_LN2 = math.log(2.0)


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


@experiment(
    "A4",
    "fp_mse_theory",
    "Quantization MSE of a lognormal in low-bit FP formats",
    """Exact relative MSE E[(Q(x)-x)^2]/E[x^2] of nearest rounding of a lognormal (log2|x| ~ N(mu2,
    sigma2^2)) to FP grids, from gradcomp.fp_theory. (a) Against the scale for FP6 [1,4,1] (saturating, with
    subnormals): an optimum between underflow and overflow. (b) At the optimal scale against sigma2 for every
    exponent/mantissa split of 6 bits (idealised grid). (c) The optimal number of exponent bits against
    sigma2 for 4-8 bit formats on the idealised grid and on real saturating and IEEE-like grids with
    subnormals (the optimum moves). (d) Analytic MSE against a Monte-Carlo estimate with quantize_fp (samples
    drawn from the energy-tilted lognormal, which has the same relative MSE and a far smaller variance).""",
    uses_runs=False,
)
def fp_mse_theory(inputs: FigureInputs) -> dict:
    params = inputs.params
    bits_list, kinds = params.get("bits", [4, 5, 6, 8]), params.get("kinds", ["ideal", "saturate", "inf"])
    numel = int(params.get("monte_carlo", 200_000))
    figure, axes = subplots(ncols=2, nrows=2, width=5.0, height=3.8)
    rows = []

    ax = axes[0][0]
    grid = parse_format("e4m1").positive_values()
    offsets = torch.linspace(-30, 20, 201, dtype=torch.float64)
    for sigma2 in (1.0, 2.0, 3.0, 4.0):
        ax.plot(offsets, fp_theory.relative_mse(grid, sigma2, offsets), label=f"sigma2 = {sigma2:g}")
    ax.set(yscale="log", xlabel="log2 scale - mu2  (binades)", ylabel="relative MSE", title="(a) FP6 [1,4,1]")
    ax.legend(fontsize=8)

    ax = axes[0][1]
    sigmas = torch.linspace(0.25, 6.0, 47, dtype=torch.float64)
    for exp_bits, mse in fp_theory.mse_by_exp_bits(6, sigmas, "ideal").items():
        ax.plot(sigmas, mse, label=f"[1,{exp_bits},{5 - exp_bits}]")
    ax.set(
        yscale="log", xlabel="sigma2 (binades)", ylabel="relative MSE at optimal scale", title="(b) 6 bits"
    )
    ax.legend(fontsize=8)

    ax = axes[1][0]
    styles = {"ideal": "-", "saturate": "--", "inf": ":"}
    optimum = {}
    for colour, bits in enumerate(bits_list):
        for kind in kinds:
            best = fp_theory.optimal_exp_bits(bits, sigmas, kind)
            optimum[(bits, kind)] = best
            ax.step(
                sigmas, best, where="mid", color=f"C{colour}", linestyle=styles[kind], label=f"{bits}b {kind}"
            )
    ax.set(xlabel="sigma2 (binades)", ylabel="optimal exponent bits E", title="(c) optimal split")
    ax.legend(fontsize=6, ncol=2)

    ax = axes[1][1]
    checks = [(name, sigma2) for name in ("e5m2", "e4m3", "e4m1", "e3m1", "e3m0") for sigma2 in (1.5, 3.0)]
    for seed, (name, sigma2) in enumerate(checks):
        fmt_grid = parse_format(name).positive_values()
        log2_scale, analytic = fp_theory.optimal_log2_scale(
            fmt_grid, torch.tensor(sigma2, dtype=torch.float64)
        )
        measured = _monte_carlo_mse(name, sigma2, float(log2_scale), numel, seed)
        rows.append(
            {
                "format": name,
                "sigma_log2": sigma2,
                "optimal_log2_scale": float(log2_scale),
                "analytic_relative_mse": float(analytic),
                "monte_carlo_relative_mse": measured,
                "ratio": measured / float(analytic),
            }
        )
    analytic = [row["analytic_relative_mse"] for row in rows]
    ax.scatter(analytic, [row["monte_carlo_relative_mse"] for row in rows], color="C0")
    line = [min(analytic) / 2, max(analytic) * 2]
    ax.plot(line, line, color="grey", linestyle="--", label="y = x")
    ax.set(
        xscale="log", yscale="log", xlabel="analytic relative MSE", ylabel=f"Monte-Carlo ({numel} samples)"
    )
    ax.set_title("(d) theory vs measurement")
    ax.legend(fontsize=8)

    def best_at(bits: int, kind: str, sigma2: float) -> int:
        return int(fp_theory.optimal_exp_bits(bits, torch.tensor([sigma2], dtype=torch.float64), kind)[0])

    headline = {
        "monte_carlo_max_relative_deviation": max(abs(row["ratio"] - 1) for row in rows),
        "optimal_exp_bits_sigma2_3": {f"{b}b {k}": best_at(b, k, 3.0) for b in bits_list for k in kinds},
    }
    return save(inputs, figure, rows, "A4 FP quantization MSE of a lognormal", headline)


def _fp_runs(runs: dict[str, Run]) -> list[Run]:
    return [run for run in runs.values() if isinstance(run.policy, FloatingPoint)]


def _baseline(runs: dict[str, Run]) -> Run | None:
    return next((run for run in runs.values() if isinstance(run.policy, NoCompression)), None)


def _mean_sigma2(run: Run) -> float:
    sigmas = [layer["sigma"] for layer in run.summary["layers"].values() if layer.get("sigma")]
    return float(np.nanmean(sigmas)) / _LN2 if sigmas else float("nan")


def _format_label(policy: FloatingPoint) -> str:
    fmt = policy.fmt
    return f"FP{1 + fmt.exp_bits + fmt.man_bits} [1,{fmt.exp_bits},{fmt.man_bits}]"


def _accuracy_rows(runs: dict[str, Run], baseline: Run | None) -> list[dict]:
    reference = baseline.accuracy if baseline else float("nan")
    rows = []
    for run in _fp_runs(runs):
        policy = run.policy
        rows.append(
            {
                "run": run.name,
                "format": _format_label(policy),
                "bits": 1 + policy.fmt.exp_bits + policy.fmt.man_bits,
                "scaling": policy.scaling,
                "log2_global_scale": math.log2(policy.global_scale) if policy.scaling == "global" else None,
                "accuracy": run.accuracy,
                "gap_to_baseline_pt": 100 * (run.accuracy - reference),
                "mean_sigma2": _mean_sigma2(run),
            }
        )
    return rows


def _scaling_label(row: dict) -> str:
    if row["scaling"] == "global":
        return f"global 2^{row['log2_global_scale']:.0f}"
    return {"per_layer_mean": "per-layer mean", "per_layer_optimal": "per-layer min-MSE"}[row["scaling"]]


def _baseline_line(ax, baseline: Run | None) -> None:
    if baseline:
        ax.axhline(baseline.accuracy, color="k", linestyle="--", label=f"fp32 ({baseline.accuracy:.3f})")


@experiment(
    "A5",
    "fp_formats",
    "Accuracy with FP gradient formats and per-layer scaling",
    """Final test accuracy when every convolution's output gradient is rounded (nearest) to an n-bit
    [1,E,M] format after a per-layer power-of-two scale that puts the layer's log2 mean of |g| at 2^-3
    (the reference code's rule), refreshed every step; dashed: the uncompressed run with the same seed.
    Same model, data and schedule for every run (see the config); at this scale differences of about a
    point are within seed noise.""",
)
def fp_formats(inputs: FigureInputs) -> dict:
    runs = load_runs(inputs.runs)
    baseline = _baseline(runs)
    rows = sorted(_accuracy_rows(runs, baseline), key=lambda row: (-row["bits"], row["format"]))
    figure, axes = subplots(width=7.0, height=4.0)
    ax = axes[0][0]
    ax.bar([row["format"] for row in rows], [row["accuracy"] for row in rows], color="C0")
    _baseline_line(ax, baseline)
    low = min([row["accuracy"] for row in rows] + ([baseline.accuracy] if baseline else []))
    ax.set(ylim=(max(0.0, low - 0.05), None), ylabel="test accuracy", xlabel="gradient format")
    ax.tick_params(axis="x", rotation=35)
    ax.legend(fontsize=8)
    headline = {
        "baseline_accuracy": baseline.accuracy if baseline else None,
        "gap_pt": {row["format"]: round(row["gap_to_baseline_pt"], 2) for row in rows},
    }
    return save(inputs, figure, rows, "A5 accuracy with FP gradient formats", headline)


@experiment(
    "A6",
    "scaling_and_split",
    "Per-layer vs global loss scaling; exponent/mantissa split",
    """(a) Final test accuracy of FP6 [1,4,1] gradients with one global loss scale for every layer, against
    log2 of that scale, next to the two per-layer rules (lines): the log2 mean of |g| at 2^-3 (reference
    code) and the scale of minimum relative MSE, and fp32 (dashed). (b) The three 6-bit splits [1,3,2],
    [1,4,1], [1,5,0] with the per-layer mean rule; the title gives the split the MSE theory (saturating grid
    with subnormals) predicts from the mean measured sigma2 of the layers.""",
)
def scaling_and_split(inputs: FigureInputs) -> dict:
    runs = load_runs(inputs.runs)
    baseline = _baseline(runs)
    rows = _accuracy_rows(runs, baseline)
    figure, axes = subplots(ncols=2, width=5.0, height=4.0)
    ax = axes[0][0]
    sweep = sorted((r for r in rows if r["scaling"] == "global"), key=lambda r: r["log2_global_scale"])
    ax.plot(
        [r["log2_global_scale"] for r in sweep], [r["accuracy"] for r in sweep], "o-", label="global scale"
    )
    per_layer = {r["scaling"]: r for r in rows if r["scaling"] != "global" and r["format"] == "FP6 [1,4,1]"}
    for (scaling, row), style in zip(sorted(per_layer.items()), ("-", ":"), strict=False):
        ax.axhline(row["accuracy"], color="C2", linestyle=style, label=f"{scaling.replace('_', ' ')}")
    _baseline_line(ax, baseline)
    ax.set(xlabel="log2 global loss scale", ylabel="test accuracy", title="(a) FP6 [1,4,1]")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    splits = sorted(
        (r for r in rows if r["scaling"] == "per_layer_mean" and r["bits"] == 6), key=lambda r: r["format"]
    )
    sigma2 = float(np.nanmean([r["mean_sigma2"] for r in splits])) if splits else float("nan")
    predicted = (
        int(fp_theory.optimal_exp_bits(6, torch.tensor([sigma2], dtype=torch.float64), "saturate")[0])
        if math.isfinite(sigma2)
        else None
    )
    ax.bar([r["format"] for r in splits], [r["accuracy"] for r in splits], color="C1")
    _baseline_line(ax, baseline)
    low = min([r["accuracy"] for r in splits] + ([baseline.accuracy] if baseline else [1.0]))
    ax.set(ylim=(max(0.0, low - 0.05), None), ylabel="test accuracy", xlabel="6-bit split, per-layer scale")
    ax.set_title(f"(b) theory: E = {predicted} at sigma2 = {sigma2:.2f}")
    ax.legend(fontsize=8)
    best_global = max(sweep, key=lambda r: r["accuracy"]) if sweep else None
    headline = {
        "best_global_log2_scale": best_global["log2_global_scale"] if best_global else None,
        "best_global_accuracy": best_global["accuracy"] if best_global else None,
        "worst_global_accuracy": min(r["accuracy"] for r in sweep) if sweep else None,
        "per_layer_accuracy": {scaling: row["accuracy"] for scaling, row in per_layer.items()},
        "split_accuracy": {r["format"]: r["accuracy"] for r in splits},
        "predicted_exp_bits": predicted,
        "mean_sigma2": sigma2,
    }
    return save(inputs, figure, rows, "A6 loss scaling and exponent/mantissa split", headline)


def _log2_scale(policy: FloatingPoint, mu2: float, sigma2: float) -> float:
    """The scale (log2) the policy gives a layer with these log2 statistics."""
    if policy.scaling == "global":
        return math.log2(policy.global_scale)
    mu2_t, sigma2_t = (torch.tensor(value, dtype=torch.float64) for value in (mu2, sigma2))
    return float(policy.layer_log2_scale(mu2_t, sigma2_t))


def _range_losses(stats_run: Run, policy: FloatingPoint) -> tuple[list[float], list[float]]:
    """Per layer (input to output): the lognormal's predicted shares of non-zero gradients that `policy`
    flushes to zero (below half the smallest subnormal after scaling) and clips at its largest value, from
    the (mu, sigma) measured in `stats_run`."""
    low, high = math.log2(policy.fmt.min_subnormal / 2), math.log2(policy.fmt.max_value)
    flushed, clipped = [], []
    for layer in stats_run.summary["layers"].values():
        if not (layer.get("sigma") and math.isfinite(layer["sigma"])):
            continue
        mu2, sigma2 = layer["mu"] / _LN2, layer["sigma"] / _LN2
        centre = mu2 + _log2_scale(policy, mu2, sigma2)
        flushed.append(0.5 * math.erfc(-(low - centre) / sigma2 / math.sqrt(2)))
        clipped.append(0.5 * math.erfc((high - centre) / sigma2 / math.sqrt(2)))
    return flushed, clipped


@experiment(
    "A10",
    "failure_cases",
    "Where low-precision FP gradients fail, and the fix",
    """(a) Final test accuracy of each failing configuration (red) next to the change that fixes it (green),
    and fp32 (dashed), for the pairs the config lists. Mechanisms of the lognormal analysis: one global loss
    scale for layers whose mu2 lie many binades apart, so that some layers clip or flush (fix: per-layer
    scaling); a per-layer scale chosen for minimum relative MSE, which at large sigma2 keeps the
    high-energy tail and flushes most values to zero (fix: the mean rule); too few exponent bits for the
    gradients' sigma2 (fix: the same bit budget split with more exponent bits).
    (b) Why: per layer, the lognormal's predicted share of non-zero gradients each failing configuration
    flushes to zero (solid) or clips at the format's largest value (dashed), from the layers' (mu, sigma)
    measured in the fixing run.""",
)
def failure_cases(inputs: FigureInputs) -> dict:
    runs = load_runs(inputs.runs)
    baseline = _baseline(runs)
    by_run = {row["run"]: row for row in _accuracy_rows(runs, baseline)}
    pairs = inputs.params["pairs"]
    figure, axes = subplots(ncols=2, width=5.8, height=4.4)
    rows, labels, heights, colours = [], [], [], []
    for failing, fixing in pairs:
        for name, colour in ((failing, "C3"), (fixing, "C2")):
            row = by_run[name]
            labels.append(f"{row['format']}\n{_scaling_label(row)}")
            heights.append(row["accuracy"])
            colours.append(colour)
        flushed, clipped = _range_losses(runs[fixing], runs[failing].policy)
        label = f"{by_run[failing]['format']}, {_scaling_label(by_run[failing])}"
        (line,) = axes[0][1].plot(range(len(flushed)), flushed, "o-", label=f"{label}: flushed")
        axes[0][1].plot(
            range(len(clipped)), clipped, "s--", color=line.get_color(), label=f"{label}: clipped"
        )
        rows.append(
            {
                "failing_run": failing,
                "failing_accuracy": by_run[failing]["accuracy"],
                "fixing_run": fixing,
                "fixing_accuracy": by_run[fixing]["accuracy"],
                "recovered_pt": 100 * (by_run[fixing]["accuracy"] - by_run[failing]["accuracy"]),
                "mean_predicted_flushed_share": float(np.mean(flushed)) if flushed else None,
                "mean_predicted_clipped_share": float(np.mean(clipped)) if clipped else None,
                "measured_sparsity_failing": runs[failing].summary["gradient_sparsity"],
            }
        )
    ax = axes[0][0]
    ax.bar(range(len(labels)), heights, color=colours)
    ax.set_xticks(range(len(labels)), labels=labels, rotation=30, fontsize=8)
    _baseline_line(ax, baseline)
    ax.set(ylabel="test accuracy", ylim=(0, 1))
    ax.legend(fontsize=8)
    axes[0][1].set(
        xlabel="layer index (input to output)",
        ylabel="predicted share of non-zero gradients",
        ylim=(-0.02, 1.02),
    )
    axes[0][1].legend(fontsize=8)
    headline = {
        "baseline_accuracy": baseline.accuracy if baseline else None,
        "pairs": {
            f"{r['failing_run']} -> {r['fixing_run']}": {
                k: r[k]
                for k in (
                    "failing_accuracy",
                    "fixing_accuracy",
                    "mean_predicted_flushed_share",
                    "mean_predicted_clipped_share",
                )
            }
            for r in rows
        },
    }
    return save(inputs, figure, rows, "A10 failures of low-bit FP gradients and their fixes", headline)
