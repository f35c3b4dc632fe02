"""attach() in a user's own loop: steps advance without begin_step, non-finite fits are redone, the
schedules that cannot be honoured warn, and every policy reports what it has."""

import importlib
import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import gradcomp
from gradcomp import CompressionConfig, attach
from gradcomp.training.models import create_model


def _model():
    torch.manual_seed(0)
    return create_model("resnet18", 10, 1, 28, "3x3s2", channels=[8, 16, 16, 16])


def _batch(seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 1, 28, 28, generator=generator), torch.randint(0, 10, (16,), generator=generator)


def _train(model, handle, steps, driven=False, refresh_epoch=False):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images, labels = _batch()
    for step in range(steps):
        if driven:
            handle.begin_step(step, epoch_start=step == 0 or refresh_epoch)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_plain_loop_gets_the_same_steps_as_one_that_calls_begin_step():
    runs = []
    for driven in (False, True):
        model = _model()
        handle = attach(model, CompressionConfig("prune:sparsity=0.85", refresh=2))
        _train(model, handle, 4, driven)
        runs.append((model, handle))
    (auto, auto_handle), (driven, driven_handle) = runs
    assert auto_handle.step == driven_handle.step == 3
    for a, b in zip(auto.parameters(), driven.parameters(), strict=True):
        assert torch.equal(a, b)
    assert auto_handle.sparsity() == driven_handle.sparsity()


def test_evaluation_forwards_do_not_count_as_steps():
    model = _model()
    handle = attach(model, "prune:sparsity=0.85")
    _train(model, handle, 2)
    with torch.no_grad():
        model(_batch()[0])
    assert handle.step == 1
    for _ in range(2):  # the next step begins with the first forward pass; no backward, so no other one
        model(_batch()[0])
    assert handle.step == 2


def test_first_step_zero_gradients_are_fitted_again_at_the_next_step():
    """timm zero-initialises each residual block's last BatchNorm weight: at the first step the convolutions
    of the branch before it receive all-zero gradients and fit nothing. With refresh every 10 steps those
    layers fit again at step 1; the layers that did fit keep their statistics, as the schedule says."""
    model = _model()
    handle = attach(model, CompressionConfig("prune:sparsity=0.85", refresh=10))
    _train(model, handle, 1)
    unfitted = {x.name for x in handle.layers if not math.isfinite(float(x.stats.mu))}
    assert unfitted and all(name.startswith("layer") and ".conv" in name for name in unfitted)  # the branches
    thresholds = {x.name: float(x.stats.threshold) for x in handle.layers if x.name not in unfitted}
    handle.reset_counts()
    with pytest.warns(RuntimeWarning, match="fitted nothing finite at step 0"):
        _train(model, handle, 1)
    assert all(math.isfinite(float(x.stats.mu)) for x in handle.layers)
    assert thresholds == {
        name: float(x.stats.threshold) for x in handle.layers if (name := x.name) in thresholds
    }
    summary = handle.layer_summary()
    assert all(summary[name]["sparsity"] > 0.5 for name in unfitted)


def test_an_epoch_schedule_fits_the_unfitted_layers_again_too():
    model = _model()
    handle = attach(model, CompressionConfig("prune:sparsity=0.85", refresh="epoch"))
    _train(model, handle, 3, driven=True)
    assert all(math.isfinite(float(x.stats.mu)) for x in handle.layers)


def test_schedules_that_cannot_be_honoured_warn_once():
    model = _model()
    handle = attach(model, CompressionConfig("prune:sparsity=0.85", refresh="epoch"))
    with pytest.warns(RuntimeWarning, match="epoch boundaries"):
        _train(model, handle, 2)
    handle.detach()

    handle = attach(model, "prune:sparsity=0.85")
    handle.begin_step(0)
    images, labels = _batch()
    with pytest.warns(RuntimeWarning, match="two backward passes"):
        for _ in range(2):
            nn.functional.cross_entropy(model(images), labels).backward()
    with pytest.warns(RuntimeWarning, match="steps must increase"):
        handle.begin_step(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle.begin_step(1)  # a warning is given once


def test_step_hooks_context_manager_and_detach():
    model = _model()
    seen = []
    with attach(model, "prune:sparsity=0.85") as handle:
        remove = handle.add_step_hook(lambda h, step: seen.append((h is handle, step)))
        _train(model, handle, 3)
        remove()
        _train(model, handle, 1)
    assert seen == [(True, 0), (True, 1), (True, 2)]
    # detached: the gradients are those of the plain model
    plain = _model()
    model.load_state_dict(plain.state_dict())
    model.zero_grad(set_to_none=True)
    images, labels = _batch()
    for net in (model, plain):
        nn.functional.cross_entropy(net(images), labels).backward()
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_int_policies_report_range_and_bins_and_chains_each_member():
    layer = nn.Linear(32, 16)
    x = torch.randn(8, 32)
    upstream = torch.randn(8, 16)
    handle = attach(layer, CompressionConfig("int:bits=4,scheme=psq", layer_types=["linear"]))
    (layer(x) * upstream).sum().backward()
    summary = handle.layer_summary()[""]
    assert summary["bins"] == 15 and summary["range"] == pytest.approx(float(upstream.max() - upstream.min()))
    handle.detach()

    handle = attach(layer, CompressionConfig("prune:sparsity=0.8+fp:format=e4m3", layer_types=["linear"]))
    (layer(x) * upstream).sum().backward()
    summary = handle.layer_summary()[""]
    prune, fp = summary["members"]
    assert prune["policy"].startswith("prune:") and fp["policy"].startswith("fp:format=e4m3")
    assert fp["format"] == "e4m3" and fp["scale"] > 0 and "scale" not in prune
    assert prune["threshold"] > 0 and "threshold" not in fp
    assert summary == {**{k: v for k, v in prune.items() if k != "policy"}, **summary}  # the first member


def test_torch_compile_after_attach_matches_eager():
    grads = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(288, 4)
        )
        handle = attach(model, "prune:sparsity=0.8")
        net = torch.compile(model) if compiled else model
        torch.manual_seed(1)
        for _ in range(2):
            model.zero_grad()
            net(torch.randn(4, 3, 8, 8)).sum().backward()
        grads.append((handle.step, handle.sparsity(), model[0].weight.grad))
    assert grads[0][:2] == grads[1][:2]
    torch.testing.assert_close(grads[0][2], grads[1][2], rtol=1e-4, atol=1e-6)


def test_the_public_api_is_importable_from_the_package():
    importlib.import_module(
        "gradcomp.training.attachment"
    )  # importing the module does not shadow the function
    from gradcomp import attach as attach_function

    assert callable(attach_function) and attach_function is attach
    for name in ("attach", "Attachment", "CompressionConfig", "Prune", "FloatingPoint", "Integer", "Chain"):
        assert name in gradcomp.__all__ and getattr(gradcomp, name) is not None
    assert (Path(gradcomp.__file__).parent / "py.typed").exists()
