"""Accuracy (and other per-run numbers) of run groups over seeds: table rows and paired comparisons."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gradcomp.analysis.runs import Run, RunGroup, one_per_model
from gradcomp.analysis.seeds import SIGNIFICANT, UNTESTED, Comparison, Estimate, compare
from gradcomp.analysis.tables import Table


def run_row(group: RunGroup, **values: Callable[[Run], float | None]) -> dict[str, Any]:
    """One table row per run: name, label, seed count, and mean / sd / 95 % CI of each named per-run value
    (accuracy by default)."""
    values = values or {"accuracy": lambda run: run.accuracy}
    row: dict[str, Any] = {"run": group.name, "label": group.label, "seeds": len(group.runs)}
    for name, value in values.items():
        row |= group.estimate(value).columns(name)
    return row


def per_seed_table(groups: Sequence[RunGroup], **values: Callable[[Run], float | None]) -> Table:
    """Every seed's values (for figures that show each seed), kept out of the Markdown."""
    values = values or {"accuracy": lambda run: run.accuracy}
    rows = [
        {"run": group.name, "seed": seed, **{name: value(run) for name, value in values.items()}}
        for group in groups
        for seed, run in group.runs.items()
    ]
    return Table("Every seed", rows, markdown=False)


def compare_accuracy(
    pairs: Sequence[tuple[RunGroup, RunGroup]], label: Callable[[RunGroup], str] | None = None
) -> list[Comparison]:
    """Paired accuracy differences a - b in points (one experiment's comparisons, Holm-adjusted together);
    each arm named by `label` (default: its policy label)."""
    label = label or (lambda group: group.label)
    return compare([((label(a), a.accuracy), (label(b), b.accuracy)) for a, b in pairs])


def with_gaps(rows: list[dict], gaps: Mapping[str, Comparison]) -> list[dict]:
    """Rows of the table with the paired gap (points, 95 % CI) to their reference and its verdict, where
    `gaps` (run name -> comparison) has the row's run."""
    for row in rows:
        gap = gaps.get(row["run"])
        row["gap_pt"] = gap.difference if gap else None
        row["gap_ci_low"] = gap.ci_low if gap else None
        row["gap_ci_high"] = gap.ci_high if gap else None
        row["gap_verdict"] = gap.verdict if gap else None
    return rows


def noise_floor(group: RunGroup) -> dict[str, str | float | int]:
    """The baseline's accuracy over seeds, and its standard deviation in points (the noise floor)."""
    estimate = Estimate.of(list(group.accuracy.values()))
    return {
        "baseline": group.label,
        "baseline_accuracy": estimate.mean,
        "noise_floor_sd_pt": 100 * estimate.sd,
        "baseline_seeds": estimate.n,
    }


def model_names(groups: Sequence[RunGroup]) -> dict[str, str]:
    """A short name for each model (`RunGroup.model`) among `groups`: its timm name, or the full
    description where models of one timm name differ in options or stem."""
    models = list(dict.fromkeys(group.model for group in groups))
    timm = {group.model: group.config["model"] for group in groups}
    shared = {name for name in timm.values() if sum(value == name for value in timm.values()) > 1}
    return {model: model if timm[model] in shared else timm[model] for model in models}


@dataclass(frozen=True)
class WithinModels:
    """Arms of one or several models, each matched with the uncompressed run of its own model (same model,
    model options and stem): accuracy gaps are only ever taken within a model."""

    baselines: list[RunGroup]  # one per model, in the order named
    arms: list[RunGroup]
    own: dict[str, RunGroup]  # arm name -> its model's baseline
    names: dict[str, str]  # model description -> short name

    @classmethod
    def of(cls, baselines: Sequence[str], arms: Sequence[str], runs: Mapping[str, RunGroup], where: str):
        """Match `arms` with `baselines` (run names); `where` (e.g. "experiments.A5.baseline") names the
        setting in the errors: two baselines of one model, or an arm without a baseline of its model."""
        groups = [runs[name] for name in baselines]
        by_model = one_per_model(groups, where)
        chosen = [runs[name] for name in dict.fromkeys(arms) if name not in baselines]
        for arm in chosen:
            if arm.model not in by_model:
                raise ValueError(
                    f"{where}: run {arm.name!r} ({arm.model}) has no uncompressed run of its model among "
                    f"{', '.join(repr(g.name) for g in groups)}; add that model's baseline run"
                )
        own = {arm.name: by_model[arm.model] for arm in chosen}
        return cls(groups, chosen, own, model_names([*groups, *chosen]))

    @property
    def several(self) -> bool:
        return len(self.baselines) > 1

    def name(self, group: RunGroup) -> str:
        """The short name of the group's model."""
        return self.names[group.model]

    def label(self, group: RunGroup) -> str:
        """The group's label, with its model's short name where there are several models."""
        return f"{group.label} ({self.name(group)})" if self.several else group.label

    def arms_of(self, baseline: RunGroup) -> list[RunGroup]:
        return [arm for arm in self.arms if self.own[arm.name] is baseline]

    def gaps(self, extra: Sequence[tuple[RunGroup, RunGroup]] = ()) -> list[Comparison]:
        """Every arm against its model's baseline (in the order of `arms`), then the `extra` pairs (which
        must be of one model each); Holm-adjusted together."""
        for a, b in extra:
            if a.model != b.model:
                raise ValueError(f"{a.name!r} and {b.name!r} are runs of different models")
        return compare_accuracy([(arm, self.own[arm.name]) for arm in self.arms] + list(extra), self.label)

    def headline(self, baseline: RunGroup, gaps: Mapping[str, Comparison]) -> dict[str, Any]:
        """The baseline's noise floor, every arm's paired gap to it (mean, 95 % CI, verdict, seeds) and the
        arms significantly below it."""
        arms = self.arms_of(baseline)
        return {
            **noise_floor(baseline),
            "gap_pt": {arm.label: _gap_text(gaps[arm.name]) for arm in arms},
            "significantly_worse": [
                arm.label
                for arm in arms
                if gaps[arm.name].verdict == SIGNIFICANT and gaps[arm.name].difference < 0
            ],
        }

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


def _gap_text(gap: Comparison) -> str:
    """e.g. "-0.87 (95 % CI [-1, -0.74]), significant, 2 seeds"."""
    if gap.verdict == UNTESTED:
        return f"{gap.difference:+.3g}, {gap.verdict}"
    interval = f"95 % CI [{gap.ci_low:+.3g}, {gap.ci_high:+.3g}]"
    return f"{gap.difference:+.3g} ({interval}), {gap.verdict}, {gap.seeds} seeds"
