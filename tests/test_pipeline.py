import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from gradcomp.cli import main
from gradcomp.pipeline import check_config, experiment_runs, figure_files, run_spec
from gradcomp.plots import experiments

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def _snakemake(*args, cwd=ROOT):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return subprocess.run(
        [str(SNAKEMAKE), *args], cwd=cwd, capture_output=True, text=True, env=env, check=False
    )


@pytest.mark.parametrize("name", ["default", "cifar10", "imagenet"])
def test_dry_run_of_every_shipped_config(name):
    # --forceall: the whole DAG even where `make run` has already produced the outputs
    dry = _snakemake("-n", "--forceall", "--cores", "2", "--configfile", f"config/{name}.yaml")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "train" in dry.stdout and "figure" in dry.stdout


def test_lint_is_clean():
    lint = _snakemake("--lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "default.yaml").read_text())


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
    config = _default_config()
    change(config)
    with pytest.raises(WorkflowError, match=named):
        validate(config, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["train"].update(epoch=3), "config key train: unknown training keys \\['epoch'\\]"),
        (lambda c: c["runs"].update(bad="prune:sparsity=2"), "config key runs.bad: prune: sparsity"),
        (lambda c: c["experiments"]["A5"]["runs"].append("nope"), "experiments.A5: runs \\['nope'\\]"),
    ],
)
def test_config_check_names_the_bad_key(change, message):
    config = _default_config()
    change(config)
    with pytest.raises(ValueError, match=message):
        check_config(config)


def test_a_bad_config_stops_snakemake_with_the_message(tmp_path):
    config = _default_config()
    config["runs"]["baseline"] = "fp:format=e9m9x"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    dry = _snakemake("-n", "--cores", "1", "--configfile", str(path))
    assert dry.returncode != 0
    assert "runs.baseline" in dry.stdout + dry.stderr


def test_run_specs_merge_shared_and_own_keys():
    config = _default_config()
    assert run_spec(config, "fp_e4m1")["policy"] == "fp:format=e4m1"
    assert run_spec(config, "qat8")["forward_bits"] == 8
    assert run_spec(config, "qat8")["model"] == config["train"]["model"]
    assert experiment_runs(config, "X1") == list(config["runs"])
    assert experiment_runs(config, "A1") == ["baseline"]


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


def test_the_committed_default_figures_are_complete():
    """The README points readers at figures/default: every file the default config produces is there."""
    figures = ROOT / "figures" / "default"
    missing = [name for name in figure_files(_default_config()) if not (figures / name).is_file()]
    assert not missing, f"figures/default lacks {missing}: run `make run` and commit figures/default"


def test_whole_pipeline_runs_end_to_end_on_a_tiny_config(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(
        ROOT,
        work,
        ignore=shutil.ignore_patterns(".venv", ".git", "results", "figures", ".snakemake", "*.egg-info"),
    )
    config_path = "tests/pipeline_tiny.yaml"
    result = _snakemake("--cores", "2", "--configfile", config_path, cwd=work)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    config = yaml.safe_load((work / config_path).read_text())
    registry = experiments()
    expected = figure_files(config)
    figures = work / "figures" / "tiny"
    missing = [name for name in expected if not (figures / name).is_file()]
    assert not missing
    assert all((figures / name).stat().st_size > 0 for name in expected)
    summary = (figures / "SUMMARY.md").read_text()
    assert all(f"## {exp}:" in summary for exp in config["experiments"])
    report = _snakemake("--configfile", config_path, "--report", "report.html", cwd=work)
    assert report.returncode == 0, report.stdout[-4000:] + report.stderr[-4000:]
    html = (work / "report.html").read_text(errors="replace")
    assert registry["A7"].title in html
    # a fresh clone has the committed figures but no runs: the runs are trained again, not skipped
    shutil.rmtree(work / "results")
    again = _snakemake("-n", "--cores", "2", "--configfile", config_path, cwd=work)
    assert again.returncode == 0 and "train" in again.stdout, again.stdout[-4000:] + again.stderr[-4000:]
