"""quantize_int: the unbiased integer gradient quantizers of the statistical FQT framework.

Rows are the first dimension (samples); the rest is flattened. Every scheme maps a group of values
affinely onto the integer codes 0..B (B = 2^bits - 1), rounds stochastically and maps back:
* "ptq": one (min, range) for the whole tensor;
* "psq": one (min, range) per row;
* "bhq": PSQ applied after the block-Householder transform T (section 2.6), then T^-1. T is built from the
  row ranges and applied structurally: per-row scaling plus one reflection y = z - 2 v (v^T z) per block,
  O(N*D) work, never a dense N x N matrix, and no host sync.
Outputs of PTQ and PSQ lie on their group's grid within its [min, max]. The min maps to code 0 and comes
back exactly, so a group of values >= 0 (e.g. after a ReLU) keeps its zeros exact, as does a constant group;
in a group with negative values a zero lies between two codes and is rounded to one of them (unbiased, but
rarely exactly 0): the map stays the framework's affine min-max map, whose estimator a grid through 0
would change. BHQ mixes rows: only an all-zero tensor stays exact, and outputs beyond the dtype's range
saturate at its largest finite value. An element sharing its scale with a NaN or Inf comes out NaN
(PTQ: the whole tensor, PSQ: the row, BHQ: the whole tensor, since the transform mixes rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from gradcomp._backend import Backend, check_float, compute_layout, use_triton
from gradcomp.choices import INT_BITS, INT_SCHEMES, choose, integer
from gradcomp.ops.stats import add_zero_count, check_counter
from gradcomp.rng import random_bits, resolve_seed, uniform24

Scheme = Literal["ptq", "psq", "bhq"]
# BHQ pads row ranges by RANGE_EPS times the largest range (the reference code pads by an absolute 1e-8, which
# would swamp gradients of magnitude 1e-8 and below); relative padding keeps the quantizer scale-free
RANGE_EPS = 1e-8


def quantize_int(
    x: Tensor,
    bits: int,
    scheme: Scheme = "ptq",
    seed: int | None = None,
    backend: Backend = "auto",
    count_zeros_into: Tensor | None = None,
) -> Tensor:
    """Stochastic-rounding b-bit quantize/dequantize of x: unbiased (E[out] = x up to the rounding of the
    compute dtype, float32 or float64) for finite groups of any magnitude. count_zeros_into: an int64
    one-element tensor on x's device to which the output's zeros are added (on CUDA inside the kernel for
    PTQ and PSQ). Not differentiable: x is detached and the result does not require grad."""
    x = check_float(x, "quantize_int")
    check_counter(count_zeros_into, x)
    bits = integer("bits", bits, *INT_BITS)
    choose("scheme", scheme, INT_SCHEMES)
    seed = resolve_seed(seed)
    if x.numel() == 0:
        return x.clone()
    levels = 2**bits - 1
    triton = use_triton(x, backend)
    if triton and scheme != "bhq":  # the kernels read and write x's dtype
        from gradcomp.kernels.int_quant import quantize_groups_triton

        groups = x.reshape(1 if scheme == "ptq" or not x.dim() else x.shape[0], -1).contiguous()
        return quantize_groups_triton(groups, levels, seed, zeros=count_zeros_into).view(x.shape)
    rows = x.to(compute_layout(x.dtype).float_dtype).reshape(x.shape[0] if x.dim() else 1, -1)
    if scheme == "ptq":
        out = _quantize_rows(rows.reshape(1, -1), levels, seed, triton).view(rows.shape)
    elif scheme == "psq":
        out = _quantize_rows(rows, levels, seed, triton)
    else:  # the transform's noise can carry a value near the dtype's limit past it: saturate there, not Inf
        largest = torch.finfo(x.dtype).max
        out = _block_householder_quantize(rows, levels, seed, triton).clamp_(-largest, largest)
    return add_zero_count(out.view(x.shape).to(x.dtype), count_zeros_into)


class AffineMap(NamedTuple):
    """Per-row parameters of the stochastic affine quantizer, each (R,) in the compute dtype.

    With y = x * pre: codes = (y - zero) * scale clamped to [0, levels], rounded stochastically to q, and
    out = (q * step + zero) * post clamped to [low, high]. pre = 2^k and post = 2^-k bring the group's
    largest magnitude to about 1, so that neither its range nor levels / range overflows or loses precision
    whatever its magnitude (a float32 group of 1e-40 or of 3e38 alike). Powers of two because scaling by
    them is exact (short of subnormals) and costs one multiplication each way: where the plain map worked
    the results are the same, and no wider dtype is needed (there is none for float64, and float64
    arithmetic is slow on most GPUs). The final clamp keeps the rounding of the last operations (and an
    overflow of the top code) inside the group's range; 0 comes out as +0.0. A group with NaN or Inf has
    NaN zero, low and high, so all of it comes out NaN.
    """

    pre: Tensor
    zero: Tensor
    scale: Tensor
    step: Tensor
    post: Tensor
    low: Tensor
    high: Tensor

    @classmethod
    def of_rows(cls, rows: Tensor, levels: int, dim: int = 1) -> AffineMap:
        """The map of each row's [min, max] onto [0, levels] (each column's with dim=0); a constant row gets
        scale and step 1."""
        low, high = torch.aminmax(rows, dim=dim)
        pre, post = _power_of_two_rescaling(torch.maximum(-low, high))
        zero = low * pre
        spread = high * pre - zero
        flat = spread == 0
        finite = torch.isfinite(spread)
        # + 0.0 turns -0.0 into 0.0: clamping to a signed zero would give either zero, by implementation
        zero, low, high = (torch.where(finite, value, math.nan) for value in (zero, low + 0.0, high + 0.0))
        scale = torch.where(flat, 1.0, levels / spread)
        step = torch.where(flat, 1.0, spread / levels)
        return cls(pre, zero, scale, step, post, low, high)


def _power_of_two_rescaling(magnitude: Tensor) -> tuple[Tensor, Tensor]:
    """(2^k, 2^-k) with 2^k * magnitude in [0.5, 1) (frexp), k limited to where both factors are normal
    numbers of the compute dtype (then 2^k * magnitude stays within [2^-mantissa_bits, 4)). Built from the
    exponent bits, since torch.ldexp would compute 2^k in float32."""
    layout = compute_layout(magnitude.dtype)
    limit = layout.exp_bias - 1
    k = torch.frexp(magnitude).exponent.neg_().clamp_(-limit, limit).to(layout.int_dtype)

    return layout.pow2_bits(k).view(layout.float_dtype), layout.pow2_bits(-k).view(layout.float_dtype)


def quantize_columns(
    x: Tensor, bits: int, seed: int, backend: Backend = "auto", count_zeros_into: Tensor | None = None
) -> Tensor:
    """PSQ with one scale group per column of the 2-D tensor x (per feature across the batch: the weight
    gradient's quantizer of the framework's reference code), in x's dtype; random bits by x's row-major
    element index. Three launches on CUDA."""
    levels = 2**bits - 1
    if x.numel() == 0:
        return x.clone()
    if use_triton(x, backend):
        from gradcomp.kernels.int_quant import quantize_groups_triton

        return quantize_groups_triton(x.contiguous(), levels, seed, columns=True, zeros=count_zeros_into)
    rows = x.to(compute_layout(x.dtype).float_dtype)
    return add_zero_count(_quantize_rows(rows, levels, seed, False, dim=0).to(x.dtype), count_zeros_into)


def _quantize_rows(rows: Tensor, levels: int, seed: int, triton: bool, dim: int = 1) -> Tensor:
    """Per-row stochastic affine quantization (PSQ; PTQ is the one-row case; per column with dim=0)."""
    if triton:
        from gradcomp.kernels.int_quant import quantize_groups_triton

        return quantize_groups_triton(rows.contiguous(), levels, seed, columns=dim == 0)
    affine = AffineMap.of_rows(rows, levels, dim)
    pre, zero, scale, step, post, low, high = (value.unsqueeze(dim) for value in affine)
    codes = (rows * pre).sub_(zero).mul_(scale).clamp_(0, levels)
    whole = torch.floor(codes)
    random = uniform24(random_bits(seed, rows.numel(), rows.device)).view(rows.shape).to(rows.dtype)  # exact
    # 0.0 / 1.0: bool tensors are slow on CPUs
    up = torch.lt(random, codes.sub_(whole).mul_(2.0**24), out=random)
    return whole.add_(up).mul_(step).add_(zero).mul_(post).clamp_(low, high)


@dataclass(frozen=True)
class BlockHouseholder:
    """The transform T of BHQ, described per row (original row order).

    T x = H_blocks(scale * x): each row belongs to `block`; a block's reflection is I - 2 v v^T with the
    entries `v` of its rows; T^-1 y = H_blocks(y) / scale (H is symmetric and orthogonal).
    """

    block: Tensor  # int64 block id of each row
    v: Tensor  # Householder vector entry of each row
    scale: Tensor  # diagonal scaling d of each row
    members: Tensor  # the rows in block order (ascending within a block): the kernel's visiting order
    starts: Tensor  # where each block's rows begin in `members` (n_rows + 1 entries)

    @classmethod
    def from_ranges(cls, ranges: Tensor) -> BlockHouseholder:
        """Section 2.6 steps 2-5, vectorised over rows with fixed shapes (no host sync)."""
        n_rows = ranges.numel()
        device, dtype = ranges.device, ranges.dtype
        lam = ranges + (RANGE_EPS * ranges.max() + torch.finfo(dtype).tiny)
        order = torch.argsort(lam, descending=True, stable=True)
        v_sorted = lam[order]
        position = torch.arange(n_rows, device=device)

        # step 3: k = first count of small rows with k * v_(N-k) / S_k > 1 (else N - 1)
        k_candidates = torch.arange(1, n_rows, device=device)
        kept_sum = v_sorted.sum() - torch.cumsum(v_sorted.flip(0), 0)[: n_rows - 1]
        stops = k_candidates * v_sorted[n_rows - 1 - k_candidates] > kept_sum
        first_stop = k_candidates.gather(0, stops.int().argmax().reshape(1)).reshape(())
        k = torch.where(stops.any(), first_stop, n_rows - 1)
        n_large = n_rows - k

        # step 4: small rows allocated to large rows by cumulative rounding of k * v_i / S
        large = position < n_large
        cumulative = torch.cumsum(torch.where(large, v_sorted, 0.0), 0)
        large_sum = cumulative.gather(0, (n_large - 1).reshape(1))
        ends = torch.where(large, torch.floor(cumulative * k / large_sum + 0.5), math.inf)
        starts = torch.cat([ends.new_zeros(1), ends[:-1]])
        small_index = (position - n_large).to(dtype)
        block_sorted = torch.where(large, position, torch.searchsorted(ends, small_index, right=True))
        block_sorted = block_sorted.clamp(0, n_rows - 1)  # only non-finite ranges could push it out
        size = 1 + ends[block_sorted] - starts[block_sorted]

        # step 5: per-block scalings s1 (large row) and s2 (small rows)
        first_small = (n_large + starts[block_sorted]).nan_to_num(0).long().clamp(0, n_rows - 1)
        w_large = v_sorted[block_sorted] / size.sqrt()
        w_small = v_sorted[first_small] * _householder_max_entry(size)
        s_large = w_large.pow(-1 / 3)
        s_small = (w_small / (size - 1)).pow(-1 / 3)
        norm = torch.sqrt(s_large.pow(-2) + s_small.pow(-2))
        scale_sorted = torch.where(large, s_large, s_small) * norm

        root = size.sqrt()
        v_sorted_entries = torch.where(large, 1 / root - 1, 1 / root) / torch.sqrt(2 - 2 / root)
        block = _unsort(block_sorted, order)
        starts = torch.zeros(n_rows + 1, dtype=torch.int64, device=device)
        starts[1:] = torch.cumsum(torch.bincount(block, minlength=n_rows), 0)
        return cls(
            block=block,
            v=_unsort(v_sorted_entries, order),
            scale=_unsort(scale_sorted, order),
            members=torch.argsort(block, stable=True),
            starts=starts,
        )

    def reflect(self, rows: Tensor) -> Tensor:
        """H_blocks(rows): rows - 2 v (v^T rows) within each block."""
        projection = torch.zeros_like(rows).index_add_(0, self.block, self.v[:, None] * rows)
        return rows - 2 * self.v[:, None] * projection[self.block]


def _unsort(sorted_values: Tensor, order: Tensor) -> Tensor:
    out = torch.empty_like(sorted_values)
    out[order] = sorted_values
    return out


def _householder_max_entry(size: Tensor) -> Tensor:
    """max |entry| of H_n (H_n e_1 = 1/sqrt n): of 1/sqrt n, |1 - 1/(n - sqrt n)| and 1/(n - sqrt n)."""
    root = size.sqrt()
    off = 1 / (size - root)
    return torch.maximum(torch.maximum(1 / root, (1 - off).abs()), torch.where(size >= 3, off, 0.0))


def _block_householder_quantize(rows: Tensor, levels: int, seed: int, triton: bool) -> Tensor:
    if rows.shape[0] < 2:
        return _quantize_rows(rows, levels, seed, triton)
    low, high = torch.aminmax(rows, dim=1)
    # T mixes rows, so the exact power-of-two rescaling of AffineMap is applied to the whole tensor (T is
    # scale-free: its row scalings are ratios of ranges); then no range overflows and T's values stay near 1
    pre, post = _power_of_two_rescaling(torch.maximum(-low, high).max())
    rows = rows * pre
    transform = BlockHouseholder.from_ranges(high * pre - low * pre)
    inverse_scale = torch.reciprocal(transform.scale)
    if triton:
        from gradcomp.kernels.int_quant import householder_triton

        transformed = householder_triton(rows, transform, transform.scale, None)
        quantized = _quantize_rows(transformed, levels, seed, triton)
        out = householder_triton(quantized, transform, None, inverse_scale)
    else:
        transformed = transform.reflect(rows * transform.scale[:, None])
        quantized = _quantize_rows(transformed, levels, seed, triton)
        out = transform.reflect(quantized) * inverse_scale[:, None]
    finite = torch.isfinite(low).all() & torch.isfinite(high).all()
    return torch.where(finite, out.mul_(post), math.nan)
