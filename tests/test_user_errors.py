"""Ordinary mistakes fail early, in one line that names what is wrong, and leave nothing behind."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import yaml
from helpers import ROOT, TINY, default_config, run_snakemake

from gradcomp.cli import main
from gradcomp.pipeline import check_config, run_spec, schema_violations
from gradcomp.training.config import ConfigError, resolve_config, timm_model_names
from gradcomp.training.data import FASHION_MNIST_SYSTEM_DIR, DatasetNotFound
from gradcomp.training.models import check_model
from gradcomp.training.policies import parse_policy
from gradcomp.training.train import train

SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def _train(tmp_path, **overrides):
    out = tmp_path / "run"
    return train(resolve_config(**{**TINY, "max_steps": 1, "out": str(out), **overrides})), out


def test_the_model_names_read_from_timms_sources_are_its_registry():
    names = timm_model_names()
    assert set(timm.list_models()) <= names and all(timm.is_model(name) for name in names)


def test_an_unknown_model_fails_at_parse_time_without_torch():
    code = (
        "import sys\n"
        "from gradcomp.training.config import ConfigError, resolve_config\n"
        "resolve_config(model='resnet18.a1_in1k')\n"  # a pretrained tag is not part of the name
        "try:\n"
        "    resolve_config(model='resnet181')\n"
        "except ConfigError as error:\n"
        "    print(error)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message, imported = result.stdout.strip().splitlines()
    assert message.startswith("unknown timm model 'resnet181'; did you mean resnet18")
    assert imported == "[]"


def test_model_kwargs_are_checked_against_the_model_class_before_any_data(tmp_path, monkeypatch):
    with pytest.raises(
        ConfigError, match=r"key 'chanels' is not a parameter of resnet18 \(known: .*channels,"
    ):
        check_model("resnet18", model_kwargs={"chanels": [8, 8, 16, 16]})
    with pytest.raises(ConfigError, match="'num_classes' is set from the dataset"):
        check_model("resnet18", model_kwargs={"num_classes": 5})
    with pytest.raises(ConfigError, match="stem applies to ResNet-style models"):
        check_model("deit_tiny_patch16_224", "3x3")
    monkeypatch.setattr("gradcomp.training.train.load_split", lambda *args: pytest.fail("data loaded"))
    with pytest.raises(ConfigError, match="'chanels'"):
        _train(tmp_path, model_kwargs={"chanels": [8, 8, 16, 16]})
    assert not (tmp_path / "run").exists()


def test_the_shipped_model_kwargs_pass_the_check():
    config = default_config()
    for run in config["runs"]:
        spec = run_spec(config, run, 0)
        check_model(spec["model"], spec.get("stem", "model"), spec.get("model_kwargs"))


def test_a_dataset_error_leaves_no_output_folder(tmp_path):
    with pytest.raises(DatasetNotFound, match="CIFAR-10 needs --data-dir"):
        _train(tmp_path, dataset="cifar10", model="resnet18")
    assert not (tmp_path / "run").exists()


def test_a_wrong_fashion_mnist_data_dir_is_refused(tmp_path):
    with pytest.raises(DatasetNotFound, match=f"--data-dir {tmp_path / 'typo'} is not a folder"):
        _train(tmp_path, dataset="fashion-mnist", data_dir=str(tmp_path / "typo"))
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not FASHION_MNIST_SYSTEM_DIR.exists(), reason="dataset-fashion-mnist not installed")
@pytest.mark.parametrize("given", [False, True])
def test_config_yaml_records_the_data_folder_read(tmp_path, given):
    folder = FASHION_MNIST_SYSTEM_DIR
    if given:  # a copy of the files elsewhere (links): that folder is read, not the package's
        folder = tmp_path / "fashion"
        folder.mkdir()
        for path in FASHION_MNIST_SYSTEM_DIR.iterdir():
            (folder / path.name).symlink_to(path)
    options = {"dataset": "fashion-mnist", "batch_size": 10, "subset_per_class": 1}
    _, out = _train(tmp_path, data_dir=str(folder) if given else None, **options)
    assert yaml.safe_load((out / "config.yaml").read_text())["data_dir"] == str(folder)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"policy": "fp:format=e9m9"}, r"^fp: format='e9m9': exp_bits must be in \[1, 8\]"),
        ({"epochs": "3"}, r"^epochs must be int, got '3'$"),
        ({"lr": True}, r"^lr must be float, got True$"),
        ({"model_kwargs": [1]}, r"^model_kwargs must be dict"),
    ],
)
def test_bad_values_name_their_key(options, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(**options)


def test_a_policy_error_names_the_policy_and_the_key():
    with pytest.raises(ValueError, match=r"fp: format='e4m3x': cannot parse format"):
        parse_policy("prune:sparsity=0.8+fp:format=e4m3x")


def test_invalid_yaml_is_one_line(tmp_path):
    file = tmp_path / "run.yaml"
    file.write_text("epochs: [1\n")
    with pytest.raises(ConfigError, match=f"^{file} is not valid YAML: [^\n]*$"):
        resolve_config(file)


def test_the_command_line_prints_one_line_and_the_traceback_only_with_debug(tmp_path, capsys):
    arguments = ["train", "--dataset", "synthetic", "--policy", "fp:format=e9m9", "--out", str(tmp_path)]
    assert main(arguments) == 2
    assert capsys.readouterr().err == (
        "gradcomp: error: fp: format='e9m9': exp_bits must be in [1, 8] for reserved='none' and man_bits=9, "
        "got 9\n"
    )
    for debug in (["--debug", *arguments], [*arguments, "--debug"]):
        with pytest.raises(ConfigError, match="e9m9"):
            main(debug)
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_a_command_line_error_exits_with_status_2():
    command = [sys.executable, "-m", "gradcomp", "train", "--dataset", "synthetic", "--model", "resnet181"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "gradcomp: error: unknown timm model 'resnet181'; did you mean resnet18, resnet18d, resnet101?"
    ]


@pytest.mark.parametrize(
    "arguments",
    [
        ["train", "--lr", "-1"],
        ["train", "--lr", "nan"],
        ["train", "--lr", "0"],
        ["train", "--device", "tpu"],
        ["train", "--device", "cuda"],  # where torch sees no GPU
        ["train", "--epochs", "0"],
        ["train", "--seed", "1.5"],
        ["train", "--dataset", "mnist"],
        ["train", "--refresh", "0"],
        ["train", "--resume", "--overwrite"],
        ["run", "--job", "[1]"],
        ["run", "--job", '[{"run": "a", "seed": 0, "out": "a", "spec": {"device": "cuda"}}]'],
        ["compute", "Z9", "--out-dir", "out"],
        ["compute", "A1", "--out-dir", "out", "--runs", "a=folder"],
        ["compute", "A4", "--out-dir", "out", "--threads", "0"],
        ["draw"],
    ],
    ids=" ".join,
)
def test_every_bad_request_is_one_line_and_status_2_before_any_work(arguments, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    try:
        status = main(arguments)
    except SystemExit as stop:  # argparse's errors
        status = stop.code
    error = capsys.readouterr().err
    assert status == 2 and error.startswith("gradcomp: error: ") and error.count("\n") == 1, error
    assert not any(tmp_path.iterdir())


def test_schema_violations_are_one_line_each():
    config = default_config()
    config.update(gpus=-1, trian={})
    config["runs"]["bad"] = {"forward_bits": 8}
    config["runs"]["noseed"] = {"policy": "none", "seeds": [1, -1]}
    assert schema_violations(config, SCHEMA) == [
        "the config: Additional properties are not allowed ('trian' was unexpected)",
        "gpus: -1 is less than the minimum of 0",
        "runs.bad: 'policy' is a required property",
        "runs.noseed.seeds[1]: -1 is less than the minimum of 0",
    ]
    assert schema_violations(default_config(), SCHEMA) == []


def test_snakemake_stops_on_a_schema_violation_without_dumping_the_schema(tmp_path):
    config = default_config()
    config["seeds"] = [0, -1]
    path = Path(tmp_path) / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    dry = run_snakemake("-n", "--cores", "1", "--configfile", str(path))
    output = dry.stdout + dry.stderr
    assert dry.returncode != 0
    assert "seeds[1]: -1 is less than the minimum of 0" in output
    assert "additionalProperties" not in output and len(output.splitlines()) < 10


# --- the layers a config selects, checked before any data (issue 40, item 11) ------------------------------
def _no_data(monkeypatch):
    monkeypatch.setattr("gradcomp.training.train.load_split", lambda *args: pytest.fail("data loaded"))


def _one_error_line(capsys) -> str:
    error = capsys.readouterr().err
    assert error.startswith("gradcomp: error: ") and error.count("\n") == 1, error
    return error


def _status(arguments) -> int:
    try:
        return main(arguments)
    except SystemExit as stop:  # argparse's errors
        return stop.code


@pytest.mark.parametrize(
    "selection", [{"include": ["nosuchlayer.*"]}, {"exclude": ["*"]}, {"include": ["fc"], "policy": "prune"}]
)
def test_a_selection_matching_no_layer_is_one_line_before_any_data(selection, tmp_path, monkeypatch, capsys):
    _no_data(monkeypatch)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"policy": "fp:format=e4m3", **selection}))
    out = tmp_path / "run"
    arguments = ["train", "--dataset", "synthetic", "--config", str(config), "--out", str(out)]
    assert _status(arguments) == 2
    error = _one_error_line(capsys)
    assert "resnet10t: no layer of types ['conv'] matches" in error and "include" in error
    assert not out.exists()


def test_a_pipeline_job_checks_every_runs_selection_before_training_any(tmp_path, monkeypatch, capsys):
    _no_data(monkeypatch)
    monkeypatch.setattr("gradcomp.training.train.train", lambda config: pytest.fail("trained"))
    spec = {"dataset": "synthetic", "policy": "prune", "device": "cpu"}
    items = [
        {"run": "fine", "seed": 0, "out": str(tmp_path / "fine"), "spec": spec},
        {"run": "typo", "seed": 0, "out": str(tmp_path / "typo"), "spec": {**spec, "include": ["layer9.*"]}},
    ]
    assert _status(["run", "--job", json.dumps(items)]) == 2
    error = _one_error_line(capsys)
    assert error.startswith("gradcomp: error: --job item 2 (typo, seed 0): resnet10t: no layer of types")
    assert not any(tmp_path.iterdir())


def test_a_probe_alone_checks_its_selection_and_an_uncompressed_run_has_none_to_check(tmp_path, monkeypatch):
    from gradcomp.training.train import check_model_config

    check_model_config(resolve_config(dataset="synthetic", include=["nosuch"]))  # nothing is attached
    with pytest.raises(ConfigError, match="no layer of types"):
        check_model_config(resolve_config(dataset="synthetic", include=["nosuch"], probe={"every": 1}))


# --- compute: the runs its settings name, each trained as it needs, before computing -----------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Folders that read as finished runs (config.yaml, summary.json; nothing trained): name -> policy and
    forward_bits, at seeds 0 and 1; `corrupt` holds a summary that is not JSON."""
    root = tmp_path_factory.mktemp("finished")
    kinds = {
        "base": ("none", None),
        "qat": ("none", 8),
        "fp": ("fp:format=e4m1", None),
        "prune": ("prune:sparsity=0.85", None),
    }
    for name, (policy, forward_bits) in kinds.items():
        for seed in (0, 1):
            folder = root / name / f"seed{seed}"
            folder.mkdir(parents=True)
            config = resolve_config(
                dataset="synthetic", policy=policy, forward_bits=forward_bits, seed=seed, out=str(folder)
            )
            (folder / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
            (folder / "summary.json").write_text(json.dumps({"final_test_accuracy": 0.5, "steps": 1}))
    corrupt = root / "corrupt"
    shutil.copytree(root / "base" / "seed0", corrupt)
    (corrupt / "summary.json").write_text("{")
    return root


A5 = {"baseline": "base", "runs": ["fp"]}


@pytest.mark.parametrize(
    ("settings", "runs", "message"),
    [
        (
            A5,
            ["base:0=base/seed0"],
            r"A5 reads runs \['fp'\] \(named by its settings\), which --runs does not ",
        ),
        (A5, ["base:0=base/seed0", "fp:0=prune/seed0"], r"A5 setting runs: run 'fp' trains policy prune:"),
        (
            A5,
            ["base:0=fp/seed0", "fp:0=fp/seed0"],
            r"setting baseline: run 'base' trains policy fp:.*needs an ",
        ),
        (
            {"exact": "base", "qat": "q", "runs": ["fqt"]},
            ["base:0=base/seed0", "q:0=base/seed0", "fqt:0=qat/seed0"],
            r"B4 setting qat: run 'q' trains policy none; B4 needs a QAT run \(policy none with forward",
        ),
        (
            {"run": "base"},
            ["base:0=base/seed0"],
            r"B1 setting run: run 'base' trains policy none; B1 needs a",
        ),
        ({"run": "qat", "seeds": [0, 1]}, ["qat:0=qat/seed0"], r"B1 measures run qat at seeds \[0, 1\]"),
        (A5, ["base:0=base/seed0", "fp:0=fp/seed0", "fp:1=prune/seed1"], r"--runs fp: seed 1 .* differently"),
        (
            A5,
            ["base:0=base/seed0", "base:0=base/seed1"],
            r"--runs base:0=base/seed1: run base at seed 0 is given",
        ),
        (A5, ["base:0=nosuch"], r"--runs base:0=nosuch: no nosuch/config.yaml: not a finished training run"),
        (A5, ["base:0=corrupt"], r"--runs base:0=corrupt: not a training run's folder \(JSONDecodeError"),
    ],
)
def test_compute_refuses_runs_its_settings_do_not_get_in_one_line_before_computing(
    settings, runs, message, finished, tmp_path, monkeypatch, capsys
):
    from gradcomp.experiments.base import Experiment

    monkeypatch.setattr(Experiment, "compute", property(lambda self: pytest.fail("computed")))
    monkeypatch.chdir(finished)
    experiment_id = "B4" if "exact" in settings else "B1" if "run" in settings else "A5"
    file = tmp_path / "settings.json"
    file.write_text(json.dumps(settings))
    out = tmp_path / "figures"
    arguments = ["compute", experiment_id, "--settings", str(file), "--out-dir", str(out), "--runs", *runs]
    assert _status(arguments) == 2
    assert re.search(message, _one_error_line(capsys))
    assert not out.exists()


def test_a_pipeline_config_naming_a_run_of_the_wrong_policy_is_refused_at_parse_time():
    config = default_config()
    config["experiments"]["A5"]["runs"].append("short_prune_85")
    with pytest.raises(
        ValueError, match=r"^config key experiments.A5.runs: run 'short_prune_85' trains policy prune"
    ):
        check_config(config)


# --- summary, draw, page, run: every mistake one line, status 2, nothing written ----------------------------
@pytest.fixture
def inputs(tmp_path):
    """Files a user might hand the verbs by mistake, in tmp_path/inputs."""
    folder = tmp_path / "inputs"
    (folder / "empty").mkdir(parents=True)
    (folder / "not.json").write_text("{not json")
    (folder / "list.json").write_text("[1, 2]")
    (folder / "latin1.md").write_bytes("# Überblick\n".encode("latin-1"))
    (folder / "page.md").write_text("# A page\n")
    (folder / "figure.png").write_text("not a PNG")
    (folder / "broken").mkdir()
    (folder / "broken" / "A5_fp_formats.json").write_text('{"id": "A5"}')
    return folder


JOB = [{"run": "a", "seed": 0, "out": "out", "spec": {"dataset": "synthetic", "device": "cpu"}}]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["summary", "--figures", "missing", "--out", "SUMMARY.md"], "--figures missing is not a folder"),
        (["summary", "--figures", "inputs/empty", "--out", "SUMMARY.md"], "holds no experiment's numbers"),
        (["summary", "--figures", "inputs/broken", "--out", "SUMMARY.md"], "is not an experiment's numbers"),
        (["summary", "--figures", "inputs/empty", "--out", "inputs/page.md/S.md"], "holds no experiment's"),
        (["draw", "inputs/not.json"], "inputs/not.json is not an experiment's numbers (the JSON gradcomp"),
        (["draw", "inputs/list.json"], "inputs/list.json is not an experiment's numbers"),
        (["draw", "inputs/missing.json"], "No such file or directory: 'inputs/missing.json'"),
        (["page", "inputs/latin1.md", "--out", "page.html"], "inputs/latin1.md is not UTF-8 text"),
        (["page", "inputs/page.md", "--figure", "inputs/figure.png", "--out", "p.html"], "is not a PNG file"),
        (["page", "inputs/page.md", "--out", "inputs/empty"], "--out inputs/empty is a folder"),
        (
            ["page", "inputs/page.md", "--out", "inputs/page.md/p.html"],
            "inputs/page.md is not a writable folder",
        ),
        (["compute", "A4", "--out-dir", "inputs/page.md"], "--out-dir inputs/page.md is not a folder"),
        (["compute", "A5", "--out-dir", "out"], "no --settings given: experiments.A5: missing settings"),
        (["compute", "A4", "--out-dir", "out", "--runs", ":0=folder"], "items are RUN:SEED=FOLDER, got ':0="),
        (["compute", "A4", "--out-dir", "out", "--runs", "a:0="], "items are RUN:SEED=FOLDER, got 'a:0='"),
        (["run", "--job", "[]"], "argument --job: expected a JSON list of"),
        (
            ["run", "--job", json.dumps([{**JOB[0], "spec": "x"}])],
            "item 1: spec must be a mapping of training",
        ),
        (
            ["run", "--job", json.dumps([{**JOB[0], "seed": -1}])],
            "item 1: seed must be an integer >= 0, got -1",
        ),
        (["run", "--job", json.dumps([{**JOB[0], "run": ""}])], "item 1: run must be a name, got ''"),
        (
            ["run", "--job", json.dumps(JOB), "--manifest", "inputs/page.md/m.json"],
            "--manifest inputs/page.md/",
        ),
    ],
    ids=lambda value: " ".join(value)[:60] if isinstance(value, list) else None,
)
def test_every_pipeline_verb_mistake_is_one_line_and_status_2_writing_nothing(
    arguments, message, inputs, monkeypatch, capsys
):
    monkeypatch.chdir(inputs.parent)
    monkeypatch.setattr("gradcomp.training.train.train", lambda config: pytest.fail("trained"))
    before = sorted(inputs.parent.rglob("*"))
    assert _status(arguments) == 2
    assert message in _one_error_line(capsys)
    assert sorted(inputs.parent.rglob("*")) == before
