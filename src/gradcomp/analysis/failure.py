"""F0-F2: when compressed gradients stall training. F0: the noise ratio R = ||g_W|| / ||noise in g_W|| of
each layer's weight gradient (FP4 All the Way, section 4: training stalls below sqrt(3)), measured with the
weight-gradient GEMMs and predicted without them (`gradcomp.training.noise_monitor`), on the trained models of
every family under every lossy policy. F1: whether the time a run spends below sqrt(3) ranks the accuracy it
loses, and L7 on that criterion. F2: switching the backward pass to fp32 late, or where the guard says."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import replace

import torch
from scipy import stats
from torch import nn

from gradcomp.analysis.accuracy import (
    FAILS,
    UNDECIDED,
    WithinModels,
    accuracy_pair,
    held_out_pair,
    outcome,
    run_row,
)
from gradcomp.analysis.claims import OUT_OF_REGIME, Decision, decide, deciding, undecided
from gradcomp.analysis.fp_failures import flush_clip_failures
from gradcomp.analysis.runs import Run, RunGroup, eval_batches, trained_models, training_context
from gradcomp.analysis.seeds import CORRELATION, FRACTION, LINEAR, PerSeed
from gradcomp.analysis.tables import Result, Table
from gradcomp.analysis.verdicts import (
    EQUIVALENT,
    GAP,
    Pair,
    by_arm,
    compare,
    correlation_pair,
    one_sample,
    prediction_pair,
    summarise,
)
from gradcomp.experiments import LateSwitch, NoiseRatios, Stalls
from gradcomp.theory.noise import CRITICAL_RATIO, noise_ratio
from gradcomp.training.attachment import attach
from gradcomp.training.config import CompressionConfig
from gradcomp.training.noise_monitor import PREDICTIONS
from gradcomp.training.policies import FloatingPoint, parse_policy

KINDS = (*PREDICTIONS, "measured")
SPEARMAN, HELD_OUT, SWITCH = "correlation", "held_out", "switch"  # F1's correlations, L7's pair; F2's
UNCORRELATED = 0.1  # F0: an error whose correlation with the gradient is within this counts as noise
CUTOFFS = tuple(c / 10 for c in range(10))  # L7: shares of time below the threshold tried on one model
# a run whose median measured R lies within this of 1 carries (nearly) nothing: R = 1 is what a gradient
# compressed to zero has by construction (the noise is the gradient), and a clipped one comes close; its
# outcome is trivial, so it never decides F1 or L7 (reported apart)
BY_CONSTRUCTION = 0.05
Histories = dict[tuple[str, int], dict[str, list[tuple[int, float]]]]  # (run, seed) -> `noise_history`


def _ratios(model: nn.Module, spec: str, batches: list) -> list[dict]:
    """Every compressed layer's noise-ratio rows, one noise step per batch (eval mode: no statistics move)."""
    config = CompressionConfig(
        parse_policy(spec), layer_types=("conv", "linear"), noise_every=1, measure_noise=True
    )
    with attach(model, config) as handle:
        for images, labels in batches:
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images), labels).backward()
        rows = handle.noise_ratios()
    model.zero_grad(set_to_none=True)
    return rows


def _model_ratio(rows: list[dict], kind: str) -> float | None:
    """R over the model's compressed layers: the energies of signal and noise summed over layers."""
    pairs = [(row[f"{kind}_signal"], row[f"{kind}_noise"]) for row in rows]
    if any(signal is None or noise is None for signal, noise in pairs):
        return None
    return noise_ratio(sum(s for s, _ in pairs), sum(n for _, n in pairs))


def _measure(settings: NoiseRatios, groups: list[RunGroup]) -> tuple[PerSeed, list[dict]]:
    """Per (family, policy) and seed: the model-wide R of each kind and the ln of each prediction over the
    measurement; and every layer's rows (for the figure)."""
    bounds = {f"{kind}_ratio": LINEAR for kind in KINDS} | {"error_correlation": CORRELATION}
    per_seed = PerSeed(("model", "policy"), bounds)
    layers = []
    for group in groups:
        for seed, run, model in trained_models(group):
            batches = eval_batches(run, settings.batches)
            for spec in settings.policies:
                label = parse_policy(spec).label
                rows = _ratios(model, spec, batches)
                ratios = {kind: _model_ratio(rows, kind) for kind in KINDS}
                logs = _ln_misses(ratios)
                key = {"model": group.config["model"], "policy": label}
                per_seed.add(
                    seed,
                    key,
                    **{f"{k}_ratio": v for k, v in ratios.items()},
                    error_correlation=_error_correlation(rows),
                    **logs,
                )
                layers.extend({**key, "seed": seed, **row} for row in rows)
    return per_seed, layers


