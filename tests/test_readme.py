"""The README's Python examples run as written, each in a fresh interpreter."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _python_blocks() -> dict[str, str]:
    """Each ```python block of the README, keyed by the section it sits in."""
    blocks = {}
    for section in re.split(r"^## ", README, flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0]
        for index, code in enumerate(re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)):
            blocks[f"{title} #{index}"] = code
    return blocks


def test_the_readme_has_the_examples():
    assert any(key.startswith("Using the ops") for key in _python_blocks())
    assert any(key.startswith("Compressed gradients in your own training loop") for key in _python_blocks())


@pytest.mark.parametrize("name", sorted(_python_blocks()))
def test_readme_example_runs(name, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _python_blocks()[name]], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]
    if name.startswith("Compressed gradients"):
        logged = [float(x) for x in re.findall(r"gradient sparsity ([0-9.]+)", result.stderr)]
        assert len(logged) == 2 and all(0.5 < x <= 1 for x in logged), result.stderr
        assert result.stderr.count("threshold") == 3
