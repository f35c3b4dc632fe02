import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, default_config, run_snakemake
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from gradcomp.experiments import CLAIMS
from gradcomp.pipeline import (
    check_config,
    experiment_reads,
    figure_files,
    job_of,
    run_spec,
    seeds,
    training_jobs,
)


@pytest.mark.parametrize(
    "name", ["default", "gpu", "gpu_headline", "cifar10", "imagenet", "converged", "failure"]
)
def test_dry_run_of_every_shipped_config(name):
    # --forceall: the whole DAG even where `make run` has already produced the outputs
    dry = run_snakemake("-n", "--forceall", "--cores", "2", "--configfile", f"config/{name}.yaml")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "train" in dry.stdout
    # the job stats: every experiment of the config is computed, drawn and paged once, and summarised
    jobs = {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)$", dry.stdout, re.MULTILINE)}
    experiments = len(yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())["experiments"])
    assert [jobs.get(rule) for rule in ("compute", "draw", "page", "summary")] == [experiments] * 3 + [1]


def test_lint_is_clean():
    lint = run_snakemake("--lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda c: c.update(gpus=-1), "gpus"),
        (lambda c: c.update(trian={}), "trian"),
        (lambda c: c["runs"].update(bad={"forward_bits": 8}), "policy"),
        (lambda c: c["experiments"].update(Z9={"run": "baseline"}), "Z9"),
    ],
)
def test_schema_rejects_a_bad_config_naming_the_key(change, named):
    config = default_config()
    change(config)
    with pytest.raises(WorkflowError, match=named):
        validate(config, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["train"].update(epoch=3), "config key train: unknown training keys \\['epoch'\\]"),
        (lambda c: c["train"].update(seed=3), "config key train.seed: give the seeds as `seeds:"),
        (lambda c: c["runs"].update(bad="prune:sparsity=2"), "config key runs.bad: prune: sparsity"),
        (lambda c: c["runs"].update(bad={"policy": "none", "lr": -1.0, "epochs": 0}), "runs.bad: epochs"),
        (lambda c: c["experiments"]["A5"]["runs"].append("nope"), "experiments.A5: runs \\['nope'\\]"),
        (lambda c: c["experiments"]["A5"].update(run="x"), "experiments.A5: unknown settings \\['run'\\]"),
        (lambda c: c["experiments"]["B2"].update(bits=4), "experiments.B2.bits must be a list"),
        (lambda c: c["experiments"]["B1"].update(seeds=[9]), "experiments.B1.seeds: run qat8 is not trained"),
    ],
)
def test_config_check_names_the_bad_key(change, message):
    config = default_config()
    change(config)
    with pytest.raises(ValueError, match=message):
        check_config(config)


def test_a_bad_config_stops_snakemake_with_the_message(tmp_path):
    config = default_config()
    config["runs"]["baseline"] = "fp:format=e9m9x"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    dry = run_snakemake("-n", "--cores", "1", "--configfile", str(path))
    assert dry.returncode != 0
    assert "runs.baseline" in dry.stdout + dry.stderr


def test_run_specs_merge_shared_and_own_keys_and_the_seed():
    config = default_config()
    assert run_spec(config, "short_fp_e4m1", 0)["policy"] == "fp:format=e4m1"
    assert run_spec(config, "qat8", 2)["forward_bits"] == 8 and run_spec(config, "qat8", 2)["seed"] == 2
    assert run_spec(config, "qat8", 0)["model"] == config["train"]["model"]
    config["runs"]["qat8"]["seeds"] = [5, 6]
    assert seeds(config, "qat8") == [5, 6] and seeds(config, "fp_e3m1") == config["seeds"]
    assert "seeds" not in run_spec(config, "qat8", 5)


def test_training_jobs_pack_every_pair_once_in_config_order_up_to_job_steps():
    config = yaml.safe_load((ROOT / "tests" / "pipeline_tiny.yaml").read_text())
    # the runs of the shared 2-epoch budget: 10 steps a pair (X4's budget runs are longer or shorter)
    config["runs"] = {k: v for k, v in config["runs"].items() if not isinstance(v, dict) or "epochs" not in v}
    pairs = [(run, seed) for run in config["runs"] for seed in seeds(config, run)]
    for limit in (None, 10, 20, 35, 10_000):
        config["job_steps"] = limit
        jobs = training_jobs(config)
        assert [pair for job in jobs.values() for pair in job.items] == pairs  # each once, in order
        assert all(job.steps == 10 * len(job.items) for job in jobs.values())  # 10 steps a pair
        assert all(job.steps <= (limit or 10) for job in jobs.values())
        assert all(job_of(jobs, run, seed) in jobs for run, seed in pairs)
    config["job_steps"] = None
    assert len(training_jobs(config)) == len(pairs)  # unset: a job per pair
    config["job_steps"] = 20
    jobs = training_jobs(config)
    assert jobs["baseline"].items == (("baseline", 0), ("baseline", 1))  # a whole run is named by the run
    assert job_of(jobs, "other_baseline", 1) == "other_baseline.seed1..other_prune_85.seed0"
    assert len(training_jobs({**config, "job_steps": 9})) == len(pairs)  # a longer pair is a job alone


