"""The statistics of neural gradients that the compressors need, from one fused reduction.

`log_moments` is that reduction; `fit_statistics` turns it into a layer's lognormal fit, pruning threshold
and power-of-two FP scale. On CUDA the two are two kernel launches in all and never read a value on the
host; on CPU tensors the reduction runs as compiled chunk functions and the small solve in Python floats.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from gradcomp import lognormal
from gradcomp._backend import Backend, CpuCompiled, check_float, compute_layout, use_triton
from gradcomp.lognormal import Calibration
from gradcomp.ops._chunked import sum_chunks

FIT_FIELDS = ("mu", "sigma", "bn_zero_share", "threshold", "scale")
Rule = Literal["mixture", "reference", "all"]


def calibrated_target(sparsity: float, calibration: Calibration) -> float:
    """The torch path of the calibration (host floats, as the CPU fit is): updates the correction and the
    mark, returns the target the threshold is solved for."""
    correction = float(calibration.correction)
    counted = int(calibration.counter)
    if calibration.elements > 0 and float(calibration.threshold) > 0:
        achieved = float(counted - int(calibration.mark)) / float(calibration.elements)
        correction = min(
            max(correction + sparsity - achieved, -sparsity), lognormal.MAX_CALIBRATED_TARGET - sparsity
        )
    calibration.correction.fill_(correction)
    calibration.mark.fill_(counted)
    return sparsity + correction


def log_moments(x: Tensor, backend: Backend = "auto", mask: Tensor | None = None) -> Tensor:
    """float64 tensor [count_nonzero, sum ln|x|, sum ln^2|x|, count_zero] over x's finite elements.

    Zeros (e.g. from ReLU) are counted apart because ln 0 is undefined; NaN and +-Inf take part in neither
    count, so numel - count_nonzero - count_zero is the number of non-finite elements. With `mask` (a tensor
    of x's shape, e.g. the gradient at the following BatchNorm's output), shape (2, 4): the moments of the
    elements where the mask is non-zero, then of the others.
    """
    x = check_float(x, "log_moments")
    mask = _check_mask(mask, x)
    if use_triton(x, backend):
        from gradcomp.kernels.stats import statistics_triton

        return statistics_triton(x, mask, fit=False)[0]
    if x.numel() == 0:
        return torch.zeros((4,) if mask is None else (2, 4), dtype=torch.float64, device=x.device)
    if mask is None:
        return sum_chunks(x, _chunk_moments)
    return sum_chunks(x, _masked_chunk_moments, mask).view(2, 4)


def _check_mask(mask: Tensor | None, x: Tensor) -> Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.shape != x.shape or mask.device != x.device:
        raise ValueError(f"mask must be a tensor of x's shape {tuple(x.shape)} on {x.device}")
    return mask.detach()


def _chunk_moments(chunk: Tensor) -> tuple[Tensor, ...]:
    zeros, sum_log, sum_log_sq = _log_sums(chunk)
    if torch.isfinite(sum_log_sq):
        return chunk.numel() - zeros, sum_log, sum_log_sq, zeros
    log_abs, _ = _log_magnitudes(chunk)  # NaN or Inf in this chunk: leave them out
    finite = torch.isfinite(log_abs)
    log_abs = torch.where(finite, log_abs, 0.0)
    return finite.sum() - zeros, log_abs.sum(), torch.dot(log_abs, log_abs), zeros


@CpuCompiled
def _masked_chunk_moments(chunk: Tensor, mask: Tensor) -> Tensor:
    """The moments of the chunk's finite elements where the mask is non-zero, then of the others (8 fields;
    0.0/1.0 float masks, which CPUs handle faster than booleans)."""
    log_abs, zero = _log_magnitudes(chunk)
    finite = torch.isfinite(log_abs)
    log_abs = torch.where(finite, log_abs, 0.0)
    finite = finite.to(log_abs.dtype)
    active = (mask != 0).to(log_abs.dtype)
    fields = []
    for part in (active, 1 - active):
        zeros = torch.dot(zero, part)
        values = log_abs * part
        fields += [torch.dot(finite, part) - zeros, values.sum(), torch.dot(values, values), zeros]
    return torch.stack(fields)


def _log_magnitudes(chunk: Tensor) -> tuple[Tensor, Tensor]:
    """(ln|x| with ln|0| taken as 0, 1.0 at the zeros) in the compute dtype (bool math is slow on CPUs; the
    -inf of ln 0 too). In place where possible: fresh buffers cost page faults."""
    magnitude = chunk.to(compute_layout(chunk.dtype).float_dtype).abs()
    zero = torch.eq(magnitude, 0, out=torch.empty_like(magnitude))
    return magnitude.add_(zero).log_(), zero


@CpuCompiled
def _log_sums(chunk: Tensor) -> Tensor:
    """(count of zeros, sum ln|x|, sum ln^2|x|) of one chunk, zeros left out of the sums."""
    log_abs, zero = _log_magnitudes(chunk)
    return torch.stack([zero.sum(), log_abs.sum(), torch.dot(log_abs, log_abs)])


def fit_statistics(
    x: Tensor,
    mask: Tensor | None = None,
    sparsity: float | None = None,
    rule: Rule = "mixture",
    scale_points: Tensor | None = None,
    backend: Backend = "auto",
    calibration: Calibration | None = None,
    count_zeros_into: Tensor | None = None,
    min_zeros: int = 0,
    max_value: float | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(moments, fit, alpha): a layer's statistics from one `log_moments` reduction (its result the first),
    two launches on CUDA.

    fit: float64 over FIT_FIELDS. mu and sigma of ln|x| over the fitted non-zeros; bn_zero_share, the share
    of the elements where `mask` is zero (NaN without a mask); threshold, where `sparsity` is given, the
    alpha at which stochastic pruning leaves that expected fraction of zeros in x (existing zeros included;
    0 when nothing needs pruning); scale, where `scale_points` (float64 (2, P): sigma2 and the log2-scale
    offset at it) is given, the power-of-two scale 2^round(offset(sigma2) - mu2) (mu2, sigma2: log2 units),
    NaN otherwise; with `max_value` (an FP format's largest value) that scale is at least the clip-free one,
    the largest power of two that keeps x's largest finite magnitude within max_value (`clip_free_log2_scale`
    of `largest_finite(x)`: x's largest value always stays representable, so no scale flushes the whole
    tensor), then clamped to [2^-120, 2^120]. alpha: the threshold as `stochastic_prune` takes it on x
    (float32, at most x's largest value), None without `sparsity`.

    With a mask, `rule` says how the threshold treats the elements where it is zero (at a BatchNorm's input,
    those whose BatchNorm-output gradient is zero: what ReLU cut): "mixture" fits them their own lognormal
    and solves the threshold for the whole tensor (the expected zeros of both parts hit the target);
    "reference" (the lognormal paper's code) counts them as zeros and aims the fitted part at
    (sparsity - s0)/(1 - s0), or fits every element where their share s0 reaches the target; "all" fits
    every element as one lognormal. mu and sigma are those of the unmasked elements, except where all are
    fitted together. With `calibration` (and `sparsity`), the threshold aims at the target corrected by the
    feedback of `Calibration`, which this call updates. count_zeros_into: an int64 counter to which x's
    exact zeros are added, or `min_zeros` where that is more (pruning to a target reaches the larger: it
    only adds zeros).
    """
    x = check_float(x, "fit_statistics")
    mask = _check_mask(mask, x)
    if sparsity is not None and not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if rule not in ("mixture", "reference", "all"):
        raise ValueError(f"rule must be 'mixture', 'reference' or 'all', got {rule!r}")
    if calibration is not None:
        _check_calibration(calibration, x, sparsity)
    check_counter(count_zeros_into, x)
    if max_value is not None and not (scale_points is not None and 0 < max_value < math.inf):
        raise ValueError(f"max_value (with scale_points) must be positive and finite, got {max_value}")
    if use_triton(x, backend):
        from gradcomp.kernels.stats import statistics_triton

        moments, fit, alpha = statistics_triton(
            x,
            mask,
            sparsity,
            rule,
            scale_points,
            calibration=calibration,
            zeros=count_zeros_into,
            min_zeros=min_zeros,
            max_value=max_value,
        )
        return moments, fit, alpha if sparsity is not None else None
    moments = log_moments(x, "torch", mask)
    if count_zeros_into is not None:
        zeros = moments[..., 3].sum().to(torch.int64).clamp_min(min_zeros)
        count_zeros_into += zeros.view(count_zeros_into.shape)
    if calibration is not None:
        sparsity = calibrated_target(sparsity, calibration)
    values = _fit_values(moments.flatten().tolist(), x.numel(), sparsity, rule)
    fit = torch.tensor(values, dtype=torch.float64, device=x.device)
    if scale_points is not None:
        floor = None if max_value is None else clip_free_log2_scale(largest_finite(x), max_value)
        fit[4] = torch.exp2(log2_scale(fit[0] / math.log(2), fit[1] / math.log(2), scale_points, floor))
    return moments, fit, None if sparsity is None else usable_threshold(fit[3], x)


