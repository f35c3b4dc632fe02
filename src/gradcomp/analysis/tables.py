"""An experiment's numbers (`Result`) and how they are written: JSON (everything, what the draw step and
SUMMARY.md read), CSV (the main table, every column, for machines) and Markdown (for readers: findings,
decided claims, comparisons and tables, each estimate as one "mean [95 % CI]" cell)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gradcomp.analysis.claims import Decision
from gradcomp.analysis.seeds import Estimate, number
from gradcomp.analysis.verdicts import INCONCLUSIVE, POWER, Comparison
from gradcomp.experiments import CLAIMS


@dataclass
class Table:
    title: str
    rows: list[dict]
    markdown: bool = True  # False: long per-seed or per-point tables, kept in the JSON only
    note: str = ""  # under the title: e.g. the scale and seeds behind the numbers


@dataclass
class Result:
    """What an experiment's compute step produces: `tables["main"]` and any others (what the figure is drawn
    from), the paired comparisons it states, findings (short sentences generated from the numbers), the
    papers' claims it decides, a caption generated from its settings and data, and `facts`: numbers the
    figure needs beyond its tables."""

    caption: str
    tables: dict[str, Table]
    comparisons: list[Comparison] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    claims: list[Decision] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

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
    findings: list[str]
    claims: list[dict]
    facts: dict[str, Any]

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
        findings=result.findings,
        claims=[decision.row() for decision in result.claims],
        facts=result.facts,
    )
    prefix.parent.mkdir(parents=True, exist_ok=True)
    plain = _plain(
        {**asdict(record), "tables": {name: asdict(table) for name, table in record.tables.items()}}
    )
    prefix.with_suffix(".json").write_text(json.dumps(plain, indent=1) + "\n")
    write_csv(result.tables["main"].rows, prefix.with_suffix(".csv"))
    loaded = Record.load(prefix.with_suffix(".json"))
    prefix.with_suffix(".md").write_text(record_markdown(loaded))
    return loaded


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


def _family(comparison: Comparison) -> str:
    """A claim's family with its test ("claim L6 (non-inferiority)", also "claim L6 at 8 epochs ..."), a
    named question's, or "secondary"."""
    if not comparison.family:
        return "secondary"
    if comparison.family.split()[0] in CLAIMS:
        return f"claim {comparison.family} ({comparison.test})"
    return comparison.family


def comparison_rows(comparisons: Sequence[dict]) -> list[dict]:
    """The comparisons as a short table: their family (a claim's, or secondary), what is compared, the
    difference with its 95 % interval, sign consistency, the minimum detectable effect, the verdict and what
    would decide an open one."""
    rows = []
    for comparison in map(Comparison.from_row, comparisons):
        unit = f" {comparison.unit}" if comparison.unit else ""
        open_ = comparison.verdict == INCONCLUSIVE
        rows.append(
            {
                "family": _family(comparison),
                "comparison": f"{comparison.a} vs {comparison.b}",
                "difference [95 % CI]": f"{comparison.difference:+.3g}{unit} {comparison.interval}",
                "seeds agreeing": comparison.sign,
                f"detectable ({100 * POWER:.0f} % power)": ""
                if comparison.mde is None
                else f"{number(comparison.mde)}{unit}",
                "verdict": comparison.decision,
                "to decide": comparison.needed if open_ else "",
            }
        )
    return rows


def claim_rows(claims: Sequence[dict]) -> list[dict]:
    """The claims an experiment decides: what it shows, its status, its plan against the seeds used and
    its status at the plan's second margin."""
    return [
        {
            "claim": d["claim"],
            "this configuration": d["evidence"],
            "at this scale": d["status"],
            "seeds planned / used": plan_cell(d),
            "plan": d.get("plan", ""),
            "at the second margin": d.get("sensitivity", ""),
        }
        for d in claims
    ]


def plan_cell(decision: dict) -> str:
    """e.g. "4 / 6", "22 / 3 (under-powered)", "exact"."""
    if decision.get("plan") == "exact":
        return "exact"
    planned, used = decision.get("planned"), decision.get("used")
    if used is None:
        return ""
    planned_text = "none would do" if planned is None else str(planned)
    return f"{planned_text} / {used}" + (" (under-powered)" if under_powered(decision) else "")


def record_markdown(record: Record) -> str:
    """The experiment for readers: caption, findings, decided claims, comparisons, then every table."""
    lines = [f"# {record.id}: {record.title}", "", record.caption, ""]
    if record.findings:
        lines += ["## Findings", "", *(f"- {finding}" for finding in record.findings), ""]
    if record.claims:
        lines += ["## The papers' claims, at this scale", "", to_markdown(claim_rows(record.claims))]
    if record.comparisons:
        lines += [
            "## Paired comparisons across seeds (a - b; verdicts after Holm over each family's comparisons)",
            "",
            to_markdown(comparison_rows(record.comparisons)),
        ]
    for table in record.tables.values():
        if table.markdown:
            lines += [f"## {table.title}", ""]
            lines += [table.note, ""] if table.note else []
            lines += [to_markdown(readable(table.rows))]
    return "\n".join(lines)


def readable(rows: Sequence[dict]) -> list[dict]:
    """Rows with each estimate as one "mean [95 % CI]" cell under its name (the seed count where it differs
    from the row's `seeds`)."""
    out = []
    for row in rows:
        names = Estimate.names(row)
        hidden = {f"{name}_{key}" for name in names for key in ("sd", "ci_low", "ci_high", "n")}
        cells = {}
        for key, value in row.items():
            if key in hidden:
                continue
            name = key[: -len("_mean")] if key.endswith("_mean") and key[: -len("_mean")] in names else None
            if name is None:
                cells[key] = value
                continue
            estimate = Estimate.read(row, name)
            text = estimate.text() if estimate.n else ""
            if estimate.n != row.get("seeds", estimate.n) and estimate.n > 1:
                text += f" ({estimate.n} seeds)"
            cells[name] = text
        out.append(cells)
    return out


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return number(value, 4)
    if isinstance(value, list):
        return " ".join(_cell(item) for item in value)
    return str(value).replace("|", "\\|")


def columns(rows: Sequence[dict]) -> list[str]:
    """Every key of the rows, in order of first appearance (rows may leave some out)."""
    return list(dict.fromkeys(key for row in rows for key in row))


def fill_section(text: str, name: str, content: str) -> str:
    """`text` with what stands between its `<!-- name:begin -->` and `<!-- name:end -->` lines replaced by
    `content` (the generated parts of a hand-written Markdown file); ValueError unless the two markers stand
    once each, in that order."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if text.count(begin) != 1 or text.count(end) != 1 or text.find(begin) > text.find(end):
        raise ValueError(f"needs one {begin} line and, after it, one {end} line")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{content.rstrip(chr(10))}\n{end}{rest.split(end)[1]}"


def under_powered(decision: dict) -> bool:
    """Whether a decision used fewer seeds than its plan asks for (or its plan supports no seed count)."""
    planned = decision.get("planned")
    return planned is None or decision["used"] < planned


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