def _error_correlation(rows: list[dict]) -> float | None:
    """The model-wide correlation of the compression's noise in the weight gradient with the exact weight
    gradient, from the measured energies: ||g_hat_W||^2 = ||g_W||^2 + ||noise||^2 + 2 <g_W, noise>."""
    parts = [(row["compressed_signal"], row["measured_signal"], row["measured_noise"]) for row in rows]
    if any(value is None for part in parts for value in part):
        return None
    compressed, exact, noise = (sum(part[i] for part in parts) for i in range(3))
    if not (exact > 0 and noise > 0):
        return None
    return max(-1.0, min(1.0, (compressed - exact - noise) / (2 * math.sqrt(exact * noise))))


def _why_missed(per_seed: PerSeed, comparisons: list) -> str:
    """The misses against the error's correlation with the gradient: the predictions carry the error as
    noise uncorrelated with the gradient (`gradcomp.theory.noise`), which an unbiased compressor's is."""
    rows = {f"{row['model']} {row['policy']}": row for row in per_seed.rows()}
    known = {
        arm: row["error_correlation_mean"] for arm, row in rows.items() if "error_correlation_mean" in row
    }
    noise = {arm for arm, r in known.items() if abs(r) <= UNCORRELATED}
    parts = []
    for kind in PREDICTIONS:
        mine = [c for c in comparisons if c.role == kind and c.arm in known]
        held = [c for c in mine if c.arm in noise and c.verdict == EQUIVALENT]
        missed = [c for c in mine if c.verdict != EQUIVALENT]
        outside = [c for c in missed if c.arm not in noise]
        parts.append(
            f"{kind}: within the margin for {len(held)} of the {sum(c.arm in noise for c in mine)} pairs "
            f"whose error is noise; {len(outside)} of its {len(missed)} misses have a correlated error "
            f"({', '.join(f'{c.arm}: {known[c.arm]:+.2f}' for c in outside) or 'none'})"
        )
        if kind != "carried":  # the lognormal theory's other misses are its fit's: its R over the carried one
            fits = [
                f"{c.arm}: {rows[c.arm][f'{kind}_ratio_mean'] / rows[c.arm]['carried_ratio_mean']:.2g}x"
                for c in missed
                if c.arm in noise
            ]
            parts[-1] += f"; the others' R over the carried R (the fit's share): {', '.join(fits) or 'none'}"
    return (
        "Where and why the predictions miss: both carry the error as noise uncorrelated with the gradient. "
        f"The measured correlation of the weight-gradient noise with the weight gradient is within "
        f"±{UNCORRELATED:g} for {len(noise)} of {len(known)} (family, policy) pairs (the unbiased "
        f"compressors), and from {min(known.values(), default=0):+.2f} to "
        f"{max(known.values(), default=0):+.2f} in all: nearest rounding flushes and shrinks small values "
        "toward zero, so its error partly cancels the gradient and adds to it coherently rather than as "
        f"noise. {'; '.join(parts)}."
    )


def _ln_misses(ratios: dict[str, float | None]) -> dict[str, float]:
    """ln(predicted R / measured R) of each prediction. A ratio of 0 (the compressed weight gradient
    vanished: all noise) or inf (no noise) has no finite ln: that seed leaves the comparison, and the table
    still shows the ratio."""
    measured = ratios["measured"]
    return {
        f"ln_{kind}": math.log(ratios[kind] / measured)
        for kind in PREDICTIONS
        if all(r is not None and 0 < r < math.inf for r in (ratios[kind], measured))
    }


def _pairs(settings: NoiseRatios, per_seed: PerSeed) -> list:
    return [
        prediction_pair(
            f"{row['model']} {row['policy']}: {kind} R / measured R",
            per_seed.values(row, f"ln_{kind}"),
            "measured",
            settings.margin,
            role=kind,
            arm=f"{row['model']} {row['policy']}",
        )
        for row in per_seed.rows()
        for kind in PREDICTIONS
        if per_seed.values(row, f"ln_{kind}")
    ]


