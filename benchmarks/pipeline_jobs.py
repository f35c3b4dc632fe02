"""Where a pipeline run's time went: the wall time and peak memory Snakemake wrote for every training and
compute job (`results/<config>/benchmarks/*.tsv`, the rules' `benchmark:` files), summed by rule, with each
rule's longest jobs. The other rules (settings, draw, page, summary) take seconds each and write none.

    python benchmarks/pipeline_jobs.py results/default [--wall MINUTES] [--record]

`--wall`: the run's measured wall clock (e.g. `make run`'s), shown beside the jobs' sum; `--record` saves the
table as a record of `pipeline-<config>` (see records.py), stamped with the commit of the checkout that holds
the results."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from records import save

from gradcomp.analysis.tables import to_markdown

RULES = ("train", "compute")  # the rules with a benchmark file, by the file name's first word
LONGEST = 3  # jobs named per rule


def jobs(results: Path) -> dict[str, dict[str, dict[str, float]]]:
    """rule -> job -> {"s": wall seconds, "max_rss": peak resident MB} from the benchmark files."""
    found: dict[str, dict[str, dict[str, float]]] = {rule: {} for rule in RULES}
    for path in sorted((results / "benchmarks").glob("*.tsv")):
        rule, _, job = path.stem.partition("_")
        if rule not in found:
            raise ValueError(f"{path}: not a benchmark file of the rules {RULES}")
        with path.open() as handle:
            row = next(csv.DictReader(handle, delimiter="\t"))
        found[rule][job] = {"s": float(row["s"]), "max_rss": float(row["max_rss"])}
    if not any(found.values()):
        raise ValueError(f"{results}/benchmarks holds no job's benchmark file: run the pipeline first")
    return found


def summary(found: dict[str, dict[str, dict[str, float]]]) -> list[dict]:
    """One row per rule: its jobs, their summed and longest wall times, its longest jobs and largest peak."""
    rows = []
    for rule, by_job in found.items():
        if not by_job:
            continue
        ranked = sorted(by_job.items(), key=lambda item: -item[1]["s"])
        rows.append(
            {
                "rule": rule,
                "jobs": len(by_job),
                "sum (s of one core)": round(sum(job["s"] for job in by_job.values())),
                "longest jobs (s)": ", ".join(f"{name} {job['s']:.0f}" for name, job in ranked[:LONGEST]),
                "largest peak memory (MB)": round(max(job["max_rss"] for job in by_job.values())),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", type=Path, help="a configuration's results folder, e.g. results/default")
    parser.add_argument("--wall", type=float, help="the run's wall clock in minutes (e.g. make run's)")
    parser.add_argument("--record", action="store_true", help="save the table to benchmarks/records/")
    args = parser.parse_args()
    rows = summary(jobs(args.results))
    rows.append(
        {
            "rule": "all" + (f" (the run's wall clock: {args.wall:g} min)" if args.wall else ""),
            "jobs": sum(row["jobs"] for row in rows),
            "sum (s of one core)": sum(row["sum (s of one core)"] for row in rows),
            "longest jobs (s)": "",
            "largest peak memory (MB)": max(row["largest peak memory (MB)"] for row in rows),
        }
    )
    print(to_markdown(rows))
    if args.record:
        settings = {"config": args.results.name}
        repository = args.results.resolve().parents[1]
        print(save(f"pipeline-{args.results.name}", rows, settings, repository=repository))


if __name__ == "__main__":
    main()
