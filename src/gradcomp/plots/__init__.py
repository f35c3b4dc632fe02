"""One function per experiment figure, registered by experiment ID (A1..A10, B1..B4, X1..X3).

Every experiment writes, under its output folder, ``<ID>_<slug>.png`` and ``.pdf`` (the figure),
``.csv`` and ``.md`` (the numbers behind it) and ``.json`` (its headline numbers, gathered into
SUMMARY.md). A figure function receives the experiment's inputs and returns the headline numbers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXTENSIONS = ("png", "pdf", "csv", "md", "json")
_MODULES = ("distributions", "fp", "sparsity", "statquant", "beyond")


@dataclass
class FigureInputs:
    """What an experiment reads: training runs by name, its config section, and where to write."""

    runs: Mapping[str, Path]
    params: Mapping[str, Any]
    out_dir: Path
    prefix: str  # "<ID>_<slug>": every output file is prefix + extension
    notes: list[str] = field(default_factory=list)  # what this scale cannot show; goes into the caption

    def path(self, extension: str) -> Path:
        return self.out_dir / f"{self.prefix}.{extension}"


@dataclass(frozen=True)
class Experiment:
    id: str
    slug: str
    title: str
    caption: str  # what the figure shows and how it was made
    make: Callable[[FigureInputs], dict[str, Any]]
    uses_runs: bool = True

    @property
    def prefix(self) -> str:
        return f"{self.id}_{self.slug}"

    def outputs(self) -> list[str]:
        return [f"{self.prefix}.{extension}" for extension in EXTENSIONS]


EXPERIMENTS: dict[str, Experiment] = {}


def experiment(id: str, slug: str, title: str, caption: str, uses_runs: bool = True):
    """Register a figure function under an experiment ID."""

    def wrap(make: Callable[[FigureInputs], dict[str, Any]]):
        EXPERIMENTS[id] = Experiment(id, slug, title, " ".join(caption.split()), make, uses_runs)
        return make

    return wrap


def experiments() -> dict[str, Experiment]:
    """The registry, with every figure module imported (they register on import)."""
    for module in _MODULES:
        importlib.import_module(f"gradcomp.plots.{module}")
    return dict(sorted(EXPERIMENTS.items(), key=lambda item: (item[0][0], int(item[0][1:]))))
