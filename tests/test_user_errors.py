"""Ordinary mistakes fail early, in one line that names what is wrong, and leave nothing behind."""

import subprocess
import sys
from pathlib import Path

import pytest
import timm
import yaml
from helpers import ROOT, TINY, default_config, run_snakemake

from gradcomp.cli import main
from gradcomp.config import ConfigError, resolve_config, timm_model_names
from gradcomp.data import FASHION_MNIST_SYSTEM_DIR, DatasetNotFound
from gradcomp.models import check_model
from gradcomp.pipeline import run_spec, schema_violations
from gradcomp.policies import parse_policy
from gradcomp.train import train

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
        "from gradcomp.config import ConfigError, resolve_config\n"
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
    monkeypatch.setattr("gradcomp.train.load_split", lambda *args: pytest.fail("data loaded"))
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
