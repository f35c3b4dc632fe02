"""The compiled CPU path (torch.compile of the chunk functions) against the eager torch implementation."""

import warnings

import pytest
import torch
from helpers import lognormal_gradient, same_bits
from torch import nn

from gradcomp import log_moments, lognormal_threshold, quantize_block, stochastic_prune
from gradcomp._backend import COMPILE_ENV, CpuCompiled, CpuCompiledPerLayout
from gradcomp.formats.block import BlockFormat
from gradcomp.ops.block import quantize_block_pair
from gradcomp.ops.prune import _prune_chunk
from gradcomp.ops.stats import _log_sums
from gradcomp.training.attachment import attach
from gradcomp.training.config import CompressionConfig


def _both(monkeypatch, fn):
    """fn() eagerly, then compiled."""
    monkeypatch.setenv(COMPILE_ENV, "0")
    eager = fn()
    monkeypatch.setenv(COMPILE_ENV, "1")
    return eager, fn()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_compiled_prune_is_bit_exact(monkeypatch, dtype):
    x = lognormal_gradient((3, 100_000), sigma=2.0).to(dtype)  # two chunks, specials in the first
    for alpha in (float(x[0, 5:].abs().median()), 0.0):
        eager, compiled = _both(monkeypatch, lambda a=alpha: stochastic_prune(x.t(), a, seed=7))
        assert same_bits(compiled, eager)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_compiled_log_moments_match(monkeypatch, dtype):
    x = lognormal_gradient(300_000, sigma=2.0).to(dtype)
    x[1000:2000] = 0
    for tensor in (x, x[5:]):  # with NaN/Inf (the eager fallback of that chunk) and without
        eager, compiled = _both(monkeypatch, lambda t=tensor: log_moments(t))
        assert torch.equal(compiled[[0, 3]], eager[[0, 3]])  # counts exactly
        torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=0)
    eager, compiled = _both(monkeypatch, lambda: lognormal_threshold(x[5:], 0.85))
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=0)  # float32 sums, in another order


def test_compiled_compression_inside_backward(monkeypatch):
    monkeypatch.setenv(COMPILE_ENV, "1")
    layer = nn.Linear(512, 512)
    handle = attach(layer, CompressionConfig("prune:sparsity=0.8", layer_types=["linear"]))
    upstream = lognormal_gradient((256, 512), specials=False)  # the output gradient
    (layer(torch.randn(256, 512)) * upstream).sum().backward()
    assert handle.sparsity() == pytest.approx(0.8, abs=0.02)


def _fake_compile(calls: list, fail: bool):
    """A torch.compile stand-in whose compiled function records its calls, and fails if `fail`."""

    def compile_(fn, **kwargs):
        def run(*args):
            calls.append(args)
            if fail:
                raise RuntimeError("no C++ compiler")
            return fn(*args)

        return run

    return compile_


def test_a_failed_compile_warns_once_per_dtypes_and_runs_eagerly(monkeypatch):
    calls = []
    monkeypatch.setenv(COMPILE_ENV, "1")
    monkeypatch.setattr(torch, "compile", _fake_compile(calls, fail=True))
    kernel = CpuCompiled(lambda x: x + 1)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler.*run eagerly"):
        assert torch.equal(kernel(torch.zeros(3)), torch.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(kernel(torch.ones(2)), torch.full((2,), 2.0))
    assert len(calls) == 1  # float32 is no longer tried
    with pytest.warns(RuntimeWarning, match="float64"):
        kernel(torch.zeros(2, dtype=torch.float64))


def test_an_error_of_the_inputs_is_raised_and_compiling_stays_on(monkeypatch):
    def reject_negative(x: torch.Tensor) -> torch.Tensor:
        if (x < 0).any():
            raise ValueError("negative input")
        return x * 2

    calls = []
    monkeypatch.setenv(COMPILE_ENV, "1")
    monkeypatch.setattr(torch, "compile", _fake_compile(calls, fail=False))
    kernel = CpuCompiled(reject_negative)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="negative input"):
            kernel(-torch.ones(3))
        assert torch.equal(kernel(torch.ones(3)), torch.full((3,), 2.0))
    assert len(calls) == 2 and not kernel.eager_signatures  # both calls went to the compiled function


