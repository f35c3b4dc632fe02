"""The compiled CPU path (torch.compile of the chunk functions) against the eager torch implementation."""

import warnings

import pytest
import torch
from helpers import lognormal_gradient, same_bits
from torch import nn

from gradcomp import log_moments, lognormal_threshold, stochastic_prune
from gradcomp._backend import COMPILE_ENV, CpuCompiled
from gradcomp.attach import attach
from gradcomp.config import CompressionConfig


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


def test_a_failed_compile_warns_once_and_runs_eagerly(monkeypatch):
    def broken_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler")

        return run

    monkeypatch.setenv(COMPILE_ENV, "1")
    monkeypatch.setattr(torch, "compile", broken_compile)
    kernel = CpuCompiled(lambda x: x + 1)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler.*runs eagerly"):
        assert torch.equal(kernel(torch.zeros(3)), torch.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(kernel(torch.ones(2)), torch.full((2,), 2.0))
