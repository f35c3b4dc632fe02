"""Quantization-aware training (QAT) forward quantizers, the reference point of the statistical FQT framework.

QAT quantizes the inputs and weights of every convolution and linear layer in the forward pass with
deterministic round-to-nearest (statquant digest section 2.2) and keeps the backward pass exact through the
straight-through estimator. Fully quantized training (FQT) is QAT plus an unbiased gradient quantizer (an
`int` policy), so a QAT run and its FQT runs differ only in the gradients. This is a baseline emulated in
torch, not a compression op: it has no Triton kernel.

Activations: per-tensor min-max, z = min - 1e-8, s = B / (max - min + 2e-8).
Weights: per-tensor min-max with the range widened to include 0 and zero aligned to an integer code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from gradcomp.training.attachment import select_layers


def _straight_through(x: Tensor, quantized: Tensor) -> Tensor:
    return x + (quantized - x).detach()


def quantize_activation(x: Tensor, bits: int) -> Tensor:
    """Round-to-nearest per-tensor min-max quantize/dequantize with a straight-through gradient: x + (Q(x) -
    x), the difference held constant. One pass for the range and in-place steps (fresh buffers cost page
    faults on CPUs); the same operations, so the same values, as `_straight_through`."""
    levels = 2**bits - 1
    with torch.no_grad():
        smallest, largest = torch.aminmax(x)
        low = smallest - 1e-8
        scale = levels / (largest - smallest + 2e-8)
        difference = (x - low).mul_(scale).round_().div_(scale).add_(low).sub_(x)
    return x + difference


def quantize_weight(w: Tensor, bits: int) -> Tensor:
    """Round-to-nearest min-max quantize/dequantize whose grid holds 0 exactly (straight-through gradient)."""
    levels = 2**bits - 1
    with torch.no_grad():
        low = torch.clamp(w.min() - 1e-8, max=0.0)
        high = torch.clamp(w.max() + 1e-8, min=0.0)
        zero_code = torch.floor(-low * levels / (high - low)).clamp(min=1.0)
        high = low * (zero_code - levels) / zero_code  # widen so that 0 falls on code zero_code
        scale = levels / (high - low)
        quantized = torch.round((w - low) * scale) / scale + low
    return _straight_through(w, quantized)


class _WeightQuantizer(nn.Module):
    def __init__(self, bits: int) -> None:
        super().__init__()
        self.bits = bits

    def forward(self, w: Tensor) -> Tensor:
        return quantize_weight(w, self.bits)


def _input_hook(bits: int) -> Callable:
    def hook(module: nn.Module, args: tuple) -> tuple:
        return (quantize_activation(args[0], bits), *args[1:])

    return hook


def quantize_forward(model: nn.Module, bits: int, types: tuple[str, ...] = ("conv", "linear")) -> int:
    """Make `model` a QAT model: `bits`-bit inputs and weights for every layer of `types` (in place).

    Call before `attach` so that gradient compression sees the quantized layers. Returns the layer count."""
    if not isinstance(bits, int) or not 2 <= bits <= 16:
        raise ValueError(f"forward_bits must be an integer in [2, 16], got {bits!r}")
    layers = select_layers(model, types)
    for _, module in layers:
        parametrize.register_parametrization(module, "weight", _WeightQuantizer(bits))
        module.register_forward_pre_hook(_input_hook(bits))
    return len(layers)
