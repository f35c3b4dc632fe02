import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradcomp.cli import main

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def _snakemake(*args, cwd=ROOT):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return subprocess.run(
        [str(SNAKEMAKE), *args], cwd=cwd, capture_output=True, text=True, env=env, check=False
    )


def test_dry_run_and_lint():
    dry = _snakemake("-n", "--cores", "2", "--configfile", "config/default.yaml")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    lint = _snakemake("--lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_snakefmt_clean():
    snakefmt = Path(sys.executable).parent / "snakefmt"
    result = subprocess.run(
        [str(snakefmt), "--check", "Snakefile", "workflow"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_sparsity_verb_writes_csv_and_markdown(tmp_path):
    out = tmp_path / "A7.csv"
    main(
        [
            "sparsity",
            "--numel",
            "4096",
            "--sigmas",
            "2",
            "--targets",
            "0.8",
            "--zero-fractions",
            "0",
            "--out",
            str(out),
        ]
    )
    rows = list(csv.DictReader(out.open()))
    assert {row["estimator"] for row in rows} == {"lognormal", "gaussian", "laplace", "topk"}
    assert out.with_suffix(".md").read_text().startswith("## ")


def test_theory_verb_writes_both_tables(tmp_path):
    switch, mse = tmp_path / "switch.csv", tmp_path / "mse.csv"
    main(
        [
            "theory",
            "--bits",
            "4",
            "--kinds",
            "ideal",
            "--sigmas",
            "1",
            "--sigma-max",
            "4",
            "--switch-points",
            str(switch),
            "--mse",
            str(mse),
        ]
    )
    assert [row["exp_bits"] for row in csv.DictReader(switch.open())] == ["1", "2", "3"]
    assert len(list(csv.DictReader(mse.open()))) == 4  # E = 0..3 at one sigma


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_pipeline_runs_end_to_end_on_a_tiny_config(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "name: tiny\n"
        "theory: {bits: [4], kinds: [ideal], sigmas: [1.0]}\n"
        "synthetic: {numel: 4096, sigmas: [2.0], targets: [0.8], zero_fractions: [0.0]}\n"
    )
    work = tmp_path / "work"
    shutil.copytree(
        ROOT, work, ignore=shutil.ignore_patterns(".venv", ".git", "results", ".snakemake", "*.egg-info")
    )
    result = _snakemake("--cores", "2", "--configfile", str(config), cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    outputs = sorted(p.name for p in (work / "results" / "tiny").glob("*.*"))
    assert outputs == [
        "A4_fp_theory_relative_mse.csv",
        "A4_fp_theory_relative_mse.md",
        "A4_fp_theory_switch_points.csv",
        "A4_fp_theory_switch_points.md",
        "A7_synthetic_sparsity.csv",
        "A7_synthetic_sparsity.md",
    ]
    assert all(p.stat().st_size > 0 for p in (work / "results" / "tiny").glob("*.*"))
