"""F1: reading a run's noise-ratio history and loss curve, and the decisions (gradcomp.analysis.failure)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from gradcomp.analysis import failure
from gradcomp.analysis.claims import deciding
from gradcomp.analysis.runs import Run, RunGroup
from gradcomp.analysis.verdicts import compare
from gradcomp.experiments import LateSwitch, Stalls


def _run(tmp_path, name: str, records: list[dict]) -> Run:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return Run(name, 0, folder, {}, {})


def _noise(step: int, layer: str, signal: float, noise: float) -> dict:
    parts = {f"{kind}_{part}": value for kind in failure.KINDS for part, value in
             (("signal", signal), ("noise", noise))}  # fmt: skip
    return {"kind": "noise", "step": step, "layer": layer, **parts}


def test_the_model_wide_ratio_sums_energies_over_layers(tmp_path):
    run = _run(tmp_path, "a", [_noise(0, "x", 4.0, 1.0), _noise(0, "y", 0.0, 3.0), _noise(10, "x", 9.0, 1.0)])
    history = failure.noise_history(run)
    assert history["measured"] == [(0, 1.0), (10, 3.0)]  # sqrt(4 / 4), sqrt(9 / 1)


def test_departure_is_the_first_step_from_which_the_loss_stays_above(tmp_path):
    def losses(values):
        return [{"kind": "step", "step": 10 * i, "loss": v} for i, v in enumerate(values)]

    base = _run(tmp_path, "base", losses([2.0, 1.5, 1.0, 0.8, 0.7]))
    assert failure._departure(_run(tmp_path, "a", losses([2.0, 1.8, 1.0, 1.0, 0.9])), base, 0.1) == 30
    assert failure._departure(_run(tmp_path, "b", losses([2.0, 1.5, 1.0, 0.8, 0.7])), base, 0.1) is None
    assert (
        failure._departure(_run(tmp_path, "c", losses([2.0, 1.5, math.nan, math.nan, math.nan])), base, 0.1)
        == 20
    )


def test_f1_is_decided_by_the_per_seed_rank_correlation_of_loss_with_time_below():
    rows = [
        {
            "seed": seed,
            "run": f"r{i}",
            "gap_pt": -10.0 * i + seed,
            "measured_median": 3.0 - 0.3 * i,
            **{f"{k}_below": i / 5 for k in failure.KINDS},
        }
        for seed in range(3)
        for i in range(6)
    ]
    settings = Stalls(runs=("r0",), baseline=("b",))
    comparisons = compare(failure._correlation_pairs(settings, rows, "a scale", failure.trivial_runs(rows)))
    deciding = [c for c in comparisons if c.family == "F1"]
    assert len(deciding) == 1 and deciding[0].difference == pytest.approx(1.0)
    assert deciding[0].verdict == "better"  # every seed ranks perfectly: above the 0.5 margin
    assert {c.arm for c in comparisons} == set(failure.KINDS)


def test_runs_whose_r_is_one_by_construction_never_decide_f1():
    """A run compressed to (nearly) zero has R = 1 and loses everything: it would make any criterion look
    right. Left out of F1's deciding correlation (which then sees no ranking), shown in a secondary one."""
    rows = [
        {"seed": seed, "run": f"r{i}", "gap_pt": float(seed - i % 2), "measured_median": 4.0,
         **{f"{k}_below": (i * 7 % 5) / 5 for k in failure.KINDS}}
        for seed in range(3) for i in range(5)
    ] + [
        {"seed": seed, "run": f"zero{i}", "gap_pt": -60.0, "measured_median": 1.0 + 0.01 * i,
         **{f"{k}_below": 1.0 for k in failure.KINDS}}
        for seed in range(3) for i in range(3)
    ]  # fmt: skip
    assert failure.trivial_runs(rows) == {"zero0", "zero1", "zero2"}
    trivial = failure.trivial_runs(rows)
    comparisons = compare(
        failure._correlation_pairs(Stalls(runs=("r0",), baseline=("b",)), rows, "s", trivial)
    )
    (f1,) = [c for c in comparisons if c.family == "F1"]
    (everything,) = [c for c in comparisons if c.arm == "measured, every run"]
    assert f1.verdict != "better" and everything.verdict == "better" and f1.difference < everything.difference


def test_f1_states_its_correlation_at_other_thresholds(tmp_path):
    history = [(step, 0.5 + 0.25 * step) for step in range(8)]  # R from 0.5 up to 2.25
    rows = [{"seed": 0, "run": f"r{i}", "gap_pt": -float(i), "measured_median": 2.0} for i in range(4)]
    histories = {("r" + str(i), 0): {"measured": history[: 8 - i]} for i in range(4)}  # more time below
    settings = Stalls(runs=("r0",), baseline=("b",))
    text = failure._threshold_sensitivity(settings, rows, histories, failure.trivial_runs(rows))
    assert text.startswith("F1 at other thresholds") and "1.2: 1.00" in text and "1.73: 1.00" in text
    assert "3: n/a (no ranking)" in text  # every run below 3 all the time