def _check_calibration(calibration: Calibration, x: Tensor, sparsity: float | None) -> None:
    if sparsity is None:
        raise ValueError("calibration needs a sparsity to calibrate")
    for name, dtype in (("correction", torch.float64), ("counter", torch.int64), ("mark", torch.int64)):
        value = getattr(calibration, name)
        if value.dtype != dtype or value.numel() != 1 or value.device != x.device:
            raise ValueError(f"calibration.{name} must be one {dtype} element on {x.device}")
    if calibration.elements < 0:
        raise ValueError(f"calibration.elements must be >= 0, got {calibration.elements}")
    if calibration.threshold.numel() != 1 or calibration.threshold.device != x.device:
        raise ValueError(f"calibration.threshold must be one element on {x.device}")


def _fit_values(moments: list[float], numel: int, sparsity: float | None, rule: Rule) -> list[float]:
    """`fit_statistics` of the moments in Python floats (the finishing kernel's steps, on the host)."""
    count, sum_log, sum_log_sq, zeros, *rest = moments
    rest_count, rest_sum_log, rest_sum_log_sq, rest_zeros = rest or (0.0, 0.0, 0.0, 0.0)
    share = (rest_count + rest_zeros) / numel if rest and numel else math.nan
    pooled = not rest or rule == "all" or (rule == "reference" and sparsity is not None and share >= sparsity)
    if pooled:
        count, sum_log, sum_log_sq = count + rest_count, sum_log + rest_sum_log, sum_log_sq + rest_sum_log_sq
    mu, sigma = _fit_float(count, sum_log, sum_log_sq)
    threshold = math.nan
    if sparsity is not None:
        wanted = sparsity * numel - zeros - rest_zeros
        second = lognormal.Population(0.0, math.nan, math.nan)
        if rule == "reference" and not pooled:
            wanted -= rest_count
        elif not pooled:
            second = lognormal.Population(rest_count, *_fit_float(rest_count, rest_sum_log, rest_sum_log_sq))
        threshold = _threshold_float(lognormal.Population(count, mu, sigma), second, wanted)
    return [mu, sigma, share, threshold, math.nan]