def test_inputs_that_require_grad_keep_the_compiled_path(monkeypatch):
    """Inputs that require grad used to fail inside the compiled chunk (copysign(out=)) and switch
    compiling off for the process; the ops detach them now."""
    x = lognormal_gradient((2, 1000), sigma=2.0).requires_grad_()
    eager, compiled = _both(monkeypatch, lambda: stochastic_prune(x, 0.01, seed=3))
    assert same_bits(compiled, eager) and not compiled.requires_grad
    eager, compiled = _both(monkeypatch, lambda: log_moments(x))
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=0)
    assert not _prune_chunk.eager_signatures and not _log_sums.eager_signatures


# (the format's settings but its rounding, the rounding, the call's sign_seed)
BLOCK_CASES = [
    ({"element": "e2m1fn"}, "nearest", None),
    ({"element": "e4m3fn", "rule": "ceil", "hadamard": 32}, "stochastic", None),
    ({"element": "e2m1fn", "block_size": 16, "scale": "e4m3fn"}, "nearest", None),
    (
        {"element": "e2m1fn", "block_size": 16, "scale": "e4m3fn", "rule": "te", "hadamard": 16},
        "stochastic",
        None,
    ),
    ({"element": "e2m1fn", "rule": "three_quarters", "hadamard": 32}, "stochastic", 3),
    ({"element": "e2m1fn", "block_size": 16, "scale": "float8_e3m4"}, "nearest", None),
    ({"element": "e2m1fn", "block_size": 16, "scale": "e5m3fnu", "rule": "ceil"}, "stochastic", None),
    (
        {"element": "e2m1fn", "block_size": 16, "scale": "e4m3fn", "rule": "reciprocal", "hadamard": 16},
        "stochastic",
        None,
    ),
    ({"element": "e2m1fn", "block_size": 16, "scale": "e4m3fn", "rule": "four_over_six"}, "stochastic", None),
    # TetraJet-v2: outer blocks grouped by line, each line shorter than the outer block of 128
    (
        {"element": "e2m1fn", "block_size": 16, "scale": "e4m3fn", "outer": 128, "hadamard": 16},
        "stochastic",
        None,
    ),
]