def test_what_each_experiment_reads():
    config = default_config()
    assert list(experiment_reads(config, "X1")) == [
        "short_baseline",
        *(run for run in config["runs"] if run != "short_baseline"),
    ]
    assert experiment_reads(config, "A1")["short_baseline"] == config["seeds"]  # every seed by default
    assert experiment_reads(config, "A3") == {"short_baseline": [0, 1, 2]}  # the seeds its setting names
    config["experiments"]["B1"]["seeds"] = [1]
    assert experiment_reads(config, "B1") == {"qat8": [1]}
    assert experiment_reads(config, "A4") == {}
    assert experiment_reads(config, "A5")["short_baseline"] == seeds(config, "short_baseline")


def test_parsing_the_workflow_imports_neither_torch_nor_matplotlib():
    """What `snakemake -n`, `--lint` and every cluster job's start pay: the Snakefile and gradcomp's
    config checks, without torch (seconds to import) or matplotlib."""
    code = (
        "import sys\n"
        "from snakemake.cli import main\n"
        "try:\n"
        "    main(['-n', '--forceall', '--quiet', '--cores', '1', '--configfile', 'config/default.yaml'])\n"
        "except SystemExit as stop:\n"
        "    assert not stop.code, stop.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'matplotlib', 'seaborn')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


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


def test_the_committed_default_figures_are_complete():
    """The README points readers at figures/default: every file the default config produces is there."""
    figures = ROOT / "figures" / "default"
    missing = [name for name in figure_files(default_config()) if not (figures / name).is_file()]
    assert not missing, f"figures/default lacks {missing}: run `make run` and commit figures/default"


# The smallest configuration that runs every rule (train, settings, compute, draw, page, summary,
# summary_page and the report): tests/pipeline_tiny.yaml's training at toy scale, three runs of two seeds
# packed two pairs to a job, one experiment that reads runs (A5) and one that reads none (A4);
# tests/test_experiments.py computes and draws every experiment of the tiny configuration.
SMALLEST = {
    "runs": ["baseline", "fp_e4m1", "fp_e3m1"],
    "experiments": {
        "A4": None,
        "A5": {"baseline": ["baseline"], "runs": ["fp_e4m1", "fp_e3m1"], "claim": "fp_e4m1"},
    },
}


def smallest_config() -> dict:
    """tests/pipeline_tiny.yaml cut down to `SMALLEST` (A4 with its tiny settings)."""
    config = yaml.safe_load((ROOT / "tests" / "pipeline_tiny.yaml").read_text())
    config["runs"] = {run: config["runs"][run] for run in SMALLEST["runs"]}
    chosen = SMALLEST["experiments"].items()
    config["experiments"] = {exp: settings or config["experiments"][exp] for exp, settings in chosen}
    return config


def test_whole_pipeline_runs_end_to_end_on_the_smallest_config(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(
        ROOT,
        work,
        ignore=shutil.ignore_patterns(".venv", ".git", "results", "figures", ".snakemake", "*.egg-info"),
    )
    config = smallest_config()
    config_path = "smallest.yaml"
    (work / config_path).write_text(yaml.safe_dump(config, sort_keys=False))
    result = run_snakemake("--cores", "2", "--configfile", config_path, cwd=work)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for run in config["runs"]:  # every (run, seed) trains into its own folder
        assert [p.name for p in sorted((work / "results" / "tiny" / "runs" / run).iterdir())] == [
            f"seed{seed}" for seed in seeds(config, run)
        ]
    expected = figure_files(config)
    figures = work / "figures" / "tiny"
    missing = [name for name in expected if not (figures / name).is_file()]
    assert not missing
    assert all((figures / name).stat().st_size > 0 for name in expected)
    summary = (figures / "SUMMARY.md").read_text()
    assert all(f"## {exp}:" in summary for exp in config["experiments"])
    claims = summary.split("## The papers' claims", 1)[1].split("\n## ", 1)[0]
    assert all(f"\n#### {claim}: " in claims for claim in CLAIMS)  # every verified claim, decided or not
    assert "| difference [95 % CI] |" in summary
    a5 = (figures / "A5_fp_formats.md").read_text()
    assert "| seeds |" in a5 and "| accuracy |" in a5 and "## The papers' claims, at this scale" in a5
    assert "| verdict |" in a5
    report = run_snakemake("--configfile", config_path, "--report", "report.html", cwd=work)
    assert report.returncode == 0, report.stdout[-4000:] + report.stderr[-4000:]
    html = (work / "report.html").read_text(errors="replace")
    assert "scaled per layer" in html  # A5's generated caption reached the report
    # a fresh clone has the committed figures but no results/: the runs are trained again and every
    # experiment is computed again, A4 (which reads no runs) included
    shutil.rmtree(work / "results")
    again = run_snakemake("-n", "--cores", "2", "--configfile", config_path, cwd=work)
    assert again.returncode == 0 and "train" in again.stdout, again.stdout[-4000:] + again.stderr[-4000:]
    assert "exp=A4, slug=fp_mse_theory" in again.stdout