def _layer_shares(layers: list[dict], margin: float) -> dict[str, str]:
    """Per prediction: how many layer rows have their predicted R within the margin of the measured, and
    how many of the misses have a measured R within 10 % of 1: noise as large as the signal, where the
    error is (nearly) the gradient itself (e.g. everything flushed), which sums coherently as the signal
    does, not as the uncorrelated noise the carrying assumes."""
    shares = {}
    for kind in PREDICTIONS:
        usable = [
            row
            for row in layers
            if row[f"{kind}_ratio"] and row["measured_ratio"] and 0 < row["measured_ratio"] < math.inf
        ]
        missed = [r for r in usable if abs(math.log(r[f"{kind}_ratio"] / r["measured_ratio"])) > margin]
        coherent = sum(abs(math.log(r["measured_ratio"])) < math.log(1.1) for r in missed)
        shares[kind] = (
            f"{len(usable) - len(missed)} of {len(usable)} layer measurements (of the {len(missed)} missed, "
            f"{coherent} have a measured R within 10 % of 1: noise as large as the signal, where the error "
            "is nearly the gradient itself and sums as the signal does, not as uncorrelated noise)"
        )
    return shares


def noise_ratios(settings: NoiseRatios, runs: dict[str, RunGroup]) -> Result:
    """F0: measured and predicted noise ratios of every family and policy, and whether each prediction
    holds within the margin."""
    groups = [runs[name] for name in settings.named_runs(list(runs))]
    torch.manual_seed(0)
    per_seed, layers = _measure(settings, groups)
    comparisons = compare(_pairs(settings, per_seed))
    findings = []
    shares = _layer_shares(layers, settings.margin)
    for kind in PREDICTIONS:
        mine = [c for c in comparisons if c.role == kind]
        held = [c.arm for c in mine if c.verdict == EQUIVALENT]
        missed = [f"{c.arm} ({math.exp(c.difference):.2g}x)" for c in mine if c.verdict != EQUIVALENT]
        findings.append(
            f"{kind} prediction: within a factor of {math.exp(settings.margin):.3g} of the measured R, "
            f"model-wide, for {len(held)} of {len(mine)} (family, policy) pairs; not shown for "
            f"{', '.join(missed) or 'none'}; per layer, {shares[kind]} within it."
        )
    findings.append(_why_missed(per_seed, comparisons))
    below = defaultdict(set)
    for row in per_seed.rows():
        if row.get("measured_ratio") is not None and row["measured_ratio"] < CRITICAL_RATIO:
            below[row["model"]].add(row["policy"])
    findings.append(
        "Model-wide measured R below sqrt(3) (mean over seeds): "
        + ("; ".join(f"{model}: {', '.join(sorted(p))}" for model, p in below.items()) or "none")
        + "."
    )
    named = {group.name: group for group in groups}
    return Result(
        caption=_caption(settings, named),
        tables={
            "main": Table("Model-wide noise ratio R, measured and predicted", per_seed.rows()),
            "layers": Table("Every layer's noise ratio, per seed and batch", layers, markdown=False),
        },
        comparisons=comparisons,
        findings=findings,
        facts={"margin": settings.margin, "critical": CRITICAL_RATIO, "kinds": list(PREDICTIONS)},
    )


def _caption(settings: NoiseRatios, groups: dict[str, RunGroup]) -> str:
    policies = ", ".join(parse_policy(spec).label for spec in settings.policies)
    return f"""The noise ratio R = ||g_W|| / ||noise in g_W|| of every convolution and linear layer's weight
        gradient (FP4 All the Way, section 4: training stalls below sqrt(3), dotted) under {policies}, on
        the trained models ({training_context(groups)}; eval mode, {settings.batches} test batch(es)):
        measured with the weight-gradient GEMMs of the exact neural gradient and of the compression's
        error (x axis), against its prediction without a GEMM (y axis): "theory" carries the error the
        lognormal theory predicts from the layer's fit, "carried" the error the compression made on the
        neural gradient, each through the energy of the input patches of each convolution group, with
        ||g_W||^2 the compressed gradient's energy less the predicted noise. One panel per family and
        prediction; dashed: a factor of {math.exp(settings.margin):.3g}. Comparisons: per family and policy,
        the ln of the model-wide predicted over measured R against 0, equivalent within
        ±{settings.margin:.3g}."""


