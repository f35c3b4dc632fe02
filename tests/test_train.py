import contextlib
import math
import os
import signal

import numpy as np
import pytest
import torch
import yaml
from helpers import TINY, read_metrics, train_run
from timm.models.resnet import ResNet
from torch.nn.modules.module import register_module_forward_pre_hook

from gradcomp.training.config import CompressionConfig, TrainConfig, resolve_config
from gradcomp.training.policies import Prune, parse_policy
from gradcomp.training.probe import load_probe
from gradcomp.training.train import TrainingInterrupted, train

CONVS = 14  # resnet10t's convolutions (where prune and fp act; int and the probe-only run add the classifier)


@pytest.mark.parametrize(
    "policy",
    [
        "none",
        "prune:sparsity=0.8",
        "fp:format=e4m1",
        "int:bits=5,scheme=bhq",
        "prune:sparsity=0.7+fp:format=e3m2",
    ],
)
def test_end_to_end_each_policy_family(tmp_path, policy):
    summary, run_dir = train_run(tmp_path, "run", policy=policy)
    assert summary["steps"] == 10 and summary["epochs"] == 2
    assert (
        0 <= summary["final_test_accuracy"] <= 1
        and summary["best_test_accuracy"] >= summary["final_test_accuracy"]
    )
    assert summary["wall_seconds"] > 0
    if policy == "none":
        assert summary["gradient_sparsity"] is None and summary["layers"] == {}
    else:
        layers = summary["layers"]
        expected = CONVS + 1 if policy.startswith("int") else CONVS
        assert len(layers) == expected and all(v["sparsity"] is not None for v in layers.values())
    if policy.startswith("prune"):
        target = 0.8 if policy.startswith("prune:sparsity=0.8") else 0.7
        assert summary["gradient_sparsity"] >= target - 0.05
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert parse_policy(config["compression"]["policy"]) == parse_policy(policy)  # written in full
    assert resolve_config(run_dir / "config.yaml").to_dict() == config  # config.yaml reads back
    kinds = [m["kind"] for m in read_metrics(run_dir)]
    assert kinds.count("epoch") == 2 and kinds.count("step") == 5
    assert (run_dir / "checkpoint.pt").exists()


def test_training_is_deterministic(tmp_path):
    first, _ = train_run(tmp_path, "a", policy="prune:sparsity=0.8")
    second, _ = train_run(tmp_path, "b", policy="prune:sparsity=0.8")
    assert first["final_test_accuracy"] == second["final_test_accuracy"]
    assert [m.get("loss") for m in read_metrics(tmp_path / "a")] == [
        m.get("loss") for m in read_metrics(tmp_path / "b")
    ]


@contextlib.contextmanager
def sigterm_during_step(step: int):
    """A real SIGTERM to this process from inside the model's forward pass of training step `step` (a
    global forward hook on the top-level ResNet in training mode): a signal arriving mid-step."""
    calls = [0]

    def hook(module, args):
        if isinstance(module, ResNet) and module.training:
            calls[0] += 1
            if calls[0] == step:
                os.kill(os.getpid(), signal.SIGTERM)

    handle = register_module_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


RESUME_OPTIONS = {"policy": "prune:sparsity=0.8", "refresh": "epoch"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("uninterrupted"), "reference", **RESUME_OPTIONS)


@pytest.mark.parametrize("stop_at", [3, 5, 8])  # mid-epoch, at the end of an epoch, mid second epoch
def test_resume_after_interruption_matches_an_uninterrupted_run(tmp_path, uninterrupted, stop_at):
    options = RESUME_OPTIONS
    reference, reference_dir = uninterrupted
    with (
        sigterm_during_step(stop_at),
        pytest.raises(TrainingInterrupted, match=f"stopped by a signal at step {stop_at};.*--resume"),
    ):
        train_run(tmp_path, "resumed", **options)
    resumed, resumed_dir = train_run(tmp_path, "resumed", resume=True, **options)
    for key in (
        "final_test_accuracy",
        "best_test_accuracy",
        "steps",
        "epochs",
        "gradient_sparsity",
        "layers",
    ):
        assert resumed[key] == reference[key], key
    strip = [{k: v for k, v in m.items() if k != "wall_seconds"} for m in read_metrics(reference_dir)]
    assert [{k: v for k, v in m.items() if k != "wall_seconds"} for m in read_metrics(resumed_dir)] == strip


