"""C4: the block recipes side by side: each against fp32 of its model and scale and against each other,
with the measured and predicted noise ratios of their weight gradients (the error that stalls training,
F0-F1)."""

from __future__ import annotations

import itertools
import statistics

from gradcomp.analysis.accuracy import GAP_PANEL, GapExperiment, WithinModels, accuracy_pair, run_row
from gradcomp.analysis.failure import KINDS, noise_history
from gradcomp.analysis.runs import RunGroup, training_context
from gradcomp.analysis.seeds import LINEAR, Estimate
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import FAMILIES, compare, summarise
from gradcomp.experiments.recipes import Recipes

BETWEEN = "between"  # the role of two recipes' comparison


def _row(group: RunGroup) -> dict:
    """A run's row: its recipe, bits per gradient element and, per kind of R, the mean over seeds of its
    model-wide R averaged over the noise steps it logged."""
    row = {**run_row(group), "recipe": group.label, "bits": group.policy.bits_per_element({})}
    histories = [noise_history(run) for run in group.runs.values()]  # each run's metrics read once
    for kind in KINDS:
        means = [statistics.fmean(r for _, r in history[kind]) for history in histories if history[kind]]
        row |= Estimate.of(means, LINEAR).columns(f"{kind}_R")
    return row


def recipes(settings: Recipes, runs: dict[str, RunGroup]) -> Result:
    """C4: the recipes against fp32 and against each other, with their noise ratios."""
    models = WithinModels.of_settings(settings, runs, "C4")
    between = [
        accuracy_pair(a, b, settings.margin, models.label, role=BETWEEN)
        for baseline in models.baselines
        for a, b in itertools.combinations(models.arms_of(baseline), 2)
    ]
    experiment = GapExperiment(models, compare(models.gap_pairs(settings.margin) + between))
    others = [c for c in experiment.comparisons if c.role == BETWEEN]
    rows = experiment.rows(_row)
    between_rows = [
        {"comparison": f"{c.a} vs {c.b}", "difference_pt": c.difference, "low": c.ci_low,
         "high": c.ci_high, "verdict": c.verdict}
        for c in others
    ]  # fmt: skip
    return experiment.result(
        _caption(settings, models, experiment.groups),
        "Accuracy and noise ratios of each recipe",
        rows,
        findings=[f"Recipes against each other (each comparison its own family): {summarise(others)}."],
        tables={"between": Table("Every two recipes of one model (accuracy, paired by seed)", between_rows)},
    )


def _caption(settings: Recipes, models: WithinModels, groups: dict[str, RunGroup]) -> str:
    recipes = "; ".join(dict.fromkeys(models.label(arm) for arm in models.arms))
    return f"""(a) {GAP_PANEL}, and (b) each recipe's noise ratio R = ||g_W|| / ||noise in g_W|| of its
        weight gradients, model-wide, averaged over the noise steps of its run and over seeds (each recipe
        numbered as in (a)): measured (the weight-gradient GEMMs, x) against its two predictions without a
        GEMM (theory: the lognormal block model; carried: the error the compression made), the dotted line
        sqrt(3) (FP4 All the Way's stall), the grey one predicted = measured. Recipes: {recipes}.
        {models.caption()}. {training_context(groups)}. Each recipe against its baseline and every two of
        one model against each other, paired by seed, {FAMILIES}, equivalence within ±{settings.margin:g}
        pt."""
