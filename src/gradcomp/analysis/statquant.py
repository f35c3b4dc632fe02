"""B1-B4, X2: the unbiased integer gradient quantizers PTQ, PSQ and BHQ of the statistical FQT framework.

Measurements (B1-B3, X2) use the trained QAT model (8-bit forward quantization) of each seed read, in eval
mode, so that BatchNorm uses running statistics and repeated passes over a batch differ only by the gradient
quantizers' random bits; batches come from the test split in a fixed shuffled order. Each seed's model gives
one measurement (a `PerSeed` record); tables give the mean and 95 % CI over seeds.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from gradcomp.analysis.accuracy import (
    accuracy_pair,
    claim_of,
    gap_columns,
    per_seed_table,
    run_row,
    scale_note,
)
from gradcomp.analysis.claims import decide, deciding
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
from gradcomp.analysis.runs import RunGroup, eval_batches, seed_list, trained_models, training_context
from gradcomp.analysis.seeds import (
    CORRELATION,
    FRACTION,
    LINEAR,
    POSITIVE,
    Bounds,
    Estimate,
    PerSeed,
    spearman,
)
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    BETTER,
    FAMILIES,
    GAP,
    Comparison,
    Pair,
    by_arm,
    compare,
    having,
    one_sample,
    summarise,
)
from gradcomp.choices import INT_SCHEMES
from gradcomp.experiments import BinUsage, FqtAccuracy, RangePredictor, Unbiasedness, VarianceVsBits

SCHEMES = INT_SCHEMES
NAMES = {scheme: scheme.upper() for scheme in SCHEMES}
# roles of the comparisons: one scheme against another; a scheme's per-bit factor against 4 and its variance
# against the QAT sampling variance (B2); QAT against exact training (B4)
ORDERING, PER_BIT, SAMPLING, QAT = "ordering", "per-bit factor", "sampling", "qat"


def _int_policy(bits: int, scheme: str, weight_bits: int | None = None) -> str:
    return f"int:bits={bits},scheme={scheme},weight_bits={weight_bits or bits}"


def _measured(group: RunGroup, what: str) -> str:
    """Where a measurement comes from, for captions."""
    config = group.config
    return (
        f"{what} of the {group.name} run's trained model ({config['forward_bits']}-bit forward quantization; "
        f"{training_context({group.name: group})}), in eval mode, on test batches of {config['batch_size']}; "
        f"one measurement per seed ({seed_list(group.seeds)}), mean and 95 % CI over them"
    )


def _scheme_pairs(
    values: PerSeed, key: str, name: str, unit: str, higher_is_better: bool, layer: str | None = None, **pair
) -> list[Pair]:
    """PSQ vs PTQ, BHQ vs PTQ and BHQ vs PSQ on the quantity `name` of rows keyed {key: scheme}, or with
    `layer` of rows keyed {"layer": layer, key: scheme}: each arm then names its layer and the reference is
    "the same layer", so that a kind of comparison (e.g. PSQ vs PTQ) has one reference on every layer and
    pools its planning sd over them."""
    where = {} if layer is None else {"layer": layer}
    return [
        Pair(
            NAMES[a] if layer is None else f"{NAMES[a]} on {layer}",
            NAMES[b] if layer is None else f"{NAMES[b]} on the same layer",
            values.values({**where, key: a}, name),
            values.values({**where, key: b}, name),
            unit=unit,
            factor=1.0,
            higher_is_better=higher_is_better,
            role=ORDERING,
            arm=a,
            baseline=b,
            kind=f"{NAMES[a]} vs {NAMES[b]}",
            **pair,
        )
        for a, b in (("psq", "ptq"), ("bhq", "ptq"), ("bhq", "psq"))
    ]


# --- B1 -----------------------------------------------------------------------------------------------------
def _code_usage(codes: Tensor, levels: int) -> tuple[Tensor, dict[str, float]]:
    """Histogram of the codes and how much of the code book it uses (distinct bins, entropy, the fewest
    bins that hold 99% of the elements)."""
    counts = torch.bincount(codes.flatten(), minlength=levels).double()
    share = counts / counts.sum()
    used = share[share > 0]
    cover = int(torch.searchsorted(share.sort(descending=True).values.cumsum(0), 0.99)) + 1
    return counts, {
        "distinct_bins": float(used.numel()),
        "used_fraction": used.numel() / levels,
        "entropy_bits": float(-(used * used.log2()).sum()),
        "bins_for_99pct": float(min(cover, levels)),
    }


def _range_histogram(x: Tensor) -> list[dict]:
    """The per-sample ranges of one gradient as a log-spaced histogram (what panel (a) draws)."""
    ranges = row_ranges(x).double()
    positive = ranges[ranges > 0]
    counts, edges = np.histogram(
        positive.numpy(), bins=np.geomspace(float(positive.min()), float(positive.max()), 30)
    )
    return [
        {
            "left": float(a),
            "right": float(b),
            "samples": int(n),
            "whole_tensor_range": float(x.max() - x.min()),
            "shape": list(x.shape),
        }
        for a, b, n in zip(edges[:-1], edges[1:], counts, strict=True)
    ]


def _network_order(model: nn.Module, gradients: dict[str, Tensor]) -> list[str]:
    """The layers of `gradients` in the model's module order (`output_gradients` records them in the order
    the backward pass reaches them, last layer first)."""
    return [name for name, _ in model.named_modules() if name in gradients]


def _b1_caption(settings: BinUsage, group: RunGroup, layers: list[str]) -> str:
    levels = 2**settings.bits
    return f"""(a) Per-sample ranges (max - min) of the output gradient of {settings.layer} for one test
        batch, first seed (seed {group.seeds[0]}): the samples' scales differ by orders of magnitude, and
        PTQ's single range (dashed) is set by the largest. (b-d) Histograms (log y) of the integer codes each
        element of that gradient lands on at {settings.bits} bits (codes 0-{levels - 1}) under PTQ, PSQ and
        BHQ (quantize_int's own stochastic rounding), first seed; in each panel the bins used and the code
        entropy, mean over seeds. (e) Code entropy (bits; at most {settings.bits}) of every one of the
        {len(layers)} quantized layers' output gradients ({layers[0]} to {layers[-1]}, in network order;
        {settings.layer}, shaded, is the one of (a-d)), mean and 95 % CI over seeds; dotted: {settings.bits}
        bits, every code equally often. Main table: per layer and scheme the distinct bins used, their
        fraction of the {levels}, the code entropy, the fewest bins holding 99 % of the elements, and each
        scheme's code-entropy verdict against PTQ; second table: {settings.layer}'s numbers with each
        scheme's quantization variance ||Q(x) - x||^2 (mean over {settings.draws} draws), measured on that
        layer only ({settings.draws} draws on every layer would cost {settings.draws} times the codes'
        pass);
        {_measured(group, "measured on the gradients")}. Comparisons: code entropy, paired by seed (higher
        is better); PSQ and BHQ against PTQ on each of the {len(layers)} layers decide S1 as one family
        ({2 * len(layers)} comparisons), BHQ against PSQ on {settings.layer} is secondary; {FAMILIES}."""


def _b1_findings(bits: int, layers: list[str], against_ptq: dict[tuple[str, str], Comparison]) -> str:
    """On how many layers PSQ and BHQ have a higher code entropy than PTQ (the mean difference over seeds),
    on how many S1's comparisons find them better, and each one's smallest gain."""
    higher, better, smallest, below = [], [], [], []
    for scheme in ("psq", "bhq"):
        mine = {layer: against_ptq[layer, scheme] for layer in layers}
        higher.append(f"{NAMES[scheme]} on {sum(c.difference > 0 for c in mine.values())} of {len(layers)}")
        better.append(f"{NAMES[scheme]} on {sum(c.verdict == BETTER for c in mine.values())}")
        least = min(mine, key=lambda layer: mine[layer].difference)
        smallest.append(f"{NAMES[scheme]} {mine[least].difference:+.3g} bits on {least}")
        if not_above := [layer for layer, c in mine.items() if not c.difference > 0]:
            below.append(f"{NAMES[scheme]} not above PTQ on {', '.join(not_above)}")
    return (
        f"Code entropy of {bits}-bit codes against PTQ on the same layer: higher (more of the bins used) for "
        f"{', '.join(higher)} quantized layers; better after Holm over S1's {2 * len(layers)} comparisons: "
        f"{', '.join(better)} (smallest gains: {', '.join(smallest)}"
        + "".join(f"; {text}" for text in below)
        + ")."
    )


def bin_usage(settings: BinUsage, runs: dict[str, RunGroup]) -> Result:
    """B1: how many quantization bins each scheme uses on the neural gradient of every quantized layer, one
    layer (`settings.layer`) in detail."""
    group = runs[settings.run]
    bits, levels = settings.bits, 2**settings.bits
    entropy_bounds = Bounds(0.0, float(bits))
    usage = PerSeed(
        ("layer", "scheme"),
        {"used_fraction": FRACTION, "entropy_bits": entropy_bounds, "quantization_variance": POSITIVE},
    )
    spreads = PerSeed(("layer",), {"sigma_ln_sample_range": POSITIVE})
    ranges_table, codes_table, layers = [], [], []
    for seed, run, model in trained_models(group):
        gradients = output_gradients(model, *eval_batches(run, 1)[0])
        order = _network_order(model, gradients)
        if settings.layer not in gradients:
            known = ", ".join(order)
            raise KeyError(
                f"experiments.B1.layer: {settings.layer!r} is not among the quantized layers: {known}"
            )
        first = not layers
        layers = layers or order
        for layer in order:
            x = gradients[layer]
            ranges = row_ranges(x).double()
            spreads.add(seed, {"layer": layer}, sigma_ln_sample_range=float(ranges[ranges > 0].log().std()))
            detailed = layer == settings.layer
            if first and detailed:  # the figure shows the first seed's tensor
                ranges_table = _range_histogram(x)
            for scheme in SCHEMES:
                counts, numbers = _code_usage(bin_codes(x, bits, scheme, seed=seed), levels)
                # `draws` times the codes' cost per layer: on the detailed layer only
                variance = (
                    quantizer_variance(x, bits, scheme, settings.draws, seed=seed) if detailed else None
                )
                usage.add(seed, {"layer": layer, "scheme": scheme}, **numbers, quantization_variance=variance)
                if first and detailed:
                    codes_table += [
                        {"scheme": scheme, "code": code, "elements": int(n)} for code, n in enumerate(counts)
                    ]

    by_layer = {
        layer: _scheme_pairs(
            usage,
            "scheme",
            "entropy_bits",
            "bits of entropy",
            True,
            layer,
            bounds=entropy_bounds,
            scale=group.scale,
        )
        for layer in layers
    }
    # PSQ and BHQ against PTQ on every layer decide S1 as one family; BHQ against PSQ, on the detailed layer
    # only, is secondary
    deciders = deciding("S1", [pair for layer in layers for pair in by_layer[layer][:2]])
    comparisons = compare([*deciders, *by_layer[settings.layer][2:]])
    keys = [(layer, scheme) for layer in layers for scheme in ("psq", "bhq")]
    against_ptq = dict(zip(keys, comparisons[: len(deciders)], strict=True))
    rows = []
    usage_rows = usage.rows()
    for row in usage_rows:  # the variance, on one layer only, is in the detailed table
        verdict = against_ptq.get((row["layer"], row["scheme"]))
        rows.append(
            {key: value for key, value in row.items() if not key.startswith("quantization_variance")}
            | ({} if verdict is None else {"vs_ptq": verdict.verdict})
        )
    detail = [row for row in usage_rows if row["layer"] == settings.layer]
    on_detail = [
        against_ptq[settings.layer, "psq"],
        against_ptq[settings.layer, "bhq"],
        *comparisons[len(deciders) :],
    ]
    spread = next(row for row in spreads.rows() if row["layer"] == settings.layer)
    findings = [
        _b1_findings(bits, layers, against_ptq),
        f"Code entropy on {settings.layer}: {summarise(on_detail)}.",
        f"sigma of ln(per-sample range) on {settings.layer}: "
        f"{Estimate.read(spread, 'sigma_ln_sample_range').text()}.",
    ]
    note = scale_note({group.name: group})
    return Result(
        caption=_b1_caption(settings, group, layers),
        tables={
            "main": Table(
                f"Bin usage of {bits}-bit gradient quantizers, every quantized layer", rows, note=note
            ),
            "detail": Table(f"Bin usage and quantization variance on {settings.layer}", detail, note=note),
            "spreads": Table("sigma of ln(per-sample range) per layer", spreads.rows(), markdown=False),
            "ranges": Table("Per-sample ranges (first seed)", ranges_table, markdown=False),
            "codes": Table("Code histograms (first seed)", codes_table, markdown=False),
        },
        comparisons=comparisons,
        findings=findings,
        claims=[decide("S1", comparisons)],
        facts={"layer": settings.layer, "bits": bits, "layers": layers},
    )


# --- B2 -----------------------------------------------------------------------------------------------------
def unbiased_sampling_variance(qat: Tensor) -> tuple[float, float]:
    """(V, its standard error) from per-batch gradients [B, P]: V = sum_b ||g_b - g_bar||^2 / (B - 1), the
    unbiased estimate of the minibatch sampling variance E||g_b - E g||^2 (the mean of the per-batch squared
    deviations d_b = ||g_b - g_bar||^2 B/(B - 1)); its standard error sd(d_b)/sqrt(B) is the first-order
    one of this degree-2 U-statistic."""
    count = qat.shape[0]
    if count < 2:
        raise ValueError(f"the sampling variance needs at least 2 batches, got {count}")
    deviations = (qat.double() - qat.double().mean(0)).square().sum(1) * (count / (count - 1))
    return float(deviations.mean()), float(deviations.std() / math.sqrt(count))


def _per_bit_factor(bits: list[int], variances: list[float]) -> float:
    """exp(-slope) of ln(variance) against bits: by how much one more bit divides the variance."""
    return float(np.exp(-np.polyfit(bits, np.log(variances), 1)[0]))


def _variances(settings: VarianceVsBits, group: RunGroup) -> tuple[PerSeed, PerSeed, list[dict]]:
    """Per seed: each (bits, scheme)'s quantization variance of the weight gradient (mean over batches and
    draws, with its standard error over batches), the QAT sampling variance; per scheme its mean ln
    variance over the bit widths and its per-bit factor."""
    points = PerSeed(("bits", "scheme"), {"quantization_variance": POSITIVE, "ln_variance": LINEAR})
    schemes = PerSeed(("scheme",), {"per_bit_factor": POSITIVE})
    sampling_rows = []
    for seed, run, model in trained_models(group):
        batches = eval_batches(run, max(settings.batches, settings.sampling_batches))
        qat = torch.stack([weight_gradients(model, *batch) for batch in batches])
        estimate, error = unbiased_sampling_variance(qat[: settings.sampling_batches])
        points.add(
            seed,
            {"bits": None, "scheme": "QAT sampling"},
            quantization_variance=estimate,
            ln_variance=math.log(estimate),
            within_seed_se=error,
        )
        sampling_rows.append(
            {
                "seed": seed,
                "batches": settings.sampling_batches,
                "sampling_variance": estimate,
                "standard_error": error,
                "relative_standard_error": error / estimate,
                "biased_estimate_first_batches": sample_variance(qat[: settings.batches])
                if settings.batches > 1
                else None,
            }
        )
        qat = qat[: settings.batches]
        for scheme in SCHEMES:
            variances = []
            for bits in settings.bits:
                policy = _int_policy(bits, scheme, settings.weight_bits)
                per_batch = [
                    quantization_variance(
                        qat[i : i + 1],
                        fqt_weight_gradients(
                            model, *batch, policy, settings.draws, seed=seed, first_step=i * settings.draws
                        )[None],
                    )
                    for i, batch in enumerate(batches[: settings.batches])
                ]
                variance = float(np.mean(per_batch))
                error = (
                    float(np.std(per_batch, ddof=1) / math.sqrt(len(per_batch)))
                    if len(per_batch) > 1
                    else None
                )
                points.add(
                    seed,
                    {"bits": bits, "scheme": scheme},
                    quantization_variance=variance,
                    ln_variance=math.log(variance),
                    within_seed_se=error,
                )
                variances.append(variance)
            factor = _per_bit_factor(list(settings.bits), variances)
            schemes.add(
                seed,
                {"scheme": scheme},
                mean_ln_variance=float(np.mean(np.log(variances))),
                per_bit_factor=factor,
                ln_factor_over_4=math.log(factor / 4),
            )
    return points, schemes, sampling_rows


def _b2_caption(settings: VarianceVsBits, group: RunGroup, sampling_rows: list[dict]) -> str:
    relative = [row["relative_standard_error"] for row in sampling_rows]
    weight_path = f"{settings.weight_bits} bits" if settings.weight_bits else "the swept bits"
    draws = f"{settings.batches} batch{'es' if settings.batches > 1 else ''} x {settings.draws} draws"
    return f"""Quantization variance of the FQT weight gradient, the mean over test batches and stochastic
        draws of ||g_FQT - g_QAT||^2 summed over every convolution and linear weight (statquant section
        3.4), against the gradient bits ({draws} per point; activation path: the scheme; weight path: per
        tensor for PTQ, per column otherwise, at {weight_path});
        {_measured(group, "measured on the weight gradients")}. Points: mean over seeds with its 95 % CI
        (computed on the log scale). Dashed (band: 95 % CI over seeds): the QAT minibatch sampling variance
        E||g_b - g_bar||^2, unbiased (squared deviations summed over B - 1) from B =
        {settings.sampling_batches} batches per seed, with a standard error (from the per-batch squared
        deviations) of {min(relative):.0%}-{max(relative):.0%} of it within a seed (table column
        within_seed_se: the standard error within a seed, over batches; per-seed table: also the biased
        mean_b ||g_b - g_bar||^2 of the first {settings.batches} batches alone). Dotted: a fall by 4 per
        bit. Comparisons, paired by seed on ln variance and Holm-adjusted together: the mean ln variance over
        the bit widths, PSQ and BHQ against PTQ and BHQ against PSQ (lower is better; exp of the difference
        is the geometric-mean variance ratio); each scheme's per-bit factor against 4 (ln of factor / 4,
        within ±{settings.per_bit_margin:g} counts as 4); and each scheme at each bit width against the
        sampling variance (filled markers: significantly below or above it, hollow: inconclusive)."""


def _against_sampling(settings: VarianceVsBits, group: RunGroup, points: PerSeed) -> list[Pair]:
    """Each scheme at each bit width against the QAT sampling variance, on ln variance (lower is better)."""
    sampling = points.values({"bits": None, "scheme": "QAT sampling"}, "ln_variance")
    return [
        Pair(
            f"{NAMES[scheme]} {bits} bits",
            "QAT sampling",
            points.values({"bits": bits, "scheme": scheme}, "ln_variance"),
            sampling,
            unit="ln variance",
            factor=1.0,
            higher_is_better=False,
            bounds=LINEAR,
            scale=group.scale,
            role=SAMPLING,
            arm=f"{scheme} {bits}",
        )
        for bits in settings.bits
        for scheme in SCHEMES
    ]


def _ratio_rows(points: PerSeed, against: dict[tuple, Comparison]) -> list[dict]:
    """The variance rows, each with its ratio to the sampling variance (exp of the paired ln difference,
    as an estimate) and that comparison's verdict."""
    rows = []
    for row in points.rows():
        comparison = against.get((row["bits"], row["scheme"]))
        if comparison is not None:
            ratio = Estimate(
                math.exp(comparison.difference),
                math.nan,
                math.exp(comparison.ci_low),
                math.exp(comparison.ci_high),
                comparison.seeds,
            )
            row |= {**ratio.columns("ratio_to_sampling"), "vs_sampling": comparison.verdict}
        rows.append(row)
    return rows


