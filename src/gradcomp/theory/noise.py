"""The noise ratio of a layer's weight gradient, predicted from what a compression policy already has.

FP4 All the Way (Chmiel et al., NeurIPS 2025, section 4, appendix B.1): with quantization noise of squared
norm E||g_hat - g||^2 in a gradient g, the loss decrease at the best step is most sensitive to the noise at
||g|| / ||g_hat - g|| = sqrt(3), and training stalls below it. Here g is a layer's weight gradient g_W and
the noise is what compressing the layer's neural gradient delta adds to it:

    R = ||g_W|| / ||J^T (Q(delta) - delta)||,

J^T the layer's weight-gradient map (the GEMM with its input activations). g_W stands for grad L: it is
the minibatch's weight gradient, the direction the optimizer steps along. The paper's grad L is the
expected gradient, whose norm the minibatch's exceeds by its sampling noise, so R as measured here is an
upper bound of the paper's R late in training, when the sampling noise dominates; both are what the guard
can see without extra passes, and the measured R is taken the same way.

The prediction needs no GEMM:
* the neural error E||Q(delta) - delta||^2 comes from the lognormal fit of delta's non-zeros (the theory of
  each policy: `fp`, `block`, `unbiased`) times the fitted second moment and the count of non-zeros; integer
  quantizers, whose error is set by their range rather than by the fit, from the range: stochastic rounding
  adds (x - lo)(hi - x) to each element, summed exactly (one elementwise pass, no GEMM);
* carried to the weight gradient through the energy of the layer's input: J^T e sums, for each weight,
  e over (sample, position) times the input patch each position reads; with e uncorrelated across its
  entries and of the same variance within each convolution group k, E||J^T e||^2 = sum_k E||e_k||^2 * S_k
  / rows, e_k the error on group k's output channels, S_k the sum over (sample, position) of the squared
  norm of the patch group k reads (`patch_energy`), rows the number of (sample, position) pairs. Per group,
  not in total: in a depthwise convolution each channel's error meets only its own input, and where a
  channel's input is dead (zero after a ReLU) its error is largest (the batch norm after the convolution
  divides a constant channel's gradient by sqrt(eps)) yet adds nothing to the weight gradient. The theory's
  error, one number per layer, is spread over the groups by `error_by_group`;
* ||g_W||^2 is the compressed gradient's ||g_hat_W||^2 less the predicted noise (an unbiased compressor's
  noise adds to the energy), at least a tenth of ||g_hat_W||^2.

This module sees formats, numbers and the fit, never a policy: which prediction a policy takes, with which
of its settings, and the fit's log moments are `gradcomp.training.noise_monitor.neural_error`'s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from scipy import special
from torch import Tensor, nn

from gradcomp.formats import FPFormat
from gradcomp.formats.block import BlockFormat
from gradcomp.lognormal import fit_lognormal_float
from gradcomp.theory.block import BlockLevels, correlated_block_statistics, per_tensor_statistics
from gradcomp.theory.unbiased import luq_variance, nm_variance, prune_variance

CRITICAL_RATIO = math.sqrt(3.0)  # FP4 All the Way, section 4: training stalls below it
_LN2 = math.log(2.0)
_MIN_SIGNAL = 0.1  # ||g_W||^2 predicted as at least this share of ||g_hat_W||^2
_CONVOLUTIONS = {1: nn.functional.conv1d, 2: nn.functional.conv2d, 3: nn.functional.conv3d}


@dataclass(frozen=True)
class GradientFit:
    """What the prediction reads from a neural gradient (host floats): the natural-log mean and std of its
    non-zeros, their count, the element count, the largest magnitude, and the squared norm."""

    mu: float
    sigma: float
    nonzero: int
    numel: int
    largest: float
    energy: float

    @classmethod
    def of(cls, g: Tensor, moments: Sequence[float]) -> GradientFit | None:
        """The fit of `g` given its log moments `moments` (`gradcomp.ops.log_moments` of it, as host floats:
        the caller's; one host sync here); None without two finite non-zeros."""
        if moments[0] < 2:
            return None
        mu, sigma = fit_lognormal_float(moments)
        finite = g.detach().double().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        largest, energy = torch.stack([finite.abs().amax(), finite.square().sum()]).tolist()
        return cls(mu, max(sigma, 1e-6), int(moments[0]), g.numel(), largest, energy)

    @property
    def zero_share(self) -> float:
        return 1.0 - self.nonzero / self.numel

    @property
    def energy_given_largest(self) -> float:
        """The expected squared norm of the non-zeros given the largest: the others drawn below it."""
        z = (math.log(self.largest) - self.mu) / self.sigma
        below = float(special.ndtr(z - 2 * self.sigma) / special.ndtr(z))
        return (self.nonzero - 1) * math.exp(2 * self.mu + 2 * self.sigma**2) * below + self.largest**2

    @property
    def fitted_energy(self) -> float:
        """The fitted lognormal's second moment times the non-zeros: what relative theory errors scale."""
        return math.exp(2 * self.mu + 2 * self.sigma**2) * self.nonzero


def prune_relative_error(fit: GradientFit, sparsity: float) -> float:
    """Lognormal stochastic pruning's error at target `sparsity` over the fitted second moment."""
    return prune_variance(fit.sigma, sparsity, fit.zero_share)


def luq_relative_error(fit: GradientFit, bits: int, samples: int) -> float:
    """LUQ's error (`bits`, SMP `samples`) over the fitted second moment, its alpha from the largest
    magnitude."""
    largest = fit.largest / math.exp(fit.mu)
    return luq_variance(fit.sigma, bits, fit.numel, samples, largest=largest)


def nm_relative_error(fit: GradientFit, n: int, m: int) -> float:
    """MVUE n:m's error over the fitted second moment (the quadrature at rounded parameters, kept)."""
    return _nm_variance(round(fit.sigma, 2), n, m, round(fit.zero_share, 3))


def fp_relative_error(fit: GradientFit, fmt: FPFormat, rounding: str, scale: Tensor | float) -> float:
    """The error of rounding to `fmt` at `scale` (the layer's statistics) over the fitted second moment:
    the per-tensor model given the largest magnitude."""
    mu2, sigma2 = fit.mu / _LN2, fit.sigma / _LN2
    log2_scale = mu2 + math.log2(float(scale))
    largest = fit.largest / math.exp(fit.mu)
    shares = per_tensor_statistics(fmt, sigma2, log2_scale, rounding, largest, fit.nonzero)
    return shares.relative_mse * fit.energy_given_largest / fit.fitted_energy


def block_error(fmt: BlockFormat, rounding: str, hadamard: bool, blocks: Tensor, fit: GradientFit) -> float:
    """The correlated block model's error on a copy's blocks (`blocks`: one block of `fmt` per row, as the
    copy is laid out for its quantizer), times their energy (block scaling is scale-free: the relative
    error is that of the measured energy, not the fitted lognormal's); the levels are fitted on these
    blocks. The model does not cover the scale rules taken from the tensor's largest magnitude (TE's, Four
    Over Six: `fmt.from_tensor_max`), which the caller leaves out."""
    levels = BlockLevels.of(blocks)
    if levels is None:
        return 0.0
    shares = correlated_block_statistics(fmt, levels.rounded(), rounding, hadamard, fit.numel)
    return shares.relative_mse * fit.energy


# N:M's quadrature takes tens of milliseconds; a layer's fit changes little between noise steps, so it is
# taken at rounded parameters and kept (as blocks' `BlockLevels.rounded`).
@functools.lru_cache(maxsize=4096)
def _nm_variance(sigma: float, n: int, m: int, zero_share: float) -> float:
    return nm_variance(max(sigma, 1e-3), n, m, zero_share=zero_share)


def integer_error(g: Tensor, scheme: str, bits: int) -> float | None:
    """Stochastic rounding's exact expected error given g: Delta^2 f (1 - f) per element, f its position
    within its bin of width Delta on its group's min-max grid of `bits` bits (the scheme's groups: "ptq"
    the tensor, "column" each column, the others each row); "none" (an exact copy) adds nothing; BHQ,
    whose transform mixes rows, has no prediction here."""
    if scheme == "none":
        return 0.0
    if scheme == "bhq":
        return None
    x = g.detach().double()
    rows = x.reshape(1, -1) if scheme == "ptq" or x.dim() < 2 else x.reshape(x.shape[0], -1)
    dim = 0 if scheme == "column" and x.dim() >= 2 else 1
    low, high = torch.aminmax(rows, dim=dim, keepdim=True)
    step = (high - low) / (2**bits - 1)
    position = torch.where(step > 0, (rows - low) / step, 0.0)
    f = position - position.floor()
    return float((step.square() * f * (1 - f)).sum())


def patch_energy(module: nn.Module, x: Tensor) -> Tensor:
    """S_k: for each convolution group k, the sum over (sample, output position) of the squared norm of the
    input patch the group reads (a linear layer: one group, ||x||^2), as a float64 tensor of one entry per
    group (one small grouped convolution of x^2 summed over each group's channels, no GEMM with the
    weights)."""
    if isinstance(module, nn.Linear):
        return x.detach().double().square().sum().reshape(1)
    if not isinstance(module, nn.modules.conv._ConvNd) or module.padding_mode != "zeros":
        raise TypeError(f"patch_energy takes linear and zero-padded convolution layers, got {module}")
    groups = module.groups
    squares = x.detach().double().square().unflatten(1, (groups, -1)).sum(2)
    ones = squares.new_ones((groups, 1, *module.kernel_size))
    convolve = _CONVOLUTIONS[len(module.kernel_size)]
    sums = convolve(squares, ones, None, module.stride, module.padding, module.dilation, groups)
    return sums.transpose(0, 1).flatten(1).sum(1)


def group_energy(e: Tensor, groups: int, feature_axis: int) -> Tensor:
    """||e_k||^2 for each convolution group k of the output features along `feature_axis` (float64)."""
    squares = e.detach().double().square()
    if groups == 1:
        return squares.sum().reshape(1)
    return squares.movedim(feature_axis, 0).reshape(groups, -1).sum(1)


def error_by_group(
    error: float, g: Tensor, groups: int, feature_axis: int, by_elements: bool = False
) -> Tensor:
    """The theory's neural error `error` of layer gradient `g` spread over its convolution groups: by element
    count where `by_elements` (integer grids, whose error is set by the range and the same for every
    element: stochastic rounding's mean f(1 - f) Delta^2), else by the gradient's energy (the other
    policies, whose error is relative to the magnitudes they act on)."""
    if by_elements:
        return torch.full((groups,), error / groups, dtype=torch.float64, device=g.device)
    energy = group_energy(g, groups, feature_axis)
    total = float(energy.sum())
    return energy * (error / total) if total > 0 else energy * 0.0


def rows_and_groups(module: nn.Module, output: Tensor) -> tuple[int, int]:
    """(sample, position) pairs of the layer's output, and its convolution groups (1 for linear layers)."""
    if isinstance(module, nn.Linear):
        return output.numel() // module.out_features, 1
    return output.numel() // module.out_channels, module.groups


def weight_noise(error: Tensor, energy: Tensor, rows: int) -> float:
    """E||J^T e||^2 for a neural error of squared norm `error[k]` in group k, uncorrelated and of the same
    variance within each group, and patch energies `energy[k]` (module doc)."""
    return float((error * energy).sum()) / rows


def noise_ratio(signal: float, noise: float) -> float:
    """||g_W|| / ||noise||: inf without noise, 0 without signal."""
    if noise <= 0:
        return math.inf
    return math.sqrt(max(signal, 0.0) / noise)


def predicted_signal(compressed: float, noise: float) -> float:
    """||g_W||^2 predicted from the compressed gradient's ||g_hat_W||^2 less the predicted noise."""
    return max(compressed - noise, _MIN_SIGNAL * compressed)
