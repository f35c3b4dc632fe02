"""X1, X3: comparisons across compressor families (bits per gradient element, pruning with low-bit FP)."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from torch import Tensor

from gradcomp.analysis.accuracy import (
    ACCURACY,
    Quantity,
    accuracy_pair,
    baseline_text,
    per_seed_table,
    run_row,
    scale_note,
)
from gradcomp.analysis.runs import Run, RunGroup, model_key, training_context
from gradcomp.analysis.seeds import FRACTION, POSITIVE, Estimate
from gradcomp.analysis.synthetic import signed_lognormal
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    BETTER,
    EQUIVALENT,
    FAMILIES,
    GAP,
    WORSE,
    Comparison,
    compare,
    having,
    summarise,
)
from gradcomp.experiments import EveryRun, PruneWithFp
from gradcomp.training.compress import GradientCopy, LayerStats, chain_seed, compress
from gradcomp.training.policies import Chain, FloatingPoint

BITS_RULE = """Bits per element count everything the backward pass stores of a layer's neural gradient, per
element, the same way for every family (Policy.bits_per_element): fp32 and QAT 32; FP formats 1+E+M; integer
schemes b on the activation path plus the weight path's copy (8 bits unless the policy says otherwise), since
FQT keeps two quantized copies; pruning a 1-bit occupancy mask, plus a sign for each survivor at the threshold
and a float32 for each survivor beyond it (their share from each layer's lognormal fit, weighted by its
elements); prune + FP the mask plus the FP bits of every survivor; per-tensor, per-row and per-column scales
are neglected."""


def _bits(run: Run) -> float:
    return run.policy.bits_per_element(run.summary)


BITS = Quantity("bits", _bits, POSITIVE)


def _row(group: RunGroup) -> dict:
    return {**run_row(group, ACCURACY, BITS), "family": group.family, "policy": group.policy.describe()}


def _pareto(rows: list[dict]) -> list[dict]:
    """Runs no other run beats on both fewer bits and higher accuracy (by their means over seeds)."""
    front, best = [], -1.0
    for row in sorted(rows, key=lambda r: (r["bits_mean"], -r["accuracy_mean"])):
        if row["accuracy_mean"] > best:
            front.append(row)
            best = row["accuracy_mean"]
    return front


def _x1_caption(model: str, runs: dict[str, RunGroup]) -> str:
    return f"""Final test accuracy of every training run of {model} at one training scale (mean and 95 % CI
        over seeds, both axes; runs of other models or scales are left out) against the bits its compressed
        neural gradients take per element. {BITS_RULE} The line joins the runs on the Pareto front of the
        means (no other run has fewer bits and a higher mean accuracy); whether a front run differs from
        fp32 is tested below (paired by seed, {FAMILIES}, equivalence by two one-sided tests at the
        settings' margin), and the differences between neighbouring runs are judged in A5, A8 and B4.
        {training_context(runs)}."""


def learning_curve(group: RunGroup) -> list[dict]:
    """Test accuracy after each epoch (mean and CI over seeds, from each run's metrics.jsonl): whether the run
    has reached its plateau at this scale."""
    by_epoch: dict[tuple[int, int], list[float]] = defaultdict(list)  # (epoch, its last step) -> accuracies
    for run in group.runs.values():
        for record in run.records("epoch"):
            by_epoch[record["epoch"] + 1, record["step"]].append(record["test_accuracy"])
    return [
        {"run": group.name, "epoch": epoch, "step": step}
        | Estimate.of(values, FRACTION).columns("test_accuracy")
        for (epoch, step), values in sorted(by_epoch.items())
    ]


def accuracy_vs_bits(settings: EveryRun, runs: dict[str, RunGroup]) -> Result:
    """X1: every compressor of one model on one accuracy-vs-bits plot, its Pareto front against fp32."""
    baseline = runs[settings.baseline] if settings.baseline else None
    first = baseline or next(iter(runs.values()))
    model = first.model
    # one model at one scale: runs of other models or scales are left out
    runs = {name: group for name, group in runs.items() if model_key(group) == model_key(first)}
    groups = list(runs.values())
    rows = [_row(group) for group in groups]
    front = _pareto(rows)
    for row in rows:
        row["pareto"] = row in front
    pairs = [
        accuracy_pair(runs[row["run"]], baseline, settings.margin)
        for row in front
        if baseline is not None and row["run"] != baseline.name
    ]
    comparisons = compare(pairs)
    on_front = ", ".join(f"{row['label']} ({row['bits_mean']:.2f} bits)" for row in front)
    findings = [f"Pareto front: {on_front}."]
    curve = learning_curve(baseline) if baseline is not None else []
    if baseline is not None:
        findings.insert(0, f"{baseline_text(baseline)}; front runs {summarise(comparisons)}.")
        by_epoch = ", ".join(f"{row['test_accuracy_mean']:.1%}" for row in curve)
        findings.append(f"{baseline.label} test accuracy after each epoch (mean over seeds): {by_epoch}.")
    return Result(
        caption=_x1_caption(model, runs),
        tables={
            "main": Table("Accuracy vs bits per gradient element", rows, note=scale_note(runs)),
            **({"curve": Table(f"Learning curve of {baseline.label}", curve)} if curve else {}),
            "seeds": per_seed_table(groups),
        },
        comparisons=comparisons,
        findings=findings,
    )


def _members(chain: RunGroup, groups: list[RunGroup]) -> list[RunGroup]:
    """The runs whose policy is one member of `chain`'s policy alone."""
    members = getattr(chain.policy, "policies", ())
    described = {member.describe() for member in members}
    return [group for group in groups if group.policy.describe() in described]


# --- X3 mechanism: what the FP stage does to the |g| mass, alone and after pruning ---------------------
def fp_mass_effects(fp: FloatingPoint, x: Tensor, mass: float, seed: int = 0) -> dict[str, float]:
    """`fp` applied to `x` as training applies it (scale fitted on x itself), as shares of the |g| mass
    `mass` (that of the original gradient; pruning is unbiased, so x carries the same mass in expectation):
    flushed (|x| of the non-zero entries the format rounds to 0), saturated (what clamping at the format's
    largest value removes, sum of (|x| - max/scale)+), and the net relative change of the mass
    (sum |Q(x)| / mass - 1, rounding included); also the share of x's non-zeros flushed and log2 scale."""
    stats = LayerStats()
    quantized = compress(fp, GradientCopy(x, seed), stats)
    magnitude = x.detach().abs().double()
    nonzero = magnitude > 0
    flushed = nonzero & (quantized == 0)
    clip = fp.fmt.max_value / float(stats.scale)
    return {
        "flushed_share": float(magnitude[flushed].sum()) / mass,
        "saturated_share": float((magnitude - clip).clamp(min=0).sum()) / mass,
        "mass_change": float(quantized.abs().double().sum()) / mass - 1.0,
        "flushed_elements": float(flushed.sum()) / max(int(nonzero.sum()), 1),
        "log2_scale": math.log2(float(stats.scale)),
    }


def chain_mass_effects(chain: Chain, g: Tensor, seed: int = 0) -> dict[str, dict[str, float]]:
    """The FP member of `chain` on g alone ("alone") and after the members before it ("chain"), each with
    its own statistics fitted on its own input, as `Chain` does (the FP scale refitted on the pruned
    tensor)."""
    index = next(i for i, member in enumerate(chain.policies) if isinstance(member, FloatingPoint))
    fp = chain.policies[index]
    mass = float(g.abs().double().sum())
    x = g
    for step, member in enumerate(chain.policies[:index]):
        x = compress(member, GradientCopy(x, chain_seed(seed, step)), LayerStats())
    return {"alone": fp_mass_effects(fp, g, mass, seed), "chain": fp_mass_effects(fp, x, mass, seed)}


def _layer_statistics(groups: list[RunGroup]) -> tuple[str, dict[str, tuple[float, float, float]]]:
    """(run name, layer -> (mu, sigma, elements)) of ln|g| as measured, mean over seeds, from the first
    group whose summaries have them (the FP-alone run first: its statistics are of the raw gradient)."""
    for group in groups:
        layers: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for run in group.runs.values():
            for name, layer in (run.summary.get("layers") or {}).items():
                mu, sigma = layer.get("mu"), layer.get("sigma")
                if mu is not None and sigma is not None and math.isfinite(mu) and math.isfinite(sigma):
                    layers[name].append((mu, sigma, float(layer.get("elements") or 1.0)))
        if layers:
            return group.name, {name: tuple(np.mean(v, axis=0)) for name, v in layers.items()}
    return "", {}


CHAIN = "chain"  # X3: a chain of policies against one of its members alone
MECHANISM_KEYS = ("flushed_share", "saturated_share", "mass_change", "flushed_elements", "log2_scale")


def mechanism(settings: PruneWithFp, chain: RunGroup, arms: list[RunGroup]) -> tuple[list[dict], list[dict]]:
    """Per layer and over the layers (weighted by elements): the FP member's flushed and saturated shares of
    the |g| mass alone and within `chain`, on synthetic signed lognormal gradients with each layer's measured
    (mu, sigma)."""
    members = _members(chain, arms)
    fp_runs = [group for group in members if isinstance(group.policy, FloatingPoint)]
    source, layers = _layer_statistics(fp_runs + [group for group in members if group not in fp_runs])
    per_layer, total = [], defaultdict(float)
    weight = 0.0
    for index, (name, (mu, sigma, elements)) in enumerate(layers.items()):
        g = signed_lognormal(settings.elements, sigma, mu=mu, seed=settings.seed + index)
        effects = chain_mass_effects(chain.policy, g, settings.seed + index)
        for arm, numbers in effects.items():
            per_layer.append({"chain": chain.label, "layer": name, "arm": arm, "sigma_ln": sigma, **numbers})
            for key, number in numbers.items():
                total[arm, key] += elements * number
        weight += elements
    sigmas = [sigma for _, sigma, _ in layers.values()]
    summary = (
        [
            {
                "chain": chain.label,
                "fp": next(p for p in chain.policy.policies if isinstance(p, FloatingPoint)).label,
                "arm": arm,
                "statistics_from": source,
                "layers": len(layers),
                "sigma_ln_min": min(sigmas),
                "sigma_ln_max": max(sigmas),
                **{key: total[arm, key] / weight for key in MECHANISM_KEYS},
            }
            for arm in ("alone", "chain")
        ]
        if layers
        else []
    )
    return summary, per_layer


def _scaling_rules(arms: list[RunGroup]) -> str:
    """How each FP policy of the runs scales a layer, read from the policy objects (alone, and after what
    ran before it in a chain), with its refresh schedule from the runs' configs."""
    contexts: dict[FloatingPoint, list[str]] = defaultdict(list)
    refresh: dict[FloatingPoint, set[str]] = defaultdict(set)
    for group in arms:
        members = getattr(group.policy, "policies", (group.policy,))
        for index, member in enumerate(members):
            if isinstance(member, FloatingPoint):
                before = " + ".join(p.label for p in members[:index])
                context = f"the {before} tensor's non-zeros" if before else "the layer's gradient"
                if context not in contexts[member]:
                    contexts[member].append(context)
                refresh[member].add(str(group.config.get("compression", {}).get("refresh", "step")))
    rules = []
    for fp, where in contexts.items():
        where_text = " or ".join(where)
        rule = fp.scaling_rule
        if fp.scaling.startswith("per_layer"):
            rule += f", fitted on {where_text}"
        rounding = "stochastic" if fp.rounding == "stochastic" else "nearest"
        rules.append(
            f"{fp.label} (values up to {fp.fmt.max_value:g}, smallest {fp.fmt.min_subnormal:g}, rounding to "
            f"{rounding}): {rule}, refitted every {' or '.join(sorted(refresh[fp]))}"
        )
    return "; ".join(rules)


def _chain_statement(comparison: Comparison, summary: list[dict]) -> str:
    """The paired verdict of chain vs its FP member alone, and the measured mechanism next to it."""
    alone, chained = (next(r for r in summary if r["arm"] == arm) for arm in ("alone", "chain"))
    lost = {r["arm"]: r["saturated_share"] + r["flushed_share"] for r in (alone, chained)}
    shift = alone["log2_scale"] - chained["log2_scale"]
    rounding = chained["mass_change"] + lost["chain"]
    helps = lost["chain"] < lost["alone"]
    if comparison.verdict in (BETTER, WORSE):
        verdict = "pruning first " + ("recovers" if comparison.verdict == BETTER else "costs") + " accuracy"
    elif comparison.verdict == EQUIVALENT:
        verdict = "pruning first changes the accuracy by less than the margin"
    else:
        verdict = "so these runs do not show that pruning first changes the accuracy"
        if comparison.seeds > 1 and (comparison.difference > 0) == helps:
            verdict += " (the difference has the sign the mechanism below predicts)"
    return (
        f"{comparison.statement}: {verdict}. Mechanism (synthetic signed lognormal gradients with the "
        f"per-layer (mu, sigma) measured in {alone['statistics_from']}, sigma {alone['sigma_ln_min']:.2f}-"
        f"{alone['sigma_ln_max']:.2f} ln units over {alone['layers']} layers, weighted by elements): "
        f"{alone['fp']} alone saturates {alone['saturated_share']:.1%} and flushes "
        f"{alone['flushed_share']:.1%} of the |g| mass (net change of the mass {alone['mass_change']:+.1%}); "
        f"after pruning, the scale refitted on the survivors is {shift:.1f} binades smaller and the FP stage "
        f"saturates {chained['saturated_share']:.1%} and flushes {chained['flushed_share']:.1%} (net "
        f"{chained['mass_change']:+.1%}, of which {rounding:+.1%} is rounding to the format's grid, e.g. of "
        f"the survivors raised to the threshold alpha)."
    )


def _x3_caption(settings: PruneWithFp, arms: list[RunGroup], runs: dict[str, RunGroup]) -> str:
    return f"""(a) Final test accuracy (points: mean over seeds with 95 % CI; dots: every seed; bits per
        gradient element under each label) of stochastic pruning alone, low-bit FP alone and the chain
        prune-then-FP, where the survivors of pruning (including the values raised to the threshold alpha)
        are rounded to the FP format, against fp32 (dashed line and band). FP scaling, as the runs' policies
        set it: {_scaling_rules(arms)}. {BITS_RULE} {training_context(runs)}. Comparisons: each chain against
        each of its members alone, and every run against fp32; paired by seed, {FAMILIES}, equivalence
        by two one-sided tests at the settings' margin. (b) The mechanism, on {settings.elements:,} synthetic
        signed lognormal values per layer with each layer's measured (mu, sigma) (the threshold fitted on
        all of them: no BatchNorm mask): the share of the |g| mass the FP stage saturates (clamps at the
        format's largest value) or flushes to zero, alone and after pruning (the scale refitted on the
        pruned tensor)."""


def prune_plus_fp(settings: PruneWithFp, runs: dict[str, RunGroup]) -> Result:
    """X3: pruning and low-bit FP alone and chained, with the mechanism measured on synthetic gradients."""
    baseline = runs[settings.baseline]
    arms = [group for group in settings.present(settings.runs, runs) if group.name != settings.baseline]
    chains = [group for group in arms if _members(group, arms)]
    comparisons = compare(
        [
            *(accuracy_pair(c, m, settings.margin, role=CHAIN) for c in chains for m in _members(c, arms)),
            *(accuracy_pair(arm, baseline, settings.margin) for arm in arms),
        ]
    )
    rows = [
        {**run_row(group, ACCURACY, BITS), "policy": group.policy.describe()} for group in [baseline, *arms]
    ]
    mechanism_rows, layer_rows = [], []
    findings = [f"{baseline_text(baseline)}; {summarise(having(comparisons, GAP))}."]
    by_pair = {(c.arm, c.baseline): c for c in having(comparisons, CHAIN)}
    for chain in chains:
        if not any(isinstance(p, FloatingPoint) for p in chain.policy.policies):
            continue
        summary, per_layer = mechanism(settings, chain, arms)
        mechanism_rows += summary
        layer_rows += per_layer
        fp_alone = [g for g in _members(chain, arms) if isinstance(g.policy, FloatingPoint)]
        if summary and fp_alone:
            findings.append(_chain_statement(by_pair[chain.name, fp_alone[0].name], summary))
    groups = {group.name: group for group in [baseline, *arms]}
    return Result(
        caption=_x3_caption(settings, arms, groups),
        tables={
            "main": Table("Pruning combined with low-bit FP", rows, note=scale_note(groups)),
            "mechanism": Table(
                "What the FP stage does to the |g| mass, alone and after pruning", mechanism_rows
            ),
            "mechanism_layers": Table("Mechanism per layer", layer_rows, markdown=False),
            "seeds": per_seed_table([baseline, *arms]),
        },
        comparisons=comparisons,
        findings=findings,
    )