def variance_vs_bits(settings: VarianceVsBits, runs: dict[str, RunGroup]) -> Result:
    """B2: quantization variance against bits per scheme, against the QAT sampling variance."""
    group = runs[settings.run]
    points, schemes, sampling_rows = _variances(settings, group)
    ordering = _scheme_pairs(
        schemes, "scheme", "mean_ln_variance", "ln variance", False, bounds=LINEAR, scale=group.scale
    )
    fours = [
        one_sample(
            f"{NAMES[s]} ln(per-bit factor / 4)",
            schemes.values({"scheme": s}, "ln_factor_over_4"),
            0.0,
            unit="",
            margin=settings.per_bit_margin,
            higher_is_better=None,
            scale=group.scale,
            role=PER_BIT,
            arm=s,
        )
        for s in SCHEMES
    ]
    # PSQ and BHQ against PTQ decide S2, every scheme's per-bit factor S3
    deciders = [*deciding("S2", ordering[:2]), *ordering[2:], *deciding("S3", fours)]
    comparisons = compare([*deciders, *_against_sampling(settings, group, points)])
    sampling = by_arm(comparisons, SAMPLING)
    against = {(bits, scheme): sampling[f"{scheme} {bits}"] for bits in settings.bits for scheme in SCHEMES}
    ranked = summarise(having(comparisons, ORDERING))
    findings = [
        f"Mean ln variance over the bit widths (lower is better): {ranked}.",
        f"Per-bit factor against 4: {summarise(having(comparisons, PER_BIT))}.",
        f"Against the QAT sampling variance (better: below it): {summarise(list(against.values()))}.",
    ]
    return Result(
        caption=_b2_caption(settings, group, sampling_rows),
        tables={
            "main": Table(
                "Gradient variance vs bits (QAT model)",
                _ratio_rows(points, against),
                note=scale_note({group.name: group}),
            ),
            "schemes": Table(
                "Per scheme: mean ln variance over the bit widths and per-bit factor", schemes.rows()
            ),
            "sampling": Table(
                f"Unbiased sampling variance per seed ({settings.sampling_batches} batches)", sampling_rows
            ),
        },
        comparisons=comparisons,
        findings=findings,
        claims=[decide("S2", comparisons), decide("S3", comparisons)],
        facts={"sampling_batches": settings.sampling_batches},
    )


