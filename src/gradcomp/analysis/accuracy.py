"""Per-run numbers over seeds (accuracy, sparsity, bits): table rows, per-seed tables, and the accuracy
comparisons of arms with the uncompressed run of their own model and training scale."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gradcomp.analysis.claims import Decision, decide, deciding, undecided
from gradcomp.analysis.runs import (
    Run,
    RunGroup,
    accuracy_estimate,
    model_key,
    one_per_model,
    training_context,
)
from gradcomp.analysis.seeds import FRACTION, LINEAR, Bounds, Estimate
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import BETTER, EQUIVALENT, WORSE, Comparison, Pair, by_arm, summarise
from gradcomp.analysis.verdicts import GAP as GAP_ROLE
from gradcomp.experiments import CompareWithinModels
from gradcomp.training.datasets import lookup


@dataclass(frozen=True)
class Quantity:
    """A number every run of a group reports once per seed, with the bounds of its interval."""

    name: str
    read: Callable[[Run], float | None]
    bounds: Bounds = LINEAR


ACCURACY = Quantity("accuracy", lambda run: run.accuracy, FRACTION)
COLLAPSED = 2.0  # a run whose mean accuracy is below this many times chance (1 / classes) has collapsed


def collapsed(group: RunGroup) -> bool:
    """Whether the run's mean test accuracy is near chance (below COLLAPSED times 1 / classes): flagged in
    every table and comparison that uses it, since its gap measures a failure to train, not a loss."""
    return accuracy_estimate(group).mean < COLLAPSED / lookup(group.config["dataset"]).classes


SPARSITY = Quantity("sparsity", lambda run: run.sparsity, FRACTION)


def run_row(group: RunGroup, *quantities: Quantity) -> dict[str, Any]:
    """One table row per run: name, label, seed count, and the estimate of each quantity (accuracy by
    default) over the run's seeds."""
    row: dict[str, Any] = {"run": group.name, "label": group.label, "seeds": len(group.runs)}
    for quantity in quantities or (ACCURACY,):
        row |= group.estimate(quantity.read, quantity.bounds).columns(quantity.name)
    if ACCURACY in (quantities or (ACCURACY,)):
        row["collapsed"] = collapsed(group)
    return row


def per_seed_table(groups: Sequence[RunGroup], *quantities: Quantity) -> Table:
    """Every seed's values of each run (once per run, for figures that show each seed), kept out of the
    Markdown."""
    unique = {group.name: group for group in groups}.values()
    rows = [
        {
            "run": group.name,
            "seed": seed,
            **{q.name: q.read(run) for q in quantities or (ACCURACY,)},
        }
        for group in unique
        for seed, run in group.runs.items()
    ]
    return Table("Every seed", rows, markdown=False)


def scale_note(groups: Mapping[str, RunGroup]) -> str:
    """A table's note: how its runs were trained (models, scale, optimizers, seeds)."""
    return f"Trained: {training_context(groups)}."


def accuracy_pair(
    a: RunGroup,
    b: RunGroup,
    margin: float | None,
    label: Callable[[RunGroup], str] | None = None,
    role: str = GAP_ROLE,
) -> Pair:
    """The accuracy comparison a - b in points in `role` (arm a, baseline b), each arm named by `label`
    (default: its label; "[collapsed]" added to a run near chance)."""
    name = label or (lambda group: group.label)

    def named(group: RunGroup) -> str:
        return name(group) + (" [collapsed]" if collapsed(group) else "")

    scale = a.scale if a.scale == b.scale else f"{a.scale} vs {b.scale}"
    return Pair(
        named(a), named(b), a.accuracy, b.accuracy, margin=margin, scale=scale, role=role, arm=a.name,
        baseline=b.name,
    )  # fmt: skip


GAP = "gap_pt"  # the estimate a row's paired difference from its reference is written as
SCHEDULE = "schedule"  # the role of an arm against the same policy with the default schedule
GAP_PANEL = (
    "Paired accuracy gap of each arm to the uncompressed run of its model and scale, in points: each seed's "
    "difference (dots), their mean with its 95 % CI (hollow: inconclusive), the margin of its test shaded "
    "around 0 (a non-inferiority margin bounds the gap from below only; a margin is decided by the 90 % "
    "interval, which can lie within it where the 95 % one does not) and its verdict under its name; dashed: "
    "no difference; the axis logarithmic beyond twice the margin"
)  # what the gap panels of C1, C3 and C4 show