# --- F1 and L7 ----------------------------------------------------------------------------------------------
def noise_history(run: Run) -> dict[str, list[tuple[int, float]]]:
    """Per kind of R, (step, model-wide R) of each noise step the run logged."""
    steps: dict[int, list[dict]] = defaultdict(list)
    for record in run.records("noise"):
        steps[record["step"]].append(record)
    history: dict[str, list[tuple[int, float]]] = {kind: [] for kind in KINDS}
    for step, rows in sorted(steps.items()):
        for kind in KINDS:
            ratio = _model_ratio(rows, kind)
            if ratio is not None:
                history[kind].append((step, ratio))
    return history


def _departure(arm: Run, baseline: Run, tolerance: float) -> int | None:
    """The first logged step from which the arm's training loss exceeds the baseline's by more than
    `tolerance` (relative) at every later logged step; None where it never does."""
    arm_loss = {r["step"]: r["loss"] for r in arm.records("step")}
    base_loss = {r["step"]: r["loss"] for r in baseline.records("step")}
    steps = sorted(set(arm_loss) & set(base_loss))
    above = [not arm_loss[s] <= (1 + tolerance) * base_loss[s] for s in steps]  # a NaN loss is above
    for index, step in enumerate(steps):
        if all(above[index:]):
            return step
    return None


def _run_rows(settings: Stalls, models: WithinModels, histories: Histories) -> list[dict]:
    """Per arm and seed: the share of noise steps below the threshold and the first such step for each kind
    of R, the departure step and the accuracy gap to fp32 of its model (points)."""
    rows = []
    for arm in models.arms:
        baseline = models.own[arm.name]
        for seed in sorted(set(arm.seeds) & set(baseline.seeds)):
            run, base = arm.runs[seed], baseline.runs[seed]
            history = histories[arm.name, seed]
            if not history["measured"]:
                raise ValueError(
                    f"experiments.F1: run {arm.name!r} logged no measured noise ratio (set noise_every and "
                    "measure_noise on it)"
                )
            row = {"run": arm.name, "model": arm.config["model"], "label": models.label(arm), "seed": seed}
            for kind, points in history.items():
                below = [step for step, ratio in points if ratio < settings.threshold]
                row[f"{kind}_below"] = len(below) / len(points) if points else None
                row[f"{kind}_crossing"] = below[0] if below else None
            row["measured_median"] = statistics.median(ratio for _, ratio in history["measured"])
            row["departure"] = _departure(run, base, settings.departure)
            row["gap_pt"] = 100 * (run.accuracy - base.accuracy)
            rows.append(row)
    return rows


def trivial_runs(rows: list[dict]) -> set[str]:
    """The runs whose measured R (the median over seeds of each seed's median over its noise steps) lies
    within BY_CONSTRUCTION of 1."""
    medians: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        medians[row["run"]].append(row["measured_median"])
    return {run for run, values in medians.items() if abs(statistics.median(values) - 1) <= BY_CONSTRUCTION}


def _spearman_by_seed(rows: list[dict], share: str) -> dict[int, float]:
    """Per seed, Spearman's correlation over the runs between the accuracy loss and `share` (a row key)."""
    per_seed = {}
    for seed in sorted({row["seed"] for row in rows}):
        mine = [r for r in rows if r["seed"] == seed and r[share] is not None]
        if len(mine) >= 4 and len({r[share] for r in mine}) > 1:  # a constant share ranks nothing
            shares, losses = [r[share] for r in mine], [-r["gap_pt"] for r in mine]
            per_seed[seed] = float(stats.spearmanr(shares, losses).statistic)
    return per_seed


def _correlation_pairs(settings: Stalls, rows: list[dict], scale: str, trivial: set[str]) -> list[Pair]:
    """Per kind of R, per seed: Spearman's correlation over the informative runs (trained at `scale`; runs
    whose R is 1 by construction left out) between the accuracy loss and the share of time below the
    threshold, against `correlation_margin` (F1 decided by the measured R); and, secondary, the measured one
    with those runs in (`trivial`)."""
    informative = [row for row in rows if row["run"] not in trivial]
    pairs = []
    for kind in KINDS:
        pair = correlation_pair(
            f"Spearman(accuracy loss, time with {kind} R < {settings.threshold:.3g}) over the runs",
            _spearman_by_seed(informative, f"{kind}_below"),
            settings.correlation_margin,
            role=SPEARMAN,
            arm=kind,
            scale=scale,
        )
        pairs += deciding("F1", [pair]) if kind == "measured" else [pair]
    if trivial:
        pairs.append(
            correlation_pair(
                f"Spearman(accuracy loss, time with measured R < {settings.threshold:.3g}) over the runs, "
                f"with the {len(trivial)} whose R is 1 by construction",
                _spearman_by_seed(rows, "measured_below"),
                settings.correlation_margin,
                role=SPEARMAN,
                arm="measured, every run",
                scale=scale,
            )
        )
    return pairs


