"""Faults during training: kill -9, a full disk, an unwritable output folder, non-finite values."""

import errno
import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml
from helpers import TINY, read_metrics, train_run

import gradcomp.training.train as train_module
from gradcomp.cli import main
from gradcomp.training.config import resolve_config
from gradcomp.training.train import train

# five steps per epoch, two epochs, a checkpoint every other step and at each epoch's end
KILLED_RUN = {
    **TINY,
    "log_every": 1,
    "checkpoint_every": 2,
    "policy": "prune:sparsity=0.8",
    "refresh": "epoch",
    "threads": 1,  # the killed process and this one sum in the same order, whatever other tests have set
}
SUMMARY_KEYS = ("final_test_accuracy", "best_test_accuracy", "steps", "epochs", "gradient_sparsity", "layers")


def _logged_steps(run_dir):
    path = run_dir / "metrics.jsonl"
    complete = path.read_text().split("\n")[:-1] if path.exists() else []  # a line being written has no \n
    return [json.loads(line)["step"] for line in complete if '"kind": "step"' in line]


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_kill_9_then_the_same_command_ends_like_an_uninterrupted_run(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(KILLED_RUN))
    killed = tmp_path / "killed"
    # --resume starts afresh when there is no checkpoint, so job scripts pass it every time
    command = ["train", "--config", str(config), "--out", str(killed), "--resume"]
    with (tmp_path / "stderr.txt").open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "gradcomp", *command], stderr=stderr)
        try:
            deadline = time.monotonic() + 240
            while 7 not in _logged_steps(killed):  # step 7: the second epoch's second step
                assert process.poll() is None, (tmp_path / "stderr.txt").read_text()
                assert time.monotonic() < deadline, "the training process made no progress"
                time.sleep(0.01)
        finally:
            process.kill()  # SIGKILL
            process.wait()
    assert not (killed / "summary.json").exists()
    saved = torch.load(killed / "checkpoint.pt", weights_only=False)["state"]
    assert saved["epoch"] == 1 and saved["batch"] > 0  # the last checkpoint is from within the second epoch

    main(command)  # the same command again, in this process
    main(["train", "--config", str(config), "--out", str(tmp_path / "reference")])
    resumed, reference = (
        json.loads((tmp_path / d / "summary.json").read_text()) for d in ("killed", "reference")
    )
    for key in SUMMARY_KEYS:
        assert resumed[key] == reference[key], key
    assert read_metrics(killed, times=False) == read_metrics(tmp_path / "reference", times=False)
    final = torch.load(killed / "checkpoint.pt", weights_only=False)["model"]
    expected = torch.load(tmp_path / "reference" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(final[name], expected[name]) for name in expected)


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    _, run_dir = train_run(tmp_path, "run", max_steps=2)
    previous = (run_dir / "checkpoint.pt").read_bytes()

    def disk_full(obj, handle, *args, **kwargs):
        handle.write(previous[:100])  # part of a file, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match=r"No space left on device.*previous checkpoint") as failure:
        train_run(tmp_path, "run", max_steps=4, resume=True)
    assert failure.value.errno == errno.ENOSPC
    assert (run_dir / "checkpoint.pt").read_bytes() == previous
    assert not list(run_dir.glob("*.tmp"))  # the partial file is gone
    monkeypatch.undo()
    summary, _ = train_run(tmp_path, "run", max_steps=4, resume=True)  # the rerun continues from step 2
    assert summary["steps"] == 4


def test_unwritable_output_directory(tmp_path):
    out = tmp_path / "read-only"
    out.mkdir()
    out.chmod(0o500)
    try:
        if os.access(out, os.W_OK):
            pytest.skip("this user writes into read-only folders (root)")
        with pytest.raises(PermissionError, match="not writable"):
            train(resolve_config(**{**TINY, "out": str(out)}))
    finally:
        out.chmod(0o700)


