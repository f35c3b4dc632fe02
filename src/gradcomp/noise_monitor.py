"""The noise ratio of each compressed layer during training, and the precision guard that acts on it.

Every `noise_every` steps (CompressionConfig) a compressed convolution or linear layer notes the energy of
its input patches in forward, and in backward predicts the noise that compressing its neural gradient adds
to its weight gradient twice (`gradcomp.theory.noise`, no GEMM): "theory" carries the policy's error
predicted from the lognormal fit through that energy, "carried" the error the compression actually made
on the neural gradient (one reduction). With `measure_noise` it also computes its exact weight gradient and
the noise itself (the weight-gradient GEMMs of the neural gradient and of the compression's error, on those
steps only). The compressed weight gradient's norm is read where autograd accumulates it. When the next
step begins, the values come to the host (one sync per noise step), the ratios are recorded in `history`,
and the guard switches a layer whose "carried" ratio stayed below `guard` for `guard_patience` noise steps
in a row to `fallback` for the rest of training. It acts on "carried" because the lognormal fit
misses the error of some real layers by an order of magnitude (the tails of a two-population gradient;
see the noise-ratio experiment), while the carrying itself holds within a factor of two wherever the
error is noise (uncorrelated with the gradient, as an unbiased compressor's is).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from gradcomp.compress import GradientCopy, LayerStats
from gradcomp.config import CompressionConfig
from gradcomp.policies import Policy
from gradcomp.theory.noise import (
    error_by_group,
    group_energy,
    neural_error,
    noise_ratio,
    patch_energy,
    predicted_signal,
    rows_and_groups,
    weight_noise,
)

MEASURABLE = (nn.Linear, nn.modules.conv._ConvNd)  # layers whose weight gradient is a GEMM with their input
# the predictions of the noise a layer's weight gradient takes, each carried through its input's energy:
# from the lognormal theory of the policy's error, and from the error the compression made (measured on
# the neural gradient: one reduction, no GEMM); the guard acts on the second
PREDICTIONS = ("theory", "carried")
GUARDED = "carried"


@dataclass
class LayerNoise:
    """One layer's values at the current noise step (tensors on the device until `NoiseMonitor.finish`)."""

    name: str
    module: nn.Module
    energy: Tensor | None = None  # the input patches' energy S_k of each convolution group k
    shape: tuple[int, int] = (1, 1)  # (rows, groups) of the output
    input: Tensor | None = None  # the layer's input (measure_noise)
    predicted: dict[str, float | None] = field(default_factory=dict)  # noise by PREDICTIONS' kind
    compressed: Tensor | None = None  # ||g_hat_W||^2
    measured: Tensor | None = None  # (||g_W||^2, ||g_hat_W - g_W||^2)
    below: int = 0  # consecutive noise steps with the predicted ratio below the guard