def test_timing_counts_where_departure_follows_crossing():
    rows = [
        {"measured_crossing": 10, "departure": 30},
        {"measured_crossing": 40, "departure": 20},
        {"measured_crossing": None, "departure": None},
        {"measured_crossing": 10, "departure": None},
    ]
    text = failure._timing(rows)
    assert "crossed, then departed 1" in text and "departed before crossing 1" in text
    assert "neither 1" in text and "crossed, never departed 1" in text and "median lag" in text


def test_f0_leaves_ratios_without_a_finite_log_out_of_its_comparisons():
    ratios = {"theory": 0.0, "carried": 2.0, "measured": 1.0}
    assert failure._ln_misses(ratios) == {"ln_carried": pytest.approx(math.log(2.0))}
    assert failure._ln_misses({"theory": 2.0, "carried": None, "measured": math.inf}) == {}


def test_the_error_correlation_reads_the_cross_term_from_the_measured_energies():
    """||g + e||^2 = ||g||^2 + ||e||^2 + 2 <g, e>, summed over layers: a flushed gradient (e = -g) has
    correlation -1, uncorrelated noise 0."""

    def row(exact, noise, cross):
        return {
            "compressed_signal": exact + noise + 2 * cross,
            "measured_signal": exact,
            "measured_noise": noise,
        }

    assert failure._error_correlation([row(4.0, 4.0, -4.0)]) == pytest.approx(-1.0)
    assert failure._error_correlation([row(4.0, 1.0, 0.0), row(1.0, 4.0, 0.0)]) == pytest.approx(0.0)
    assert failure._error_correlation([row(1.0, 1.0, 0.5), row(1.0, 1.0, -0.5)]) == pytest.approx(0.0)
    assert failure._error_correlation([row(1.0, 0.0, 0.0)]) is None
    assert failure._error_correlation([{**row(1.0, 1.0, 0.0), "measured_noise": None}]) is None


def _group(tmp_path, name: str, ratios: dict[int, list[float]], accuracy: dict[int, float]) -> RunGroup:
    """A run of FP4 [1,3,0] (switched to fp32 at step 64) at each seed, its measured R at noise steps every
    10 steps, 78 steps long."""
    runs = {}
    for seed, values in ratios.items():
        folder = tmp_path / f"{name}{seed}"
        folder.mkdir()
        records = [_noise(10 * i, "l", signal=r * r, noise=1.0) for i, r in enumerate(values)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        config = {"compression": {"policy": "fp:format=e3m0", "switch_step": 64}, "model": "resnet18",
                  "dataset": "fashion-mnist", "epochs": 1, "batch_size": 64}  # fmt: skip
        summary = {"steps": 78, "final_test_accuracy": accuracy[seed]}
        runs[seed] = Run(name, seed, folder, config, summary)
    return RunGroup(name, runs)


def test_f2_outside_its_regime_says_so_and_f3_is_the_share_of_the_gap_recovered(tmp_path):
    """FP4 All the Way's late switch assumes R crosses sqrt(3) late: a format below it from the first noise
    step is not its regime. F3 compares the share of the gap recovered, per seed, with none."""
    early = {seed: [1.0] * 8 for seed in range(3)}
    late_crossing = {seed: [3.0] * 5 + [1.0] * 3 for seed in range(3)}
    fp32 = {0: 0.80, 1: 0.81, 2: 0.82}
    throughout = _group(tmp_path, "t", early, {0: 0.60, 1: 0.61, 2: 0.62})
    late = _group(tmp_path, "l", early, {0: 0.62, 1: 0.63, 2: 0.64})
    settings = LateSwitch(baseline="b", throughout="t", guarded="g", late="l")
    why = failure._regime(settings, throughout, late)
    assert "falls below sqrt(3) at step 0 of 78" in why and "late switch comes at step 64" in why
    assert failure._regime(settings, _group(tmp_path, "t2", late_crossing, fp32), late) is None
    (share,) = compare(deciding("F3", [failure._recovered(settings, _group(tmp_path, "b", early, fp32),
                                                          throughout, late, "late")]))  # fmt: skip
    assert share.difference == pytest.approx(0.1) and share.seeds == 3 and share.margin == 0.2
    assert share.verdict == "equivalent"  # a tenth of the gap, on every seed: within ±0.2 of none


def test_l7_sets_the_noise_ratio_beside_a10s_flush_clip_criterion_on_the_same_runs(monkeypatch):
    """Which criterion explains the held-out failures, in plain words: here R catches both, flush/clip one."""

    models = SimpleNamespace(arms=[SimpleNamespace(name=name) for name in "abcd"], own={})

    monkeypatch.setattr(failure, "flush_clip_failures", lambda arms, own, clipped, flushed: {
        "a": True, "b": False, "c": False, "d": False})  # fmt: skip
    outcomes = {"a": "fails", "b": "fails", "c": "trains", "d": "undecided"}
    settings = Stalls(runs=("a",), baseline=("x",))
    text = failure._side_by_side(settings, models, ["a", "b", "c", "d"], {"a", "b"}, outcomes)
    assert "R's criterion right on 3 of 3, 2 of 2 failures caught" in text
    assert "flush/clip criterion (more than 0.01 clipped or 0.99 flushed) right on 2 of 3, 1 of 2" in text
    assert text.endswith("'nothing fails' right on 1: R explains every decided held-out run")
