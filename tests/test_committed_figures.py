"""Every committed figure is its committed numbers drawn: redrawing each experiment's JSON gives the same
PNG and PDF, byte for byte (the drawing code, its style and the caption's text may not drift from what the
figures show)."""

import shutil
from pathlib import Path

import pytest

from gradcomp import cli

ROOT = Path(__file__).resolve().parents[1]
DRAWN = sorted(path for path in (ROOT / "figures").glob("*/*.json") if path.with_suffix(".png").exists())


def test_every_configurations_figures_are_checked():
    assert {path.parent.name for path in DRAWN} == {"default", "converged", "failure"}


@pytest.mark.parametrize("numbers", DRAWN, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_redrawing_a_committed_figure_gives_its_bytes(numbers, tmp_path):
    copy = tmp_path / numbers.name
    shutil.copy(numbers, copy)
    assert cli.main(["draw", str(copy)]) == 0  # as the pipeline's draw rule calls it
    for extension in (".png", ".pdf"):
        drawn, committed = copy.with_suffix(extension), numbers.with_suffix(extension)
        assert drawn.read_bytes() == committed.read_bytes(), extension