def gap_cells(gap: Comparison | None) -> dict[str, Any]:
    """A comparison as table columns: the paired difference (points) as an estimate (`GAP`), and its
    verdict; empty cells where the row has no reference."""
    if gap is None:
        return dict.fromkeys([*Estimate(math.nan, math.nan, math.nan, math.nan, 0).columns(GAP), "verdict"])
    estimate = Estimate(gap.difference, gap.sd, gap.ci_low, gap.ci_high, gap.seeds)
    return {**estimate.columns(GAP), "verdict": gap.verdict}


def gap_columns(rows: list[dict], gaps: Mapping[str, Comparison]) -> list[dict]:
    """Rows of a table with the paired gap to their reference, where `gaps` (run name -> comparison) has
    the row's run."""
    for row in rows:
        row |= gap_cells(gaps.get(row["run"]))
    return rows


def model_names(groups: Sequence[RunGroup]) -> dict[str, str]:
    """A short name for each model (`RunGroup.model`) among `groups`: its timm name, or the full
    description where models of one timm name differ in options or stem."""
    models = list(dict.fromkeys(group.model for group in groups))
    timm = {group.model: group.config["model"] for group in groups}
    shared = {name for name in timm.values() if sum(value == name for value in timm.values()) > 1}
    return {model: model if timm[model] in shared else timm[model] for model in models}


def distinct_labels(groups: Sequence[RunGroup], with_model: bool) -> dict[str, str]:
    """Run name -> label: the run's label, with its model's short name where `with_model`, and with the run
    name where two runs would otherwise read the same (e.g. a fit or schedule the label does not show)."""
    names = model_names(groups)
    labels = {g.name: f"{g.label} ({names[g.model]})" if with_model else g.label for g in groups}
    counts = Counter(labels.values())
    return {name: f"{label} [{name}]" if counts[label] > 1 else label for name, label in labels.items()}