@pytest.mark.parametrize(("options", "rounding", "sign_seed"), BLOCK_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_compiled_block_quantization_is_bit_exact(monkeypatch, options, rounding, sign_seed, dtype):
    """Compiled against eager, with non-finite values, the layouts of other axes and of padded ones, and
    the zero count fused in."""
    if dtype != torch.float32 and options.get("hadamard"):
        pytest.skip("the transform computes in float32 after the same conversion: its compiles take seconds")
    x = lognormal_gradient((20_000, 32), sigma=2.0).to(dtype)
    fmt = BlockFormat(**options, rounding=rounding)
    layouts = ((x, -1), (x[:, :24], -1), (x.view(500, 40, 32), 1))
    for tensor, axis in layouts if dtype == torch.float32 else layouts[:1]:

        def quantize(tensor=tensor, axis=axis):
            zeros = torch.zeros((), dtype=torch.int64)
            call = {"seed": 9, "sign_seed": sign_seed, "axis": axis, "count_zeros_into": zeros}
            return quantize_block(tensor, fmt, **call), zeros

        (eager, eager_zeros), (compiled, compiled_zeros) = _both(monkeypatch, quantize)
        assert same_bits(compiled, eager) and compiled.shape == tensor.shape
        assert int(compiled_zeros) == int(eager_zeros) == int((eager == 0).sum())


def test_compiled_te_on_tiny_tensors_is_bit_exact(monkeypatch):
    """TE's rule where its encode scale (below 7.9e-36) and element factors (below 1.8e-38) are clamped to
    FLT_MAX and decoded by their reciprocals, down to float32 subnormals: the compiled path keeps the
    subnormals and the decode as eagerly (BLOCK_CASES' te case: the same compiled function)."""
    options, rounding, _ = BLOCK_CASES[3]
    assert options["rule"] == "te"
    fmt = BlockFormat(**options, rounding=rounding)
    x = lognormal_gradient((20_000, 32), sigma=2.0)  # with specials: they pass through
    peak = x[torch.isfinite(x)].abs().max().double()
    for magnitude in (1e-36, 1e-38, 3e-41):
        tensor = (x.double() / peak * magnitude).float()

        def quantize(tensor=tensor):
            zeros = torch.zeros((), dtype=torch.int64)
            return quantize_block(tensor, fmt, seed=9, count_zeros_into=zeros), zeros

        (eager, eager_zeros), (compiled, compiled_zeros) = _both(monkeypatch, quantize)
        assert same_bits(compiled, eager) and int(compiled_zeros) == int(eager_zeros), magnitude
        assert (eager[torch.isfinite(eager)] != 0).any()


def test_a_failed_compile_of_a_per_layout_function_warns_and_runs_eagerly(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setenv(COMPILE_ENV, "1")
    monkeypatch.setattr(torch._inductor, "compile", fail)
    kernel = CpuCompiledPerLayout(lambda x: x + 1)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler.*run eagerly"):
        assert torch.equal(kernel(torch.zeros(3)), torch.ones(3))


def test_past_its_layouts_a_per_layout_function_warns_once_and_runs_eagerly(monkeypatch):
    """Each new layout (shape, strides, dtype) of a configuration compiles; past MAX_LAYOUTS of them, the
    further ones run eagerly, with one warning."""
    monkeypatch.setenv(COMPILE_ENV, "1")
    kernel = CpuCompiledPerLayout(lambda x, flag: (x * 2, None) if flag else (x, None))
    monkeypatch.setattr(kernel, "MAX_LAYOUTS", 2)
    for n in (2, 3):
        out, none = kernel(torch.ones(n), True)
        assert torch.equal(out, torch.full((n,), 2.0)) and none is None
    with pytest.warns(RuntimeWarning, match="compiled for 2 tensor layouts"):
        assert torch.equal(kernel(torch.ones(4), True)[0], torch.full((4,), 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(kernel(torch.ones(5), True)[0], torch.full((5,), 2.0))
        assert torch.equal(kernel(torch.ones(5), False)[0], torch.ones(5))  # another configuration
    assert len(kernel.layouts[(True,)]) == 3 and len(kernel.layouts[(False,)]) == 1


@pytest.mark.parametrize("compiled", ["0", "1"])
def test_a_pair_of_block_quantizations_is_the_two_calls(monkeypatch, compiled):
    """quantize_block_pair (a training step's two copies of a gradient in one compiled call) gives what
    quantize_block gives each, zero counts included: an NHWC gradient along its channels and along the
    positions, with different settings per copy."""
    monkeypatch.setenv(COMPILE_ENV, compiled)
    g = lognormal_gradient((8, 48, 5, 3), sigma=2.0).contiguous(memory_format=torch.channels_last)
    g[0, 0, 0, 0] = float("inf")
    weight = g.movedim(1, 0).reshape(48, -1)
    first = {"element": "e2m1fn", "rounding": "stochastic", "hadamard": 16}
    second = {"element": "e2m1fn", "block_size": 16, "scale": "e4m3fn"}
    formats = (BlockFormat(**first), BlockFormat(**second))
    axes, seeds = (-1, 1), (4, 5)
    counters = [torch.zeros((), dtype=torch.int64) for _ in range(4)]
    pair = quantize_block_pair(
        (weight, g), formats, axes=axes, seeds=seeds, count_zeros_into=(counters[0], counters[1])
    )
    alone = (
        quantize_block(weight, formats[0], axis=axes[0], seed=seeds[0], count_zeros_into=counters[2]),
        quantize_block(g, formats[1], axis=axes[1], seed=seeds[1], count_zeros_into=counters[3]),
    )
    for together, single in zip(pair, alone, strict=True):
        assert same_bits(together, single) and together.stride() == single.stride()
    assert [int(c) for c in counters[:2]] == [int(c) for c in counters[2:]]
    with pytest.raises(TypeError, match="unexpected keyword argument 'hadamrd'"):
        BlockFormat(**{**first, "hadamrd": 16})


@pytest.mark.parametrize("policy", ["mxfp4", "nvidia_nvfp4"])
def test_both_copies_quantized_together_train_as_one_after_the_other(monkeypatch, policy):
    """The attachment hands a layer's two gradient copies to the block policy together (one call); the
    gradients and the zero counts are those of the two calls one after the other."""
    import gradcomp.training.attachment as attachment_module

    monkeypatch.setenv(COMPILE_ENV, "0")
    results = []
    for together in (True, False):
        if not together:
            monkeypatch.setattr(attachment_module, "pair_compressor", lambda policy: None)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 10))
        handle = attach(model, CompressionConfig(policy, layer_types=("conv", "linear")), seed=1)
        nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.arange(4)).backward()
        results.append(([p.grad for p in model.parameters()], handle.sparsity()))
    (grads, sparsity), (expected, expected_sparsity) = results
    assert all(same_bits(a, b) for a, b in zip(grads, expected, strict=True))
    assert sparsity == expected_sparsity
