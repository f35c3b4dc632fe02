"""C1, C2, C5: block-scaled gradient formats (OCP MX, NVFP4), in training and against the lognormal theory.

C1: each arm's final accuracy against the uncompressed run of its model and scale (paired by seed). C2: on
the trained baselines of each model family, every compressed layer's neural gradient in each block format
(blocks along the output features, nearest rounding), with and without the Hadamard transform, and with one
scale per layer (the same element format at the scale of least predicted MSE, the lognormal paper's
scaling): the measured shares flushed to zero and clipped and the relative MSE, next to
`gradcomp.theory.block`'s prediction from each layer's lognormal fit.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import defaultdict

import torch
from scipy import stats

from gradcomp.analysis.accuracy import (
    GAP_PANEL,
    GapExperiment,
    WithinModels,
    run_row,
)
from gradcomp.analysis.gradients import captured_gradients
from gradcomp.analysis.runs import RunGroup, eval_batches, trained_models, training_context
from gradcomp.analysis.seeds import LINEAR, PerSeed
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    EQUIVALENT,
    FAMILIES,
    INCONCLUSIVE,
    Comparison,
    Pair,
    compare,
    correlation_pair,
    one_sample,
    prediction_pair,
    summarise,
)
from gradcomp.experiments import BlockTheory, CompareWithinModels, ScaleFormats
from gradcomp.formats.block import SCALE_LABELS, BlockFormat
from gradcomp.lognormal import fit_lognormal_float
from gradcomp.ops import log_moments, quantize_fp
from gradcomp.ops._blocks import as_blocks
from gradcomp.ops.block import block_errors
from gradcomp.ops.stats import largest_finite
from gradcomp.theory.block import (
    BlockLevels,
    block_statistics,
    correlated_block_statistics,
    per_tensor_statistics,
)
from gradcomp.training.compress import layer_log2_scale
from gradcomp.training.config import CompressionConfig
from gradcomp.training.policies import Block, FloatingPoint, parse_policy

_LN2 = math.log(2.0)
PER_LAYER = "per layer"
QUANTITIES = ("flushed", "clipped", "mse")
# C2's three questions, each its own Holm family
THEORY = "theory against measurement"
VERSUS = "block formats against one scale per layer"
CORRELATED = "the correlated block model against the iid one"


# --- C1 -----------------------------------------------------------------------------------------------------
def _c1_row(group: RunGroup) -> dict:
    policy = group.policy
    if isinstance(policy, Block):
        fmt, copies = policy.format, (policy.copy(False), policy.copy(True))
        rounding, hadamard = ("/".join(dict.fromkeys(str(getattr(c, key)) for c in copies))
                              for key in ("rounding", "hadamard"))  # fmt: skip
        return {**run_row(group), "format": fmt.label, "bits": fmt.bits_per_element,
                "rounding": rounding, "hadamard": hadamard}  # fmt: skip
    if isinstance(policy, FloatingPoint):
        return {**run_row(group), "format": policy.format_label, "bits": float(policy.fmt.bits),
                "rounding": policy.rounding, "hadamard": "0"}  # fmt: skip
    return {**run_row(group), "format": group.label, "bits": 32.0, "rounding": None, "hadamard": "0"}


def _c1_caption(models: WithinModels, margin: float, groups: dict[str, RunGroup]) -> str:
    formats = "; ".join(dict.fromkeys(models.label(arm) for arm in models.arms))
    return f"""{GAP_PANEL}: the output gradient of every compressed layer in a block-scaled
        format, its two copies quantized apart with blocks along the
        reduction axis of their GEMM (input gradient: the output features; weight gradient: the batch and
        positions), SR: stochastic rounding, H n: the random Hadamard transform of n elements first; next to
        per-layer FP formats (one power-of-two scale per layer, the lognormal paper's). Arms: {formats}.
        {models.caption()}. {training_context(groups)}. Each arm against its baseline, paired by seed,
        {FAMILIES}, equivalence within ±{margin:g} pt."""


def block_formats(settings: CompareWithinModels, runs: dict[str, RunGroup]) -> Result:
    """C1: accuracy with block-scaled gradient formats, each arm against fp32 of its own model and scale."""
    models = WithinModels.of_settings(settings, runs, "C1")
    experiment = GapExperiment(models, compare(models.gap_pairs(settings.margin)))
    return experiment.result(
        _c1_caption(models, settings.margin, experiment.groups),
        "Accuracy with block-scaled gradient formats",
        experiment.rows(_c1_row, lambda r: (-r["bits"], r["format"])),
    )


# --- C2 -----------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8192)
def _predicted(fmt: BlockFormat, mu2: float, sigma2: float, hadamard: bool, numel: int):
    """The theory for a layer (mu2, sigma2 and numel as they are passed: rounded by the caller, so that
    layers share results)."""
    return block_statistics(fmt, sigma2, "nearest", hadamard, numel, nodes=1024, mu2=mu2)


def _levels(g: torch.Tensor, block_size: int, axis: int) -> BlockLevels | None:
    """The layer's block levels in blocks of `block_size` along `axis`, rounded (`BlockLevels.rounded`)."""
    levels = BlockLevels.of(as_blocks(g.detach(), block_size, axis)[0])
    return None if levels is None else levels.rounded()


def _rounded(mu2: float, sigma2: float) -> tuple[float, float]:
    """mu2 modulo 1 (power-of-two scales make the theory periodic in it) and sigma2, to 0.05."""
    return round(mu2 % 1.0 * 20) / 20, round(sigma2 * 20) / 20


def _layer(g: torch.Tensor) -> tuple[float, float, int] | None:
    """(mu2, sigma2, non-zeros) of a layer's gradient; None without two finite non-zeros."""
    moments = log_moments(g.double(), backend="torch").tolist()
    if moments[0] < 2:
        return None
    mu, sigma = fit_lognormal_float(moments)
    return mu / _LN2, sigma / _LN2, int(moments[0])


def _relative_mse(g: torch.Tensor, element, log2_scale: float) -> tuple[torch.Tensor, float]:
    """The layer quantized at one scale, and its error energy over the gradient's."""
    out = quantize_fp(g, element, scale=2.0**log2_scale, backend="torch")
    return out, float((out.double() - g.double()).square().sum() / g.double().square().sum())


def _per_layer(g: torch.Tensor, fmt: BlockFormat, mu2: float, sigma2: float, count: int):
    """(measured (flushed, clipped, mse), predicted ErrorShares, scale checked) of the element format with
    one scale for the layer: A6's per_layer_optimal rule as training applies it (A4's MSE-optimal scale for
    the layer's lognormal fit, at least the largest that keeps the layer's largest magnitude within the
    format's largest value: `compress.layer_log2_scale`). Predicted for this tensor, its `count` non-zero
    magnitudes drawn below its largest (`theory.block.per_tensor_statistics`, as a block's): the rule sets
    the scale from that largest value, so a lognormal tail beyond it, which the tensor does not have, would
    be predicted to clip. Checked: 1 when the measured MSE at that scale is within 1 % of the least at half
    and twice it (the comparator is not a weak scale; the expected-MSE optimum of a heavy-tailed lognormal
    can miss a sample's, whose energy comes from a few of the largest values), else 0."""
    element = fmt.element_format
    policy = FloatingPoint(format=element.name, scaling="per_layer_optimal")
    amax = largest_finite(g)
    log2_scale = float(layer_log2_scale(policy, torch.tensor(mu2), torch.tensor(sigma2), amax))
    out, mse = _relative_mse(g, element, log2_scale)
    nonzero = g != 0
    flushed = float((nonzero & (out == 0)).sum() / nonzero.sum().clamp_min(1))
    clipped = float((g.abs() * 2.0**log2_scale > element.max_value).double().mean())
    neighbours = [_relative_mse(g, element, log2_scale + step)[1] for step in (-1.0, 1.0)]
    checked = float(mse <= 1.01 * min(neighbours))
    largest = float(amax) / 2.0**mu2
    predicted = per_tensor_statistics(element, sigma2, log2_scale + mu2, largest=largest, numel=count)
    return (flushed, clipped, mse), predicted, checked


def family_errors(settings: BlockTheory | ScaleFormats, group: RunGroup, arms: dict[str, Block]) -> PerSeed:
    """Per seed of the family's trained model, every arm (format, transform) and the per-layer scale of each
    element format: measured and predicted shares and relative MSE over the compressed layers (shares
    weighted by elements, MSE by energy: sums over layers)."""
    per_seed = PerSeed(("arm",))
    for seed, run, model in trained_models(group):
        # the family's own placement (e.g. DeiT's linear layers) with a block policy's default types
        config = dataclasses.replace(
            CompressionConfig(**run.config["compression"]), policy=next(iter(arms.values()))
        )
        totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for images, labels in eval_batches(run, settings.batches):
            for _, g, _, axis in captured_gradients(model, config, images, labels):
                fit = _layer(g)
                if fit is None:
                    continue
                mu2, sigma2, nonzero = fit
                energy = float(g.double().square().sum())
                levels_by_block: dict[tuple[int, int], BlockLevels | None] = {}  # the arms share blocks
                for name, policy in arms.items():
                    fmt = dataclasses.replace(policy.format, rounding="nearest")  # C2 measures nearest
                    hadamard = fmt.hadamard
                    block_axis = axis if g.dim() > 1 else -1
                    measured = block_errors(g, fmt, axis=block_axis)
                    predicted = _predicted(fmt, *_rounded(mu2, sigma2), bool(hadamard), g.numel())
                    _accumulate(totals[name], measured, predicted, nonzero, g.numel(), energy)
                    block = (fmt.block_size, block_axis)
                    if block not in levels_by_block:
                        levels_by_block[block] = _levels(g, fmt.block_size, block_axis)
                    levels = levels_by_block[block]
                    correlated = (
                        predicted
                        if levels is None
                        else correlated_block_statistics(fmt, levels, "nearest", bool(hadamard), g.numel())
                    )
                    totals[name]["correlated_flushed"] += correlated.flushed * nonzero
                    totals[name]["correlated_error"] += correlated.relative_mse * energy
                for element in dict.fromkeys(policy.format.element for policy in arms.values()):
                    fmt = next(p.format for p in arms.values() if p.format.element == element)
                    measured, predicted, checked = _per_layer(g, fmt, mu2, sigma2, nonzero)
                    key = f"{fmt.element_format.name} {PER_LAYER}"
                    _accumulate(totals[key], measured, predicted, nonzero, g.numel(), energy)
                    totals[key]["layers"] += 1
                    totals[key]["scale_best"] += checked
        for name, total in totals.items():
            values = {
                "flushed": total["flushed"] / total["nonzero"],
                "clipped": total["clipped"] / total["elements"],
                "mse": total["error"] / total["energy"],
                "predicted_flushed": total["predicted_flushed"] / total["nonzero"],
                "predicted_clipped": total["predicted_clipped"] / total["elements"],
                "predicted_mse": total["predicted_error"] / total["energy"],
            }
            usable = values["mse"] > 0 and values["predicted_mse"] > 0
            values["ln_ratio"] = math.log(values["mse"] / values["predicted_mse"]) if usable else None
            if total["correlated_error"] > 0 and values["mse"] > 0:
                values["correlated_flushed"] = total["correlated_flushed"] / total["nonzero"]
                values["correlated_mse"] = total["correlated_error"] / total["energy"]
                values["correlated_ln_ratio"] = math.log(values["mse"] / values["correlated_mse"])
                if values["ln_ratio"] is not None:  # how much closer the correlated model comes
                    values["closer"] = abs(values["ln_ratio"]) - abs(values["correlated_ln_ratio"])
                    flushed, iid, correlated = (
                        values[key] for key in ("flushed", "predicted_flushed", "correlated_flushed")
                    )
                    values["closer_flushed"] = abs(flushed - iid) - abs(flushed - correlated)
            if total["layers"]:
                values["scale_best"] = total["scale_best"] / total["layers"]
            per_seed.add(seed, {"arm": name}, **values)
    return per_seed


def _accumulate(total, measured, predicted, nonzero: int, elements: int, energy: float):
    """Add a layer's measured and predicted counts; both MSEs are relative to their own energy (block
    scaling is scale-free: the error of a block follows its largest value), weighted by the layer's."""
    flushed, clipped, mse = measured
    total["nonzero"] += nonzero
    total["elements"] += elements
    total["energy"] += energy
    total["flushed"] += flushed * nonzero
    total["clipped"] += clipped * elements
    total["error"] += mse * energy
    total["predicted_flushed"] += predicted.flushed * nonzero
    total["predicted_clipped"] += predicted.clipped * nonzero
    total["predicted_error"] += predicted.relative_mse * energy


def _arms(settings: BlockTheory) -> dict[str, Block]:
    """Every format, without and with the transform, by label."""
    arms: dict[str, Block] = {}
    for spec in settings.formats:
        policy = parse_policy(spec)
        for hadamard in dict.fromkeys((0, settings.hadamard)):
            arm = Block(policy.element, policy.block, policy.scale, policy.rule, "nearest", hadamard)
            arms[arm.label] = arm
    return arms


def _c2_pairs(settings: BlockTheory, model: str, errors: PerSeed, arms: dict[str, Block]) -> list[Pair]:
    """Theory against measurement (ln ratio of the MSEs, every arm and per-layer scale), and each block
    format against per-layer scaling of its element format (ln of the MSE ratio, paired by seed)."""
    pairs = []
    for row in errors.rows():
        pairs.append(
            prediction_pair(
                f"{model} {row['arm']} measured/predicted MSE",
                errors.values({"arm": row["arm"]}, "ln_ratio"),
                "theory",
                settings.theory_margin,
                family=THEORY,
                role=model,
                arm=row["arm"],
            )
        )
    for label, policy in arms.items():
        reference = {"arm": f"{policy.format.element_format.name} {PER_LAYER}"}
        mse = errors.values({"arm": label}, "mse")
        per_layer = errors.values(reference, "mse")
        seeds = sorted(set(mse) & set(per_layer))
        if seeds:
            pairs.append(
                one_sample(
                    f"{model} {label} MSE",
                    {s: math.log(mse[s]) for s in seeds},
                    {s: math.log(per_layer[s]) for s in seeds},
                    "one scale per layer (ln MSE)",
                    higher_is_better=False,
                    unit="ln",
                    bounds=LINEAR,
                    family=VERSUS,
                    role=model,
                    arm=label,
                )
            )
    return pairs


def _correlated_pairs(errors: dict[str, PerSeed], arms: dict[str, Block]) -> list[Pair]:
    """Without the transform (where blocks keep their levels), per seed and averaged over the families and
    formats: how much closer the correlated block model comes to the measured relative MSE (|ln measured /
    predicted| of the iid model less the correlated one's) and to the share flushed (absolute miss of the
    iid model less the correlated one's); above 0 where it beats the iid model."""
    plain = [label for label, policy in arms.items() if not policy.hadamard]
    pairs = []
    for key, unit, what in (("closer", "ln", "relative MSE"), ("closer_flushed", "", "share flushed")):
        per_seed: dict[int, list[float]] = defaultdict(list)
        for family in errors.values():
            for label in plain:
                for seed, value in family.values({"arm": label}, key).items():
                    per_seed[seed].append(value)
        values = {seed: sum(v) / len(v) for seed, v in per_seed.items()}
        if values:
            pairs.append(
                one_sample(
                    f"{what} without the transform: the iid block model's miss less the correlated one's",
                    values,
                    0.0,
                    "no closer",
                    unit=unit,
                    family=CORRELATED,
                    role=key,
                )
            )
    return pairs


def _correlated_finding(correlated: list[Comparison]) -> str:
    """Whether the correlated block model comes closer to the measurement than the iid one."""
    return (
        "The correlated block model (a level per block and a spread within it) against the iid one, mean "
        f"over families and formats (its own family): {'; '.join(c.statement for c in correlated)}. After "
        "the transform the two coincide (the transformed values are modelled as Gaussian either way)."
    )


def _theory_finding(theory: list[Comparison], arms: dict[str, Block], margin: float) -> str:
    """Where the theory holds and where it fails, by kind of arm: without the transform, after it, and one
    scale per layer."""
    kinds = {"without the transform": [], "after the Hadamard transform": [], "with one scale per layer": []}
    for c in theory:
        arm = arms.get(c.arm)  # None: one scale per layer
        kind = (
            "with one scale per layer"
            if arm is None
            else "after the Hadamard transform"
            if arm.hadamard
            else "without the transform"
        )
        kinds[kind].append(c)
    parts = []
    for kind, members in kinds.items():
        if not members:
            continue
        outside = [c for c in members if c.verdict not in (EQUIVALENT, INCONCLUSIVE)]
        low, high = min(c.difference for c in members), max(c.difference for c in members)
        parts.append(
            f"{kind}, the measured MSE is off the prediction by more than a factor e^{margin:g} in "
            f"{len(outside)} of {len(members)} (family, format) arms and within it in "
            f"{sum(c.verdict == EQUIVALENT for c in members)} (measured/predicted from "
            f"{math.exp(low):.2g}x to {math.exp(high):.2g}x)"
        )
    return "The theory, by kind of arm: " + "; ".join(parts) + "."


def _c2_caption(settings: BlockTheory, groups: list[RunGroup], arms: dict[str, Block]) -> str:
    seeds = "every seed" if settings.seeds is None else f"seeds {', '.join(map(str, settings.seeds))}"
    return f"""(a) Relative MSE (error energy over gradient energy, summed over the compressed layers) of
        the neural gradients of each family's trained model in each block format, measured (x) against the
        lognormal theory's prediction (y) from each layer's fit (log2 mean mu2 and std sigma2; each layer's
        relative MSE weighted by its energy, as measured; blocks are modelled as iid draws): filled markers
        without the transform, open ones after the random Hadamard transform of {settings.hadamard} elements
        (modelled as Gaussian), squares: one scale per layer (the element format at the scale of least
        predicted MSE, A6's per_layer_optimal rule, bounded below, as in training, by the largest scale that
        keeps the layer's largest value within the format's: the lognormal optimum alone can lie below
        every value of a real gradient and flush the whole layer; checked against half and twice that
        scale). (b) The share of non-zero values flushed to zero, measured against predicted. (c) ln
        of each block format's measured MSE over that of one scale per layer with its element format (below
        0: blocks win), with the theory's prediction (x). Formats: {", ".join(arms)}; nearest rounding,
        blocks along the output features. Models: {", ".join(f"{g.name} ({g.model})" for g in groups)},
        {settings.batches} test batch(es) in eval mode, {seeds}. The tables also give the correlated block
        model's prediction (a level per block and a spread within it, log2|g| = b + w, fitted by the analysis
        of variance of each layer's blocks; `gradcomp.theory.block.BlockLevels`). Comparisons: measured
        against predicted (ln ratio, equivalence within ±{settings.theory_margin:g}), blocks against one
        scale per layer, each over seeds, and, without the transform and averaged over families and formats,
        how much closer the correlated model comes than the iid one to the relative MSE (|ln measured /
        predicted| of the iid less that of the correlated, above 0: closer) and to the share flushed; each
        question its own Holm family."""


def block_theory(settings: BlockTheory, runs: dict[str, RunGroup]) -> Result:
    """C2: the block theory against each family's real gradients, next to per-layer scaling."""
    groups = settings.present([settings.run, *settings.models], runs)
    arms = _arms(settings)
    rows, pairs, predicted_wins, errors_by_family = [], [], {}, {}
    for group in groups:
        errors = errors_by_family[group.name] = family_errors(settings, group, arms)
        pairs += _c2_pairs(settings, group.name, errors, arms)
        for row in errors.rows():
            rows.append({"model": group.name, **row})
        for label, policy in arms.items():
            block = errors.values({"arm": label}, "predicted_mse")
            layer = errors.values(
                {"arm": f"{policy.format.element_format.name} {PER_LAYER}"}, "predicted_mse"
            )
            ratios = [math.log(block[s] / layer[s]) for s in block if layer.get(s, 0) > 0 and block[s] > 0]
            if ratios:
                predicted_wins[group.name, label] = sum(ratios) / len(ratios)
    comparisons = compare(pairs + _correlated_pairs(errors_by_family, arms))
    theory = [c for c in comparisons if c.family == THEORY]
    versus = [c for c in comparisons if c.family == VERSUS]
    correlated = [c for c in comparisons if c.family == CORRELATED]
    agree = sum(
        1 for c in versus if (predicted_wins.get((c.role, c.arm), math.nan) < 0) == (c.difference < 0)
    )
    checked = [row["scale_best_mean"] for row in rows if row.get("scale_best_mean") is not None]
    findings = [
        _theory_finding(theory, arms, settings.theory_margin),
        f"Theory against measurement (MSE; its own family): {summarise(theory)}.",
        f"Block formats against one scale per layer (its own family): {summarise(versus)}.",
        _correlated_finding(correlated),
        f"The theory predicts the sign of the block/per-layer MSE difference in {agree} of {len(versus)} "
        "cases.",
        "The per-layer comparator takes A6's per_layer_optimal scale (A4's MSE-optimal scale for each "
        "layer's lognormal fit, at least the scale that keeps the layer's largest value within the format's "
        "largest); "
        "its measured MSE is within 1 % of the least at half or twice that scale in "
        f"{min(checked):.0%} to {max(checked):.0%} of the layers (per family and element format, mean over "
        "seeds)."
        if checked
        else "The per-layer comparator's scale was not checked (no layer had a fit).",
    ]
    versus_rows = [
        {"comparison": c.a, "measured_ln_ratio": c.difference, "low": c.ci_low, "high": c.ci_high,
         "predicted_ln_ratio": predicted_wins.get((c.role, c.arm)), "verdict": c.verdict}
        for c in versus
    ]  # fmt: skip
    return Result(
        caption=_c2_caption(settings, groups, arms),
        tables={
            "main": Table("Measured and predicted shares and relative MSE, per family and format", rows),
            "versus": Table("Block formats against one scale per layer (ln MSE ratio)", versus_rows),
        },
        comparisons=comparisons,
        findings=findings,
    )


# --- C5 -----------------------------------------------------------------------------------------------------
RANKING = "the theory's ranking of scale formats and block sizes"
ORDERING = "FP4 All the Way's ordering on these gradients"
MODELS = {"predicted_mse": "iid", "correlated_mse": "correlated"}


def _c5_arms(settings: ScaleFormats) -> dict[tuple[str, int], Block]:
    """(scale format, block size) -> the block policy (nearest rounding, no transform)."""
    return {
        (scale, block): Block(settings.element, block, scale, "floor", "nearest", 0)
        for scale in settings.scales
        for block in settings.blocks
    }


def _ranking_pairs(settings: ScaleFormats, family: str, errors: PerSeed, labels: list[str]) -> list[Pair]:
    """Per seed, Spearman's correlation over the arms of each model's predicted MSE with the measured."""
    pairs = []
    for key, kind in MODELS.items():
        measured = [errors.values({"arm": arm}, "mse") for arm in labels]
        model = [errors.values({"arm": arm}, key) for arm in labels]
        per_seed = {}
        for seed in sorted(set().union(*measured)):
            pairs_of_seed = [
                (m[seed], p[seed]) for m, p in zip(measured, model, strict=True) if seed in m and seed in p
            ]
            if len(pairs_of_seed) >= 4:
                x, y = zip(*pairs_of_seed, strict=True)
                per_seed[seed] = float(stats.spearmanr(x, y).statistic)
        pairs.append(
            correlation_pair(
                f"{family}: Spearman(predicted, measured MSE) over {len(labels)} arms, {kind} model",
                per_seed,
                settings.correlation_margin,
                family=RANKING,
                role=family,
                arm=kind,
            )
        )
    return pairs


def _ordering(settings: ScaleFormats) -> list[tuple[str, tuple[str, int], tuple[str, int]]]:
    """FP4 All the Way's comparisons (figures 1-2) as (what, arm, reference): scale formats at blocks of
    16, then block sizes under E4M3."""
    comparisons = [(f"{SCALE_LABELS[s]} against E8M0 scales, blocks of 16", (s, 16), ("e8m0fnu", 16))
                   for s in settings.scales if s != "e8m0fnu"]  # fmt: skip
    comparisons += [(f"{SCALE_LABELS[s]} against E4M3 scales, blocks of 16", (s, 16), ("e4m3fn", 16))
                    for s in settings.scales if s not in ("e8m0fnu", "e4m3fn")]  # fmt: skip
    sizes = sorted(settings.blocks)
    comparisons += [(f"blocks of {a} against {b}, E4M3 scales", ("e4m3fn", a), ("e4m3fn", b))
                    for a, b in itertools.pairwise(sizes)]  # fmt: skip
    return comparisons


def _ordering_pairs(settings, model, errors, labels) -> tuple[list[Pair], dict[str, float]]:
    """Each ordering comparison on the measured MSE (ln ratio, paired by seed), and the iid theory's
    predicted ln ratio (mean over seeds) by comparison name."""
    pairs, predicted = [], {}
    for what, arm, reference in _ordering(settings):
        a, b = labels[arm], labels[reference]
        mse, base = errors.values({"arm": a}, "mse"), errors.values({"arm": b}, "mse")
        seeds = sorted(s for s in set(mse) & set(base) if mse[s] > 0 and base[s] > 0)
        if not seeds:
            continue
        name = f"{model}: {what}"
        pairs.append(
            one_sample(
                name,
                {s: math.log(mse[s] / base[s]) for s in seeds},
                0.0,
                "no difference (ln MSE ratio)",
                margin=settings.margin,
                higher_is_better=False,
                unit="ln",
                family=ORDERING,
                role=model,
                arm=what,
            )
        )
        ours, theirs = (errors.values({"arm": x}, "predicted_mse") for x in (a, b))
        ratios = [math.log(ours[s] / theirs[s]) for s in seeds if ours.get(s, 0) > 0 and theirs.get(s, 0) > 0]
        if ratios:
            predicted[name] = sum(ratios) / len(ratios)
    return pairs, predicted


def scale_formats(settings: ScaleFormats, runs: dict[str, RunGroup]) -> Result:
    """C5: every scale format and block size on each family's real gradients, measured and predicted."""
    groups = settings.present([settings.run, *settings.models], runs)
    arms = _c5_arms(settings)
    labels = {key: policy.label for key, policy in arms.items()}
    rows, pairs, predicted = [], [], {}
    for group in groups:
        errors = family_errors(settings, group, {policy.label: policy for policy in arms.values()})
        by_arm = {row["arm"]: row for row in errors.rows()}
        rows += [{"model": group.name, "scale": SCALE_LABELS[scale], "block": block, **by_arm[label]}
                 for (scale, block), label in labels.items() if label in by_arm]  # fmt: skip
        pairs += _ranking_pairs(settings, group.name, errors, list(labels.values()))
        ordering, theory = _ordering_pairs(settings, group.name, errors, labels)
        pairs += ordering
        predicted |= theory
    comparisons = compare(pairs)
    ranking = [c for c in comparisons if c.family == RANKING]
    ordering = [c for c in comparisons if c.family == ORDERING]
    agree = sum(1 for c in ordering if c.a in predicted and (predicted[c.a] < 0) == (c.difference < 0))
    ordering_rows = [
        {"comparison": c.a, "measured_ln_ratio": c.difference, "low": c.ci_low, "high": c.ci_high,
         "predicted_ln_ratio": predicted.get(c.a), "verdict": c.verdict}
        for c in ordering
    ]  # fmt: skip
    return Result(
        caption=_c5_caption(settings, groups),
        tables={
            "main": Table(
                "Measured and predicted relative MSE per family, scale format and block size", rows
            ),
            "ordering": Table(
                "FP4 All the Way's comparisons on these gradients (ln MSE ratio)", ordering_rows
            ),
        },
        comparisons=comparisons,
        findings=[
            f"Does the theory rank the arms (its own family)? {summarise(ranking)}.",
            f"FP4 All the Way's ordering, measured (its own family): {summarise(ordering)}.",
            f"The iid theory predicts the sign of {agree} of {len(ordering)} of these differences.",
        ],
    )


def _c5_caption(settings: ScaleFormats, groups: list[RunGroup]) -> str:
    scales = ", ".join(SCALE_LABELS[s] for s in settings.scales)
    blocks = ", ".join(map(str, settings.blocks))
    models = ", ".join(f"{g.name} ({g.model})" for g in groups)
    arms = len(settings.scales) * len(settings.blocks)
    return f"""Relative MSE (error energy over gradient energy, summed over the compressed layers) of each
        family's neural gradients with {settings.element} elements in blocks of {blocks} under each scale
        format ({scales}; the two-level ones with a float32 scale per tensor, torchao's rule), nearest
        rounding, no transform, blocks along the output features: measured (solid) and predicted by the iid
        lognormal block model (dashed), per family, mean over seeds; over each panel, Spearman's correlation
        of the iid prediction with the measured over the arms (mean over seeds, 95 % CI). Models: {models},
        {settings.batches} test batch(es) in eval mode, every seed. Comparisons: per seed, Spearman's
        correlation of each model's (iid, correlated) predicted MSE with the measured over the {arms} arms,
        above {settings.correlation_margin:g}; FP4 All the Way's figures 1-2 (training loss of a 350M model:
        E4M3 and E3M4 scales best and about equal, E8M0 worse, smaller blocks better with the gain fading
        below 16) as differences of ln MSE on these gradients, paired by seed, within ±{settings.margin:.3g}
        (a factor {math.exp(settings.margin):.3g}) counting as none; each question its own Holm family."""
