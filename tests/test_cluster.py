"""The SLURM profile, the workflow's conda environment and the training jobs' logs across attempts."""

import os
import re
import subprocess
from pathlib import Path

import yaml
from helpers import SNAKEMAKE, pins

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"


def test_slurm_profile_runs_each_training_job_as_one_task_and_asks_for_the_account():
    profile = yaml.safe_load(PROFILE.read_text())
    # the plugin adds --ntasks-per-gpu=1 otherwise, which binds torchrun's single task to one GPU
    assert profile["set-resources"]["train"]["tasks_per_gpu"] == 0
    assert "rule train:" in (ROOT / "workflow" / "rules" / "train.smk").read_text()
    # no placeholder account reaches sbatch: the user sets it, or the plugin takes the one of their last job
    assert "slurm_account" not in profile["default-resources"]
    assert "# slurm_account:" in PROFILE.read_text()
    readme = (ROOT / "README.md").read_text()
    clusters = readme.split("## Several GPUs and clusters")[1].split("\n## ")[0]
    assert "slurm_account" in clusters and "workflow/profiles/slurm/config.yaml" in clusters


def test_every_rule_uses_the_workflow_env_which_pins_the_requirements_and_survives_being_copied():
    rules = "".join(path.read_text() for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
    assert re.findall(r'conda:\n\s+"([^"]+)"', rules) == ["../envs/gradcomp.yaml"] * len(
        re.findall(r"^rule \w+:", rules, flags=re.MULTILINE)
    )
    env = yaml.safe_load((ROOT / "workflow" / "envs" / "gradcomp.yaml").read_text())
    pip = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict))
    assert pins(pip) == pins((ROOT / "requirements.txt").read_text().splitlines())
    assert "python=3.11" in env["dependencies"]
    # Snakemake creates the env from a copy under .snakemake/conda/: nothing may point next to the file
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==\S+", line) for line in pip), pip


def test_a_retried_training_job_keeps_every_attempts_output_and_imports_gradcomp_from_the_checkout(tmp_path):
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    python = bin_folder / "python"  # stands in for `python -m gradcomp run --spec S --out FOLDER`
    python.write_text(
        "#!/bin/bash\n"
        'while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done\n'
        'echo "PYTHONPATH=$PYTHONPATH"\n'
        'if [ ! -e failed-once ]; then touch failed-once; echo "attempt one fails"; exit 1; fi\n'
        'echo "attempt two trains"; mkdir -p "$out"; echo "{}" > "$out/summary.json"\n'
    )
    python.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    target = "results/tiny/runs/baseline/seed0/summary.json"
    config = str(ROOT / "tests" / "pipeline_tiny.yaml")
    workflow = ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(work), "--configfile", config]
    run = subprocess.run(
        [str(SNAKEMAKE), "--cores", "1", "--retries", "1", target, *workflow],
        env=dict(os.environ, PATH=f"{bin_folder}:{os.environ['PATH']}"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    logs = work / "results" / "tiny" / "logs"
    attempts = (logs / "train_baseline_seed0.attempts.log").read_text()
    assert attempts.count("== attempt started") == 2
    assert attempts.index("attempt one fails") < attempts.index("attempt two trains")
    latest = (logs / "train_baseline_seed0.log").read_text()
    assert "attempt two trains" in latest and "attempt one fails" not in latest
    assert f"PYTHONPATH={ROOT / 'src'}" in latest