def _fit_float(count: float, sum_log: float, sum_log_sq: float) -> tuple[float, float]:
    if count == 0:
        return math.nan, math.nan
    return lognormal.fit_lognormal_float([count, sum_log, sum_log_sq])


def _threshold_float(first: lognormal.Population, second: lognormal.Population, wanted: float) -> float:
    if not (wanted > 0 and first.count + second.count > 0):
        return 0.0
    log_alpha = lognormal.mixture_log_threshold(first, second, wanted, lognormal._FLOATS)
    if not math.isfinite(log_alpha) or log_alpha > 709.7:  # a threshold beyond float64 (huge sigma)
        return 0.0
    return math.exp(log_alpha)


def log2_scale(mu2: Tensor, sigma2: Tensor, points: Tensor, floor: Tensor | None = None) -> Tensor:
    """round(offset(sigma2) - mu2) for a per-layer FP scale rule given as points (sigma2, offset), linear
    between them, sigma2 clamped to their range; clamped to [-120, 120], 0 for NaN (an all-zero gradient:
    any scale); then at least `floor` (a log2 scale, -inf: none) and again at most 120. On device, no host
    sync."""
    sigmas, offsets = points[0], points[1]
    x = sigma2.clamp(sigmas[0], sigmas[-1])
    index = torch.searchsorted(sigmas, x.reshape(1)).clamp(1, sigmas.numel() - 1)
    x0, x1, y0, y1 = sigmas[index - 1], sigmas[index], offsets[index - 1], offsets[index]
    offset = (y0 + (x - x0) * (y1 - y0) / (x1 - x0)).reshape(())
    scale = torch.round(torch.nan_to_num(offset - mu2, nan=0.0).clamp(-120, 120))
    return scale if floor is None else torch.maximum(scale, floor).clamp(max=120)