# --- B3 -----------------------------------------------------------------------------------------------------
# random but biased: with the reference code's per-layer scale (mean log2|g| at 2^-3) the largest gradients
# exceed e3m0's largest value 16 and saturate (about 0.1% of them in the default model, yet a large share of
# the gradient's energy)
BIASED_CONTRAST = "fp:format=e3m0,rounding=stochastic,scaling=per_layer_mean"
UNBIASED_SLOPE = -0.5  # the error of the mean of K unbiased draws falls as 1/sqrt(K)


def _b3_caption(settings: Unbiasedness, group: RunGroup, draws: int) -> str:
    return f"""Relative error ||mean of K FQT weight gradients - g_QAT|| / ||g_QAT|| (all convolution and
        linear weights) of one test batch, against the number K of independent stochastic-rounding draws (up
        to {draws}), for PTQ, PSQ and BHQ at {settings.bits} bits on both gradient paths;
        {_measured(group, "measured on the weight gradients")}. Unbiased quantizers fall as 1/sqrt(K) (dotted
        reference; log-log slope -0.5) towards the exact QAT gradient. The contrast, 4-bit floating point
        e3m0 on the convolution outputs with stochastic rounding and a per-layer scale that puts the mean
        log2|g| at 2^-3, saturates the largest gradients (beyond the format's largest value, 16): it is
        random but biased, and its error stalls at the bias. Comparisons: each curve's fitted log-log slope
        (per seed) against -0.5, equivalent within ±{settings.slope_margin:g}."""


