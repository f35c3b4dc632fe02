"""Writing result tables as CSV (for machines) and Markdown (for readers) side by side."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def to_markdown(rows: Sequence[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(row[key]) for key in header) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_table(rows: Sequence[dict], stem: Path | str, title: str = "") -> tuple[Path, Path]:
    """Write `stem`.csv and `stem`.md (with an optional title line); returns both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = stem.with_suffix(".csv"), stem.with_suffix(".md")
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    md_path.write_text((f"## {title}\n\n" if title else "") + to_markdown(rows))
    return csv_path, md_path