def _threshold_sensitivity(
    settings: Stalls, rows: list[dict], histories: Histories, trivial: set[str]
) -> str:
    """F1's correlation (mean over seeds, informative runs) at each threshold of `settings.sensitivity`."""
    parts = []
    for threshold in sorted({*settings.sensitivity, settings.threshold}):
        shares = []
        for row in rows:
            if row["run"] in trivial:
                continue
            points = histories[row["run"], row["seed"]]["measured"]
            below = sum(ratio < threshold for _, ratio in points) / len(points)
            shares.append(row | {"share": below})
        rhos = list(_spearman_by_seed(shares, "share").values())
        parts.append(f"{threshold:.3g}: " + (f"{sum(rhos) / len(rhos):.2f}" if rhos else "n/a (no ranking)"))
    return (
        "F1 at other thresholds (Spearman's rho between the accuracy loss and the time with measured R below "
        f"the threshold, mean over seeds, informative runs): {', '.join(parts)}."
    )


def _timing(rows: list[dict]) -> str:
    """Where the measured R crossed the threshold against where training departed from fp32."""
    counts: Counter[str] = Counter()
    lags = []
    for row in rows:
        crossed, departed = row["measured_crossing"], row["departure"]
        if crossed is not None and departed is not None:
            counts["crossed, then departed" if departed >= crossed else "departed before crossing"] += 1
            lags.append(departed - crossed)
        else:
            counts[{(True, False): "crossed, never departed", (False, True): "departed, never crossed"}.get(
                (crossed is not None, departed is not None), "neither"
            )] += 1  # fmt: skip
    lag = f"; median lag from crossing to departure {statistics.median(lags):g} steps" if lags else ""
    return (
        f"Timing over {len(rows)} (run, seed) pairs: "
        + ", ".join(f"{name} {count}" for name, count in counts.most_common())
        + lag
        + "."
    )


def _l7(
    settings: Stalls, rows: list[dict], models: WithinModels, outcomes: dict[str, str], trivial: set[str]
):
    """L7: the share of time with the theory's R below the threshold that best separates failing from
    training FP runs on `fit_on`'s runs (ties: the cutoff nearest one half), applied to the other models'."""
    fp = {arm.name for arm in models.arms if isinstance(arm.policy, FloatingPoint)}  # L7 is about FP formats
    left_out = sorted(fp & trivial)
    fp -= trivial
    shares: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row["run"] in fp and row["theory_below"] is not None:
            shares[row["run"]].append(row["theory_below"])
    mean = {run: sum(values) / len(values) for run, values in shares.items()}
    model = {row["run"]: row["model"] for row in rows}
    fit = [run for run in mean if model[run] == settings.fit_on and outcomes[run] != UNDECIDED]
    held = [run for run in mean if model[run] != settings.fit_on]
    arms = {arm.name: arm for arm in models.arms}
    apart = (
        f"; left out as trivial (median measured R within {BY_CONSTRUCTION:g} of 1, as for a gradient "
        f"flushed or clipped nearly whole): {', '.join(models.label(arms[run]) for run in left_out)}"
        if left_out
        else ""
    )
    families = {model[run] for run in held}
    if not fit or len(held) < settings.min_held_out or len(families) < 2:
        why = (
            f"{len(fit)} decided informative {settings.fit_on} FP runs to fix the criterion on and "
            f"{len(held)} informative held-out FP runs of {len(families)} other families; the design needs "
            f"at least {settings.min_held_out} on at least 2{apart}"
        )
        return undecided("L7", why), [], math.nan

    def agreement(cutoff: float) -> int:
        return sum((mean[run] > cutoff) == (outcomes[run] == FAILS) for run in fit)

    cutoff = max(CUTOFFS, key=lambda c: (agreement(c), -abs(c - 0.5)))
    fails = {run for run in held if mean[run] > cutoff}
    pair = held_out_pair(models, held, fails, settings.margin, HELD_OUT)
    fitted = (
        f"; criterion: the theory's R below {settings.threshold:.3g} for more than {cutoff:.0%} of the "
        f"noise steps, fixed on {settings.fit_on} (right for {agreement(cutoff)} of its {len(fit)} decided "
        f"runs), applied to {len(held)} runs of {len(families)} other models{apart}"
    )
    side = _side_by_side(settings, models, held, fails, outcomes)
    if pair is None:
        return undecided("L7", f"the criterion predicts every held-out run alike{fitted}{side}"), [], cutoff
    comparisons = compare(deciding("L7", [pair]))
    return decide("L7", comparisons, fitted + side), comparisons, cutoff