def unbiasedness(settings: Unbiasedness, runs: dict[str, RunGroup]) -> Result:
    """B3: the mean of K FQT gradients converges to the QAT gradient as 1/sqrt(K) for unbiased schemes."""
    group = runs[settings.run]
    ks = [2**i for i in range(int(math.log2(settings.draws)) + 1)]
    policies = {scheme: _int_policy(settings.bits, scheme) for scheme in SCHEMES} | {
        "fp_e3m0": BIASED_CONTRAST
    }
    errors = PerSeed(("policy", "draws"), {"relative_error": POSITIVE})
    slopes = PerSeed(("policy",))
    for seed, run, model in trained_models(group):
        images, labels = eval_batches(run, 1)[0]
        exact = weight_gradients(model, images, labels)
        for name, policy in policies.items():
            draws = fqt_weight_gradients(model, images, labels, policy, ks[-1], seed=seed)
            curve = relative_error_of_mean(exact, draws, ks)
            for k, error in zip(ks, curve, strict=True):
                errors.add(seed, {"policy": name, "draws": k}, relative_error=error)
            slopes.add(seed, {"policy": name}, slope=float(np.polyfit(np.log(ks), np.log(curve), 1)[0]))
    slope_pairs = [
        one_sample(
            f"{NAMES.get(name, name)} slope",
            slopes.values({"policy": name}, "slope"),
            UNBIASED_SLOPE,
            unit="",
            margin=settings.slope_margin,
            higher_is_better=None,
            scale=group.scale,
        )
        for name in policies
    ]
    # the unbiased schemes' slopes decide S4 (the others are secondary)
    comparisons = compare(deciding("S4", slope_pairs[: len(SCHEMES)]) + slope_pairs[len(SCHEMES) :])
    return Result(
        caption=_b3_caption(settings, group, ks[-1]),
        tables={
            "main": Table(
                f"Unbiasedness of {settings.bits}-bit FQT gradients",
                errors.rows(),
                note=scale_note({group.name: group}),
            ),
            "slopes": Table("Log-log slope of each curve", slopes.rows()),
        },
        comparisons=comparisons,
        findings=[f"Log-log slopes against -0.5: {summarise(comparisons)}."],
        claims=[decide("S4", comparisons)],
    )


