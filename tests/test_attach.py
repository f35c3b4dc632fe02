import math

import pytest
import torch
from torch import nn

from gradcomp.ops.stats import count_zeros
from gradcomp.training.attachment import attach, select_layers
from gradcomp.training.config import CompressionConfig
from gradcomp.training.models import create_model


def _linear_probe(in_features=64, out_features=64, seed=0):
    """An orthogonal Linear layer fed the identity matrix: W.grad = g_weight^T and x.grad = g_input @ W, so
    the gradients each GEMM received can be read back (to float32 rounding)."""
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.linalg.qr(torch.randn(out_features, in_features))[0])
    x = torch.eye(in_features, requires_grad=True)
    upstream = torch.randn(in_features, out_features) * torch.exp(2 * torch.randn(in_features, out_features))
    return layer, x, upstream


def _backward(layer, x, upstream):
    out = layer(x)
    (out * upstream).sum().backward()
    g_weight = layer.weight.grad.t().clone()
    g_input = x.grad @ layer.weight.detach().t()
    return out.detach(), g_input, g_weight


def test_forward_is_unchanged_and_the_gradient_is_pruned():
    layer, x, upstream = _linear_probe()
    reference = layer(x).detach()
    handle = attach(layer, CompressionConfig("prune:sparsity=0.8", layer_types=["linear"]))
    out, g_input, g_weight = _backward(layer, x, upstream)
    assert torch.equal(out, reference)
    # one stream: both GEMMs see the same gradient
    assert torch.allclose(g_input, g_weight, rtol=1e-4, atol=1e-5 * float(upstream.abs().max()))
    alpha = float(handle.layers[0].stats.threshold)
    pruned = g_weight[upstream.abs() < alpha]
    assert torch.all((pruned == 0) | torch.isclose(pruned.abs(), torch.tensor(alpha)))
    assert torch.equal(g_weight[upstream.abs() >= alpha], upstream[upstream.abs() >= alpha])
    assert abs(float((g_weight == 0).double().mean()) - 0.8) < 0.05
    assert handle.sparsity() == pytest.approx(float((g_weight == 0).double().mean()))


def test_int_policy_quantizes_the_two_gemms_differently_without_a_second_forward():
    layer, x, upstream = _linear_probe()
    calls = []
    layer.register_forward_hook(lambda *args: calls.append(1))
    attach(layer, CompressionConfig("int:bits=2,scheme=psq", layer_types=["linear"]))
    out, g_input, g_weight = _backward(layer, x, upstream)
    assert len(calls) == 1
    assert torch.allclose(out, x @ layer.weight.t())
    low, high = g_input.aminmax(dim=1, keepdim=True)
    codes = (g_input - low) / ((high - low) / 3)
    assert torch.allclose(codes, codes.round(), atol=1e-3)  # 2-bit per-sample codes on the input path
    assert g_weight.unique().numel() > 4 * 64  # the weight path is 8-bit per column
    assert not torch.allclose(g_input, g_weight, atol=1e-3)


def test_survives_in_place_relu_and_residual_adds_in_timm_resnet():
    torch.manual_seed(0)
    model = create_model("resnet18", num_classes=10, in_chans=1)
    x = torch.randn(4, 1, 32, 32)
    reference = model(x).detach()
    handle = attach(model, "prune:sparsity=0.9")
    out = model(x)
    assert torch.equal(out.detach(), reference)
    nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 3])).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert len(handle.layers) == 20  # pruning acts on the 20 convolutions, not on the classifier
    assert 0.85 < handle.sparsity() <= 1.0  # some gradients are exactly zero at init (zero_init_last)


def test_conv_followed_directly_by_in_place_relu():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(inplace=True), nn.Conv2d(8, 4, 3), nn.ReLU(inplace=True)
    )
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    for spec in ("prune:sparsity=0.5", "fp:format=e4m3", "int:bits=4,scheme=bhq"):
        handle = attach(model, spec)
        model(x).sum().backward()
        assert torch.isfinite(x.grad).all()
        handle.detach()


def test_detach_restores_exact_gradients():
    torch.manual_seed(0)
    model = create_model("resnet10t", num_classes=5)
    x = torch.randn(4, 3, 16, 16)

    def gradients():
        model.zero_grad()
        model(x).square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    reference = gradients()
    for spec in ("prune:sparsity=0.9", "int:bits=3,scheme=ptq"):
        handle = attach(model, spec)
        assert any(not torch.equal(a, b) for a, b in zip(gradients(), reference, strict=True))
        handle.detach()
        assert all(torch.equal(a, b) for a, b in zip(gradients(), reference, strict=True))


def test_default_placement_follows_each_paper():
    model = create_model("resnet18", num_classes=10, in_chans=1)
    layers = {}
    for spec in ("prune", "fp", "int", "none", "prune+int"):
        with attach(model, spec) as handle:
            layers[spec] = [layer.name for layer in handle.layers]
    assert layers["prune"] == layers["fp"] and "fc" not in layers["prune"] and len(layers["prune"]) == 20
    assert layers["int"] == layers["none"] == layers["prune+int"] == [*layers["prune"], "fc"]


