"""Benchmark records: benchmarks/README.md's generated tables are those of the committed records, and a saved
record comes back as table rows with its date, machine and commit."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
spec = importlib.util.spec_from_file_location("records", BENCHMARKS / "records.py")
records = importlib.util.module_from_spec(spec)
spec.loader.exec_module(records)


def test_the_readme_tables_are_the_committed_records():
    text = (BENCHMARKS / "README.md").read_text()
    assert records.SECTION.search(text), "benchmarks/README.md lost its records sections"
    assert records.generated(text) == text, "stale: run `python benchmarks/records.py`"


def test_a_saved_record_becomes_rows_with_date_machine_and_commit(tmp_path):
    rows = [{"arm": "uncompressed", "ms/step": 29.3}, {"arm": "MXFP4 nearest", "ms/step": 42.3}]
    records.save("demo", rows, {"rounds": 6}, records=tmp_path)
    records.save("demo", rows[:1], {"rounds": 10}, device="NVIDIA H100", records=tmp_path)
    table = records.table("demo", tmp_path).splitlines()
    assert table[0] == "| arm | ms/step | rounds | date | machine | commit |"  # settings that differ shown
    assert len(table) == 2 + 3
    assert re.search(r"\| \d{4}-\d\d-\d\d \| \d+-core .+ \| [0-9a-f]{7,}(\+changes)? \|$", table[2])
    assert "; NVIDIA H100" in table[-1]
    section = "<!-- records:demo:begin -->\nold\n<!-- records:demo:end -->"
    assert records.generated(section, tmp_path) == section.replace("old\n", records.table("demo", tmp_path))
    with pytest.raises(ValueError, match="at least one row"):
        records.save("demo", [], {}, records=tmp_path)


def test_the_pipeline_jobs_are_summed_by_rule_with_the_longest_named(tmp_path):
    spec = importlib.util.spec_from_file_location("pipeline_jobs", BENCHMARKS / "pipeline_jobs.py")
    sys.modules.setdefault("records", records)  # the script imports its neighbour
    jobs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jobs)
    folder = tmp_path / "results" / "demo" / "benchmarks"
    folder.mkdir(parents=True)
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for name, seconds in (("train_baseline", 300.5), ("train_deit", 490.0), ("compute_C2_block", 177.2)):
        (folder / f"{name}.tsv").write_text(header + f"{seconds}\t0:05:00\t812.3\t0\t0\t0\t0\t0\t95\t290\n")
    rows = jobs.summary(jobs.jobs(folder.parent))
    assert [(row["rule"], row["jobs"], row["sum (s of one core)"]) for row in rows] == [
        ("train", 2, 790),
        ("compute", 1, 177),
    ]
    assert rows[0]["longest jobs (s)"] == "deit 490, baseline 300"
    (folder / "draw_A1.tsv").write_text(header)
    with pytest.raises(ValueError, match="not a benchmark file"):
        jobs.jobs(folder.parent)