# --- B4 -----------------------------------------------------------------------------------------------------
def _b4_caption(qat: RunGroup, fqt: list[RunGroup], bit_list: list[int], runs: dict[str, RunGroup]) -> str:
    weight_paths = sorted({f"{g.policy.weight_bits}-bit {g.policy.weight_path}" for g in fqt})
    schemes = [scheme.upper() for scheme in SCHEMES if any(g.policy.scheme == scheme for g in fqt)]
    present = {(g.policy.bits, g.policy.scheme) for g in fqt}
    pairs = [
        f"{a.upper()} against {b.upper()}"
        for a, b in (("psq", "ptq"), ("bhq", "psq"))
        if any((bits, a) in present and (bits, b) in present for bits in bit_list)
    ]
    ladder = f" and at each bit width {' and '.join(pairs)}" if pairs else ""
    return f"""(a) Final test accuracy with exact gradients (Exact, no quantization), with
        {qat.forward_bits}-bit forward quantization only (QAT) and with QAT plus unbiased integer gradients
        (FQT) of {", ".join(map(str, bit_list))} bits on the activation-gradient path ({" / ".join(schemes)};
        weight-gradient path {", ".join(weight_paths)}, as in the reference code); mean and 95 % CI over
        seeds, each seed's point coloured by scheme; dashed: Exact, solid: QAT. (b) Each FQT run's accuracy
        difference from QAT, paired by seed: mean and 95 % CI, each seed's difference as a dot.
        {training_context(runs)}. Comparisons: QAT against Exact, each FQT run against QAT{ladder}; paired
        by seed, {FAMILIES}, equivalence by two one-sided tests at the settings' margin."""


