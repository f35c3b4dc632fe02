"""F1: reading a run's noise-ratio history and loss curve, and the decisions (gradcomp.analysis.failure)."""

from __future__ import annotations

import json
import math

import pytest

from gradcomp.analysis import failure
from gradcomp.analysis.runs import Run
from gradcomp.analysis.verdicts import compare
from gradcomp.experiments import Stalls


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
            **{f"{k}_below": i / 5 for k in failure.KINDS},
        }
        for seed in range(3)
        for i in range(6)
    ]
    settings = Stalls(runs=("r0",), baseline=("b",))
    comparisons = compare(failure._correlation_pairs(settings, rows, "a scale"))
    deciding = [c for c in comparisons if c.family == "F1"]
    assert len(deciding) == 1 and deciding[0].difference == pytest.approx(1.0)
    assert deciding[0].verdict == "better"  # every seed ranks perfectly: above the 0.5 margin
    assert {c.arm for c in comparisons} == set(failure.KINDS)


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