def _side_by_side(
    settings: Stalls, models: WithinModels, held: list[str], fails: set[str], outcomes: dict[str, str]
) -> str:
    """The noise-ratio criterion and A10's flush/clip criterion on the same held-out runs: which of them
    explains the failures training decided, in words."""
    arms = {arm.name: arm for arm in models.arms}
    flush_clip = flush_clip_failures([arms[run] for run in held], models.own, *settings.flush_clip)
    if flush_clip is None:
        return "; A10's flush/clip criterion: not computed (a held-out model's fp32 run has no probe)"
    decided = [run for run in held if outcomes[run] != UNDECIDED]
    failed = [run for run in decided if outcomes[run] == FAILS]

    def right(predicted: set[str]) -> tuple[str, bool]:
        caught = sum(run in predicted for run in failed)
        correct = sum((run in predicted) == (run in failed) for run in decided)
        text = f"right on {correct} of {len(decided)}, {caught} of {len(failed)} failures caught"
        return text, bool(decided) and correct == len(decided)

    (ratio, ratio_all), (flush, flush_all) = right(fails), right({r for r, f in flush_clip.items() if f})
    clipped, flushed = settings.flush_clip
    names = [
        name for name, all_right in (("R", ratio_all), ("the flush/clip criterion", flush_all)) if all_right
    ]
    verdict = " and ".join(names) + " explain" + "s" * (len(names) == 1) if names else "neither explains"
    return (
        f"; side by side on the {len(decided)} held-out runs training decided: R's criterion {ratio}; A10's "
        f"flush/clip criterion (more than {clipped:g} clipped or {flushed:g} flushed) {flush}; 'nothing "
        f"fails' right on {len(decided) - len(failed)}: {verdict} every decided held-out run"
    )


def stalls(settings: Stalls, runs: dict[str, RunGroup]) -> Result:
    """F1: whether time with the noise ratio below sqrt(3) ranks the accuracy lost; L7 on it."""
    models = WithinModels.of_settings(settings, runs, "F1")
    gaps = compare(models.gap_pairs(settings.margin))
    outcomes = {arm: outcome(gap) for arm, gap in by_arm(gaps).items()}
    histories = {
        (group.name, seed): noise_history(run)
        for group in [*models.baselines, *models.arms]
        for seed, run in group.runs.items()
    }
    rows = _run_rows(settings, models, histories)
    scale = "; ".join(dict.fromkeys(group.scale for group in models.arms))
    trivial = trivial_runs(rows)
    correlations = compare(_correlation_pairs(settings, rows, scale, trivial))
    l7, held_out, cutoff = _l7(settings, rows, models, outcomes, trivial)
    groups = {group.name: group for group in [*models.baselines, *models.arms]}
    per_run = PerSeed(("run", "label"), {f"{kind}_below": FRACTION for kind in KINDS} | {"gap_pt": LINEAR})
    for row in rows:
        values = {f"{kind}_below": row[f"{kind}_below"] for kind in KINDS}
        per_run.add(row["seed"], row, **values, gap_pt=row["gap_pt"])
    table = [row | {"outcome": outcomes[row["run"]]} for row in per_run.rows()]
    f1 = decide("F1", correlations)
    table = [row | {"R = 1 by construction": row["run"] in trivial} for row in table]
    return Result(
        caption=_stalls_caption(settings, models, groups),
        tables={
            "main": Table("Time below the threshold and accuracy gap of every run", table),
            "runs": Table("Every run and seed", rows, markdown=False),
            "history": Table(
                "Model-wide R at every noise step", _history_rows(histories, groups), markdown=False
            ),
        },
        comparisons=correlations + held_out + gaps,
        findings=[
            summarise(correlations),
            _threshold_sensitivity(settings, rows, histories, trivial),
            _timing(rows),
            f"L7 on the noise ratio the lognormal fit predicts: {l7.status} ({l7.evidence}).",
        ],
        claims=[f1, l7],
        facts={
            "threshold": settings.threshold,
            "cutoff": cutoff,
            "kinds": list(KINDS),
            "by_construction": sorted(trivial),
        },
    )


