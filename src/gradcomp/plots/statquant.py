"""B1-B4, X2: the unbiased integer gradient quantizers PTQ, PSQ and BHQ of the statistical FQT framework.

Measurements (B1-B3, X2) use the trained QAT model (8-bit forward quantization) in eval mode, so that
BatchNorm uses running statistics and repeated passes over a batch differ only by the gradient
quantizers' random bits; batches come from the test split in a fixed shuffled order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from matplotlib.ticker import LogFormatter
from scipy.stats import spearmanr
from torch import Tensor, nn

from gradcomp.analysis.gradients import (
    bin_codes,
    fqt_weight_gradients,
    output_gradients,
    quantization_variance,
    quantizer_variance,
    relative_error_of_mean,
    row_ranges,
    sample_variance,
    weight_gradients,
)
from gradcomp.analysis.runs import Run, load_runs, load_trained_model
from gradcomp.data import load_split
from gradcomp.plots import FigureInputs, experiment
from gradcomp.plots.style import finite_or_none, save, subplots
from gradcomp.policies import Integer, NoCompression

SCHEMES = ("ptq", "psq", "bhq")
COLOURS = {"ptq": "C3", "psq": "C0", "bhq": "C2"}
NAMES = {"ptq": "PTQ (per tensor)", "psq": "PSQ (per sample)", "bhq": "BHQ (block Householder)"}
Batch = tuple[Tensor, Tensor]


def _model(inputs: FigureInputs) -> tuple[Run, nn.Module]:
    run = load_runs(inputs.runs)[inputs.params["run"]]
    return run, load_trained_model(run).eval()


def _batches(run: Run, count: int, params: Mapping[str, Any]) -> list[Batch]:
    """The first `count` full test batches (run's batch size unless params say otherwise), in a fixed
    shuffled order so that every batch mixes classes; test splits are never augmented."""
    config = run.config
    split = load_split(config["dataset"], config["data_dir"], False)
    batch_size = int(params.get("batch_size", config["batch_size"]))
    stream = split.batches(batch_size, shuffle=True, seed=config["seed"], drop_last=True)
    batches = list(itertools.islice(stream, count))
    if len(batches) < count:
        raise ValueError(f"the test split holds {len(batches)} batches of {batch_size}, {count} requested")
    return batches


def _int_policy(bits: int, scheme: str, weight_bits: int | None = None) -> str:
    return f"int:bits={bits},scheme={scheme},weight_bits={weight_bits or bits}"


def _per_bit_factor(bits: list[int], variances: list[float]) -> float:
    """exp(-slope) of ln(variance) against bits: by how much one more bit divides the variance."""
    return float(np.exp(-np.polyfit(bits, np.log(variances), 1)[0]))


# --- B1 -----------------------------------------------------------------------------------------------------
def _code_usage(codes: Tensor, levels: int) -> tuple[Tensor, dict[str, float]]:
    """Histogram of the codes and how much of the code book it uses (distinct bins, entropy, the fewest
    bins that hold 99% of the elements)."""
    counts = torch.bincount(codes.flatten(), minlength=levels).double()
    share = counts / counts.sum()
    used = share[share > 0]
    cover = int(torch.searchsorted(share.sort(descending=True).values.cumsum(0), 0.99)) + 1
    return counts, {
        "distinct_bins": int(used.numel()),
        "used_fraction": used.numel() / levels,
        "entropy_bits": float(-(used * used.log2()).sum()),
        "bins_for_99pct": min(cover, levels),
    }


@experiment(
    "B1",
    "bin_usage",
    "Quantization bins used by PTQ, PSQ and BHQ on one neural gradient",
    """(a) Per-sample ranges (max - min) of the output gradient of one convolution of the qat8 run's model
    (8-bit forward quantization; default: narrow ResNet18) for one test batch (default: 128 Fashion-MNIST
    images): the samples' scales differ by orders of magnitude, and PTQ's single range (dashed) is set by
    the largest. (b-d) Histograms (log y)
    of the integer codes each element lands on at the configured gradient bits (8: codes 0-255) under PTQ,
    PSQ and BHQ (quantize_int's own stochastic rounding, seed 0): PTQ crowds most elements into a few central
    bins, per-sample scales (PSQ) spread them, and the block Householder transform (BHQ) spreads them most.
    The table gives the bins used, the code entropy and each scheme's quantization variance (10 draws).""",
)
def bin_usage(inputs: FigureInputs) -> dict:
    params = inputs.params
    bits, seed, layer = int(params.get("bits", 8)), int(params.get("seed", 0)), params["layer"]
    levels = 2**bits
    run, model = _model(inputs)
    gradients = output_gradients(model, *_batches(run, 1, params)[0])
    if layer not in gradients:
        raise KeyError(f"layer {layer!r} not among the quantized layers: {', '.join(gradients)}")
    x = gradients[layer]
    ranges = row_ranges(x).double()
    positive = ranges[ranges > 0]

    figure, axes = subplots(ncols=2, nrows=2, width=5.0, height=3.6)
    ax = axes[0][0]
    ax.hist(positive.numpy(), bins=np.geomspace(float(positive.min()), float(positive.max()), 30), color="C7")
    ax.axvline(float(x.max() - x.min()), color="k", ls="--", label="whole-tensor range (PTQ)")
    ax.set(xscale="log", xlabel="per-sample range max - min of dL/dH", ylabel="samples")
    ax.set_title(f"(a) {layer}: {x.shape[0]} samples x {x.shape[1]} values", fontsize=10)
    ax.legend(fontsize=8)
    rows, code_axes = [], (axes[0][1], axes[1][0], axes[1][1])
    for ax, scheme, letter in zip(code_axes, SCHEMES, "bcd", strict=True):
        counts, usage = _code_usage(bin_codes(x, bits, scheme, seed=seed), levels)
        variance = quantizer_variance(x, bits, scheme, int(params.get("draws", 10)), seed=seed)
        rows.append({"scheme": scheme, **usage, "quantization_variance": variance})
        ax.stairs(counts.numpy(), np.arange(levels + 1) - 0.5, fill=True, baseline=0.5, color=COLOURS[scheme])
        ax.set(yscale="log", xlim=(-0.5, levels - 0.5), xlabel=f"code (0..{levels - 1})", ylabel="elements")
        ax.set_title(f"({letter}) {NAMES[scheme]}, {bits} bits", fontsize=10)
        ax.text(
            0.02,
            0.97,
            f"{usage['distinct_bins']} bins used\nentropy {usage['entropy_bits']:.2f} bits",
            transform=ax.transAxes,
            va="top",
            fontsize=8,
        )
    for ax in code_axes:  # one count scale, so that heights compare across schemes
        ax.set_ylim(0.5, 2 * x.numel())
    log_ranges = positive.log()
    headline = {
        "layer": layer,
        "bits": bits,
        **{f"{row['scheme']}_distinct_bins": row["distinct_bins"] for row in rows},
        **{f"{row['scheme']}_used_fraction": row["used_fraction"] for row in rows},
        **{f"{row['scheme']}_entropy_bits": row["entropy_bits"] for row in rows},
        "sigma_ln_sample_range": float(log_ranges.std()),
        "max_over_median_sample_range": float((log_ranges.max() - log_ranges.median()).exp()),
    }
    return save(inputs, figure, rows, f"B1 bin usage of {bits}-bit gradient quantizers ({layer})", headline)


# --- B2 -----------------------------------------------------------------------------------------------------
@experiment(
    "B2",
    "variance_vs_bits",
    "Gradient quantization variance against bits: PTQ, PSQ, BHQ",
    """Quantization variance of the FQT weight gradient, the mean over test batches and stochastic draws of
    ||g_FQT - g_QAT||^2 summed over every convolution and linear weight (statquant section 3.4), against
    the gradient bits, for the qat8 run's model (8-bit forward quantization; default: narrow ResNet18,
    Fashion-MNIST, batches of 128, 6 batches x 2 draws per point). Both gradient paths use the swept bits
    (activation path: the scheme; weight path: per tensor for PTQ, per column otherwise) unless the config
    fixes weight_bits. Dashed: the QAT minibatch sampling variance over the same batches (quantization
    noise below it costs little); dotted: a fall by 4 per bit.""",
)
def variance_vs_bits(inputs: FigureInputs) -> dict:
    params = inputs.params
    bit_list = [int(b) for b in params.get("bits", [4, 5, 6, 7, 8])]
    draws, seed = int(params.get("draws", 2)), int(params.get("seed", 0))
    run, model = _model(inputs)
    batches = _batches(run, int(params.get("batches", 6)), params)
    qat = torch.stack([weight_gradients(model, *batch) for batch in batches])
    sampling = sample_variance(qat)
    rows = []
    for bits, scheme in itertools.product(bit_list, SCHEMES):
        policy = _int_policy(bits, scheme, params.get("weight_bits"))
        fqt = torch.stack(
            [
                fqt_weight_gradients(model, *batch, policy, draws, seed=seed, first_step=index * draws)
                for index, batch in enumerate(batches)
            ]
        )
        rows.append(
            {
                "bits": bits,
                "scheme": scheme,
                "quantization_variance": quantization_variance(qat, fqt),
                "sample_variance": sampling,
            }
        )
    variance = {(row["bits"], row["scheme"]): row["quantization_variance"] for row in rows}

    figure, axes = subplots(width=5.6, height=4.2)
    ax = axes[0][0]
    for scheme in SCHEMES:
        ax.plot(
            bit_list,
            [variance[b, scheme] for b in bit_list],
            "o-",
            color=COLOURS[scheme],
            label=NAMES[scheme],
        )
    ax.axhline(sampling, color="k", ls="--", label="QAT sampling variance")
    anchor = variance[bit_list[0], "psq"]
    ax.plot(
        bit_list, [anchor / 4 ** (b - bit_list[0]) for b in bit_list], ":", color="C7", label="1/4 per bit"
    )
    ax.set(yscale="log", xlabel="gradient bits", ylabel="weight-gradient variance")
    ax.set_xticks(bit_list)
    ax.legend(fontsize=8)

    low, high = min(bit_list), max(bit_list)
    factors = {s: _per_bit_factor(bit_list, [variance[b, s] for b in bit_list]) for s in SCHEMES}
    ratio = {
        pair: float(np.exp(np.mean([np.log(variance[b, pair[0]] / variance[b, pair[1]]) for b in bit_list])))
        for pair in (("ptq", "psq"), ("psq", "bhq"))
    }
    headline = {
        "sample_variance": sampling,
        **{f"{s}_variance_{b}bit": variance[b, s] for s in SCHEMES for b in (low, high)},
        "ptq_over_psq_geomean": ratio["ptq", "psq"],
        "psq_over_bhq_geomean": ratio["psq", "bhq"],
        **{f"{s}_per_bit_factor": factors[s] for s in SCHEMES},
    }
    if ratio["psq", "bhq"] < 1.25:
        inputs.notes.append(
            f"BHQ is within {ratio['psq', 'bhq']:.2f}x of PSQ here: the samples' gradient ranges in this "
            "small model are too homogeneous for the Householder transform to gain much."
        )
    return save(inputs, figure, rows, "B2 gradient variance vs bits (QAT model)", headline)


# --- B3 -----------------------------------------------------------------------------------------------------
# random but biased: with the reference code's per-layer scale (mean log2|g| at 2^-3) the largest gradients
# exceed e3m0's largest value 16 and saturate (about 0.1% of them in the default model, yet a large share of
# the gradient's energy)
BIASED_CONTRAST = "fp:format=e3m0,rounding=stochastic,scaling=per_layer_mean"


@experiment(
    "B3",
    "unbiasedness",
    "FQT gradients average to the QAT gradient",
    """Relative error ||mean of K FQT weight gradients - g_QAT|| / ||g_QAT|| (all convolution and linear
    weights) of one test batch of the qat8 run's model (default: narrow ResNet18, Fashion-MNIST, batch 128)
    against the number K of independent stochastic-rounding draws (up to the configured draws, default 64),
    for PTQ, PSQ and BHQ at the configured bits on both gradient paths. Unbiased quantizers fall as
    1/sqrt(K) (dotted reference) towards the exact QAT gradient. The contrast, 4-bit floating point e3m0 on
    the convolution outputs with stochastic rounding and a per-layer scale that puts the mean log2|g| at
    2^-3, saturates the largest gradients (beyond the format's largest value, 16): it is random but biased,
    and its error stalls at the bias.""",
)
def unbiasedness(inputs: FigureInputs) -> dict:
    params = inputs.params
    bits, draws, seed = int(params.get("bits", 4)), int(params.get("draws", 64)), int(params.get("seed", 0))
    ks = [2**i for i in range(int(math.log2(draws)) + 1)]
    run, model = _model(inputs)
    images, labels = _batches(run, 1, params)[0]
    exact = weight_gradients(model, images, labels)
    policies = {scheme: _int_policy(bits, scheme) for scheme in SCHEMES} | {"fp_e3m0": BIASED_CONTRAST}
    errors = {
        name: relative_error_of_mean(
            exact, fqt_weight_gradients(model, images, labels, policy, ks[-1], seed=seed), ks
        )
        for name, policy in policies.items()
    }
    rows = [
        {"policy": name, "draws": k, "relative_error": e}
        for name, curve in errors.items()
        for k, e in zip(ks, curve, strict=True)
    ]

    figure, axes = subplots(width=5.6, height=4.2)
    ax = axes[0][0]
    for name, curve in errors.items():
        colour, label = (
            (COLOURS[name], NAMES[name])
            if name in NAMES
            else ("C7", "FP e3m0 stochastic, saturating (biased)")
        )
        ax.plot(ks, curve, "o-", color=colour, label=label)
    start = float(np.exp(np.mean([np.log(errors[s][0]) for s in SCHEMES])))
    ax.plot(ks, [start / math.sqrt(k) for k in ks], ":", color="k", label="1/sqrt(K)")
    ax.set(xscale="log", yscale="log", xlabel="draws K averaged", ylabel="relative error to the QAT gradient")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.legend(fontsize=8)
    slopes = {name: float(np.polyfit(np.log(ks), np.log(curve), 1)[0]) for name, curve in errors.items()}
    headline = {
        "bits": bits,
        **{f"{name}_error_K1": curve[0] for name, curve in errors.items()},
        **{f"{name}_error_K{ks[-1]}": curve[-1] for name, curve in errors.items()},
        **{f"{name}_slope": slope for name, slope in slopes.items()},
    }
    return save(inputs, figure, rows, f"B3 unbiasedness of {bits}-bit FQT gradients", headline)


# --- B4 -----------------------------------------------------------------------------------------------------
def _setting(run: Run) -> dict[str, Any]:
    """Setting, gradient bits (32: float32) and scheme of an Exact, QAT or FQT (int policy) run."""
    policy = run.policy
    if isinstance(policy, Integer):
        return {"setting": "FQT", "bits": policy.bits, "scheme": policy.scheme}
    if isinstance(policy, NoCompression):
        return {"setting": "QAT" if run.config.get("forward_bits") else "Exact", "bits": 32, "scheme": "-"}
    raise ValueError(f"run {run.name!r}: B4 reads exact, QAT and int runs, not {policy.describe()}")


@experiment(
    "B4",
    "accuracy_table",
    "Test accuracy: Exact, QAT and FQT with PTQ, PSQ, BHQ gradients",
    """Final test accuracy of the narrow ResNet18 trained on Fashion-MNIST with exact gradients (Exact,
    no quantization), with 8-bit forward quantization only (QAT) and with QAT plus unbiased integer
    gradients (FQT) of 8 to 4 bits on the activation-gradient path (PTQ, PSQ or BHQ; 8-bit weight-gradient
    path as in the reference code), all trained with the same recipe and seed; bits and scheme are read
    from each run's policy. The paper reports all schemes close to QAT at 8 bits and BHQ >= PSQ >= PTQ as
    the bits drop.""",
)
def accuracy_table(inputs: FigureInputs) -> dict:
    rows = [
        {"run": run.name, **_setting(run), "accuracy": run.accuracy}
        for run in load_runs(inputs.runs).values()
    ]
    reference = {row["setting"]: row["accuracy"] for row in rows if row["setting"] != "FQT"}
    for row in rows:
        row["gap_to_qat_points"] = round(100 * (row["accuracy"] - reference.get("QAT", math.nan)), 2)
    order = ("Exact", "QAT", "FQT")
    rows.sort(
        key=lambda row: (order.index(row["setting"]), -row["bits"], (*SCHEMES, "-").index(row["scheme"]))
    )
    fqt = {(row["bits"], row["scheme"]): row["accuracy"] for row in rows if row["setting"] == "FQT"}
    bit_list = sorted({bits for bits, _ in fqt}, reverse=True)

    figure, axes = subplots(width=5.6, height=4.2)
    ax = axes[0][0]
    for setting, style in (("Exact", "--"), ("QAT", "-")):
        if setting in reference:
            ax.axhline(100 * reference[setting], color="k", ls=style, lw=1, label=setting)
    for offset, scheme in zip((-0.12, 0.0, 0.12), SCHEMES, strict=True):
        present = [b for b in bit_list if (b, scheme) in fqt]
        ax.plot(
            [b + offset for b in present],
            [100 * fqt[b, scheme] for b in present],
            "o-",
            color=COLOURS[scheme],
            label=NAMES[scheme],
        )
    ax.set(xlabel="gradient bits", ylabel="test accuracy (%)")
    ax.set_xticks(bit_list)
    ax.invert_xaxis()
    ax.legend(fontsize=8)

    complete = [bits for bits in bit_list if all((bits, s) in fqt for s in SCHEMES)]
    gaps = {s: [row["gap_to_qat_points"] for row in rows if row["scheme"] == s] for s in SCHEMES}
    headline = {
        **{row["run"]: row["accuracy"] for row in rows},
        **{
            f"{row['run']}_gap_to_qat_points": finite_or_none(row["gap_to_qat_points"])
            for row in rows
            if row["setting"] == "FQT"
        },
        **{f"{s}_mean_gap_to_qat_points": finite_or_none(np.mean(gaps[s])) for s in SCHEMES if gaps[s]},
        "bhq_ge_psq_ge_ptq_at_bits": {
            bits: fqt[bits, "bhq"] >= fqt[bits, "psq"] >= fqt[bits, "ptq"] for bits in complete
        },
    }
    if complete:
        top = [fqt[complete[0], s] for s in SCHEMES]
        inputs.notes.append(
            f"One training run (one seed) per setting: at {complete[0]} bits, where theory puts every scheme "
            f"within noise of QAT, the three FQT runs already differ by {100 * (max(top) - min(top)):.1f} "
            "points, so differences of that size between schemes are run-to-run noise at this scale."
        )
    return save(inputs, figure, rows, "B4 test accuracy of Exact, QAT and FQT runs", headline)


# --- X2 -----------------------------------------------------------------------------------------------------
def _range_statistics(x: Tensor) -> dict[str, float]:
    """sigma of ln(per-sample range), and N R(X)^2 / sum_i R(X_i)^2: the ratio of the PTQ and PSQ variance
    bounds (statquant section 2.7), which is what per-sample ranges predict for the PTQ/PSQ gain."""
    ranges = row_ranges(x).double()
    whole = float(x.max() - x.min())
    return {
        "sigma_ln_range": float(ranges[ranges > 0].log().std()),
        "bound_ratio": x.shape[0] * whole**2 / float(ranges.square().sum()),
    }


PREDICTORS = {"sigma_ln_range": "sigma of ln(per-sample range)", "bound_ratio": "N R(X)^2 / sum_i R(X_i)^2"}
GAINS = {"ptq_over_psq": "Var(PTQ) / Var(PSQ)", "psq_over_bhq": "Var(PSQ) / Var(BHQ)"}


def _rhos(correlations: dict[str, float], predictor: str) -> str:
    return " and ".join(f"{correlations[f'spearman_{predictor}_vs_{gain}']:.2f}" for gain in GAINS)


@experiment(
    "X2",
    "range_sigma_predictor",
    "Spread of per-sample gradient ranges as a predictor of the PSQ and BHQ gains",
    """Hypothesis: PSQ and BHQ gain over PTQ because the samples of a neural gradient have very different
    ranges, so the larger the spread of the per-sample ranges (sigma of their natural log), the larger the
    gain. For every convolution and linear layer of the qat8 run's model (default: narrow ResNet18,
    Fashion-MNIST, one test batch of 128):
    the measured quantization-variance ratios Var(PTQ)/Var(PSQ) (left) and Var(PSQ)/Var(BHQ) (right) of the
    layer's output gradient at the configured bits (mean ||Q(x) - x||^2 over the configured stochastic
    draws), against sigma of ln(per-sample range) (top) and against the ratio of the PTQ and PSQ variance
    bounds, N R(X)^2 / sum_i R(X_i)^2 (bottom). Spearman rank correlations in the panel titles.""",
)
def range_sigma_predictor(inputs: FigureInputs) -> dict:
    params = inputs.params
    bits, draws, seed = int(params.get("bits", 5)), int(params.get("draws", 4)), int(params.get("seed", 0))
    run, model = _model(inputs)
    batches = _batches(run, int(params.get("batches", 1)), params)
    per_batch = [output_gradients(model, *batch) for batch in batches]
    rows = []
    for layer in per_batch[0]:
        tensors = [gradients[layer] for gradients in per_batch]
        statistics = [_range_statistics(x) for x in tensors]
        variance = {
            s: np.mean([quantizer_variance(x, bits, s, draws, seed) for x in tensors]) for s in SCHEMES
        }
        rows.append(
            {
                "layer": layer,
                "values_per_sample": tensors[0].shape[1],
                **{key: float(np.mean([stat[key] for stat in statistics])) for key in PREDICTORS},
                **{f"var_{s}": float(variance[s]) for s in SCHEMES},
                "ptq_over_psq": float(variance["ptq"] / variance["psq"]),
                "psq_over_bhq": float(variance["psq"] / variance["bhq"]),
            }
        )

    figure, axes = subplots(ncols=2, nrows=2, width=5.0, height=3.8)
    correlations = {}
    for (predictor, xlabel), ax_row in zip(PREDICTORS.items(), axes, strict=True):
        for (gain, ylabel), ax, scheme in zip(GAINS.items(), ax_row, ("psq", "bhq"), strict=True):
            xs, ys = [row[predictor] for row in rows], [row[gain] for row in rows]
            correlations[f"spearman_{predictor}_vs_{gain}"] = float(spearmanr(xs, ys).statistic)
            ax.scatter(xs, ys, color=COLOURS[scheme])
            ax.axhline(1.0, color="k", lw=0.8)
            log_x = predictor == "bound_ratio"
            ax.set(yscale="log", xscale="log" if log_x else "linear")
            for axis in (ax.xaxis, ax.yaxis) if log_x else (ax.yaxis,):  # plain numbers: about a decade each
                axis.set_major_formatter(LogFormatter())
                axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
            ax.set(xlabel=xlabel, ylabel=f"{ylabel}, {bits} bits")
            ax.set_title(f"Spearman rho = {correlations[f'spearman_{predictor}_vs_{gain}']:.2f}", fontsize=10)
    sigmas = [row["sigma_ln_range"] for row in rows]
    headline = {
        "bits": bits,
        "layers": len(rows),
        **{key: finite_or_none(value) for key, value in correlations.items()},
        "sigma_ln_range_min_max": [min(sigmas), max(sigmas)],
        **{f"{gain}_min_max": [min(r[gain] for r in rows), max(r[gain] for r in rows)] for gain in GAINS},
    }
    if max(sigmas) - min(sigmas) < 0.5:
        ratios = [row["bound_ratio"] for row in rows]
        inputs.notes.append(
            f"Across the layers of this trained model sigma of ln(per-sample range) only spans "
            f"{min(sigmas):.2f}-{max(sigmas):.2f}, too narrow to test the sigma hypothesis (Spearman rho "
            f"{_rhos(correlations, 'sigma_ln_range')}); the bound ratio N R(X)^2 / sum R(X_i)^2, from "
            f"{min(ratios):.1f} to {max(ratios):.1f} between layers, is the per-sample-range statistic that "
            f"tracks the gains (rho {_rhos(correlations, 'bound_ratio')})."
        )
    return save(inputs, figure, rows, f"X2 per-sample range spread vs PSQ/BHQ gains ({bits} bits)", headline)
