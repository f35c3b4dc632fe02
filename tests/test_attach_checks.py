"""`attach` refuses at attach time what would fail at the first backward pass or silently do nothing, and
warns where a policy's own placement misses most of a model (issue 27)."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from helpers import hooks_and_wrappers
from torch import nn

from gradcomp.choices import choose, integer, typed
from gradcomp.rng import resolve_seed
from gradcomp.training.attachment import attach
from gradcomp.training.compress import GradientCopy, LayerStats, compress
from gradcomp.training.config import CompressionConfig
from gradcomp.training.models import create_model
from gradcomp.training.noise_monitor import NoiseMonitor
from gradcomp.training.policies import NM, Luq, parse_policy


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
    code = "import sys, gradcomp.choices, gradcomp.training.config; print('torch' in sys.modules)"
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


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"layer_types": ("bn",), "placement": "input", "noise_every": 2}, "placement='output'"),
        ({"layer_types": ("conv", "linear"), "keep_last": 2}, "keeps every one of the 2"),
        ({"layer_types": ("conv", "linear"), "noise_every": 1, "keep_worst": 2}, "keeps every one"),
        ({"include": ("nothing*",)}, "no layer of types"),
    ],
)
def test_a_refused_attach_leaves_the_model_as_it_was(config, message):
    """Everything is checked before the first hook goes on (noise_every with the input placement left the
    model's step hook behind)."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    before = hooks_and_wrappers(model)
    with pytest.raises(ValueError, match=message):
        attach(model, CompressionConfig("prune:sparsity=0.5", **config))
    assert hooks_and_wrappers(model) == before
    attach(model, "prune:sparsity=0.5").detach()  # and nothing holds its layers


@pytest.mark.parametrize("policy", ["prune:sparsity=0.5", "int:bits=4"])
def test_an_attach_that_fails_while_installing_undoes_what_it_installed(monkeypatch, policy):
    """A failure after some hooks and wrappers are on (here the second layer's noise hooks) removes them."""
    model = _model()
    before = hooks_and_wrappers(model)
    watch = NoiseMonitor.watch
    calls = []

    def fail_at_the_second_layer(self, *args):
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("injected")
        return watch(self, *args)

    monkeypatch.setattr(NoiseMonitor, "watch", fail_at_the_second_layer)
    config = CompressionConfig(policy, layer_types=("conv", "linear"), noise_every=1)
    with pytest.raises(RuntimeError, match="injected"):
        attach(model, config)
    assert hooks_and_wrappers(model) == before
    monkeypatch.undo()
    attach(model, config).detach()  # nothing holds its layers


def test_a_frozen_layer_is_compressed_without_a_noise_ratio():
    """A layer whose weight takes no gradient has no weight-gradient noise: it is not monitored (the noise
    ratio's hook on its weight failed part-way through attach with a raw torch error)."""
    model = _model()
    model[3].requires_grad_(False)
    config = CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), noise_every=1)
    with attach(model, config) as handle:
        model(torch.randn(2, 3, 8, 8)).square().sum().backward()
        assert [row["layer"] for row in handle.noise_ratios()] == ["0"]
        assert handle.layer_summary()["3"]["elements"] == 8  # still compressed
    deeper = nn.Sequential(*model, nn.ReLU(), nn.Linear(4, 4))
    deeper[0].requires_grad_(False)
    config = CompressionConfig("fp:format=e2m1", layer_types=("conv", "linear"), noise_every=1, keep_worst=2)
    with pytest.raises(ValueError, match="keep_worst=2 ranks layers by their noise ratio, and 1 of"):
        attach(deeper, config)  # two of the three layers are frozen


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"fallback": "fp:format=e4m3"}, "acts only on layers that switch"),
        ({"guard_patience": 3}, "guard_patience counts"),
        ({"guard_patience": 3, "switch_step": 5}, "guard_patience counts"),
        ({"guard_on": "carried", "noise_every": 2}, "guard_on says"),
        ({"guard": 1.7, "noise_every": 2, "guard_on": "measured"}, "needs measure_noise"),
        ({"guard": 1.7, "noise_every": 2, "guard_on": "exact"}, "guard_on must be one of"),
    ],
)
def test_keys_that_would_do_nothing_are_refused(keys, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig("fp:format=e2m1", **keys)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("prune:sparsity=0.8,sparsity=0.9", "gives sparsity twice"),
        ("mxfp4:signs=run", "signs=run sets the signs"),
        ("nvfp4:weight_signs=run", "weight_signs=run sets"),
        ("nvidia_nvfp4:signs=step", "signs=step sets the signs"),  # its input copy has no transform
    ],
)
def test_policy_keys_that_would_do_nothing_or_twice_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_policy(spec)
    assert parse_policy("nvidia_nvfp4:weight_signs=step").copy(True).signs == "step"


def test_quantize_block_refuses_signs_without_a_transform():
    from gradcomp.formats.block import BlockFormat
    from gradcomp.ops.block import quantize_block

    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="sign_seed=7 seeds a Hadamard transform's random signs"):
        quantize_block(x, BlockFormat("e2m1fn"), sign_seed=7)
    with pytest.raises(ValueError, match="signs=False sets the Hadamard transform's signs"):
        BlockFormat("e2m1fn", signs=False)
    # a policy's signs act on the copy that has a transform only: the other copy draws none
    model = _model()
    with attach(model, "mxfp4:weight_hadamard=16,signs=run") as handle:
        _gradients(model)
        assert handle.layer_summary()["0"]["elements"] > 0
