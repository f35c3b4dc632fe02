"""quantize_int: the unbiased integer gradient quantizers of the statistical FQT framework.

Rows are the first dimension (samples); the rest is flattened. Every scheme maps a group of values
affinely onto the integer codes 0..B (B = 2^bits - 1), rounds stochastically and maps back:
* "ptq": one (min, range) for the whole tensor;
* "psq": one (min, range) per row;
* "bhq": PSQ applied after the block-Householder transform T (section 2.6), then T^-1. T is built from the
  row ranges and applied structurally: per-row scaling plus one reflection y = z - 2 v (v^T z) per block,
  O(N*D) work, never a dense N x N matrix, and no host sync.
PTQ and PSQ reproduce a group whose range is 0 exactly (BHQ mixes rows: only all zeros stay exact).
An element sharing its scale with a NaN or Inf comes out NaN
(PTQ: the whole tensor, PSQ: the row, BHQ: the whole tensor, since the transform mixes rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from gradcomp._backend import Backend, check_float, compute_layout, use_triton
from gradcomp.rng import random_bits, resolve_seed, uniform24

Scheme = Literal["ptq", "psq", "bhq"]
# BHQ pads row ranges by RANGE_EPS times the largest range (the reference code pads by an absolute 1e-8, which
# would swamp gradients of magnitude 1e-8 and below); relative padding keeps the quantizer scale-free
RANGE_EPS = 1e-8


def quantize_int(
    x: Tensor, bits: int, scheme: Scheme = "ptq", seed: int | None = None, backend: Backend = "auto"
) -> Tensor:
    """Stochastic-rounding b-bit quantize/dequantize of x (unbiased: E[out] = x up to float32 rounding)."""
    check_float(x, "quantize_int")
    if not isinstance(bits, int) or not 1 <= bits <= 16:
        raise ValueError(f"bits must be an integer in [1, 16], got {bits!r}")
    if scheme not in ("ptq", "psq", "bhq"):
        raise ValueError(f"scheme must be 'ptq', 'psq' or 'bhq', got {scheme!r}")
    seed = resolve_seed(seed)
    if x.numel() == 0:
        return x.clone()
    levels = 2**bits - 1
    triton = use_triton(x, backend)
    rows = x.to(compute_layout(x.dtype).float_dtype).reshape(x.shape[0] if x.dim() else 1, -1)
    if scheme == "ptq":
        out = _quantize_rows(rows.reshape(1, -1), levels, seed, triton).view(rows.shape)
    elif scheme == "psq":
        out = _quantize_rows(rows, levels, seed, triton)
    else:
        out = _block_householder_quantize(rows, levels, seed, triton)
    return out.view(x.shape).to(x.dtype)


def _affine_params(rows: Tensor, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row (zero, scale, inv_scale) mapping [min, max] onto [0, levels]; a constant row gets scale 1."""
    low, high = torch.aminmax(rows, dim=1)
    spread = high - low
    flat = spread == 0
    scale = torch.where(flat, 1.0, levels / spread)
    inv_scale = torch.where(flat, 1.0, spread / levels)
    zero = torch.where(torch.isfinite(spread), low, math.nan)  # a non-finite row comes out NaN
    return zero, scale, inv_scale


def _quantize_rows(rows: Tensor, levels: int, seed: int, triton: bool) -> Tensor:
    """Per-row stochastic affine quantization (PSQ; PTQ is the one-row case)."""
    zero, scale, inv_scale = _affine_params(rows, levels)
    if triton:
        from gradcomp.kernels.int_quant import stochastic_affine_triton

        return stochastic_affine_triton(rows, zero, scale, inv_scale, levels, seed)
    codes = ((rows - zero[:, None]) * scale[:, None]).clamp_(0, levels)
    whole = torch.floor(codes)
    random = uniform24(random_bits(seed, rows.numel(), rows.device)).view(rows.shape).to(rows.dtype)  # exact
    up = torch.lt(random, (codes - whole) * 2.0**24, out=random)  # 0.0 / 1.0: bool tensors are slow on CPUs
    return (whole + up) * inv_scale[:, None] + zero[:, None]


@dataclass(frozen=True)
class BlockHouseholder:
    """The transform T of BHQ, described per row (original row order).

    T x = H_blocks(scale * x): each row belongs to `block`; a block's reflection is I - 2 v v^T with the
    entries `v` of its rows; T^-1 y = H_blocks(y) / scale (H is symmetric and orthogonal).
    """

    block: Tensor  # int64 block id of each row
    v: Tensor  # Householder vector entry of each row
    scale: Tensor  # diagonal scaling d of each row

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
        return cls(
            block=_unsort(block_sorted, order),
            v=_unsort(v_sorted_entries, order),
            scale=_unsort(scale_sorted, order),
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
    transform = BlockHouseholder.from_ranges(high - low)
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
    return torch.where(finite, out, math.nan)
