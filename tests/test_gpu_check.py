"""scripts/gpu_check.sh, the GPU validation, checked on the CPU: its dry run, and that failures show."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
PARTS = ("tests", "ops", "train_overhead", "torchrun")


def _gpu_check(out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"],
        env={**os.environ, "OUT": str(out), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_dry_run_runs_every_part(tmp_path):
    result = _gpu_check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for part in PARTS:
        assert f"| {part} | ok |" in result.stdout
    assert "tests collected" in (tmp_path / "tests.log").read_text()
    ops = (tmp_path / "ops.log").read_text()
    assert "| device copy |" in ops and "| x.to(float8_e5m2).float() |" in ops
    assert "| int 5-bit psq (two streams) |" in (tmp_path / "train_overhead.log").read_text()
    assert "test accuracy" in (tmp_path / "torchrun.log").read_text()
    assert (tmp_path / "summary.md").read_text() in result.stdout


def test_a_failing_part_fails_the_check(tmp_path):
    result = _gpu_check(tmp_path, PYTHON="false")
    assert result.returncode == 1
    assert all(f"| {part} | failed (1) |" in result.stdout for part in PARTS)
    usage = subprocess.run(["bash", str(SCRIPT), "--dryrun"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