def accuracy_table(settings: FqtAccuracy, runs: dict[str, RunGroup]) -> Result:
    """B4: Exact, QAT and FQT accuracies, each FQT run against QAT and the schemes against each other."""
    exact, qat = runs[settings.exact], runs[settings.qat]
    fqt = settings.present(settings.runs, runs)
    by_bits: dict[int, dict[str, RunGroup]] = {}
    for group in fqt:
        by_bits.setdefault(group.policy.bits, {})[group.policy.scheme] = group
    ladder = [
        (schemes[a], schemes[b])
        for schemes in by_bits.values()
        for a, b in (("psq", "ptq"), ("bhq", "psq"))
        if a in schemes and b in schemes
    ]
    compared = [
        accuracy_pair(qat, exact, settings.margin, role=QAT),
        *(accuracy_pair(group, qat, settings.margin) for group in fqt),
        *(accuracy_pair(a, b, settings.margin, role=ORDERING) for a, b in ladder),
    ]
    compared = [
        deciding("S5", [pair])[0] if pair.arm == settings.claim and pair.role == GAP else pair
        for pair in compared
    ]
    comparisons = compare(compared)
    gaps = by_arm(comparisons)
    ordered = sorted(fqt, key=lambda g: (-g.policy.bits, SCHEMES.index(g.policy.scheme)))
    rows = [
        {"setting": "Exact", "bits": 32, "scheme": None, **run_row(exact)},
        {"setting": "QAT", "bits": 32, "scheme": None, **run_row(qat)},
        *(
            {"setting": "FQT", "bits": g.policy.bits, "scheme": g.policy.scheme, **run_row(g)}
            for g in ordered
        ),
    ]
    gap_columns(rows, gaps)
    findings = [
        f"QAT: {summarise(having(comparisons, QAT))}.",
        f"FQT {summarise(having(comparisons, GAP))}.",
    ]
    if ladder:
        findings.append(f"Schemes at each bit width: {summarise(having(comparisons, ORDERING))}.")
    groups = {group.name: group for group in [exact, qat, *fqt]}
    return Result(
        caption=_b4_caption(qat, fqt, sorted(by_bits, reverse=True), groups),
        tables={
            "main": Table("Test accuracy of Exact, QAT and FQT runs", rows, note=scale_note(groups)),
            "seeds": per_seed_table([exact, qat, *fqt]),
        },
        comparisons=comparisons,
        findings=findings,
        claims=claim_of("S5", settings.claim, gaps),
        facts={"margin": settings.margin},
    )


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


