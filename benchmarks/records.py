"""Benchmark records: a script's table saved with when, where and on what code it was measured, and the
tables of benchmarks/README.md generated from them, each row with its date, machine and commit.

`python benchmarks/ops.py --record` (and `train_overhead.py --record`) writes
`benchmarks/records/<benchmark>/<date>-<time>-<commit>.json`; `python benchmarks/records.py` rewrites each
section of benchmarks/README.md between `<!-- records:<benchmark>:begin -->` and
`<!-- records:<benchmark>:end -->` from the committed records (`--check`: only say whether they agree, as
`tests/test_benchmark_records.py` does)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from gradcomp.analysis.tables import fill_section, to_markdown

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records"
README = HERE / "README.md"
SECTION = re.compile(r"<!-- records:([\w-]+):begin -->")  # each generated section, by benchmark
WHEN = ("date", "machine", "commit")  # the columns every generated row ends with


def machine(device: str | None = None) -> str:
    """This machine in words, e.g. "2-core AMD EPYC (AVX-512), 24 GiB", with the GPU where one measured."""
    cpu, flags, memory = platform.processor() or platform.machine(), "", ""
    info = Path("/proc/cpuinfo")
    if info.exists():
        text = info.read_text()
        cpu = next(iter(re.findall(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)), cpu).strip()
        found = set(next(iter(re.findall(r"^flags\s*:\s*(.+)$", text, re.MULTILINE)), "").split())
        flags = " (AVX-512)" if "avx512f" in found else " (AVX2)" if "avx2" in found else ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(re.search(r"^MemTotal:\s*(\d+)", meminfo.read_text(), re.MULTILINE)[1])
        memory = f", {round(kib / 2**20)} GiB"
    described = f"{os.cpu_count()}-core {cpu}{flags}{memory}"
    return described + (f"; {device}" if device else "")


def commit(repository: Path = HERE) -> str:
    """The commit checked out in `repository` (default: this one), "+changes" where the working tree differs
    from it (outside the records and the figures, which measurements write)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repository, capture_output=True, text=True, check=True
        ).stdout

    head = git("rev-parse", "--short", "HEAD").strip()
    changed = [
        line
        for line in git("status", "--porcelain").splitlines()
        if not line[3:].startswith(("benchmarks/records/", "figures/"))
    ]
    return head + ("+changes" if changed else "")


def save(
    benchmark: str,
    rows: list[dict],
    settings: dict,
    device: str | None = None,
    records: Path = RECORDS,
    repository: Path = HERE,
) -> Path:
    """Write one run's table as a record of `benchmark` (under `records`), measured on the code checked out
    in `repository` (default: this one); returns its path."""
    if not rows:
        raise ValueError(f"{benchmark}: a record needs at least one row")
    now = datetime.datetime.now()
    stamp = {"date": now.date().isoformat(), "machine": machine(device), "commit": commit(repository)}
    folder = records / benchmark
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{now:%Y-%m-%d-%H%M%S%f}-{stamp['commit']}.json"  # oldest first by name
    path.write_text(json.dumps({**stamp, "settings": settings, "rows": rows}, indent=1) + "\n")
    return path


def table(benchmark: str, records: Path = RECORDS) -> str:
    """Every record of `benchmark`, oldest first, as one Markdown table: each row's own columns, the settings
    that differ between records, then its date, machine and commit."""
    loaded = [json.loads(path.read_text()) for path in sorted((records / benchmark).glob("*.json"))]
    if not loaded:
        return "No record yet (the script's `--record` writes one).\n"
    keys = dict.fromkeys(key for record in loaded for key in record["settings"])
    varying = [key for key in keys if len({json.dumps(r["settings"].get(key)) for r in loaded}) > 1]
    return to_markdown(
        [
            {
                **row,
                **{key: record["settings"].get(key) for key in varying},
                **{key: record[key] for key in WHEN},
            }
            for record in loaded
            for row in record["rows"]
        ]
    )


def generated(readme: str, records: Path = RECORDS) -> str:
    """`readme` with each records section replaced by its benchmark's table."""
    for benchmark in SECTION.findall(readme):
        readme = fill_section(readme, f"records:{benchmark}", table(benchmark, records))
    return readme


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only say whether README.md's tables agree")
    args = parser.parse_args()
    text = README.read_text()
    new = generated(text)
    if args.check:
        print(
            "benchmarks/README.md agrees with the records" if new == text else "benchmarks/README.md is stale"
        )
        return int(new != text)
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
