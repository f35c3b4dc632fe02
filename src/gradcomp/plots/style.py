"""Shared figure style and writers: seaborn, readable fonts, PNG + PDF, tables as CSV + Markdown."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import seaborn as sns

from gradcomp.analysis.tables import write_table
from gradcomp.plots import FigureInputs

sns.set_theme(context="paper", style="whitegrid", font_scale=1.25)


def subplots(ncols: int = 1, nrows: int = 1, width: float = 4.8, height: float = 3.6):
    figure, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return figure, axes


def save(inputs: FigureInputs, figure, rows: Sequence[dict], title: str, headline: dict[str, Any]) -> dict:
    """Write the figure (PNG, PDF), its numbers (CSV, MD) and the headline numbers (JSON)."""
    figure.suptitle(title)
    figure.tight_layout()
    inputs.out_dir.mkdir(parents=True, exist_ok=True)
    figure.savefig(inputs.path("png"), dpi=150)
    figure.savefig(inputs.path("pdf"), metadata={"CreationDate": None})  # no timestamp: reruns are equal
    plt.close(figure)
    write_table(rows, inputs.path("csv"), title)
    record = {"title": title, "headline": headline, "notes": inputs.notes}
    inputs.path("json").write_text(json.dumps(record, indent=2, default=_plain) + "\n")
    return headline


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def finite_or_none(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
