"""A10: where low-bit floating-point gradients fail, from each model's measured gradients and the lognormal
theory: failing FP configurations and their fixes, every trained FP run, each model's window of single global
scales."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from gradcomp.analysis.accuracy import (
    FAILS,
    TRAINS,
    UNDECIDED,
    WithinModels,
    gap_cells,
    held_out_pair,
    outcome,
    per_seed_table,
    run_row,
    scale_note,
)
from gradcomp.analysis.fp import FIX, fp_member
from gradcomp.analysis.runs import RunGroup, accuracy_estimate, training_context
from gradcomp.analysis.seeds import spearman
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    FAMILIES,
    Comparison,
    Pair,
    by_arm,
    compare,
    having,
)
from gradcomp.experiments import FailurePairs
from gradcomp.formats import FPFormat, parse_format
from gradcomp.theory import fp as fp_theory
from gradcomp.training.compress import layer_log2_scale
from gradcomp.training.policies import FloatingPoint
from gradcomp.training.probe import load_probe

HELD_OUT = "held_out"  # the MSE rule's held-out runs predicted to train against those predicted to fail


# --- A10 ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layers:
    """A model's measured per-layer log2 statistics of its neural gradients (non-zero entries, last probed
    step of the uncompressed run, mean over its seeds), element counts and largest magnitudes (the probe's
    exact absmax, its log2 averaged over the seeds, as mu2 is): what the theory predicts from, and what
    bounds the per-layer min-MSE rule's scale (`compress.scale_bound`), as in training."""

    names: list[str]
    mu2: torch.Tensor
    sigma2: torch.Tensor
    elements: torch.Tensor
    amax: torch.Tensor

    @classmethod
    def of(cls, group: RunGroup) -> _Layers:
        by_layer: dict[str, list[tuple[float, float, float]]] = {}
        for run in group.runs.values():
            probe = load_probe(run.folder / "probe.npz")
            last = probe["step"].max()
            rows = np.flatnonzero((probe["kind"] == "gradient") & (probe["step"] == last))
            for i in rows:
                if np.isfinite(probe["log2_std"][i]) and probe["log2_std"][i] > 0:
                    values = (
                        probe["log2_mean"][i],
                        probe["log2_std"][i],
                        probe["count"][i] - probe["zeros"][i],
                        np.log2(probe["absmax"][i]),
                    )
                    by_layer.setdefault(str(probe["layer"][i]), []).append(tuple(map(float, values)))
        if not by_layer:
            raise ValueError(f"run {group.name!r}: its probe has no gradient statistics (set runs.*.probe)")
        columns = [torch.tensor([np.mean(c) for c in zip(*v, strict=True)]) for v in by_layer.values()]
        mu2, sigma2, elements, log2_amax = (
            torch.stack(column).double() for column in zip(*columns, strict=True)
        )
        return cls(list(by_layer), mu2, sigma2, elements, torch.exp2(log2_amax))

    def rule_scales(self, policy: FloatingPoint) -> torch.Tensor:
        """The per-layer log2 scales a fixed or per-layer rule gives these layers (`compress.
        layer_log2_scale`, the training rule, with each layer's amax read in float32 as training reads it)."""
        layers = zip(self.mu2, self.sigma2, self.amax.float(), strict=True)
        return torch.stack([layer_log2_scale(policy, mu2, sigma2, amax) for mu2, sigma2, amax in layers])

    def predict(self, fmt: FPFormat, log2_scales: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per layer (last axis) at the given log2 scales (broadcast against the layers): the shares of
        non-zero values flushed to zero (below half the smallest subnormal) and clipped (beyond the largest
        value), and the relative MSE of nearest rounding (gradcomp.theory.fp)."""
        centre = self.mu2 + log2_scales
        low, high = math.log2(fmt.min_subnormal / 2), math.log2(fmt.max_value)
        normal = torch.distributions.Normal(centre, self.sigma2)
        return {
            "flushed": normal.cdf(torch.tensor(low, dtype=torch.float64)),
            "clipped": 1 - normal.cdf(torch.tensor(high, dtype=torch.float64)),
            "relative_mse": fp_theory.relative_mse(fmt.positive_values(), self.sigma2, centre),
        }

    def totals(self, prediction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Over the layers (last axis): element-weighted flushed and clipped shares, the relative MSE averaged
        over layers (each layer's error relative to its own gradient's energy), and the worst layer's of
        each."""
        weights = self.elements / self.elements.sum()
        return {
            "predicted_flushed": (prediction["flushed"] * weights).sum(-1),
            "predicted_clipped": (prediction["clipped"] * weights).sum(-1),
            "predicted_relative_mse": prediction["relative_mse"].mean(-1),
        } | {f"predicted_worst_layer_{key}": values.max(-1).values for key, values in prediction.items()}

    def summarise(self, prediction: dict[str, torch.Tensor]) -> dict[str, float]:
        """`totals` of one configuration as numbers."""
        return {key: float(value) for key, value in self.totals(prediction).items()}

    def spread(self, criterion: _Criterion) -> float:
        """The binades one global scale must cover for every layer to meet the failure criterion: from the
        lowest layer's max_flushed quantile of log2|g| to the highest layer's (1 - max_clipped) quantile.
        The every-layer window is open only where the format's range exceeds it."""
        normal = torch.distributions.Normal(0.0, 1.0)
        z_flushed = float(normal.icdf(torch.tensor(criterion.max_flushed)))
        z_clipped = float(normal.icdf(torch.tensor(1 - criterion.max_clipped)))
        return float((self.mu2 + z_clipped * self.sigma2).max() - (self.mu2 + z_flushed * self.sigma2).min())


def _range(fmt: FPFormat) -> float:
    """The binades a format covers, from half its smallest subnormal (below: flushed) to its largest value."""
    return math.log2(fmt.max_value) - math.log2(fmt.min_subnormal / 2)


def _log2_scales(group: RunGroup, layers: _Layers) -> torch.Tensor:
    """The per-layer log2 scales `group`'s FP policy applies to these gradients: the rule's own for fixed and
    per-layer rules; for dynamic loss scaling the scale its runs settled at (mean over seeds)."""
    policy = fp_member(group)
    if policy.scaling == "dynamic":
        settled = [
            math.log2(layer["scale"])
            for run in group.runs.values()
            for layer in run.summary["layers"].values()
            if layer.get("scale")
        ]
        return torch.full_like(layers.mu2, float(np.mean(settled)))
    return layers.rule_scales(policy)


def _is_min_mse(group: RunGroup) -> bool:
    policies = getattr(group.policy, "policies", (group.policy,))
    return any(getattr(policy, "scaling", None) == "per_layer_optimal" for policy in policies)


SCOPES = {"element": "predicted", "every-layer": "predicted_worst_layer"}


@dataclass(frozen=True)
class _Criterion:
    """The predicted failure: more of the non-zero values clipped than `max_clipped`, or flushed to zero
    than `max_flushed`, counted over all values ("element") or in any one layer ("every-layer")."""

    max_clipped: float
    max_flushed: float
    scope: str = "element"

    def fails(self, prediction: dict):
        """On predicted `totals` (numbers, or tensors over global scales)."""
        prefix = SCOPES[self.scope]
        return (prediction[f"{prefix}_clipped"] > self.max_clipped) | (
            prediction[f"{prefix}_flushed"] > self.max_flushed
        )

    @property
    def text(self) -> str:
        return (
            f"more than {self.max_clipped:g} clipped or {self.max_flushed:g} flushed ({self.scope} criterion)"
        )


def flush_clip_failures(
    arms: Sequence[RunGroup], own: Mapping[str, RunGroup], max_clipped: float, max_flushed: float
) -> dict[str, bool] | None:
    """A10's criterion on FP runs of other experiments: per run, whether the lognormal theory predicts more
    of its non-zero gradient values clipped than `max_clipped` or flushed than `max_flushed` (element
    criterion), from the probe of its model's uncompressed run (`own`); None where a baseline has no probe."""
    layers: dict[str, _Layers] = {}
    failing = {}
    for arm in arms:
        baseline = own[arm.name]
        try:
            mine = layers.setdefault(baseline.name, _Layers.of(baseline))
        except (FileNotFoundError, ValueError):
            return None
        prediction = mine.summarise(mine.predict(fp_member(arm).fmt, _log2_scales(arm, mine)))
        failing[arm.name] = bool(_Criterion(max_clipped, max_flushed).fails(prediction))
    return failing


def _agreement(rows: list[dict], criterion: _Criterion) -> tuple[int, int, int]:
    """Over the runs training decided: (criterion right, "nothing fails" right, decided runs)."""
    decided = [row for row in rows if row["measured"] != UNDECIDED]
    right = sum(bool(criterion.fails(row["prediction"])) == (row["measured"] == FAILS) for row in decided)
    trivial = sum(row["measured"] == TRAINS for row in decided)
    return right, trivial, len(decided)


def _sensitivity(settings: FailurePairs, rows: list[dict]) -> list[dict]:
    """The agreement of every criterion of the settings' grids, on every decided run."""
    table = []
    for scope in SCOPES:
        for clipped in settings.clipped_grid:
            for flushed in settings.flushed_grid:
                right, trivial, decided = _agreement(rows, _Criterion(clipped, flushed, scope))
                table.append(
                    {
                        "scope": scope,
                        "max_clipped": clipped,
                        "max_flushed": flushed,
                        "agree": right,
                        "nothing_fails_agrees": trivial,
                        "decided_runs": decided,
                    }
                )
    return table


def _fit_and_test(settings: FailurePairs, rows: list[dict], fit_model: str) -> tuple[_Criterion, dict]:
    """The criterion of the grids that agrees best on `fit_model`'s runs (the settings' own on a tie), and
    how it does on the other models' runs against "nothing fails" (an exact sign test on the runs where
    exactly one of the two is right)."""
    fit = [row for row in rows if row["model"] == fit_model]
    held_out = [row for row in rows if row["model"] != fit_model and row["measured"] != UNDECIDED]
    default = _Criterion(settings.max_clipped, settings.max_flushed)
    candidates = [default] + [
        _Criterion(c, f, scope)
        for scope in SCOPES
        for c in settings.clipped_grid
        for f in settings.flushed_grid
    ]
    best = max(candidates, key=lambda criterion: _agreement(fit, criterion)[0])
    right, trivial, decided = _agreement(held_out, best)
    # "nothing fails" is wrong exactly on the failing runs, the criterion wherever it errs: they disagree on
    # the runs the criterion predicts to fail
    alarmed = [row["measured"] for row in held_out if bool(best.fails(row["prediction"]))]
    only_criterion, only_trivial = alarmed.count(FAILS), alarmed.count(TRAINS)
    discordant = only_criterion + only_trivial
    p = float(stats.binomtest(only_criterion, discordant).pvalue) if discordant else math.nan
    return best, {
        "fit_agree": _agreement(fit, best),
        "right": right,
        "trivial": trivial,
        "decided": decided,
        "only_criterion": only_criterion,
        "only_trivial": only_trivial,
        "p": p,
    }


def _arm_rows(
    arms: list[RunGroup], own: dict[str, RunGroup], layers: dict[str, _Layers], gaps: dict[str, Comparison]
) -> list[dict]:
    """Every trained FP run: its predicted range losses from its model's gradients, and what training
    showed against fp32 of that model."""
    rows = []
    for arm in arms:
        mine = layers[own[arm.name].name]
        policy = fp_member(arm)
        prediction = mine.summarise(mine.predict(policy.fmt, _log2_scales(arm, mine)))
        rows.append(
            {
                "run": arm.name,
                "model": arm.model,
                "label": arm.label,
                "log2_global_scale": math.log2(policy.global_scale) if policy.scaling == "global" else None,
                **prediction,
                **run_row(arm),
                **gap_cells(gaps[arm.name]),
                "measured": outcome(gaps[arm.name]),
                "prediction": prediction,
            }
        )
    return rows


def _windows(
    settings: FailurePairs, baselines: list[RunGroup], layers: dict[str, _Layers]
) -> tuple[list[dict], list[dict], list[dict]]:
    """Per model: the predicted losses at every global scale of the sweep, a summary of that window against
    the per-layer mean rule, and every format's relative MSE with the per-layer mean rule."""
    fmt = parse_format(settings.format)
    criterion = _Criterion(settings.max_clipped, settings.max_flushed)
    scales = torch.arange(settings.log2_scales[0], settings.log2_scales[1] + 1, dtype=torch.float64)
    window, per_model, formats = [], [], []
    for group in baselines:
        mine = layers[group.name]
        sweep = mine.totals(mine.predict(fmt, scales[:, None]))
        mse = sweep["predicted_relative_mse"]
        for index, scale in enumerate(scales.tolist()):
            window.append(
                {"model": group.model, "log2_scale": scale}
                | {key: float(values[index]) for key, values in sweep.items()}
            )
        rule = FloatingPoint(settings.format)
        per_layer = mine.summarise(mine.predict(fmt, mine.rule_scales(rule)))
        best = int(torch.argmin(mse))
        per_model.append(
            {
                "model": group.model,
                "layers": len(mine.names),
                "mu2_spread": float(mine.mu2.max() - mine.mu2.min()),
                "sigma2_mean": float(mine.sigma2.mean()),
                "spread": mine.spread(criterion),
                "format_range": _range(fmt),
                "per_layer_rule_relative_mse": per_layer["predicted_relative_mse"],
                "best_log2_global_scale": float(scales[best]),
                "best_global_relative_mse": float(mse[best]),
            }
            | _windows_of(scales, sweep, criterion)
        )
        for fmt_name in settings.formats:
            candidate = FloatingPoint(fmt_name)
            formats.append(
                {"model": group.model, "format": candidate.format_label}
                | mine.summarise(mine.predict(candidate.fmt, mine.rule_scales(candidate)))
                | {"spread": mine.spread(criterion), "format_range": _range(candidate.fmt)}
                | _windows_of(scales, mine.totals(mine.predict(candidate.fmt, scales[:, None])), criterion)
            )
    return window, per_model, formats


def _windows_of(scales: torch.Tensor, sweep: dict[str, torch.Tensor], criterion: _Criterion) -> dict:
    """The window of single global scales under each scope of the failure criterion, as table columns: the
    lowest and highest global log2 scale whose predicted `totals` the criterion spares (None: none does)."""
    columns = {}
    for scope in SCOPES:
        passed = ~_Criterion(criterion.max_clipped, criterion.max_flushed, scope).fails(sweep)
        good = scales[passed]
        low, high = (float(good.min()), float(good.max())) if good.numel() else (None, None)
        columns |= {f"{_column(scope)}_window_low": low, f"{_column(scope)}_window_high": high}
    return columns


def _column(scope: str) -> str:
    return scope.replace("-", "_")


def _agreement_finding(rows: list[dict], criterion: _Criterion) -> str:
    """How often a criterion matches what training decided, next to the trivial "nothing fails"."""
    right, trivial, decided = _agreement(rows, criterion)
    undecided = len(rows) - decided
    missed = [r["label"] for r in rows if r["measured"] == FAILS and not criterion.fails(r["prediction"])]
    false = [r["label"] for r in rows if r["measured"] == TRAINS and criterion.fails(r["prediction"])]
    return (
        f"Predicted failure ({criterion.text}): right for {right} of the {decided} runs training decided "
        f"(fails: worse than fp32 of its model; trains: equivalent within the margin), against {trivial} for "
        f'"nothing fails"; {undecided} runs inconclusive; failures not predicted: '
        f"{', '.join(missed) or 'none'}; predicted failures that train: {', '.join(false) or 'none'}."
    )


def _ranking_finding(rows: list[dict]) -> str:
    """Whether predicted relative MSE ranks the measured accuracy loss, over all runs and over those that
    train (plainly: a rank correlation whose interval excludes 0, or not)."""
    parts = []
    for name, chosen in (
        ("every trained FP run", [r for r in rows if (r["gap_pt_n"] or 0) > 1]),
        (
            "the runs that train (not worse than fp32)",
            [r for r in rows if r["measured"] != FAILS and (r["gap_pt_n"] or 0) > 1],
        ),
    ):
        rho, low, high, n = spearman(
            [r["predicted_relative_mse"] for r in chosen], [-r["gap_pt_mean"] for r in chosen]
        )
        if math.isnan(rho):
            parts.append(f"over {name}: too few runs ({n}) for a rank correlation")
            continue
        ranks = "ranks" if low > 0 else "ranks it inversely" if high < 0 else "does not rank"
        parts.append(
            f"over {name} it {ranks} the accuracy loss (Spearman {rho:+.2f}, 95 % CI "
            f"[{low:+.2f}, {high:+.2f}], "
            f"{n} runs)"
        )
    return "Predicted relative MSE: " + "; ".join(parts) + "."


def _fit_finding(best: _Criterion, test: dict, fit_model: str) -> str:
    fit_right, _, fit_decided = test["fit_agree"]
    if not test["decided"]:
        held = "no run of another model was decided, so it is not tested"
    else:
        p = (
            ""
            if math.isnan(test["p"])
            else f", exact sign test on the {test['only_criterion'] + test['only_trivial']} runs where they "
            f"differ p = {test['p']:.2g}"
        )
        held = (
            f"on the other models' {test['decided']} decided runs it is right for {test['right']}, "
            f'"nothing fails" for {test["trivial"]}{p}'
        )
    return (
        f"Thresholds fixed on {fit_model} ({best.text}: right for {fit_right} of its {fit_decided} decided "
        f"runs), then tested: {held}."
    )


def _held_out_pair(
    best: _Criterion, rows: list[dict], models: WithinModels, fit_model: str, margin: float
) -> Pair | None:
    """The MSE rule on the models it was not fitted on: the held-out runs it predicts to train against
    those it predicts to fail (`held_out_pair`)."""
    held = [row for row in rows if row["model"] != fit_model]
    fails = {row["run"] for row in held if bool(best.fails(row["prediction"]))}
    return held_out_pair(models, [row["run"] for row in held], fails, margin, HELD_OUT)


def _window_statement(row: dict) -> str:
    """One model's windows of single global scales for the swept format, under both scopes."""
    spread = f"mu2 spread {row['mu2_spread']:.1f} binades, mean sigma2 {row['sigma2_mean']:.2f}"
    windows = []
    for scope in SCOPES:
        low, high = (row[f"{_column(scope)}_window_{end}"] for end in ("low", "high"))
        windows.append(
            f"{scope} criterion: {'none' if low is None else f'2^{low:g} to 2^{high:g}'}"
            + (
                f" (every layer needs {row['spread']:.1f} binades, the format has {row['format_range']:.1f})"
                if scope == "every-layer"
                else ""
            )
        )
    return (
        f"{row['model']} ({spread}): single global scales predicted to pass: {'; '.join(windows)}; least "
        f"relative MSE at 2^{row['best_log2_global_scale']:g} ({row['best_global_relative_mse']:.3g}, "
        f"per-layer mean rule {row['per_layer_rule_relative_mse']:.3g})."
    )


def _a10_caption(settings: FailurePairs, baselines: list[RunGroup], runs: dict[str, RunGroup]) -> str:
    swept = FloatingPoint(settings.format).format_label
    optimal = [g.label for g in runs.values() if _is_min_mse(g)]
    bounded = (
        f" A per-layer rule's scales are those training applies: the min-MSE rule's ({', '.join(optimal)}) "
        "is at least the largest scale that keeps each layer's largest |g| (the probe's, its log2 averaged "
        "over the seeds) within the format's largest value, never the lognormal optimum alone, which can lie "
        "below every value of a real gradient; at that scale the theory, whose lognormal has no largest "
        "value, predicts a layer's tail beyond it to clip, which the layer does not have (C2 predicts the "
        "same rule for each tensor below its largest value)."
        if optimal
        else ""
    )
    return f"""Predictions of the lognormal theory from each model's measured gradients, next to trained
        outcomes. The theory reads, per layer, the mean and standard deviation of log2|g| (non-zero entries
        of the {"; ".join(f"{g.model}: {g.compression_points}" for g in baselines)}) at the last probed step
        of the uncompressed runs ({", ".join(g.name for g in baselines)}; mean over their seeds), and
        predicts for a format and per-layer scale the share of values flushed to zero (below half the
        smallest subnormal), clipped at the largest value, and the relative MSE of nearest rounding (mean
        over layers).{bounded} A configuration is predicted to fail where more than
        {settings.max_clipped:g} of the non-zero values clip or more than {settings.max_flushed:g} flush
        (the settings' thresholds; their sensitivity over the grids
        {", ".join(map(str, settings.clipped_grid))} and {", ".join(map(str, settings.flushed_grid))} is
        tabulated), counted over all values (element
        criterion) or in any one layer (every-layer criterion). Training decides a run: it fails when
        significantly worse than fp32 of its model (paired by seed, {FAMILIES}), trains when
        equivalent within ±{settings.margin:g} pt (two one-sided tests), and is undecided otherwise. (a) Each
        failing configuration next to its fix (joined), coloured by what training showed (red: fails, green:
        trains, grey: undecided): final test accuracy, mean and 95 % CI over seeds and every seed, with the
        uncompressed run of its model (band). (b) Predicted relative MSE of {swept}
        with one global scale for every layer, against log2 of that scale (2^{settings.log2_scales[0]} to
        2^{settings.log2_scales[1]}), per model, next to the per-layer mean rule (dotted), with each model's
        predicted windows (light shading: element criterion passed; dark: every-layer criterion passed). (c)
        Predicted relative MSE of every trained FP run against its measured accuracy loss from fp32 of its
        model (95 % CI; coloured as in (a), one marker per model). {training_context(runs)}."""


def _pair_rows(fixes: list[tuple[RunGroup, RunGroup]], comparisons: list[Comparison]) -> list[dict]:
    """Each (failing, fixing) pair: both runs' accuracies and the fix's paired gain."""
    gains = {(c.arm, c.baseline): c for c in having(comparisons, FIX)}
    return [
        {
            "failing": failing.label,
            "fixing": fixing.label,
            "model": failing.model,
            "failing_run": failing.name,
            "fixing_run": fixing.name,
            **accuracy_estimate(failing).columns("failing_accuracy"),
            **accuracy_estimate(fixing).columns("fixing_accuracy"),
            **gap_cells(gains[fixing.name, failing.name]),
        }
        for failing, fixing in fixes
    ]


def _a10_findings(settings: FailurePairs, rows: list[dict], fitted: tuple, per_model, formats) -> list[str]:
    """Agreement of the settings' criterion (both scopes) next to "nothing fails", the fitted criterion's
    test on the other models, whether predicted MSE ranks accuracy, and the windows of global scales."""
    no_window = [
        f"{row['format']} on {row['model']} (needs {row['spread']:.1f} binades, "
        f"has {row['format_range']:.1f})"
        for row in formats
        if row["every_layer_window_low"] is None
    ]
    return [
        *(
            _agreement_finding(rows, _Criterion(settings.max_clipped, settings.max_flushed, s))
            for s in SCOPES
        ),
        _fit_finding(*fitted),
        _ranking_finding(rows),
        *(_window_statement(row) for row in per_model),
        "No single global scale serves every layer for: " + "; ".join(no_window) + "."
        if no_window
        else "Every format listed has a global scale that serves every layer on every model.",
    ]


def failure_cases(settings: FailurePairs, runs: dict[str, RunGroup]) -> Result:
    """A10: the theory's failure predictions from measured gradients against trained outcomes: agreement
    next to "nothing fails", threshold sensitivity, thresholds fitted on one model and tested on the others,
    whether predicted MSE ranks accuracy, and each model's window of single global scales."""
    baselines = settings.present(settings.baselines, runs)
    layers = {group.name: _Layers.of(group) for group in baselines}
    fixes = [(runs[a], runs[b]) for a, b in settings.pairs if a in runs and b in runs]  # (failing, fixing)
    arms = settings.present([*(run for pair in settings.pairs for run in pair), *settings.arms], runs)
    models = WithinModels.of(baselines, arms, "experiments.A10.baselines")
    pairs = models.pairs([(fixing, failing) for failing, fixing in fixes], settings.margin, FIX)
    comparisons = compare(pairs + models.gap_pairs(settings.margin))
    rows = _arm_rows(models.arms, models.own, layers, by_arm(comparisons))
    fit_model = runs[settings.fit_on or settings.baselines[0]].model
    best, test = _fit_and_test(settings, rows, fit_model)
    pair = _held_out_pair(best, rows, models, fit_model, settings.margin)
    held_out = [] if pair is None else compare([pair])
    window, per_model, formats = _windows(settings, baselines, layers)
    groups = {group.name: group for group in [*baselines, *models.arms]}
    swept = FloatingPoint(settings.format).format_label
    return Result(
        caption=_a10_caption(settings, baselines, groups),
        tables={
            "main": Table(
                "Failures of low-bit FP gradients and their fixes",
                _pair_rows(fixes, comparisons),
                note=scale_note(groups),
            ),
            "arms": Table(
                "Every trained FP run: predicted range losses and what training showed",
                [{k: v for k, v in row.items() if k != "prediction"} for row in rows],
            ),
            "sensitivity": Table(
                "Agreement of each threshold pair with what training decided", _sensitivity(settings, rows)
            ),
            "models": Table(f"Global-scale window of {swept} per model (predicted)", per_model),
            "formats": Table("Predicted relative MSE of each format with the per-layer mean rule", formats),
            "window": Table("Predicted range losses against the global scale", window, markdown=False),
            "seeds": per_seed_table([*baselines, *models.arms]),
            "baseline": Table("fp32", [run_row(g) | {"model": g.model} for g in baselines], markdown=False),
        },
        comparisons=comparisons + held_out,
        findings=[
            *_a10_findings(settings, rows, (best, test, fit_model), per_model, formats),
            _held_out_finding(held_out, best, fit_model),
        ],
    )


def _held_out_finding(held_out: list[Comparison], best: _Criterion, fit_model: str) -> str:
    """The MSE rule's held-out test in words (claim L7 is decided by F1, on the noise ratio)."""
    fitted = f"The MSE rule fitted on {fit_model} ({best.text}) on the other models' runs"
    if not held_out:
        return f"{fitted}: it predicts every held-out run alike, nothing to compare."
    (c,) = held_out
    return f"{fitted}: {c.a} vs {c.b}: {c.difference:+.3g} pt {c.interval}, {c.decision}."
