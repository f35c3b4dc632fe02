"""An experiment's numbers (`Result`) and how they are written: JSON (everything, what the draw step and
SUMMARY.md read), CSV (the main table, for machines) and Markdown (every table and comparison, for
readers)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gradcomp.analysis.seeds import Comparison


@dataclass
class Table:
    title: str
    rows: list[dict]
    markdown: bool = True  # False: long per-seed tables, kept in the JSON only


@dataclass
class Result:
    """What an experiment's compute step produces: `tables["main"]` and any others (what the figure is
    drawn from), the paired comparisons it states, headline numbers, a caption generated from its settings
    and data, and notes on what the data show beyond the headline."""

    caption: str
    tables: dict[str, Table]
    comparisons: list[Comparison] = field(default_factory=list)
    headline: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def rows(self, table: str = "main") -> list[dict]:
        return self.tables[table].rows


@dataclass
class Record:
    """A written `Result` as read back: plain values, plus the experiment's ID and title."""

    id: str
    title: str
    caption: str
    tables: dict[str, Table]
    comparisons: list[dict]
    headline: dict[str, Any]
    notes: list[str]

    def rows(self, table: str = "main") -> list[dict]:
        return self.tables[table].rows

    @classmethod
    def load(cls, path: Path | str) -> Record:
        data = json.loads(Path(path).read_text())
        data["tables"] = {name: Table(**table) for name, table in data["tables"].items()}
        return cls(**data)


def write_result(result: Result, experiment_id: str, title: str, prefix: Path) -> Record:
    """Write <prefix>.json, .csv and .md; returns what a reader of the JSON gets."""
    record = Record(
        id=experiment_id,
        title=title,
        caption=" ".join(result.caption.split()),
        tables=result.tables,
        comparisons=[comparison.row() for comparison in result.comparisons],
        headline=result.headline,
        notes=result.notes,
    )
    prefix.parent.mkdir(parents=True, exist_ok=True)
    plain = _plain(
        {**asdict(record), "tables": {name: asdict(table) for name, table in record.tables.items()}}
    )
    prefix.with_suffix(".json").write_text(json.dumps(plain, indent=1) + "\n")
    write_csv(result.tables["main"].rows, prefix.with_suffix(".csv"))
    prefix.with_suffix(".md").write_text(record_markdown(record))
    return Record.load(prefix.with_suffix(".json"))


def _plain(value: Any) -> Any:
    """JSON-ready: NaN and infinities become null, numpy scalars and tuples plain values."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


COMPARISON_COLUMNS = ("a", "b", "seeds", "difference", "ci_low", "ci_high", "p", "p_holm", "verdict")


def record_markdown(record: Record) -> str:
    lines = [f"# {record.id}: {record.title}", "", record.caption, ""]
    for table in record.tables.values():
        if table.markdown:
            lines += [f"## {table.title}", "", to_markdown(table.rows)]
    if record.comparisons:
        unit = record.comparisons[0]["unit"]
        lines += [
            f"## Paired comparisons across seeds (a - b in {unit}: paired t-test; p_holm: Holm-adjusted over "
            "the experiment's comparisons)",
            "",
            to_markdown([{key: row[key] for key in COMPARISON_COLUMNS} for row in record.comparisons]),
        ]
    lines += [f"Note: {note}\n" for note in record.notes]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return " ".join(_cell(item) for item in value)
    return str(value).replace("|", "\\|")


def columns(rows: Sequence[dict]) -> list[str]:
    """Every key of the rows, in order of first appearance (rows may leave some out)."""
    return list(dict.fromkeys(key for row in rows for key in row))


def to_markdown(rows: Sequence[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    header = columns(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(row.get(key)) for key in header) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[dict], path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns(rows))
        writer.writeheader()
        writer.writerows({key: _csv_cell(value) for key, value in row.items()} for row in rows)
    return path


def _csv_cell(value: object) -> object:
    if isinstance(value, list):
        return " ".join(str(item) for item in value)
    return value