@dataclass(frozen=True)
class WithinModels:
    """Arms of one or several models, each matched with the uncompressed run of its own model and training
    scale (same model, options, stem, data and length): accuracy gaps are only ever taken within them."""

    baselines: list[RunGroup]  # one per model and scale, in the order named
    arms: list[RunGroup]
    own: dict[str, RunGroup]  # arm name -> its baseline
    names: dict[str, str]  # model description -> short name
    labels: dict[str, str]  # run name -> its label in comparisons

    @classmethod
    def of(cls, baselines: Sequence[RunGroup], arms: Sequence[RunGroup], where: str) -> WithinModels:
        """Match `arms` with `baselines`; `where` (e.g. "experiments.A5.baseline") names the setting in the
        errors: two baselines of one model and scale, or an arm without a baseline of its own."""
        by_model = one_per_model(baselines, where)
        named = {baseline.name for baseline in baselines}
        chosen = [arm for arm in {a.name: a for a in arms}.values() if arm.name not in named]
        for arm in chosen:
            if model_key(arm) not in by_model:
                raise ValueError(
                    f"{where}: run {arm.name!r} ({arm.model}, {arm.scale}) has no uncompressed run of its "
                    f"model at its scale among {', '.join(repr(g.name) for g in baselines)}; add one"
                )
        own = {arm.name: by_model[model_key(arm)] for arm in chosen}
        groups = [*baselines, *chosen]
        labels = distinct_labels(groups, with_model=len(baselines) > 1)
        return cls(list(baselines), chosen, own, model_names(groups), labels)

    @classmethod
    def of_settings(
        cls, settings: CompareWithinModels, runs: Mapping[str, RunGroup], experiment: str
    ) -> WithinModels:
        """The arms and baselines an accuracy experiment's settings name, where trained."""
        return cls.of(
            settings.present(settings.baselines, runs),
            settings.present(settings.runs, runs),
            f"experiments.{experiment}.baseline",
        )

    @property
    def several(self) -> bool:
        return len(self.baselines) > 1

    def name(self, group: RunGroup) -> str:
        """The short name of the group's model."""
        return self.names[group.model]

    def label(self, group: RunGroup) -> str:
        """The group's label in comparisons (`distinct_labels`)."""
        return self.labels[group.name]

    def baseline_table(self) -> Table:
        """The uncompressed run of each model and scale (figures draw each scale's arms against its own)."""
        rows = [{"model": self.name(b), "scale": b.scale, **run_row(b)} for b in self.baselines]
        return Table("Uncompressed run of each model and scale", rows, markdown=False)

    def arms_of(self, baseline: RunGroup) -> list[RunGroup]:
        return [arm for arm in self.arms if self.own[arm.name] is baseline]

    def gap_pairs(self, margin: float, claims: Mapping[str, str | None] | None = None) -> list[Pair]:
        """Every arm against its baseline, in the order of `arms`; `claims`: claim ID -> the run that
        decides it (its gap is then that claim's deciding comparison)."""
        deciders = {run: claim for claim, run in (claims or {}).items() if run}
        pairs = []
        for arm in self.arms:
            pair = accuracy_pair(arm, self.own[arm.name], margin, self.label)
            pairs += deciding(deciders[arm.name], [pair]) if arm.name in deciders else [pair]
        return pairs

    def pairs(self, extra: Sequence[tuple[RunGroup, RunGroup]], margin: float, role: str) -> list[Pair]:
        """Comparisons in `role` between (arm, baseline) runs of one model and scale each (e.g. a prior
        against the lognormal)."""
        for a, b in extra:
            if model_key(a) != model_key(b):
                raise ValueError(f"{a.name!r} and {b.name!r} are runs of different models or scales")
        return [accuracy_pair(a, b, margin, self.label, role) for a, b in extra]

    def schedules(self) -> list[tuple[RunGroup, RunGroup]]:
        """(arm, the arm of the same policy, model and scale with the default schedule): where an arm
        differs from another only by when compression starts."""
        first: dict[tuple, RunGroup] = {}
        pairs = []
        for arm in self.arms:
            key = (model_key(arm), arm.policy.describe())
            if key in first and first[key].label != arm.label:
                pairs.append((arm, first[key]))
            first.setdefault(key, arm)
        return pairs

    def points(self, baseline: RunGroup) -> str:
        """Where the arms of the baseline's model compress their gradients, e.g. ``convolution outputs``."""
        return " / ".join(dict.fromkeys(arm.compression_points for arm in self.arms_of(baseline)))

    def caption(self) -> str:
        """Each model: its description, where its arms compress, and the run they are compared with."""
        return "; ".join(
            f"{self.name(b)}{f' = {b.model}' if b.model != self.name(b) else ''}: gradients compressed at "
            f"its {self.points(b)}, against {b.name}"
            for b in self.baselines
        )


def baseline_text(group: RunGroup) -> str:
    """e.g. "fp32 0.853 [0.84, 0.866] over 8 seeds (sd 0.9 pt)": a baseline and its seed-to-seed noise."""
    estimate = accuracy_estimate(group)
    spread = "" if estimate.n < 2 else f" (sd {100 * estimate.sd:.2g} pt)"
    return f"{group.label} {estimate.text()} over {estimate.n} seed{'s' * (estimate.n != 1)}{spread}"


def model_finding(models: WithinModels, baseline: RunGroup, gaps: Mapping[str, Comparison]) -> str:
    """One sentence per model: its baseline with its noise, then every arm's verdict against it."""
    arms = [gaps[arm.name] for arm in models.arms_of(baseline) if arm.name in gaps]
    verdicts = f"; {summarise(arms)}" if arms else ""
    return f"{models.name(baseline)} at {baseline.scale}: {baseline_text(baseline)}{verdicts}."


def claim_of(claim: str, run: str | None, gaps: Mapping[str, Comparison]) -> list[Decision]:
    """The decision of a no-loss claim from the gap of the run `run` names, declared as its deciding
    comparison (`WithinModels.gap_pairs`; none where no run is named, inconclusive where it is untrained)."""
    if run is None:
        return []
    if run not in gaps:
        return [undecided(claim, f"run {run} is not trained by this configuration")]
    return [decide(claim, [gaps[run]])]


