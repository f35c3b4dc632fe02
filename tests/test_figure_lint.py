"""The figure lint: each check fires on a figure built to fail it and stays quiet on a clean one, and every
committed figure passes it (redrawn from its JSON as `gradcomp draw` does)."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from gradcomp.analysis.tables import Record
from gradcomp.experiments import experiments
from gradcomp.plots.lint import lint
from gradcomp.plots.style import subplots, titled

COMMITTED = sorted((Path(__file__).resolve().parents[1] / "figures").glob("*/*.json"))


def _checks(figure) -> list[str]:
    checks = [defect.check for defect in lint(figure)]
    plt.close(figure)
    return checks


def _clean():
    figure, axes = subplots(ncols=2)
    axes[0][0].errorbar([1, 2, 3], [0.5, 0.6, 0.7], yerr=0.05, fmt="o", label="FP6 [1,4,1]")
    axes[0][0].axhline(0.6, color="k", label="fp32")
    axes[0][0].legend()
    axes[0][1].plot(np.linspace(-50, 20, 200), np.exp(-(np.linspace(-50, 20, 200) ** 2)))
    axes[0][1].set_xlim(-5, 5)  # a curve drawn over a wider grid than shown is cut, not lost
    return titled(figure, "FP6 against fp32")


def test_a_clean_figure_passes():
    assert _checks(_clean()) == []


def test_overprinted_tick_labels_and_annotations():
    figure, axes = subplots()
    ax = axes[0][0]
    ax.plot([0, 1, 2], [0, 1, 2], "o")
    ax.set_xticks([0, 0.05, 2], ["a long category name", "another long name", "c"])
    assert "text overlaps" in _checks(figure)
    figure, axes = subplots()
    axes[0][0].plot([0, 1], [0, 1], "o")
    axes[0][0].annotate("prune 0.85", (0.5, 0.5))
    axes[0][0].annotate("prune 0.85", (0.51, 0.5))
    assert _checks(figure).count("text overlaps") == 1


def test_rotated_labels_are_measured_as_rotated():
    """Long labels at 30 degrees whose upright boxes would overlap, although the text does not."""
    figure, axes = subplots(width=8)
    axes[0][0].plot(range(6), range(6), "o")
    axes[0][0].set_xticks(
        range(6), [f"resnet18: FP6 [1,4,1] global 2^{i}" for i in range(6)], rotation=30, ha="right"
    )
    assert "text overlaps" not in _checks(figure)


def test_text_leaving_the_figure():
    figure, axes = subplots()
    axes[0][0].plot([0, 1], [0, 1], "o")
    axes[0][0].text(1.5, 0.5, "a label past the edge", transform=axes[0][0].transAxes)
    assert "leaves the figure" in _checks(figure)


def test_a_legend_entry_twice():
    figure, axes = subplots()
    axes[0][0].plot([0, 1], [0, 1], label="fp32")
    axes[0][0].plot([0, 1], [1, 0], label="fp32")
    axes[0][0].legend()
    assert _checks(figure) == ["legend entry twice"]


def test_an_axis_beyond_its_data_and_data_off_the_axis():
    figure, axes = subplots()
    axes[0][0].scatter([1, 2, 3], [1, 2, 3])
    axes[0][0].set(yscale="log", ylim=(1e-3, 1e3))
    assert "axis beyond its data" in _checks(figure)
    figure, axes = subplots()
    axes[0][0].errorbar([1, 2], [0.5, 0.6], yerr=0.3, fmt="o")
    axes[0][0].set_ylim(0.4, 0.7)  # the error bars leave the axis
    assert "data off the axis" in _checks(figure)
    figure, axes = subplots()
    axes[0][0].plot([1, 2], [0.5, 0.6], "o")
    axes[0][0].axhspan(0.3, 0.9, alpha=0.1)  # a baseline's interval cut off
    axes[0][0].set_ylim(0.4, 0.7)
    assert "data off the axis" in _checks(figure)


def test_categories_on_a_numeric_axis_and_a_lone_tick():
    figure, axes = subplots()
    axes[0][0].plot([1, 2, 3], [1, 2, 3], "o")
    axes[0][0].set_xticks([1, 2, 3], ["1", "2", "per-layer"])
    assert "categories on a numeric axis" in _checks(figure)
    figure, axes = subplots()
    axes[0][0].plot([1, 2, 3], [1, 2, 3], "o")
    axes[0][0].set(xscale="log")
    axes[0][0].set_xticks([1, 2, 3], ["a", "b", "c"])
    assert "categories on a numeric axis" in _checks(figure)
    figure, axes = subplots()
    axes[0][0].plot([4.8, 4.9, 5.0], [1, 2, 3], "o")
    axes[0][0].set_xticks([5])
    assert "one tick on a numeric axis" in _checks(figure)


def test_a_title_naming_what_is_not_drawn():
    figure, axes = subplots()
    axes[0][0].plot([0, 1], [0, 1], label="BHQ")
    axes[0][0].legend()
    assert _checks(titled(figure, "QAT with PTQ, PSQ, BHQ gradients")) == ["named but not drawn"]
    figure, axes = subplots()
    axes[0][0].plot([0, 1], [0, 1], label="luq4")  # a name begins a drawn word, in any case
    axes[0][0].legend()
    assert _checks(titled(figure, "LUQ gradients")) == []


@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_every_committed_figure_passes(path):
    record = Record.load(path)
    np.random.seed(0)
    figure = titled(experiments()[record.id].draw(record), record.title)
    defects = lint(figure)
    plt.close(figure)
    assert not defects, "\n".join(map(str, defects))