def _history_rows(histories: Histories, groups: dict[str, RunGroup]) -> list[dict]:
    """One row per run, seed, kind of R and noise step."""
    rows = []
    for (name, seed), history in histories.items():
        key = {"run": name, "model": groups[name].config["model"], "seed": seed}
        for kind, points in history.items():
            rows += [key | {"kind": kind, "step": step, "ratio": ratio} for step, ratio in points]
    return rows


def _stalls_caption(settings: Stalls, models: WithinModels, groups: dict[str, RunGroup]) -> str:
    return f"""(a) Per run, the share of its noise steps whose model-wide noise ratio R (measured) is below
        {settings.threshold:.3g} (FP4 All the Way's sqrt(3)) against its accuracy gap to fp32 of its model
        (mean over seeds). (b) Model-wide measured R over training for every run (one line per run, mean over
        seeds; dotted: the threshold). {models.caption()}. {training_context(groups)}. A run departs from
        fp32 at the first logged step from which its training loss exceeds fp32's (same seed) by more than
        {settings.departure:.0%} to the end. F1: per seed, Spearman's correlation over the runs between the
        accuracy loss and the time below the threshold, above {settings.correlation_margin:g}
        (superiority). L7: the same with the R the lognormal theory predicts, its cutoff fixed on
        {settings.fit_on} and applied to the other models' runs (held-out runs predicted to train against
        those predicted to fail, superiority beyond ±{settings.margin:g} pt). Runs whose median measured R
        lies within {BY_CONSTRUCTION:g} of 1 (a gradient flushed or clipped nearly whole has R = 1 by
        construction) decide neither (hollow in (a))."""


# --- F2 -----------------------------------------------------------------------------------------------------
def late_switch(settings: LateSwitch, runs: dict[str, RunGroup]) -> Result:
    """F2: one format throughout, with the guard, and switched late, against fp32 and each other."""
    baseline, throughout, guarded, late = (
        runs[name] for name in (settings.baseline, settings.throughout, settings.guarded, settings.late)
    )
    models = WithinModels.of([baseline], [throughout, guarded, late], "experiments.F2.baseline")
    margin, label = settings.margin, models.label
    pairs = [
        *deciding("F2", [accuracy_pair(late, baseline, margin, label)]),
        *deciding("F3", [_recovered(settings, baseline, throughout, late, label(late))]),
        accuracy_pair(late, throughout, margin, label, SWITCH),
        accuracy_pair(throughout, baseline, margin, label),
        accuracy_pair(guarded, baseline, margin, label),
        accuracy_pair(guarded, throughout, margin, label, SWITCH),
    ]
    comparisons = compare(pairs)
    regime = _regime(settings, throughout, late)
    rows = []
    for group in (baseline, throughout, guarded, late):
        bits = {seed: run.summary.get("switches", {}).get("average_bits") for seed, run in group.runs.items()}
        switched = [
            min(run.summary["switches"]["switched"].values(), default=None)
            for run in group.runs.values()
            if "switches" in run.summary
        ]
        rows.append(
            run_row(group)
            | {
                "label": label(group),
                "average_bits": _mean([b for b in bits.values() if b is not None]),
                "first_switch_step": _mean([s for s in switched if s is not None]),
            }
        )
    groups = {group.name: group for group in (baseline, throughout, guarded, late)}
    return Result(
        caption=_late_caption(settings, groups, guarded, late),
        tables={"main": Table("Accuracy and average gradient bits of each arm", rows)},
        comparisons=comparisons,
        findings=[summarise(comparisons)],
        claims=[_f2(comparisons, regime, guarded.name), decide("F3", comparisons)],
        facts={"regime": regime},
    )


