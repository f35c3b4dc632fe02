"""The SLURM and GPU profiles, the workflow's conda environment, training jobs' logs across attempts."""

import os
import re
import subprocess
from pathlib import Path

import yaml
from helpers import SNAKEMAKE, pins

from gradcomp.pipeline import seeds, training_jobs

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
    python = bin_folder / "python"  # stands in for `python -m gradcomp run --job J --manifest FILE`
    python.write_text(
        "#!/bin/bash\n"
        'while [ $# -gt 0 ]; do [ "$1" = --manifest ] && manifest=$2; shift; done\n'
        'echo "PYTHONPATH=$PYTHONPATH"\n'
        'if [ ! -e failed-once ]; then touch failed-once; echo "attempt one fails"; exit 1; fi\n'
        'echo "attempt two trains"; mkdir -p "$(dirname "$manifest")"; echo "{}" > "$manifest"\n'
    )
    python.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    job = "baseline"  # tests/pipeline_tiny.yaml trains each run's seeds in one job
    target = f"results/tiny/jobs/{job}.json"
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
    attempts = (logs / f"train_{job}.attempts.log").read_text()
    assert attempts.count("== attempt started") == 2
    assert attempts.index("attempt one fails") < attempts.index("attempt two trains")
    latest = (logs / f"train_{job}.log").read_text()
    assert "attempt two trains" in latest and "attempt one fails" not in latest
    assert f"PYTHONPATH={ROOT / 'src'}" in latest


def test_the_gpu_config_packs_its_pairs_into_jobs_that_share_one_gpu():
    config = yaml.safe_load((ROOT / "config" / "gpu.yaml").read_text())
    jobs = training_jobs(config)
    pairs = [(run, seed) for run in config["runs"] for seed in seeds(config, run)]
    assert [pair for job in jobs.values() for pair in job.items] == pairs
    assert all(job.steps <= config["job_steps"] for job in jobs.values())
    assert len(jobs) < len(pairs) / 3  # one process start-up serves several pairs
    for claim in ("baseline", "prune_85", "fp_e4m1", "qat8", "int5_bhq"):
        assert len(seeds(config, claim)) >= 8
    # every training job holds one `gpu_jobs` unit; the profile lets 8 of them share the machine's GPU
    profile = yaml.safe_load((ROOT / "workflow" / "profiles" / "gpu" / "config.yaml").read_text())
    assert "gpu_jobs=8" in profile["resources"]
    assert "gpu_jobs=1 if GPUS else 0" in (ROOT / "workflow" / "rules" / "train.smk").read_text()
    dry = subprocess.run(
        [str(SNAKEMAKE), "-n", "--profile", "workflow/profiles/gpu", "--configfile", "config/gpu.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.stdout, re.MULTILINE))
    assert int(counts["train"]) == len(jobs)
