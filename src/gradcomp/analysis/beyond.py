"""X1, X3: comparisons across compressor families (bits per gradient element, pruning with low-bit FP)."""

from __future__ import annotations

from gradcomp.analysis.accuracy import compare_accuracy, noise_floor, per_seed_table, run_row
from gradcomp.analysis.runs import Run, RunGroup, training_context
from gradcomp.analysis.tables import Result, Table
from gradcomp.experiments import Compare, EveryRun

BITS_RULE = """Bits per element count everything the backward pass stores of a layer's neural gradient, per
element, the same way for every family (Policy.bits_per_element): fp32 and QAT 32; FP formats 1+E+M; integer
schemes b on the activation path plus the weight path's copy (8 bits unless the policy says otherwise), since
FQT keeps two quantized copies; pruning a 1-bit occupancy mask, plus a sign for each survivor at the threshold
and a float32 for each survivor beyond it (their share from each layer's lognormal fit, weighted by its
elements); prune + FP the mask plus the FP bits of every survivor; per-tensor, per-row and per-column scales
are neglected."""


def _bits(run: Run) -> float:
    return run.policy.bits_per_element(run.summary)


def _row(group: RunGroup) -> dict:
    return {
        **run_row(
            group,
            accuracy=lambda run: run.accuracy,
            bits=_bits,
        ),
        "family": group.family,
        "policy": group.policy.describe(),
    }


def _pareto(rows: list[dict]) -> list[dict]:
    """Runs no other run beats on both fewer bits and higher accuracy (by their means over seeds)."""
    front, best = [], -1.0
    for row in sorted(rows, key=lambda r: (r["bits_mean"], -r["accuracy_mean"])):
        if row["accuracy_mean"] > best:
            front.append(row)
            best = row["accuracy_mean"]
    return front


def accuracy_vs_bits(settings: EveryRun, runs: dict[str, RunGroup]) -> Result:
    groups = list(runs.values())
    rows = [_row(group) for group in groups]
    front = _pareto(rows)
    for row in rows:
        row["pareto"] = row in front
    baseline = runs[settings.baseline] if settings.baseline else None
    comparisons = compare_accuracy(
        [
            (runs[row["run"]], baseline)
            for row in front
            if baseline is not None and row["run"] != baseline.name
        ]
    )
    caption = f"""Final test accuracy of every training run (mean and 95 % CI over seeds, both axes) against
        the bits its compressed neural gradients take per element. {BITS_RULE} The line joins the runs on the
        Pareto front of the means (no other run has fewer bits and a higher mean accuracy); whether a front
        run differs from fp32 is tested below, and the differences between neighbouring runs are judged in
        A5, A8 and B4. {training_context(runs)}."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Accuracy vs bits per gradient element", rows),
            "seeds": per_seed_table(groups),
        },
        comparisons=comparisons,
        headline={
            "pareto": [
                f"{row['label']} ({row['bits_mean']:.2f} bits, {row['accuracy_mean']:.4f})" for row in front
            ],
            "runs": len(rows),
            **(noise_floor(baseline) if baseline else {}),
        },
    )


def _members(chain: RunGroup, groups: list[RunGroup]) -> list[RunGroup]:
    """The runs whose policy is one member of `chain`'s policy alone."""
    members = getattr(chain.policy, "policies", ())
    described = {member.describe() for member in members}
    return [group for group in groups if group.policy.describe() in described]


def prune_plus_fp(settings: Compare, runs: dict[str, RunGroup]) -> Result:
    baseline = runs[settings.baseline]
    arms = [runs[name] for name in settings.runs if name != settings.baseline]
    chains = [group for group in arms if _members(group, arms)]
    pairs = [(chain, member) for chain in chains for member in _members(chain, arms)]
    comparisons = compare_accuracy(pairs + [(arm, baseline) for arm in arms])
    rows = [
        {**run_row(group, accuracy=lambda run: run.accuracy, bits=_bits), "policy": group.policy.describe()}
        for group in [baseline, *arms]
    ]
    caption = f"""Final test accuracy (bars: mean over seeds, 95 % CI and every seed) and bits per gradient
        element (labels) of stochastic pruning alone, low-bit FP alone and the chain prune-then-FP, where the
        survivors of pruning (including the values raised to the threshold) are rounded to the FP format with
        its own per-layer scale ({", ".join(sorted({a.policy.label for a in arms}))}), against fp32 (dashed).
        {BITS_RULE} {training_context(runs)}. Comparisons: each chain against each of its members alone, and
        every run against fp32; paired by seed."""
    return Result(
        caption=caption,
        tables={
            "main": Table("Pruning combined with low-bit FP", rows),
            "seeds": per_seed_table([baseline, *arms]),
        },
        comparisons=comparisons,
        headline=noise_floor(baseline),
    )
