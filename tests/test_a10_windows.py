"""A10: the windows of single global scales (the element criterion cannot close one, the every-layer
criterion closes exactly where the layers span more binades than the format holds), and the interpretation:
agreement next to "nothing fails", thresholds fixed on one model and tested on another, MSE ranking."""

import pytest
import torch

from gradcomp.analysis import fp_failures as fp
from gradcomp.analysis.verdicts import Pair, compare
from gradcomp.formats import parse_format

CRITERION = fp._Criterion(max_clipped=0.01, max_flushed=0.99)
SCALES = torch.arange(-40, 41, dtype=torch.float64)


def layers(mu2: list[float], sigma2: list[float]) -> fp._Layers:
    names = [f"layer{i}" for i in range(len(mu2))]
    mu2_, sigma2_ = torch.tensor(mu2).double(), torch.tensor(sigma2).double()
    return fp._Layers(names, mu2_, sigma2_, torch.ones(len(mu2)).double(), torch.exp2(mu2_ + 4 * sigma2_))


def windows(mine: fp._Layers, fmt: str) -> dict:
    return fp._windows_of(SCALES, mine.totals(mine.predict(parse_format(fmt), SCALES[:, None])), CRITERION)


def test_every_layer_window_closes_where_the_spread_exceeds_the_range():
    fmt = parse_format("e4m1")
    narrow, wide = layers([-10.0, -6.0], [1.5, 1.5]), layers([-20.0, 0.0], [1.5, 1.5])
    assert narrow.spread(CRITERION) < fp._range(fmt) < wide.spread(CRITERION)
    assert windows(narrow, "e4m1")["every_layer_window_low"] is not None
    closed = windows(wide, "e4m1")
    assert closed["every_layer_window_low"] is None
    assert closed["element_window_low"] is not None  # the element criterion still finds one


def test_one_layer_window_width_is_range_minus_spread():
    mine, fmt = layers([-8.0], [2.0]), parse_format("e4m3")
    found = windows(mine, "e4m3")
    width = found["every_layer_window_high"] - found["every_layer_window_low"]
    # integer scales inside a continuous window of width range - spread
    assert abs(width - (fp._range(fmt) - mine.spread(CRITERION))) <= 1.0
    assert found["every_layer_window_low"] == found["element_window_low"]  # one layer: the scopes agree


def _row(model: str, measured: str, clipped: float, mse: float = 0.1, gap: float = 0.0) -> dict:
    prediction = {
        "predicted_clipped": clipped,
        "predicted_flushed": 0.0,
        "predicted_worst_layer_clipped": clipped,
        "predicted_worst_layer_flushed": 0.0,
    }
    return {
        "model": model,
        "label": f"{model} {clipped}",
        "measured": measured,
        "prediction": prediction,
        "predicted_relative_mse": mse,
        "gap_pt_mean": gap,
        "gap_pt_n": 3,
    }


def test_thresholds_fitted_on_one_model_are_tested_against_nothing_fails_on_the_others():
    settings = fp.FailurePairs(
        baselines=("a",), pairs=(), clipped_grid=(0.05, 0.2), flushed_grid=(0.99,), max_clipped=0.05
    )
    # model a: clipping above 0.1 fails; b's runs fail the same way, one undecided
    rows = [
        _row("a", "fails", 0.3),
        _row("a", "trains", 0.1),
        _row("a", "trains", 0.0),
        _row("b", "fails", 0.5),
        _row("b", "fails", 0.4),
        _row("b", "fails", 0.25),
        _row("b", "fails", 0.3),
        _row("b", "fails", 0.6),
        _row("b", "fails", 0.35),
        _row("b", "trains", 0.0),
        _row("b", "undecided", 0.5),
    ]
    best, test = fp._fit_and_test(settings, rows, "a")
    assert (best.max_clipped, best.scope) == (0.2, "element")  # 0.05 calls a's 0.1 run a failure
    assert test["fit_agree"] == (3, 2, 3)
    assert (test["right"], test["trivial"], test["decided"]) == (7, 1, 7)  # the undecided run is left out
    assert (test["only_criterion"], test["only_trivial"]) == (6, 0)
    assert test["p"] == pytest.approx(2 * 0.5**6)
    # the MSE rule's held-out test: the runs predicted to train against those predicted to fail, paired by
    # seed, a secondary comparison (claim L7 is F1's, on the noise ratio)
    trains, fails = {0: 0.80, 1: 0.79, 2: 0.81}, {0: 0.60, 1: 0.62, 2: 0.58}
    held_out = compare([Pair("train", "fail", trains, fails, margin=1.0)])
    finding = fp._held_out_finding(held_out, best, "a")
    assert held_out[0].verdict == "better" and held_out[0].family == "" and "fitted on a" in finding
    assert "every held-out run alike" in fp._held_out_finding([], best, "a")
    sensitivity = {(r["scope"], r["max_clipped"]): r["agree"] for r in fp._sensitivity(settings, rows)}
    assert sensitivity["element", 0.2] == 10 and sensitivity["element", 0.05] == 9


def test_mse_ranking_is_stated_plainly():
    rows = [
        _row("a", "trains", 0.0, mse=m, gap=-g) for m, g in [(1, 0.1), (2, 0.5), (3, 0.2), (4, 0.3), (5, 0.4)]
    ]
    sentence = fp._ranking_finding(rows)
    assert "over the runs that train (not worse than fp32) it does not rank the accuracy loss" in sentence
    rows = [_row("a", "trains", 0.0, mse=m, gap=-m) for m in range(1, 9)]
    assert "it ranks the accuracy loss (Spearman +1.00" in fp._ranking_finding(rows)