def largest_finite(x: Tensor) -> Tensor:
    """x's largest finite magnitude (0-d, 0 without a finite non-zero) in the compute dtype (float32, as the
    statistics kernel reads it; float64 for float64 x)."""
    dtype = compute_layout(x.dtype).float_dtype
    if x.numel() == 0:
        return torch.zeros((), dtype=dtype, device=x.device)
    return x.detach().abs().nan_to_num(nan=0.0, posinf=0.0).amax().to(dtype)


def clip_free_log2_scale(amax: Tensor, max_value: float) -> Tensor:
    """log2 of the largest power of two s with amax * s <= max_value (float64 0-d; exact: from the binary
    exponents and mantissas of the two numbers), -inf where amax is 0 or not finite (no bound).

    The MSE-optimal power-of-two scale of a tensor as it is never lies below it: at a scale s with
    2 * amax * s <= max_value nothing clips at 2s either, each normal value keeps its relative rounding
    error (the grid's binades shift by one) and each value in the subnormal or flush range gets a grid
    at least as fine (every grid point up to max_value / 2 doubles to a grid point), so no value's error
    grows, with nearest or stochastic rounding, whatever the format's overflow and subnormals."""
    mantissa, exponent = torch.frexp(amax.to(torch.float64))
    top_mantissa, top_exponent = math.frexp(max_value)
    bound = (top_exponent - exponent - (mantissa > top_mantissa).to(exponent.dtype)).to(torch.float64)
    return torch.where((amax > 0) & (amax < math.inf), bound, -math.inf)


def usable_threshold(alpha: Tensor, x: Tensor) -> Tensor:
    """alpha in the compute dtype of stochastic_prune on x, at most x's largest finite value (a larger
    threshold prunes as that one does)."""
    return alpha.clamp(max=torch.finfo(x.dtype).max).to(compute_layout(x.dtype).float_dtype)


def check_counter(counter: Tensor | None, x: Tensor) -> None:
    """A zero counter must be an int64 one-element tensor on x's device."""
    if counter is None:
        return
    if not isinstance(counter, Tensor) or counter.dtype != torch.int64 or counter.numel() != 1:
        raise TypeError("count_zeros_into must be an int64 tensor of one element")
    if counter.device != x.device:
        raise ValueError(f"count_zeros_into is on {counter.device}, x on {x.device}")


def count_zeros(x: Tensor) -> Tensor:
    """Exact zeros in x (NaN is not one) as an int64 0-d tensor on x's device, without a host sync. A
    0.0/1.0 float mask sums three times faster than count_nonzero counts on CPUs; float32 sums of it are
    exact below 2^24, hence the pieces."""
    flat = x.detach().reshape(-1)
    zero = torch.eq(flat, 0, out=torch.empty(flat.shape, device=flat.device))
    return torch.stack([piece.sum() for piece in zero.split(1 << 24)]).double().sum().long()


def add_zero_count(out: Tensor, counter: Tensor | None) -> Tensor:
    """out, after adding its zeros to `counter` (when there is one): the torch path of count_zeros_into."""
    if counter is not None:
        counter += count_zeros(out).view(counter.shape)
    return out
