"""`attach` refuses at attach time what would fail at the first backward pass or silently do nothing, and
warns where a policy's own placement misses most of a model (issue 27)."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from gradcomp.attachment import attach
from gradcomp.choices import choose, integer, typed
from gradcomp.compress import GradientCopy, LayerStats, compress
from gradcomp.config import CompressionConfig
from gradcomp.models import create_model
from gradcomp.policies import NM, Luq, parse_policy
from gradcomp.rng import resolve_seed


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))


def _gradients(model: nn.Module) -> list[torch.Tensor]:
    model.zero_grad()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    model(x.to(next(model.parameters()).dtype)).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_seeds_are_checked_at_attach_and_none_draws_one():
    model = _model()
    with attach(model, "nm", seed=None) as handle:  # used to fail in backward: None ^ int
        _gradients(model)
        assert isinstance(handle.seed, int) and handle.sparsity() >= 0.5
    with attach(model, "nm", seed=np.int64(7)) as handle:
        numpy_seeded = _gradients(model)
        assert type(handle.seed) is int
    with attach(model, "nm", seed=7):
        assert all(torch.equal(a, b) for a, b in zip(_gradients(model), numpy_seeded, strict=True))
    for bad in (True, 7.0, "7"):
        with pytest.raises(TypeError, match="seed must be an integer or None"):
            attach(model, "nm", seed=bad)
    assert resolve_seed(np.uint32(3)) == 3 and type(resolve_seed(np.int8(3))) is int


def test_an_unknown_backend_is_refused_at_attach():
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'torch', 'triton', got 'gpu'"):
        attach(_model(), "nm", backend="gpu")


def test_a_dtype_the_policy_cannot_compute_in_is_refused_at_attach():
    model = _model().double()
    with pytest.raises(TypeError, match=r"MXFP4 takes float16, bfloat16, float32 gradients.*float64"):
        attach(model, "mxfp4")
    with pytest.raises(TypeError, match="float64"):
        attach(model, "prune+nvfp4")  # a chain's member
    with attach(model, "prune"):  # pruning computes in float64
        assert all(torch.isfinite(g).all() for g in _gradients(model))


@pytest.mark.parametrize("how", ["wrapper", "module.compile", "submodule", "forward"])
def test_a_compiled_model_is_refused(how):
    model = _model()
    if how == "wrapper":
        model = torch.compile(model)
    elif how == "module.compile":
        model.compile()
    elif how == "submodule":
        model[0] = torch.compile(model[0])
    else:
        model.forward = torch.compile(model.forward)
    for policy in ("prune", "int"):  # one-stream policies compressed nothing, two-stream ones did
        with pytest.raises(RuntimeError, match=r"compiled by torch\.compile: attach to the model before"):
            attach(model, policy)


def test_a_second_attach_on_the_same_layers_is_refused_until_the_first_detaches():
    model = _model()
    handle = attach(model, "prune")
    with pytest.raises(RuntimeError, match=r"1 of the layers \(e.g. '0'\) already have an attachment"):
        attach(model, "fp")
    with attach(model, CompressionConfig("int", layer_types=["linear"])):  # other layers: allowed
        pass
    handle.detach()
    with attach(model, "fp"):
        pass


@pytest.mark.parametrize("spec", ["prune+prune:sparsity=0.5", "fp+prune+fp:format=e5m2", "mxfp4+nvfp4"])
def test_a_chain_naming_a_policy_twice_is_refused(spec):
    with pytest.raises(ValueError, match="more than once"):
        parse_policy(spec)


def test_a_placement_that_misses_most_layers_warns_and_names_the_option():
    vit = create_model("deit_tiny_patch16_224", num_classes=4, image_size=32, patch_size=8, depth=2)
    for policy in ("prune", "fp"):
        with pytest.warns(UserWarning, match=r"1 of the model's 10 .*layer_types=\['conv', 'linear'\]"):
            attach(vit, policy).detach()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attach(vit, CompressionConfig("prune", layer_types=["conv", "linear"])).detach()
        attach(vit, "int").detach()
        attach(create_model("resnet10t", num_classes=4), "prune").detach()  # 11 of 12 layers


@pytest.mark.parametrize(
    ("spec", "name"), [("mxfp4", r"MXFP4 \(block policy\)"), ("prune+int:bits=4", r"int4 PTQ \(int policy\)")]
)
def test_the_two_stream_placement_error_names_the_policy_given(spec, name):
    with pytest.raises(ValueError, match=f"^{name} compresses .* needs placement='output', got 'input'"):
        CompressionConfig(spec, placement="input")


def test_a_float_axis_is_a_clear_error():
    g = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"feature_axis must be an integer, got 1\.0"):
        compress(NM(), GradientCopy(g, 0, feature_axis=1.0), LayerStats())
    out = compress(NM(), GradientCopy(g, np.int64(0), feature_axis=np.int64(1)), LayerStats())
    assert (out.reshape(4, 2, 4) != 0).sum(-1).max() <= 2


def test_the_choices_are_one_torch_free_module_with_one_message_form():
    code = "import sys, gradcomp.choices, gradcomp.config; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
    assert choose("rounding", "nearest", ("nearest", "stochastic")) == "nearest"
    with pytest.raises(ValueError, match=r"^rounding must be one of 'nearest', 'stochastic', got 'down'$"):
        choose("rounding", "down", ("nearest", "stochastic"))
    assert integer("bits", np.int16(4), 1, 16) == 4
    for bad in (True, 4.0, "4", 17):
        with pytest.raises(ValueError, match=r"^bits must be an integer in \[1, 16\], got"):
            integer("bits", bad, 1, 16)
    assert typed("lr", "float", 1) == 1.0 and type(typed("epochs", "int | None", np.int64(3))) is int
    assert Luq(bits=np.int64(4)).describe() == "luq:bits=4,samples=1"
    with pytest.raises(ValueError, match=r"^int: scheme must be one of 'ptq', 'psq', 'bhq', got 'pts'$"):
        parse_policy("int:scheme=pts")
