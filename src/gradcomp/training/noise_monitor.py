"""The noise ratio of each compressed layer during training, and the precision guard that acts on it.

Every `noise_every` steps (CompressionConfig) a compressed convolution or linear layer notes the energy of
its input patches in forward, and in backward predicts the noise that compressing its neural gradient adds
to its weight gradient twice (`gradcomp.theory.noise`, no GEMM): "theory" carries the policy's error
predicted from the lognormal fit through that energy, "carried" the error the compression actually made
on the neural gradient (one reduction). With `measure_noise` it also computes its exact weight gradient and
the noise itself (the weight-gradient GEMMs of the neural gradient and of the compression's error, on those
steps only). The compressed weight gradient's norm is that of the gradient this backward pass adds to the
weight (a hook on the weight before autograd accumulates it), so gradient accumulation does not inflate it.

A noise step measures the first forward and backward pass through each layer in that step. Its life cycle
does not depend on when anyone reads it: `record` brings its values to the host (one sync) once its backward
pass has run, whoever asks first (a report, a checkpoint, or the next step's beginning); `decide`, called as
the next step begins and nowhere else, updates the guard. The guard switches a layer whose R (the one
`guard_on` names: measured where it is measured, else the "carried" prediction, which holds within a factor
of two where the error is noise, uncorrelated with the gradient, as an unbiased compressor's is; the
lognormal fit misses some real layers' error by an order of magnitude) stayed below `guard` for
`guard_patience` noise steps in a row to `fallback` for the rest of training. Under torch.distributed the
decision reads, for each layer, the smallest R of all ranks (one all-reduce per noise step, as every rank
begins the next step), so every rank compresses the same layers: a layer switches when any rank's R stays
low. A layer whose weight does not require a gradient when it is attached (frozen) has no weight gradient
and no noise ratio: it is not monitored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import parametrize

from gradcomp.ops._blocks import as_blocks
from gradcomp.ops.stats import log_moments
from gradcomp.theory import noise as noise_theory
from gradcomp.theory.noise import (
    GradientFit,
    group_energy,
    noise_ratio,
    patch_energy,
    predicted_signal,
    rows_and_groups,
    weight_noise,
)
from gradcomp.training.compress import GradientCopy, LayerStats, block_layout
from gradcomp.training.config import CompressionConfig
from gradcomp.training.policies import NM, Block, FloatingPoint, Integer, Luq, NoCompression, Policy, Prune

MEASURABLE = (nn.Linear, nn.modules.conv._ConvNd)  # layers whose weight gradient is a GEMM with their input
# the predictions of the noise a layer's weight gradient takes, each carried through its input's energy:
# from the lognormal theory of the policy's error, and from the error the compression made (measured on
# the neural gradient: one reduction, no GEMM)
PREDICTIONS = ("theory", "carried")


def gradient_fit(g: Tensor) -> GradientFit | None:
    """The lognormal fit the theory reads from `g` (its log moments on the torch path; one host sync);
    None without two finite non-zeros."""
    return GradientFit.of(g, log_moments(g.detach(), backend="torch").tolist())


def neural_error(
    policy: Policy,
    g: Tensor,
    scale: Tensor | float | None = None,
    weight_path: bool = True,
    feature_axis: int = -1,
) -> float | None:
    """Predicted E||Q(g) - g||^2 of `policy` on the layer gradient `g` (the copy of the weight-gradient GEMM
    where the policy has two, its output features along `feature_axis`); `scale`: the FP policy's scale
    (the layer's statistics). None where the policy has no prediction (heterogeneous or non-lognormal
    pruning, BHQ, chains, TE's block scale rule). Block formats take the correlated block model
    (`gradcomp.theory.block`), whose levels are fitted on the copy's own blocks. The theory
    (`gradcomp.theory.noise`) takes the policy's formats and numbers; this chooses among them."""
    if isinstance(policy, NoCompression):
        return 0.0
    if isinstance(policy, Integer):
        scheme, bits = (policy.weight_path, policy.weight_bits) if weight_path else ("same", policy.bits)
        if scheme == "same":
            scheme, bits = policy.scheme, policy.bits
        return noise_theory.integer_error(g, scheme, bits)
    fit = gradient_fit(g)
    if fit is None:
        return 0.0
    if isinstance(policy, Block):
        settings = policy.copy(weight_path)
        if settings.format.from_tensor_max:
            return None
        laid_out, axis = block_layout(g.detach(), weight_path, feature_axis)
        blocks = as_blocks(laid_out, settings.format.block_size, axis)[0]
        return noise_theory.block_error(
            settings.format, settings.rounding, bool(settings.hadamard), blocks, fit
        )
    relative = _relative_error(policy, fit, scale)
    return None if relative is None else relative * fit.fitted_energy


def _relative_error(policy: Policy, fit: GradientFit, scale: Tensor | float | None) -> float | None:
    """The theory's error over the fitted lognormal's second moment."""
    if isinstance(policy, Prune):
        if policy.estimator != "lognormal" or policy.heterogeneous:
            return None
        return noise_theory.prune_relative_error(fit, policy.sparsity)
    if isinstance(policy, Luq):
        return noise_theory.luq_relative_error(fit, policy.bits, policy.samples)
    if isinstance(policy, NM):
        return noise_theory.nm_relative_error(fit, policy.n, policy.m)
    if isinstance(policy, FloatingPoint):
        if scale is None:
            return None
        return noise_theory.fp_relative_error(fit, policy.fmt, policy.rounding, scale)
    return None


def error_by_group(policy: Policy, error: float, g: Tensor, groups: int, feature_axis: int) -> Tensor:
    """The theory's neural error `error` of layer gradient `g` under `policy` spread over its convolution
    groups (`gradcomp.theory.noise.error_by_group`): by element count for integer grids, by energy for the
    other policies."""
    return noise_theory.error_by_group(
        error, g, groups, feature_axis, by_elements=isinstance(policy, Integer)
    )


@dataclass
class LayerNoise:
    """One layer's values at the current noise step (tensors on the device until `NoiseMonitor.record`)."""

    name: str
    module: nn.Module
    energy: Tensor | None = None  # the input patches' energy S_k of each convolution group k
    shape: tuple[int, int] = (1, 1)  # (rows, groups) of the output
    input: Tensor | None = None  # the layer's input (measure_noise)
    predicted: dict[str, float | None] = field(default_factory=dict)  # noise by PREDICTIONS' kind
    compressed: Tensor | None = None  # ||g_hat_W||^2 of this backward pass's weight gradient
    measured: Tensor | None = None  # (||g_W||^2, ||g_hat_W - g_W||^2)
    below: int = 0  # consecutive noise steps with the guard's ratio below the guard

    @property
    def observed(self) -> bool:
        """Whether this noise step's backward pass reached the layer (its values are then kept)."""
        return bool(self.predicted)

    def clear(self) -> None:
        self.energy = self.compressed = self.measured = self.input = None
        self.predicted = {}


@dataclass
class NoiseMonitor:
    """See the module doc. `history`: one row per (noise step, layer) with the predicted and measured R and
    their parts."""

    config: CompressionConfig
    layers: dict[int, LayerNoise] = field(default_factory=dict)  # by the attachment's layer index
    history: list[dict] = field(default_factory=list)
    pending: int | None = None  # the noise step being measured: its values are on the device
    undecided: int | None = None  # a recorded noise step the guard has not yet acted on
    ranked: bool = False  # keep_worst has chosen its layers

    def due(self, step: int) -> bool:
        return self.config.noise_every is not None and step % self.config.noise_every == 0

    def watch(self, index: int, name: str, module: nn.Module, is_due: Callable[[], bool]) -> list[Callable]:
        """Hooks on one layer (its forward, its weight's incoming gradient); returns their removers. A layer
        without a weight, or whose weight takes no gradient (frozen), is not watched."""
        if not monitorable(module):
            return []
        layer = self.layers[index] = LayerNoise(name, module)

        def forward(module: nn.Module, inputs: tuple, output: Tensor) -> None:
            # until the step's backward reaches the layer, the latest forward pass is the one it measures
            measuring = is_due() and not layer.observed and torch.is_grad_enabled()
            if measuring and inputs and isinstance(output, Tensor):
                layer.energy = patch_energy(module, inputs[0])
                layer.shape = rows_and_groups(module, output)
                layer.input = inputs[0].detach() if self.config.measure_noise else None

        def incoming(grad: Tensor) -> None:
            if layer.observed and layer.compressed is None:
                layer.compressed = grad.detach().double().square().sum()

        handles = [module.register_forward_hook(forward), _weight_leaf(module).register_hook(incoming)]
        return [handle.remove for handle in handles]

    def observe(self, index: int, policy: Policy, copy: GradientCopy, out: Tensor, stats: LayerStats) -> None:
        """In backward, the copy of layer `index`'s neural gradient that feeds its weight-gradient GEMM
        (`copy`), its compressed value `out`, and the layer's statistics (the first backward pass of the
        noise step only)."""
        layer = self.layers.get(index)
        if layer is None or layer.energy is None or layer.observed:
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

    def record(self) -> None:
        """Bring the pending noise step's values to the host (one sync) as rows of `history`; the guard acts
        on them when the next step begins (`decide`)."""
        if self.pending is None:
            return
        step, self.pending = self.pending, None
        for layer in self.layers.values():
            if layer.observed:
                self.history.append(self._row(step, layer))
            layer.clear()
        self.undecided = step

    def discard(self) -> None:
        """Drop the pending noise step (its step was not applied, e.g. skipped for non-finite values)."""
        self.pending = None
        for layer in self.layers.values():
            layer.clear()

    def decide(self, candidates: set[int]) -> list[int]:
        """As a step begins, the guard's and keep_worst's reading of the last recorded noise step: the layers
        (attachment indices, among `candidates`, those still under the policy) to switch now. Under
        torch.distributed every rank reads the smallest ratio over ranks (one all-reduce)."""
        step, self.undecided = self.undecided, None
        config = self.config
        if step is None or (config.guard is None and not config.keep_worst):
            return []
        ratios = self._ratios(step)
        switch = []
        for index, ratio in ratios.items():
            layer = self.layers[index]
            if config.guard is not None:
                layer.below = layer.below + 1 if ratio < config.guard else 0
                if layer.below >= config.guard_patience and index in candidates:
                    switch.append(index)
        if config.keep_worst and not self.ranked:
            self.ranked = True
            measured = [(ratio, index) for index, ratio in ratios.items() if ratio < math.inf]
            ranked = sorted(pair for pair in measured if pair[1] in candidates)  # no ratio: not ranked
            switch += [index for _, index in ranked[: config.keep_worst] if index not in switch]
        return switch

    def _ratios(self, step: int) -> dict[int, float]:
        """Each watched layer's ratio at `step` as the guard reads it (+inf where there is none: no evidence
        of noise), the smallest over ranks under torch.distributed."""
        key = f"{self.config.guard_on}_ratio"
        by_name = {row["layer"]: row[key] for row in self.history if row["step"] == step}
        indices = sorted(self.layers)
        values = [by_name.get(self.layers[index].name) for index in indices]
        values = [math.inf if value is None or math.isnan(value) else value for value in values]
        return dict(zip(indices, smallest_over_ranks(values), strict=True))

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
        return row

    def state(self) -> dict:
        """The history, each layer's guard count and where the guard stands, for checkpoints (a noise step
        still measuring is recorded as pending: its values are not kept, the step is measured again)."""
        return {
            "history": list(self.history),
            "below": {x.name: x.below for x in self.layers.values()},
            "pending": self.pending,
            "undecided": self.undecided,
            "ranked": self.ranked,
        }

    def load(self, state: dict) -> None:
        self.history = list(state["history"])
        for layer in self.layers.values():
            layer.below = state["below"].get(layer.name, 0)
            layer.clear()
        self.pending, self.undecided = state.get("pending"), state.get("undecided")
        self.ranked = state.get("ranked", bool(self.history))  # older checkpoints ranked at the first one


def monitorable(module: nn.Module) -> bool:
    """Whether a layer has a noise ratio: a convolution or linear layer whose weight takes a gradient."""
    weight = getattr(module, "weight", None)
    return isinstance(module, MEASURABLE) and weight is not None and _weight_leaf(module).requires_grad


def smallest_over_ranks(values: list[float]) -> list[float]:
    """`values` replaced by their elementwise minimum over the ranks of torch.distributed's default group
    (unchanged outside it): the guard's decision is then the same on every rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return values
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    shared = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(shared, op=dist.ReduceOp.MIN)
    return shared.tolist()


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