def test_resume_refuses_a_changed_configuration_or_a_damaged_checkpoint(tmp_path):
    train_run(tmp_path, "run", policy="prune:sparsity=0.8", max_steps=2)
    with pytest.raises(ValueError, match="policy"):
        train_run(tmp_path, "run", policy="prune:sparsity=0.9", max_steps=4, resume=True)
    path = tmp_path / "run" / "checkpoint.pt"
    checkpoint = path.read_bytes()
    for damaged in (checkpoint[: len(checkpoint) // 2], b"not a checkpoint"):  # a truncated file, garbage
        path.write_bytes(damaged)
        with pytest.raises(RuntimeError, match=r"unreadable.*remove it to start over"):
            train_run(tmp_path, "run", policy="prune:sparsity=0.8", max_steps=4, resume=True)


def test_probe_does_not_change_training(tmp_path):
    plain, plain_dir = train_run(tmp_path, "plain", policy="prune:sparsity=0.8", max_steps=7)
    probe = {"steps": [0, 4], "every": 6, "reservoir": 64}
    probed, probed_dir = train_run(tmp_path, "probed", policy="prune:sparsity=0.8", max_steps=7, probe=probe)
    assert probed["final_test_accuracy"] == plain["final_test_accuracy"]
    assert [m.get("loss") for m in read_metrics(probed_dir)] == [
        m.get("loss") for m in read_metrics(plain_dir)
    ]
    data = load_probe(probed_dir / "probe.npz")
    assert set(data["kind"]) == {"gradient", "gradient_active", "weight", "activation"}
    assert sorted(set(data["step"].tolist())) == [0, 4, 6]
    gradient_rows = data["kind"] == "gradient"
    assert gradient_rows.sum() == 3 * CONVS
    hist = data["hist"]
    counted = hist.sum(1) + data["zeros"] + data["nonfinite"] + data["underflow"] + data["overflow"]
    assert np.array_equal(counted, data["count"])
    assert (
        data["samples"].shape == (len(data["step"]), 64) and np.isfinite(data["samples"][gradient_rows]).any()
    )
    measured = gradient_rows & (data["count"] - data["zeros"] - data["nonfinite"] > 1)
    assert measured.sum() > CONVS and np.isfinite(data["log2_std"][measured]).all()
    # layers whose gradient is all zeros (timm's zero-initialised last BN, at step 0) have no spread
    assert np.isnan(data["log2_std"][gradient_rows & ~measured]).all()


def test_probe_alone_without_compression(tmp_path):
    summary, run_dir = train_run(
        tmp_path, "probe_only", max_steps=2, probe={"steps": [1], "kinds": ["gradient"]}
    )
    assert summary["gradient_sparsity"] is None
    assert set(load_probe(run_dir / "probe.npz")["kind"]) == {"gradient", "gradient_active"}


def test_non_finite_gradients_are_skipped_then_stop_training(tmp_path, monkeypatch):
    original = torch.nn.functional.cross_entropy
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", lambda *a, **k: original(*a, **k) * math.nan)
    with pytest.raises(FloatingPointError, match="non-finite"):
        train_run(tmp_path, "nan", max_steps=8, max_skipped_steps=3)
    lines = read_metrics(tmp_path / "nan")
    assert lines == [] or all(m["skipped_steps"] > 0 for m in lines)
    saved = torch.load(tmp_path / "nan" / "checkpoint.pt", weights_only=False)
    assert saved["state"]["skipped_steps"] == 4
    assert all(torch.isfinite(value).all() for value in saved["model"].values() if value.is_floating_point())


def test_config_resolution(tmp_path):
    file = tmp_path / "config.yaml"
    file.write_text("dataset: synthetic\nepochs: 3\npolicy: {name: prune, sparsity: 0.9}\n")
    config = resolve_config(file, epochs=5, lr=None)
    assert (config.model, config.epochs, config.policy) == ("resnet10t", 5, Prune(0.9))
    assert resolve_config(dataset="fashion-mnist").model == "resnet18"
    assert resolve_config(refresh="10").compression.refresh == 10
    nested = resolve_config(compression={"policy": "prune:sparsity=0.9", "refresh": 4})
    assert nested.compression == CompressionConfig(Prune(0.9), refresh=4)
    with pytest.raises(ValueError, match="both flat and under compression"):
        resolve_config(refresh=2, compression={"refresh": 4})
    file.write_text("epochs: 3\nlearning_rate: 0.1\n")
    with pytest.raises(ValueError, match="learning_rate"):
        resolve_config(file)
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(optimizer="lamb")


def test_output_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot create the output directory"):
        train(resolve_config(**{**TINY, "out": str(blocker / "run")}))