PREDICTORS = ("sigma_ln_range", "bound_ratio")
GAINS = ("ptq_over_psq", "psq_over_bhq")


def _x2_caption(settings: RangePredictor, group: RunGroup) -> str:
    return f"""Hypothesis: PSQ and BHQ gain over PTQ because the samples of a neural gradient have very
        different ranges, so the larger the spread of the per-sample ranges (sigma of their natural log), the
        larger the gain. For every convolution and linear layer: the measured quantization-variance ratios
        Var(PTQ)/Var(PSQ) (left) and Var(PSQ)/Var(BHQ) (right) of the layer's output gradient at
        {settings.bits} bits (mean ||Q(x) - x||^2 over {settings.draws} stochastic draws and
        {settings.batches} test batch(es)), against sigma of ln(per-sample range) (top) and against the ratio
        of the PTQ and PSQ variance bounds, N R(X)^2 / sum_i R(X_i)^2 (bottom);
        {_measured(group, "measured on the gradients")} (points: layers, mean over seeds with 95 % CI).
        Spearman rank correlations per seed, then mean and 95 % CI over seeds (Fisher z), in the panel
        titles."""


def range_sigma_predictor(settings: RangePredictor, runs: dict[str, RunGroup]) -> Result:
    """X2: the spread of per-sample ranges against the PSQ and BHQ variance gains, layer by layer."""
    group = runs[settings.run]
    layers = PerSeed(("layer", "values_per_sample"), dict.fromkeys((*PREDICTORS, *GAINS), POSITIVE))
    correlations = PerSeed(("predictor", "gain"), {"rho": CORRELATION})
    for seed, run, model in trained_models(group):
        per_batch = [output_gradients(model, *batch) for batch in eval_batches(run, settings.batches)]
        mine = []
        for layer in per_batch[0]:
            tensors = [gradients[layer] for gradients in per_batch]
            statistics = [_range_statistics(x) for x in tensors]
            variance = {
                s: float(
                    np.mean([quantizer_variance(x, settings.bits, s, settings.draws, seed) for x in tensors])
                )
                for s in SCHEMES
            }
            row = {
                **{key: float(np.mean([stat[key] for stat in statistics])) for key in PREDICTORS},
                "ptq_over_psq": variance["ptq"] / variance["psq"],
                "psq_over_bhq": variance["psq"] / variance["bhq"],
            }
            mine.append(row)
            layers.add(seed, {"layer": layer, "values_per_sample": tensors[0].shape[1]}, **row)
        for predictor in PREDICTORS:
            for gain in GAINS:
                rho = spearman([r[predictor] for r in mine], [r[gain] for r in mine])[0]
                correlations.add(seed, {"predictor": predictor, "gain": gain}, rho=rho)
    rows = layers.rows()
    sigmas = [row["sigma_ln_range_mean"] for row in rows]
    findings = [
        f"Spearman rho of {row['predictor']} against {row['gain']}: {Estimate.read(row, 'rho').text()} "
        "over seeds."
        for row in correlations.rows()
    ]
    if max(sigmas) - min(sigmas) < 0.5:
        findings.append(
            f"Across the layers of this trained model sigma of ln(per-sample range) only spans "
            f"{min(sigmas):.2f}-{max(sigmas):.2f}, too narrow to test the sigma hypothesis; the bound ratio "
            "N R(X)^2 / sum R(X_i)^2 is the per-sample-range statistic to read against the gains."
        )
    return Result(
        caption=_x2_caption(settings, group),
        tables={
            "main": Table(
                f"Per-sample range spread vs PSQ/BHQ gains ({settings.bits} bits)",
                rows,
                note=scale_note({group.name: group}),
            ),
            "correlations": Table(
                "Spearman rank correlations, per seed then over seeds", correlations.rows()
            ),
        },
        findings=findings,
        facts={"bits": settings.bits},
    )