def _recovered(
    settings: LateSwitch, baseline: RunGroup, throughout: RunGroup, late: RunGroup, name: str
) -> Pair:
    """F3's comparison: per seed, the share of the gap to fp32 that the late switch recovers, (late -
    throughout) / (fp32 - throughout), against none (seeds without a gap left out)."""
    shares = {}
    for seed in sorted(set(baseline.seeds) & set(throughout.seeds) & set(late.seeds)):
        gap = baseline.accuracy[seed] - throughout.accuracy[seed]
        if gap > 0:
            shares[seed] = (late.accuracy[seed] - throughout.accuracy[seed]) / gap
    return one_sample(
        f"{name}: share of the gap to fp32 recovered", shares, 0.0, "none", margin=settings.fraction_margin,
        higher_is_better=None, scale=late.scale,
    )  # fmt: skip


def _regime(settings: LateSwitch, throughout: RunGroup, late: RunGroup) -> str | None:
    """Why F2 is not tested in its regime (None where it is): FP4 All the Way's quantization-aware finetuning
    assumes the format's measured R crosses sqrt(3) late in training, after `late_from` of its steps."""
    crossings, steps = [], []
    for run in throughout.runs.values():
        points = noise_history(run)["measured"]
        below = [step for step, ratio in points if ratio < CRITICAL_RATIO]
        crossings.append(below[0] if below else None)
        steps.append(run.summary.get("steps"))
    if not crossings or None in steps:
        return f"{throughout.label} logged no measured noise ratio or no step count: its regime is unknown"
    total = max(steps)
    crossed = [c for c in crossings if c is not None]
    if len(crossed) < len(crossings):
        return (
            f"{throughout.label}'s measured R stays above sqrt(3) on {len(crossings) - len(crossed)} of "
            f"{len(crossings)} seeds: there is no crossing to switch after"
        )
    median = statistics.median(crossed)
    if median >= settings.late_from * total:
        return None
    switch = late.config["compression"]["switch_step"]
    return (
        f"{throughout.label}'s measured R falls below sqrt(3) at step {median:g} of {total} (median over "
        f"seeds), before {settings.late_from:.0%} of training, and the late switch comes at step {switch}: "
        "the format fails early, where switching late cannot undo what was lost"
    )


def _f2(comparisons: list, regime: str | None, guarded: str) -> Decision:
    """F2 decided by its deciding comparison where the format's R crosses sqrt(3) late; else recorded as
    not tested in its regime, with the guard's comparison with fp32 as the test of the principle."""
    decision = decide("F2", comparisons)
    if regime is None:
        return decision
    guard = next(c for c in comparisons if c.arm == guarded and c.role == GAP)
    return replace(
        decision,
        status=OUT_OF_REGIME,
        evidence=f"{regime}. At this configuration: {decision.evidence}. The principle (switch to high "
        f"precision where R crosses sqrt(3)) is tested by the guard: {guard.statement}",
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


_GUARD_RATIO_WORDS = {"measured": "measured", "carried": "predicted", "theory": "lognormal-theory"}


def _late_caption(
    settings: LateSwitch, groups: dict[str, RunGroup], guarded: RunGroup, late: RunGroup
) -> str:
    guard = guarded.config["compression"]
    ratio = _GUARD_RATIO_WORDS[guard.get("guard_on") or "carried"]  # runs before the key read the carried R
    return f"""Final test accuracy of {groups[settings.throughout].label} throughout training, with the
        precision guard (a layer goes to fp32 for the rest of training once its {ratio} noise ratio stays
        below {guard["guard"]:g} at {guard["guard_patience"]} noise steps in a row, one every
        {guard["noise_every"]} steps) and switched to fp32 in every layer from step
        {late.config["compression"]["switch_step"]} (the late switch), against fp32; with each arm's average
        bits per gradient element over training; beside them, the paired differences the verdicts decide
        (each seed's, their mean and 95 % interval, the margin of each test shaded).
        {training_context(groups)}. F2 (FP4 All the Way, section 5):
        the late switch non-inferior to fp32 within {settings.margin:g} pt, where the format's measured R
        first falls below sqrt(3) after {settings.late_from:.0%} of training (its regime; else recorded as
        not tested there, with the guard against fp32 as the test of the principle); F3 (NVIDIA, appendix
        D): the share of the gap to fp32 the late switch recovers, (late - throughout) / (fp32 -
        throughout) per seed, equivalent to none within ±{settings.fraction_margin:g}."""