@dataclass
class NoiseMonitor:
    """See the module doc. `history`: one row per (noise step, layer) with the predicted and measured R and
    their parts."""

    config: CompressionConfig
    layers: dict[int, LayerNoise] = field(default_factory=dict)  # by the attachment's layer index
    history: list[dict] = field(default_factory=list)
    pending: int | None = None  # the noise step whose values are not yet on the host

    def due(self, step: int) -> bool:
        return self.config.noise_every is not None and step % self.config.noise_every == 0

    def watch(self, index: int, name: str, module: nn.Module, is_due: Callable[[], bool]) -> list[Callable]:
        """Hooks on one layer (its forward, its weight's gradient accumulation); returns their removers."""
        if not isinstance(module, MEASURABLE) or getattr(module, "weight", None) is None:
            return []
        layer = self.layers[index] = LayerNoise(name, module)

        def forward(module: nn.Module, inputs: tuple, output: Tensor) -> None:
            if is_due() and torch.is_grad_enabled() and inputs and isinstance(output, Tensor):
                layer.energy = patch_energy(module, inputs[0])
                layer.shape = rows_and_groups(module, output)
                layer.input = inputs[0].detach() if self.config.measure_noise else None

        def accumulated(weight: Tensor) -> None:
            if layer.energy is not None and weight.grad is not None:
                layer.compressed = weight.grad.detach().double().square().sum()

        handles = [
            module.register_forward_hook(forward),
            _weight_leaf(module).register_post_accumulate_grad_hook(accumulated),
        ]
        return [handle.remove for handle in handles]

    def observe(self, index: int, policy: Policy, copy: GradientCopy, out: Tensor, stats: LayerStats) -> None:
        """In backward, the copy of layer `index`'s neural gradient that feeds its weight-gradient GEMM
        (`copy`), its compressed value `out`, and the layer's statistics."""
        layer = self.layers.get(index)
        if layer is None or layer.energy is None:
            return
        rows, groups = layer.shape
        g = copy.g
        theory = neural_error(policy, g, stats.scale, copy.weight_path, copy.feature_axis)
        errors = {
            "theory": None
            if theory is None
            else error_by_group(policy, theory, g, groups, copy.feature_axis),
            "carried": group_energy(out.double() - g.double(), groups, copy.feature_axis),
        }
        layer.predicted = {
            kind: None if error is None else weight_noise(error, layer.energy, rows)
            for kind, error in errors.items()
        }
        if layer.input is not None:
            layer.measured = _measure(layer.module, layer.input, g, out)
            layer.input = None

    def finish(self) -> list[int]:
        """Bring the last noise step's values to the host, record them, and decide the guard; returns the
        layers (attachment indices) whose ratio has now stayed below the guard for its patience. Called as
        each step begins (and by reports), so a noise step's figures are complete."""
        if self.pending is None:
            return []
        noise_step, self.pending = self.pending, None
        below = []
        for index, layer in self.layers.items():
            if layer.energy is None:
                continue
            self.history.append(self._row(noise_step, layer))
            if layer.below >= self.config.guard_patience:
                below.append(index)
            layer.energy = layer.compressed = layer.measured = layer.input = None
            layer.predicted = {}
        return below

    def _row(self, step: int, layer: LayerNoise) -> dict:
        compressed = None if layer.compressed is None else float(layer.compressed)
        row: dict = {"step": step, "layer": layer.name, "compressed_signal": compressed}
        for kind in PREDICTIONS:
            noise = layer.predicted.get(kind)
            signal = None if compressed is None or noise is None else predicted_signal(compressed, noise)
            ratio = None if signal is None else noise_ratio(signal, noise)
            row |= {f"{kind}_ratio": ratio, f"{kind}_signal": signal, f"{kind}_noise": noise}
        row |= {"measured_ratio": None, "measured_signal": None, "measured_noise": None}
        if layer.measured is not None:
            exact, error = layer.measured.tolist()
            row |= {
                "measured_ratio": noise_ratio(exact, error),
                "measured_signal": exact,
                "measured_noise": error,
            }
        guard, ratio = self.config.guard, row[f"{GUARDED}_ratio"]
        if guard is not None and ratio is not None:
            layer.below = layer.below + 1 if ratio < guard else 0
        return row

    def state(self) -> dict:
        """The history and each layer's guard count, for checkpoints (complete a pending step first)."""
        return {"history": list(self.history), "below": {x.name: x.below for x in self.layers.values()}}

    def load(self, state: dict) -> None:
        self.history = list(state["history"])
        for layer in self.layers.values():
            layer.below = state["below"].get(layer.name, 0)


def _weight_leaf(module: nn.Module) -> Tensor:
    """The parameter autograd accumulates the weight's gradient into: the weight, or under a
    parametrization (e.g. QAT's forward quantizer) its original."""
    if parametrize.is_parametrized(module, "weight"):
        return module.parametrizations.weight.original
    return module.weight


def _measure(module: nn.Module, x: Tensor, g: Tensor, out: Tensor) -> Tensor:
    """(||J^T g||^2, ||J^T (out - g)||^2): the exact weight gradient's and the compression noise's squared
    norms, from the layer's forward run again on its input with a weight that requires a gradient."""
    with torch.enable_grad():
        weight = module.weight.detach().requires_grad_()
        if isinstance(module, nn.Linear):
            y = nn.functional.linear(x, weight)
        else:
            y = module._conv_forward(x, weight, None)
        (exact,) = torch.autograd.grad(y, weight, g, retain_graph=True)
        (noise,) = torch.autograd.grad(y, weight, out.to(g.dtype) - g)
    return torch.stack([exact.double().square().sum(), noise.double().square().sum()])