def _poison_inputs(monkeypatch, poisoned, also=None) -> None:
    """Training builds models whose input is multiplied by Inf at the training forward passes (counted from
    1) that `poisoned` picks (a non-finite forward: loss, gradients and BatchNorm statistics); `also(model)`
    adds more."""
    create_model = train_module.create_model
    forwards = [0]

    def faulty_model(*args, **kwargs):
        model = create_model(*args, **kwargs)

        def poison_input(module, inputs):
            forwards[0] += module.training
            return (inputs[0] * math.inf,) if module.training and poisoned(forwards[0]) else None

        model.register_forward_pre_hook(poison_input)
        if also is not None:
            also(model)
        return model

    monkeypatch.setattr(train_module, "create_model", faulty_model)


def test_non_finite_steps_are_skipped_and_training_goes_on(tmp_path, monkeypatch):
    """An Inf input at the 3rd step (non-finite forward: loss, gradients and BatchNorm statistics) and an Inf
    gradient at the 6th (second epoch): both steps are skipped and counted, and nothing non-finite reaches
    the model."""
    backwards = [0]

    def poison_gradient(model):
        def poison(grad):
            backwards[0] += 1
            return grad * math.inf if backwards[0] == 6 else grad

        model.get_classifier().weight.register_hook(poison)

    _poison_inputs(monkeypatch, lambda forward: forward == 3, poison_gradient)
    summary, run_dir = train_run(tmp_path, "faulty")
    assert summary["steps"] == 10 and summary["skipped_steps"] == 2
    assert [m["skipped_steps"] for m in read_metrics(run_dir) if m["kind"] == "epoch"] == [1, 2]
    model = torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.isfinite(value).all() for value in model.values() if value.is_floating_point())
    assert summary["final_test_accuracy"] > 0.2  # a working model (ten classes)


def test_a_skipped_step_counts_in_no_epoch_figure(tmp_path, monkeypatch):
    """A step with an Inf input (its loss and every gradient not finite) is skipped: the epoch's train_loss
    and train_accuracy are those of the other steps, and its compressed gradients (all NaN) take no part in
    the gradient sparsity (pruning to 0.8: each trained step's about 0.8; counting the skipped one's
    elements as non-zeros drew the epoch's to about 0.64)."""
    _poison_inputs(monkeypatch, lambda forward: forward == 3)
    options = {"epochs": 1, "log_every": 1, "policy": "prune:sparsity=0.8", "layer_types": ["conv"]}
    summary, run_dir = train_run(tmp_path, "skipped", **options)
    assert summary["skipped_steps"] == 1
    metrics = read_metrics(run_dir)
    losses = [m["loss"] for m in metrics if m["kind"] == "step"]
    assert len(losses) == 5 and not math.isfinite(losses[2])
    (epoch,) = [m for m in metrics if m["kind"] == "epoch"]
    trained = [loss for loss in losses if math.isfinite(loss)]
    assert epoch["train_loss"] == pytest.approx(sum(trained) / len(trained), rel=1e-9)
    assert 0.75 < epoch["gradient_sparsity"] < 0.85
    assert summary["gradient_sparsity"] == epoch["gradient_sparsity"]


def test_an_epoch_whose_every_step_is_skipped_reports_no_figure(tmp_path, monkeypatch):
    """Its train_loss, gradient sparsity and pruning's bits per element are unknown (None), not the zero
    they read when skipped steps counted."""
    _poison_inputs(monkeypatch, lambda forward: forward > 5)  # the second epoch's five steps
    options = {"policy": "prune:sparsity=0.8", "layer_types": ["conv"], "keep_last": 1}
    summary, run_dir = train_run(tmp_path, "skipped", **options)
    first, second = [m for m in read_metrics(run_dir) if m["kind"] == "epoch"]
    assert first["train_loss"] > 0 and 0.7 < first["gradient_sparsity"] < 0.9
    assert second["train_loss"] is None and second["gradient_sparsity"] is None
    assert summary["skipped_steps"] == 5 and summary["gradient_sparsity"] is None
    assert summary["switches"]["average_bits"] is None and summary["switches"]["switched"]