def test_layer_selection_and_placement_on_batchnorm_inputs():
    model = create_model("resnet18", num_classes=10, in_chans=1)
    names = [name for name, _ in select_layers(model, ["conv"], include=["layer1.*"])]
    assert names == ["layer1.0.conv1", "layer1.0.conv2", "layer1.1.conv1", "layer1.1.conv2"]
    assert [n for n, _ in select_layers(model, ["conv", "linear"], exclude=["*downsample*", "fc"])] == [
        n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and "downsample" not in n
    ]
    handle = attach(model, CompressionConfig("prune:sparsity=0.85", layer_types=["bn"], placement="input"))
    nn.functional.cross_entropy(model(torch.randn(4, 1, 28, 28)), torch.tensor([0, 1, 2, 3])).backward()
    # at initialisation timm zeroes the last BN of each block, so some layers get all-zero gradients
    assert len(handle.layers) == 20 and 0.75 < handle.sparsity() <= 1.0
    with pytest.raises(ValueError, match="no layer"):
        select_layers(model, ["conv"], include=["nothing*"])
    with pytest.raises(ValueError, match="unknown layer types"):
        select_layers(model, ["attention"])


def test_schedule_refresh_and_warmup():
    layer, x, upstream = _linear_probe()
    config = CompressionConfig("prune:sparsity=0.8", layer_types=["linear"], refresh=3, warmup_steps=1)
    handle = attach(layer, config)
    thresholds = []
    for step in range(5):
        handle.begin_step(step)
        layer.zero_grad()
        x.grad = None
        _, _, g_weight = _backward(layer, x, upstream * (step + 1))
        if step == 0:
            assert torch.equal(g_weight, upstream)  # warm-up: uncompressed
        thresholds.append(
            float(handle.layers[0].stats.threshold) if handle.layers[0].stats.threshold is not None else None
        )
    # statistics were due at step 0 (applied at the first compressed step, 1) and refreshed at step 3
    assert thresholds[0] is None
    assert thresholds[1] == thresholds[2] and thresholds[3] == thresholds[4] != thresholds[2]
    with pytest.raises(ValueError, match="refresh"):
        CompressionConfig(refresh="sometimes")


def test_state_dict_round_trip():
    layer, x, upstream = _linear_probe()
    config = CompressionConfig("prune:sparsity=0.8+fp:format=e4m3", layer_types=["linear"])
    handle = attach(layer, config)
    _backward(layer, x, upstream)
    state = handle.state_dict()
    other = attach(nn.Linear(64, 64, bias=False), config)
    other.load_state_dict(state)
    assert torch.equal(other.layers[0].stats.parts[0].threshold, handle.layers[0].stats.parts[0].threshold)
    assert other.sparsity() == handle.sparsity()
    summary = handle.layer_summary()[""]
    assert summary["threshold"] > 0 and summary["members"][1]["scale"] > 0 and 0.7 < summary["sparsity"] < 0.9
    assert other.step == handle.step and other.layer_summary() == handle.layer_summary()


def test_zero_counts_are_exact_beyond_float32_integers():
    x = torch.zeros((1 << 24) + 3)
    x[:2] = torch.tensor([math.nan, 1.0])  # NaN is not a zero
    assert count_zeros(x).item() == (1 << 24) + 1  # a float32 sum would round to 2^24
    assert count_zeros(torch.tensor([0.0, -0.0, 2.0], dtype=torch.bfloat16)).item() == 2
    assert count_zeros(torch.empty(0)).item() == 0


@pytest.mark.parametrize("policy", ["mxfp4", "nvidia_nvfp4", "int:bits=5,scheme=psq"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_plain_convolutions_take_aten_backward_with_the_same_gradients(monkeypatch, policy, channels_last):
    """A two-stream policy's plain convolutions call aten's convolution backward once per gradient copy
    instead of differentiating a local graph twice: the same gradients and counts, bit for bit (strides,
    dilation, groups, no bias; a linear layer and a convolution the fast path does not take, beside)."""
    import gradcomp.training.attachment as attachment_module

    plain_convolution = attachment_module._plain_convolution
    results = []
    for plain in (True, False):
        if not plain:
            monkeypatch.setattr(attachment_module, "_plain_convolution", lambda module: False)
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, dilation=2, groups=2, bias=False),
            nn.Conv2d(8, 8, 3, padding="same", padding_mode="reflect"),
            nn.Flatten(),
            nn.Linear(8 * 4 * 4, 10),
        )
        x = torch.randn(4, 3, 16, 16)
        if channels_last:
            model, x = (
                model.to(memory_format=torch.channels_last),
                x.contiguous(memory_format=torch.channels_last),
            )
        handle = attach(model, CompressionConfig(policy, layer_types=("conv", "linear")), seed=1)
        path = type(model[0](x).grad_fn).__name__
        assert path == ("_TwoStreamConvBackward" if plain else "_TwoStreamLayerBackward")
        nn.functional.cross_entropy(model(x), torch.arange(4)).backward()
        results.append(([p.grad for p in model.parameters()], handle.sparsity()))
    (grads, sparsity), (expected, expected_sparsity) = results
    assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))
    assert sparsity == expected_sparsity
    assert plain_convolution(nn.Conv2d(3, 8, 3)) and not plain_convolution(model[3])