@dataclass(frozen=True)
class GapExperiment:
    """The template of the accuracy experiments (A5, A8, C1, C3): each arm's paired gap to the uncompressed
    run of its model and scale, next to whatever else the experiment compares; a main-table row per run
    (its model, reference, the experiment's columns, gap and verdict), a finding per model, and the tables
    of baselines and per-seed accuracies."""

    models: WithinModels
    comparisons: list[Comparison]

    @property
    def gaps(self) -> dict[str, Comparison]:
        """Run name -> its gap to its baseline."""
        return by_arm(self.comparisons)

    @property
    def groups(self) -> dict[str, RunGroup]:
        return {group.name: group for group in [*self.models.baselines, *self.models.arms]}

    def rows(
        self,
        row: Callable[[RunGroup], dict],
        order: Callable[[dict], Any] | None = None,
        baselines: bool = True,
    ) -> list[dict]:
        """Per model, its baseline's row (unless `baselines` is False) and its arms' (sorted by `order`),
        each with the model, the reference run and the gap."""
        rows = []
        for baseline in self.models.baselines:
            arms = [row(arm) for arm in self.models.arms_of(baseline)]
            head = [row(baseline)] if baselines else []
            rows += [
                {"model": self.models.name(baseline), "reference": baseline.name, **cells}
                for cells in [*head, *(sorted(arms, key=order) if order else arms)]
            ]
        return gap_columns(rows, self.gaps)

    def result(
        self,
        caption: str,
        title: str,
        rows: list[dict],
        *,
        findings: Sequence[str] = (),
        tables: Mapping[str, Table] | None = None,
        claims: Sequence[Decision] = (),
        quantities: Sequence[Quantity] = (),
    ) -> Result:
        """The experiment's Result: the main table titled `title`, the experiment's own `tables`, the
        baselines and every run's per-seed accuracies (and `quantities`); a finding per model, then
        `findings`."""
        runs = [*self.models.baselines, *self.models.arms]
        gaps = self.gaps
        return Result(
            caption=caption,
            tables={
                "main": Table(title, rows, note=scale_note(self.groups)),
                **(tables or {}),
                "baseline": self.models.baseline_table(),
                "seeds": per_seed_table(runs, *quantities),
            },
            comparisons=self.comparisons,
            findings=[*(model_finding(self.models, b, gaps) for b in self.models.baselines), *findings],
            claims=list(claims),
        )


def held_out_pair(
    models: WithinModels, held: Sequence[str], fails: set[str], margin: float, role: str
) -> Pair | None:
    """A failure criterion fixed on one model, on the runs `held` out of that fit: per seed, the mean
    accuracy gap to fp32 of those it predicts to train against that of those it predicts to fail (`fails`),
    superiority beyond `margin` where it explains the failures; None where it predicts every run alike."""
    fail = [run for run in held if run in fails]
    train = [run for run in held if run not in fails]
    if not fail or not train:
        return None
    arms = {arm.name: arm for arm in models.arms}

    def mean_gap(names: list[str]) -> dict[int, float]:
        shared = set.intersection(*(set(arms[n].seeds) & set(models.own[n].seeds) for n in names))
        return {
            seed: sum(arms[n].accuracy[seed] - models.own[n].accuracy[seed] for n in names) / len(names)
            for seed in sorted(shared)
        }

    return Pair(
        f"held-out runs predicted to train ({', '.join(models.label(arms[n]) for n in train)})",
        f"those predicted to fail ({', '.join(models.label(arms[n]) for n in fail)}), gap to fp32",
        mean_gap(train),
        mean_gap(fail),
        margin=margin,
        scale="; ".join(dict.fromkeys(arms[n].scale for n in held)),
        role=role,
    )


FAILS, TRAINS, UNDECIDED = "fails", "trains", "undecided"  # what training showed against fp32 of a model


def outcome(gap: Comparison) -> str:
    """A run's gap to fp32 of its model as an outcome: fails (worse), trains (equivalent within the margin,
    or better), undecided (inconclusive)."""
    return {WORSE: FAILS, EQUIVALENT: TRAINS, BETTER: TRAINS}.get(gap.verdict, UNDECIDED)
