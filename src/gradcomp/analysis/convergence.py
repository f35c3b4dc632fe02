"""X4: the headline claims' accuracy gaps at several training budgets, to tell "loses accuracy" from
"converges more slowly" (config/converged.yaml)."""

from __future__ import annotations

import numpy as np

from gradcomp.analysis.accuracy import accuracy_pair, gap_cells, per_seed_table, run_row, scale_note
from gradcomp.analysis.claims import decide, deciding
from gradcomp.analysis.runs import RunGroup
from gradcomp.analysis.seeds import LINEAR, PerSeed
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import EQUIVALENT, Comparison, by_arm, compare, having, one_sample, summarise
from gradcomp.experiments import Budgets

TREND, PLATEAU = "trend", "plateau"  # an arm's gap slope over the budgets; fp32's gain beyond the longest


def _curves(group: RunGroup) -> PerSeed:
    """Test accuracy after each epoch of every seed of `group` (its metrics.jsonl)."""
    curve = PerSeed(("run", "epoch"), {"accuracy": LINEAR})
    for seed, run in group.runs.items():
        for entry in run.records("epoch"):
            curve.add(seed, {"run": group.name, "epoch": entry["epoch"] + 1}, accuracy=entry["test_accuracy"])
    return curve


def _trend(settings: Budgets, arm: str, reference: str, runs: dict[str, RunGroup]) -> dict[int, float]:
    """Per seed, the slope of the gap (arm - reference, points) against log2 of the budget: above 0 where
    the arm catches up as training lengthens."""
    x = np.log2(settings.budgets)
    slopes = {}
    groups = [(runs[settings.run(arm, b)], runs[settings.run(reference, b)]) for b in settings.budgets]
    shared = set.intersection(*(set(a.seeds) & set(r.seeds) for a, r in groups))
    for seed in sorted(shared):
        gaps = [100 * (a.accuracy[seed] - r.accuracy[seed]) for a, r in groups]
        slopes[seed] = float(np.polyfit(x, gaps, 1)[0])
    return slopes


def _caption(settings: Budgets, groups: dict[str, RunGroup]) -> str:
    pairs = "; ".join(
        f"{arm} against {reference} (claim {claim})" for arm, reference, claim in settings.pairs
    )
    budgets = ", ".join(map(str, settings.budgets))
    return f"""(a) Paired accuracy gap (points, mean over seeds with 95 % CI) of each headline arm against its
        reference, each trained for {budgets} epochs (cosine schedule over the budget): {pairs}; dashed:
        the ±{settings.margin:g} pt margin. (b) Test accuracy of {settings.reference} after each epoch
        of every budget, and of {settings.plateau} epochs, trained for {settings.reference} only to
        show whether it levels off by {settings.budgets[-1]} (mean over seeds). The gap at
        {settings.replicates} epochs replicates the default configuration's full scale on other seeds;
        each arm's trend is the per-seed slope of its gap against log2 of the budget (above 0: it catches
        up; in (a)'s legend, mean with 95 % CI). {scale_note(groups)}"""


def training_budget(settings: Budgets, runs: dict[str, RunGroup]) -> Result:
    """X4: each headline gap at every budget, its trend, the claims at the replicating and longest budgets,
    and where fp32 levels off."""
    longest = settings.budgets[-1]
    pairs, rows = [], []
    for arm, reference, claim in settings.pairs:
        for budget in settings.budgets:
            a, b = runs[settings.run(arm, budget)], runs[settings.run(reference, budget)]
            pair = accuracy_pair(a, b, settings.margin, _budget_label)
            if budget in (settings.replicates, longest):
                pair = deciding(claim, [pair], f"{claim} at {budget} epochs")[0]
            pairs.append(pair)
            rows.append({"arm": arm, "claim": claim, "budget": budget, **run_row(a)})
    trends = [
        one_sample(
            f"{arm} vs {reference} gap slope",
            _trend(settings, arm, reference, runs),
            0.0,
            "0 (no catching up)",
            unit="pt per doubling",
            scale="budgets " + ", ".join(map(str, settings.budgets)),
            role=TREND,
            arm=arm,
        )
        for arm, reference, _ in settings.pairs
    ]
    fp32 = [runs[settings.run(settings.reference, b)] for b in (*settings.budgets, settings.plateau)]
    plateau = accuracy_pair(fp32[-1], fp32[-2], settings.margin, _budget_label, PLATEAU)
    comparisons = compare([*pairs, *trends, plateau])
    gaps = by_arm(comparisons)
    for row in rows:
        row |= gap_cells(gaps[settings.run(row["arm"], row["budget"])])
    slopes = by_arm(comparisons, TREND)
    findings = [
        f"{arm}: gap "
        f"{', '.join(_gap_text(gaps[settings.run(arm, b)], b) for b in settings.budgets)}; trend: "
        f"{slopes[arm].statement}."
        for arm, _, _ in settings.pairs
    ]
    (gain,) = having(comparisons, PLATEAU)
    levelled = gain.verdict == EQUIVALENT
    findings.append(
        f"fp32 from {longest} to {settings.plateau} epochs: {summarise([gain])}: "
        + (
            f"accuracy has levelled off within ±{settings.margin:g} pt by {longest} epochs."
            if levelled
            else f"not shown to level off ({gain.difference:+.2g} pt {gain.interval}): the gaps at "
            f"{longest} epochs are those of a longer budget, not of a shown plateau."
        )
    )
    replications = [
        decide(claim, comparisons, family=f"{claim} at {settings.replicates} epochs").row()
        for _, _, claim in settings.pairs
    ]
    groups = {g.name: g for g in runs.values()}
    return Result(
        caption=_caption(settings, groups),
        tables={
            "main": Table("Accuracy gap at each training budget", rows, note=scale_note(groups)),
            "curves": Table(
                f"Test accuracy of {settings.reference} after each epoch",
                [row for group in fp32 for row in _curves(group).rows()],
                markdown=False,
            ),
            "seeds": per_seed_table(list(runs.values())),
        },
        comparisons=comparisons,
        findings=findings,
        facts={
            "replications": replications,
            "converged": [
                decide(claim, comparisons, family=f"{claim} at {longest} epochs").row()
                for _, _, claim in settings.pairs
            ],
            "trends": {claim: slopes[arm].statement for arm, _, claim in settings.pairs},
            "budgets": list(settings.budgets),
            "replicates": settings.replicates,
            "margin": settings.margin,
        },
    )


def _budget_label(group: RunGroup) -> str:
    """e.g. "prune 0.85, 8 epochs": runs of one policy differ only by their budget."""
    return f"{group.label}, {group.config['epochs']:g} epochs"


def _gap_text(gap: Comparison, budget: int) -> str:
    return f"{budget} epochs {gap.difference:+.2f} pt {gap.interval} ({gap.verdict})"
