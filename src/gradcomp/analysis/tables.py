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


def write_table(rows: Sequence[dict], csv_path: Path | str, title: str = "") -> tuple[Path, Path]:
    """Write the rows to `csv_path` and a Markdown copy (with an optional title) beside it, suffix .md."""
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    md_path = csv_path.with_suffix(".md")
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    md_path.write_text((f"## {title}\n\n" if title else "") + to_markdown(rows))
    return csv_path, md_path
