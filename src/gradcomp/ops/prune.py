"""Unbiased stochastic pruning of neural gradients and the thresholds that hit a target sparsity.

`lognormal_threshold` is the method of the lognormal paper (one fused reduction, a closed-form inverse
solved on device); the Gaussian- and Laplace-prior thresholds and the exact sort-based threshold are the
baselines it is compared with. Thresholds are 0-d tensors of the compute dtype on x's device, finite and
at most x's largest finite value. Like every op of `gradcomp.ops` these are not differentiable: they compute
on x.detach() and return tensors that do not require grad.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import Tensor

from gradcomp import lognormal
from gradcomp._backend import (
    Backend,
    CpuCompiled,
    check_float,
    check_tensor,
    compute_layout,
    constant_over,
    triton_available,
    use_triton,
)
from gradcomp.choices import BACKENDS, choose
from gradcomp.ops._chunked import map_chunks
from gradcomp.ops.stats import Rule, add_zero_count, check_counter, fit_statistics, usable_threshold
from gradcomp.rng import chunk_counter, hash_counter, resolve_seed, uniform24


def stochastic_prune(
    x: Tensor,
    alpha: float | Tensor,
    seed: int | None = None,
    backend: Backend = "auto",
    count_zeros_into: Tensor | None = None,
) -> Tensor:
    """|x| >= alpha unchanged; |x| < alpha becomes sign(x)*alpha with probability |x|/alpha, else 0.

    Unbiased (E[out] = x) for any alpha: alpha is rounded once to x's dtype (a float64 tensor alpha through
    float32, as torch's casts do), so that the promoted values are exactly representable, and carried in the
    compute dtype (float32, float64 for float64 x); the keep decision compares |x| * 2^24/alpha with 24
    random bits. So a non-zero alpha must be at least 2^24 / (largest compute-dtype value), about 4.9e-32
    (9.3e-301 for float64), below which 2^24/alpha overflows, and at most x's largest finite value. A Python
    number is checked against these bounds (ValueError; alpha = 0 prunes nothing). A tensor alpha (typically
    a threshold computed on the device) is not read on the host (on CUDA the kernel reads it); instead,
    above x's largest finite value (Inf included) it acts as that value and below the lower bound as 0: the
    result stays unbiased, only less sparse. A NaN or negative tensor alpha makes the output NaN. Exact
    zeros stay zero; NaN and +-Inf pass through. Random bits come from (seed, element index).
    count_zeros_into: an int64 one-element tensor on x's device to which the number of zeros of the output
    is added (on CUDA in the same kernel, without a host sync). Not differentiable: x is detached and the
    result does not require grad.
    """
    x = check_float(x, "stochastic_prune")
    check_counter(count_zeros_into, x)
    number = _checked_number_alpha(alpha, x) if not isinstance(alpha, Tensor) else None
    if number is None and alpha.numel() != 1:
        raise ValueError(f"alpha must be a number or a one-element tensor, got shape {tuple(alpha.shape)}")
    seed = resolve_seed(seed)
    if x.numel() == 0:
        return x.clone()
    if use_triton(x, backend):
        from gradcomp.kernels.prune import stochastic_prune_triton

        if number is None:
            return stochastic_prune_triton(x, alpha.detach().to(x.device), None, seed, count_zeros_into)
        keep_scale = np.nextafter(np.float32(2.0**24) / np.float32(number), np.float32(math.inf))
        return stochastic_prune_triton(x, number, float(keep_scale), seed, count_zeros_into)
    alpha_t = alpha_in_compute_dtype(alpha, x) if number is None else _number_tensor(number, x)
    # rounded up, so that |x| >= alpha gives |x| * keep_scale >= 2^24 > every 24-bit draw: kept as is
    keep_scale = torch.nextafter(constant_over(2.0**24, alpha_t), alpha_t.new_tensor(math.inf))

    def prune_chunk(chunk: Tensor, offset: int) -> Tensor:
        counter = chunk_counter(seed, chunk.numel(), x.device, offset)
        out = _prune_chunk(chunk, alpha_t, keep_scale, *counter).to(chunk.dtype)
        if not torch.isfinite(out.sum()):  # NaN comes out as some NaN: give back the input's bits
            out = torch.where(torch.isnan(chunk), chunk, out)
        return out

    return add_zero_count(map_chunks(x, prune_chunk), count_zeros_into)


def alpha_in_compute_dtype(alpha: Tensor, x: Tensor) -> Tensor:
    """A tensor alpha rounded to x's dtype, as a 0-d tensor of the compute dtype on x's device, brought
    inside the bounds of stochastic_prune on the device (the kernel does the same steps)."""
    layout = compute_layout(x.dtype)
    largest = torch.finfo(x.dtype).max
    smallest = 2.0**24 / torch.finfo(layout.float_dtype).max
    value = alpha.detach().reshape(()).to(x.device, torch.promote_types(alpha.dtype, layout.float_dtype))
    value = value.clamp(max=largest).to(x.dtype).to(layout.float_dtype)
    return torch.where(value >= smallest, value, torch.where(value >= 0, 0.0, math.nan))


def _checked_number_alpha(alpha: object, x: Tensor) -> float:
    """A number alpha rounded to x's dtype (once; not at all for float64), after checking the bounds of
    stochastic_prune."""
    layout = compute_layout(x.dtype)
    largest = torch.finfo(x.dtype).max
    smallest = 2.0**24 / torch.finfo(layout.float_dtype).max
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a real number or a one-element tensor, got {type(alpha).__name__}")
    try:
        number = float(alpha)
    except OverflowError:
        raise ValueError("alpha must be finite and >= 0, got an integer beyond the float64 range") from None
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
    value = _round_to_dtype(number, x.dtype)
    if math.isinf(value):
        raise ValueError(
            f"alpha={alpha} exceeds the largest {x.dtype} value {largest:.6g}, so the pruned values "
            "sign(x)*alpha cannot be represented"
        )
    if 0 < value < smallest:
        raise ValueError(
            f"alpha={alpha} is below 2^24 / (largest {layout.float_dtype} value) = {smallest:.3g}, the "
            "smallest alpha whose keep probabilities |x|/alpha the 24-bit decisions resolve; 0 prunes nothing"
        )
    return value


def _round_to_dtype(value: float, dtype: torch.dtype) -> float:
    """value rounded to dtype (through float32, as torch's casts of float64 do), on the host."""
    if dtype == torch.float64:
        return value
    with np.errstate(over="ignore"):
        single = np.float32(value)
    if dtype == torch.float16:
        with np.errstate(over="ignore"):
            return float(np.float16(single))
    if dtype == torch.bfloat16:  # round to nearest even on the upper 16 bits (finite values)
        bits = int(single.view(np.uint32))
        if np.isfinite(single):
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(np.uint32(bits).view(np.float32))
    return float(single)


def _number_tensor(value: float, x: Tensor) -> Tensor:
    return torch.tensor(value, dtype=compute_layout(x.dtype).float_dtype, device=x.device)


@CpuCompiled
def _prune_chunk(
    chunk: Tensor, alpha: Tensor, keep_scale: Tensor, base: Tensor, first: Tensor, high: Tensor
) -> Tensor:
    """The torch implementation on one chunk, in the compute dtype of alpha.

    One formula for both sides of alpha, copysign(keep * max(|x|, alpha), x), with keep a 0.0/1.0 float
    (boolean tensors and torch.where are several times slower on CPUs): keep is 1 wherever |x| >= alpha,
    and for Inf; exact zeros keep their sign. alpha = 0 makes keep_scale infinite: everything non-zero is
    kept, and 0 * inf = NaN gives keep 0 at the zeros. NaN stays NaN, with some payload.
    """
    values = chunk.to(alpha.dtype)
    magnitude = values.abs()
    random = uniform24(hash_counter(base, first, high)).to(alpha.dtype)
    keep = torch.gt(magnitude * keep_scale, random, out=random)
    return torch.copysign(keep.mul_(magnitude.clamp_min_(alpha)), values, out=keep)


def _prunable_target(numel: int, count_nonzero: Tensor, count_zero: Tensor, sparsity: float) -> Tensor:
    """Fraction of the finite non-zeros to prune so that all zeros make up `sparsity` of the tensor
    (the reference code's S' = (S - s0)/(1 - s0), with non-finite elements left alone)."""
    return (sparsity * numel - count_zero) / count_nonzero


def _check_sparsity(sparsity: float) -> None:
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")


def _finish(alpha: Tensor, target: Tensor, x: Tensor) -> Tensor:
    """0 (no pruning) where nothing needs pruning; see `usable_threshold`."""
    return usable_threshold(torch.where((target > 0) & torch.isfinite(alpha), alpha, 0.0), x)


def lognormal_threshold(
    x: Tensor,
    sparsity: float,
    backend: Backend = "auto",
    mask: Tensor | None = None,
    rule: Rule = "mixture",
) -> Tensor:
    """0-d alpha such that stochastic_prune(x, alpha) has expected fraction of zeros `sparsity`.

    Counts zeros already in x (ReLU zeros); fits (mu, sigma) of ln|x| from `log_moments` and inverts the
    closed-form lognormal sparsity on device: no sort, no host sync (two kernel launches on CUDA). With a
    `mask` (e.g. the gradient at the following BatchNorm's output), `rule` says how the elements where it is
    zero are treated (see `fit_statistics`).
    """
    x = check_float(x, "lognormal_threshold")
    _check_sparsity(sparsity)
    return fit_statistics(x, mask, sparsity, rule, backend=backend)[2]


def lognormal_threshold_from_moments(
    moments: Tensor, numel: int | Tensor, sparsity: float, backend: Backend = "auto"
) -> Tensor:
    """Batched form: moments [..., 4] from `log_moments` (float64), one threshold per leading index
    (float64); numel an int or a tensor that broadcasts to the leading shape. On CUDA one kernel launch
    (`lognormal_threshold`'s solve, equal to the torch path within 1e-6), no host sync."""
    _check_sparsity(sparsity)
    check_tensor(moments, "lognormal_threshold_from_moments")
    if moments.dtype != torch.float64 or moments.dim() == 0 or moments.shape[-1] != 4:
        raise ValueError(
            f"moments must be float64 [..., 4] from log_moments, got {moments.dtype} {tuple(moments.shape)}"
        )
    choose("backend", backend, BACKENDS)
    if backend == "triton" or (backend == "auto" and moments.is_cuda and triton_available()):
        from gradcomp.kernels.stats import thresholds_triton

        lead = moments.shape[:-1]
        rows = moments.reshape(-1, 4).contiguous()
        if isinstance(numel, Tensor):
            numel = numel.to(moments.device, torch.float64).expand(lead).reshape(-1).contiguous()
        return thresholds_triton(rows, numel, sparsity).view(lead)
    if moments.shape == (4,) and moments.device.type == "cpu" and not isinstance(numel, Tensor):
        return torch.tensor(_threshold_of_one_layer(moments.tolist(), numel, sparsity), dtype=torch.float64)
    target = _prunable_target(numel, moments[..., 0], moments[..., 3], sparsity)
    mu, sigma = lognormal.fit_lognormal(moments)
    alpha_n = lognormal.normalized_threshold(sigma, target.clamp(1e-12, 1 - 1e-9))
    alpha = alpha_n * torch.exp(mu)
    return torch.where((target > 0) & torch.isfinite(alpha), alpha, 0.0)


def _threshold_of_one_layer(moments: list[float], numel: int, sparsity: float) -> float:
    """`lognormal_threshold_from_moments` of one layer in Python floats (a CPU layer's threshold would
    otherwise cost a hundred tiny tensor operations)."""
    count, _, _, zeros = moments
    target = _prunable_target(numel, count, zeros, sparsity) if count else 0.0
    if not target > 0:
        return 0.0
    mu, sigma = lognormal.fit_lognormal_float(moments)
    if not (math.isfinite(mu) and math.isfinite(sigma)):
        return 0.0
    try:
        alpha = lognormal.normalized_threshold_float(sigma, min(max(target, 1e-12), 1 - 1e-9)) * math.exp(mu)
    except OverflowError:  # a threshold beyond float64 (huge sigma), Inf in the batched form
        return 0.0
    return alpha if math.isfinite(alpha) else 0.0


def _prunable(x: Tensor) -> tuple[Tensor, Tensor]:
    """(finite non-zero magnitudes in float64, the count of exact zeros)."""
    magnitude = x.to(torch.float64).abs().flatten()
    values = magnitude[(magnitude > 0) & (magnitude < torch.inf)]
    return values, (magnitude == 0).sum(dtype=torch.float64)


def _prior_moment(x: Tensor, power: int) -> tuple[Tensor, Tensor, Tensor]:
    """(mean of |x|^power over the finite non-zeros, their count, the count of exact zeros), in float64
    without selecting the values (no host sync)."""
    magnitude = x.to(torch.float64).abs().flatten()
    usable = magnitude.nan_to_num(nan=0.0, posinf=0.0)  # finite non-zeros keep their value, the rest 0
    count = torch.count_nonzero(usable).to(torch.float64)
    return usable.pow_(power).sum() / count, count, (magnitude == 0).sum(dtype=torch.float64)


def gaussian_threshold(x: Tensor, sparsity: float) -> Tensor:
    """Baseline: threshold from a zero-mean Gaussian prior with s = RMS of the non-zeros (Ye et al. style)."""
    x = check_float(x, "gaussian_threshold")
    _check_sparsity(sparsity)
    mean_square, count, zeros = _prior_moment(x, 2)
    target = _prunable_target(x.numel(), count, zeros, sparsity)
    s = torch.sqrt(mean_square)
    return _finish(s * lognormal.gaussian_normalized_threshold(target.clamp(1e-12, 1 - 1e-9)), target, x)


def laplace_threshold(x: Tensor, sparsity: float) -> Tensor:
    """Baseline: threshold from a Laplace prior, |g| ~ Exp(b) with b = mean of the non-zero |g|."""
    x = check_float(x, "laplace_threshold")
    _check_sparsity(sparsity)
    b, count, zeros = _prior_moment(x, 1)
    target = _prunable_target(x.numel(), count, zeros, sparsity)
    return _finish(b * lognormal.laplace_normalized_threshold(target.clamp(1e-12, 1 - 1e-9)), target, x)


def topk_threshold(x: Tensor, sparsity: float) -> Tensor:
    """Exact baseline: the alpha whose expected sparsity on this very tensor is `sparsity` (sorts |x|).

    With a_1 <= ... <= a_n the sorted non-zeros, the expected number of new zeros at alpha in (a_k, a_k+1]
    is k - (a_1 + ... + a_k)/alpha, continuous and increasing in alpha; it is solved exactly on that piece.
    """
    x = check_float(x, "topk_threshold")
    _check_sparsity(sparsity)
    values, zeros = _prunable(x)
    wanted = sparsity * x.numel() - zeros  # expected new zeros
    if values.numel() == 0:
        return _finish(torch.zeros((), dtype=torch.float64, device=x.device), wanted, x)
    sorted_values = torch.sort(values).values
    below = torch.cat([sorted_values.new_zeros(1), torch.cumsum(sorted_values, 0)])  # sum of the k smallest
    k = torch.arange(values.numel() + 1, dtype=torch.float64, device=x.device)
    zeros_at_breakpoints = k[:-1] - below[:-1] / sorted_values  # expected new zeros at alpha = a_(k+1)
    piece = torch.searchsorted(zeros_at_breakpoints, wanted.reshape(1)).clamp(1, values.numel())
    alpha = below[piece] / (k[piece] - wanted.clamp(max=values.numel() - 1e-9))
    return _finish(alpha.reshape(()), wanted, x)
