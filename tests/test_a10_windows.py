"""A10's windows of single global scales: the element criterion cannot close one, the every-layer criterion
closes exactly where the layers span more binades than the format holds."""

import torch

from gradcomp.analysis.fp import _Layers, _range, _windows_of
from gradcomp.experiments import FailurePairs
from gradcomp.formats import parse_format

SETTINGS = FailurePairs(baselines=("baseline",), pairs=())
SCALES = torch.arange(-40, 41, dtype=torch.float64)


def layers(mu2: list[float], sigma2: list[float]) -> _Layers:
    names = [f"layer{i}" for i in range(len(mu2))]
    mu2_, sigma2_ = torch.tensor(mu2).double(), torch.tensor(sigma2).double()
    return _Layers(names, mu2_, sigma2_, torch.ones(len(mu2)).double())


def windows(mine: _Layers, fmt: str) -> dict:
    return _windows_of(SCALES, mine.totals(mine.predict(parse_format(fmt), SCALES[:, None])), SETTINGS)


def test_every_layer_window_closes_where_the_spread_exceeds_the_range():
    fmt = parse_format("e4m1")
    narrow, wide = layers([-10.0, -6.0], [1.5, 1.5]), layers([-20.0, 0.0], [1.5, 1.5])
    assert narrow.spread(SETTINGS) < _range(fmt) < wide.spread(SETTINGS)
    assert windows(narrow, "e4m1")["every_layer_window_low"] is not None
    closed = windows(wide, "e4m1")
    assert closed["every_layer_window_low"] is None
    assert closed["element_window_low"] is not None  # the element criterion still finds one


def test_one_layer_window_width_is_range_minus_spread():
    mine, fmt = layers([-8.0], [2.0]), parse_format("e4m3")
    found = windows(mine, "e4m3")
    width = found["every_layer_window_high"] - found["every_layer_window_low"]
    # integer scales inside a continuous window of width range - spread
    assert abs(width - (_range(fmt) - mine.spread(SETTINGS))) <= 1.0
    assert found["every_layer_window_low"] == found["element_window_low"]  # one layer: the scopes agree
