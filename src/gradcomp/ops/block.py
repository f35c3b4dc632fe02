"""quantize_block: block-scaled formats (OCP MX, NVFP4), optionally after a random Hadamard transform.

Blocks of `block_size` consecutive elements along `axis` share one scale (`gradcomp.formats.block` defines
the scales). The elements are rounded to the element format's grid by `quantize_fp`'s rounding (nearest with
ties to even, or stochastic with the counter-based bits of each element's position in the blocked layout),
saturating at its largest value, and multiplied back by their scale. Everything is float32:

* MX (e8m0fnu): the scale's exponent comes from amax's bits, exactly (no log2); elements are multiplied by
  2^-k and the rounded values by 2^k, both exact unless the product is a float32 subnormal;
* two-level scales (NVFP4's e4m3fn, float8_e3m4, e5m3fnu): the per-tensor scale s = amax / (S_max *
  max_value) (division rounded to float32, at least 2^(-126 - emin) so that s times the smallest block scale
  stays a normal float32; torchao's gives NaN for a tensor of zeros), the block scale amax(block) /
  max_value / s (two rounded divisions), clamped and rounded to the scale format, the elements divided by
  s * (block scale) (rounded product and quotient), the rounded values multiplied by it: torchao's reference
  operations in its order;
* NVFP4 with rule "te": Transformer Engine's operations in its order (`gradcomp.formats.block`): no
  lower clamp, so blocks whose scale underflows E4M3 decode to zero; on tiny tensors, where TE clamps its
  encode scale or a block's element factor to float32's largest value and its decode would shrink the
  values, such blocks decode by the reciprocal of that factor (gradcomp's one deviation: `_clamped`);
* NVFP4 with rule "four_over_six": its authors' operations in their order (`gradcomp.formats.block`),
  both candidates quantized and the one of smaller squared error kept; the encode scale and the element
  factors clamped to float32's largest value (as TE's Four Over Six does; the authors' code overflows to NaN
  or infinity on tiny tensors) and decoded as under "te" where they were;
* two-level scales with rule "reciprocal": torchao's ratio of each block, its reciprocal C / ratio
  rounded to the scale format, the block scale s * (C / rounded) (`gradcomp.formats.block`).

With `hadamard` = n, each group of n elements of a block is transformed (`gradcomp.ops.hadamard`, signs from
the seed) before the scales are taken, and the quantized values are transformed back: the result is what a
GEMM whose other operand is transformed the same way computes with. Non-finite values pass through
unchanged and take no part in any scale; with the transform, the whole group of a non-finite value passes
through. A trailing block shorter than block_size (the axis length not a multiple of it) is quantized as if
padded with zeros: its scale is that of the elements it has.

Range: with the transform, a block whose largest finite magnitude reaches 2^(127 - P), P = 2 log2(hadamard)
+ 2 (2^115 for hadamard=32), is computed as 2^P times the result for the block times 2^-P (exact, as the
scales are powers of two or divided through, but for values below 2^(P - 126), which lie far below the
block's rounding error), so that no sum of the butterflies overflows float32. The "te" and "four_over_six"
rules do as their sources do and do not prescale: there such a block's transform overflows and the whole
tensor's result with it (non-finite). Results beyond the dtype's largest finite value (an exact result of a
value within a rounding step of it) saturate there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from gradcomp._backend import (
    Backend,
    CpuCompiledPerLayout,
    check_float,
    compute_layout,
    constant_over,
    use_triton,
)
from gradcomp.formats.block import (
    FLOAT32_MAX,
    FLOAT32_MAX_RECIPROCAL,
    FOUR_OVER_SIX_ENCODE,
    NVFP4_SCALE_MAX,
    BlockFormat,
    as_block_format,
)
from gradcomp.formats.rounding import RoundingPlan
from gradcomp.ops._blocks import as_blocks, check_axis, lines_in_place
from gradcomp.ops.fp_quant import _apply_sign, _round
from gradcomp.ops.hadamard import butterfly, check_kernel_dtype, prescales, transform_signs
from gradcomp.ops.stats import add_zero_count, check_counter, count_zeros
from gradcomp.rng import counter_bits, counter_keys, hash_counter, resolve_seed

FLOAT32 = compute_layout(torch.float32)


def quantize_block(
    x: Tensor,
    fmt: BlockFormat | str,
    axis: int = -1,
    seed: int | None = None,
    sign_seed: int | None = None,
    backend: Backend = "auto",
    count_zeros_into: Tensor | None = None,
) -> Tensor:
    """x in the block-scaled format `fmt` (see the module), dequantized: x's dtype and shape.

    fmt: a `BlockFormat` (element and scale formats, block size, scale rule, outer scale, rounding and
    transform, checked where it is built) or a preset's name ("mxfp8", "mxfp6", "mxfp4", "nvfp4"). The
    blocks run along `axis`. seed: the random bits of stochastic rounding (by position), and the
    transform's signs unless `sign_seed` is given; a fresh one from torch's generator where None and either
    is drawn. sign_seed: the transform's signs' own seed (e.g. one for a whole run); refused where the format
    has no random signs. Stochastic rounding is unbiased (E[out] = x) but for the saturation at the dtype's
    range and the scale rules whose blocks saturate (`gradcomp.formats.block`). float16, bfloat16 or float32
    input; a 0-d tensor is one block of one element. count_zeros_into: an int64 one-element tensor on x's
    device to which the output's zeros are added. One kernel launch on CUDA for MX and outer scales, three
    for a per-tensor scale (the tensor's largest magnitude first), plus a copy where `axis` is not the last,
    contiguous one or block_size (or outer) does not divide it; no host sync. Not differentiable."""
    call = _BlockCall.of(x, fmt, axis, seed, sign_seed, count_zeros_into)
    if x.numel() == 0:
        return call.x.clone()
    if not use_triton(x, backend):
        return _torch_path(call)
    from gradcomp.kernels.block import quantize_block_triton

    blocks, restore = format_blocks(call.x, call.fmt, call.axis)
    length = x.shape[call.axis] if x.dim() else 1
    out = quantize_block_triton(blocks, call.fmt, call.seed, length, count_zeros_into, call.sign_seed)
    return restore(out)


def quantize_block_pair(
    xs: tuple[Tensor, Tensor],
    formats: tuple[BlockFormat | str, BlockFormat | str],
    axes: tuple[int, int] = (-1, -1),
    seeds: tuple[int | None, int | None] = (None, None),
    sign_seeds: tuple[int | None, int | None] = (None, None),
    backend: Backend = "auto",
    count_zeros_into: tuple[Tensor | None, Tensor | None] = (None, None),
) -> tuple[Tensor, Tensor]:
    """`quantize_block` of two tensors, each with its own format and per-call arguments (the pairs), e.g.
    the two copies of one gradient in a training step: the same results, on the CPU's compiled path in one
    call for both (a call's own cost is much of a small layer's)."""
    per_copy = zip(xs, formats, axes, seeds, sign_seeds, count_zeros_into, strict=True)
    calls = [_BlockCall.of(*arguments) for arguments in per_copy]
    if any(call.x.numel() == 0 or use_triton(call.x, backend) for call in calls):
        return tuple(_single(call, backend) for call in calls)  # type: ignore[return-value]
    (lines_a, restore_a, args_a), (lines_b, restore_b, args_b) = (_lines_call(call) for call in calls)
    if _eagerly(calls[0], lines_a, args_a) or _eagerly(calls[1], lines_b, args_b):
        return _run(calls[0], lines_a, restore_a, args_a), _run(calls[1], lines_b, restore_b, args_b)
    out_a, zeros_a, out_b, zeros_b = _quantize_two(
        lines_a, *args_a[:3], lines_b, *args_b[:3], args_a[3:], args_b[3:]
    )
    return _finish(calls[0], out_a, zeros_a, restore_a), _finish(calls[1], out_b, zeros_b, restore_b)


def _single(call: _BlockCall, backend: Backend) -> Tensor:
    """`quantize_block` of a checked call (its seeds resolved)."""
    return quantize_block(call.x, call.fmt, call.axis, call.seed, call.sign_seed, backend, call.counter)


class _BlockCall(NamedTuple):
    """One quantize_block call's arguments, checked and resolved."""

    x: Tensor
    fmt: BlockFormat
    axis: int
    seed: int
    sign_seed: int | None
    counter: Tensor | None

    @classmethod
    def of(
        cls,
        x: Tensor,
        fmt: BlockFormat | str,
        axis: int,
        seed: int | None,
        sign_seed: int | None,
        count_zeros_into: Tensor | None,
    ) -> _BlockCall:
        x = check_kernel_dtype(check_float(x, "quantize_block"), "quantize_block")
        fmt = as_block_format(fmt)
        axis = check_axis(x, axis)
        check_counter(count_zeros_into, x)
        random_signs = fmt.hadamard and fmt.signs
        if sign_seed is not None and not random_signs:
            raise ValueError(
                f"sign_seed={sign_seed!r} seeds a Hadamard transform's random signs, and the format has "
                f"none (hadamard={fmt.hadamard}, signs={fmt.signs})"
            )
        stochastic = fmt.rounding == "stochastic"
        seed = resolve_seed(seed) if stochastic or (random_signs and sign_seed is None) else 0
        if not random_signs:
            return cls(x, fmt, axis, seed, None, count_zeros_into)
        return cls(
            x, fmt, axis, seed, seed if sign_seed is None else resolve_seed(sign_seed), count_zeros_into
        )


def format_blocks(x: Tensor, fmt: BlockFormat, axis: int) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """The kernel's layout: x as rows of block_size elements (`as_blocks`), its axis padded to
    `fmt.padded_length`, so that each outer block is outer / block_size consecutive rows (the torch path
    pads to a block only: `torch_blocks`)."""
    blocks, restore = as_blocks(x, fmt.outer or fmt.block_size, axis)
    return blocks.view(-1, fmt.block_size), restore


class _Parts(NamedTuple):
    transformed: Tensor  # the values the format sees (after the transform), non-finite ones zeroed
    scaled: Tensor  # their magnitudes in units of the block's scale, before saturation and rounding
    rounded: Tensor  # the element grid's values they round to
    out: Tensor  # the result, float32


def _torch_path(call: _BlockCall) -> Tensor:
    """The torch implementation (the kernel's oracle) on x's lines along the axis where they lie in memory
    (`lines_in_place`): one call of `_quantize_lines`, compiled on CPU for each layout
    (`CpuCompiledPerLayout`: a few fused loops), but under Four Over Six, whose two candidates inductor
    fused into a different choice for some blocks: eagerly there."""
    return _run(call, *_lines_call(call))


def _run(call: _BlockCall, lines: Tensor, restore: Callable[[Tensor], Tensor], args: tuple) -> Tensor:
    """`_quantize_lines` of `_lines_call`'s lines and arguments, as x."""
    quantize = _quantize_lines.fn if call.fmt.rule == "four_over_six" else _quantize_lines
    out, zeros = quantize(lines, *args)
    return _finish(call, out, zeros, restore)


def _eagerly(call: _BlockCall, lines: Tensor, args: tuple) -> bool:
    """Whether the call's torch path runs eagerly (Four Over Six, see `_torch_path`; not compiling)."""
    return call.fmt.rule == "four_over_six" or _quantize_lines.eager(lines, *args[:3])


def _lines_call(call: _BlockCall) -> tuple[Tensor, Callable[[Tensor], Tensor], tuple]:
    """`_torch_path`'s lines, the function that restores x from them, and `_quantize_lines`' other
    arguments."""
    lines, restore = lines_in_place(call.x, call.axis)
    before, length, after = lines.shape
    fmt = call.fmt
    if before * after * fmt.padded_length(length) > MAX_TORCH_ELEMENTS:
        raise ValueError(
            f"quantize_block's torch path takes at most 2^32 elements (the axis padded to a multiple of "
            f"{fmt.outer or fmt.block_size}), got {before * after * fmt.padded_length(length)}: quantize "
            "the tensor in parts"
        )
    # padded before the compiled call: inside it, inductor's padding of (lines, length, 1) tensors read
    # undefined memory at times (two-level scales with stochastic rounding)
    blocks = torch_blocks(lines, fmt)
    if blocks.numel() != lines.numel():
        lines, unpadded = blocks.view(before, -1, after), restore

        def restore(out: Tensor) -> Tensor:
            return unpadded(out[:, :length].contiguous())

    signs = transform_signs(call.sign_seed, fmt.hadamard, lines.device) if fmt.hadamard else None
    keys = counter_keys(call.seed, lines.device) if fmt.rounding == "stochastic" else (None, None)
    # eagerly, the masks of non-finite values cost passes of their own where there are none (a host sync,
    # harmless on CPUs, tells); compiled, they are a few operations inside the loop
    finite = _eagerly(call, lines, (signs, *keys)) and bool(torch.isfinite(lines.sum()))
    count = call.counter is not None and lines.shape[1] == length  # else of the restored result
    return lines, restore, (signs, *keys, fmt, *_plans(fmt), finite, count)


def _finish(
    call: _BlockCall, out: Tensor, zeros: Tensor | None, restore: Callable[[Tensor], Tensor]
) -> Tensor:
    """The quantized lines as x, their zeros added to the call's counter."""
    if zeros is None:
        return add_zero_count(restore(out), call.counter)
    call.counter.add_(zeros.view(call.counter.shape))  # type: ignore[union-attr]
    return restore(out)


MAX_TORCH_ELEMENTS = 1 << 32  # the counter of the random bits keeps one high word below it


def torch_blocks(lines: Tensor, fmt: BlockFormat) -> Tensor:
    """The torch path's blocks: `lines_in_place`'s (before, length, after) as (before, blocks, block_size,
    after), each line zero-padded to a multiple of block_size; a line shorter than a block as one block of
    its length (the padding's zeros change no scale and no rounding; the transform mixes them in, and Four
    Over Six sums errors over a power-of-two block: padded there)."""
    before, length, after = lines.shape
    block_size = fmt.block_size
    if length < block_size and not fmt.hadamard and fmt.rule != "four_over_six":
        return lines.view(before, 1, length, after)
    padding = -length % block_size
    if padding:
        lines = torch.nn.functional.pad(lines, (0, 0, 0, padding))
    return lines.view(before, -1, block_size, after)


def _random_bits(blocks: Tensor, fmt: BlockFormat, first: Tensor, high: Tensor) -> Tensor:
    """The random bits of `torch_blocks`' blocks, each element's by its position in the kernel's layout
    (`format_blocks`: line by line, each line padded to a multiple of the block or, with an outer scale,
    of the outer block), so that both backends draw the same bits; `first`, `high`: `counter_keys`."""
    before, count, size, after = blocks.shape
    stride = fmt.padded_length(count * size)
    if after == 1 and stride == count * size:  # the positions in order
        return counter_bits(blocks.numel(), first, high).view(blocks.shape)
    device = blocks.device
    lines = torch.arange(before, dtype=torch.int64, device=device).view(-1, 1, 1, 1) * after
    lines = lines + torch.arange(after, dtype=torch.int64, device=device)
    within = torch.arange(count * size, dtype=torch.int64, device=device).view(1, count, size, 1)
    return hash_counter((lines * stride + within).to(torch.int32), first, high)


@CpuCompiledPerLayout
def _quantize_lines(
    lines: Tensor,
    signs: Tensor | None,
    first: Tensor | None,
    high: Tensor | None,
    fmt: BlockFormat,
    plan: RoundingPlan,
    scale_plan: RoundingPlan,
    finite: bool,
    count: bool,
) -> tuple[Tensor, Tensor | None]:
    """`_lines_call`'s lines (padded there) quantized (`_quantize` of their `torch_blocks`), in their dtype
    and shape, and where `count`, their zeros; `first`, `high`: the random bits' keys (`counter_keys`), None
    for nearest rounding; `finite`: every value is finite."""
    blocks = torch_blocks(lines, fmt)
    random = None if first is None else _random_bits(blocks, fmt, first, high)
    out = _quantize(blocks, fmt, random, signs, plan, scale_plan, finite).out.to(lines.dtype)
    out = out.view(lines.shape)
    return out, count_zeros(out) if count else None


@CpuCompiledPerLayout
def _quantize_two(
    lines_a: Tensor,
    signs_a: Tensor | None,
    first_a: Tensor | None,
    high_a: Tensor | None,
    lines_b: Tensor,
    signs_b: Tensor | None,
    first_b: Tensor | None,
    high_b: Tensor | None,
    config_a: tuple,
    config_b: tuple,
) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
    """`_quantize_lines` of two tensors' lines (`quantize_block_pair`), each with its configuration (fmt,
    plan, scale_plan, finite, count), in one compiled call."""
    out_a, zeros_a = _quantize_lines.fn(lines_a, signs_a, first_a, high_a, *config_a)
    out_b, zeros_b = _quantize_lines.fn(lines_b, signs_b, first_b, high_b, *config_b)
    return out_a, zeros_a, out_b, zeros_b


def _quantize(
    blocks: Tensor,
    fmt: BlockFormat,
    random: Tensor | None,
    signs: Tensor | None,
    plan: RoundingPlan,
    scale_plan: RoundingPlan,
    all_finite: bool = False,
) -> _Parts:
    """`torch_blocks`' blocks (each along dim 2) quantized, non-finite values included: they pass through,
    and with the transform their whole group does (see the module). `random`: the elements' random bits
    (None for nearest rounding); `signs`: the transform's (`transform_signs`); `all_finite`: every value is
    known to be finite (the same result without the masks)."""
    values = blocks.float()
    finite = None if all_finite else torch.isfinite(values)
    hadamard = fmt.hadamard
    if hadamard and finite is not None:
        finite = _groups(finite, hadamard).all(3, keepdim=True).expand(_groups(finite, hadamard).shape)
        finite = finite.reshape(values.shape)
    kept = values if finite is None else torch.where(finite, values, 0.0)
    transformed, unscale = _transformed(kept, signs, fmt)
    out_max = torch.finfo(blocks.dtype).max
    parts = _quantize_finite(transformed, unscale, signs, fmt, plan, scale_plan, random, out_max)
    return parts if finite is None else parts._replace(out=torch.where(finite, parts.out, values))


def _quantize_seeded(blocks: Tensor, fmt: BlockFormat, seed: int, sign_seed: int | None) -> _Parts:
    """`_quantize` of `torch_blocks`' blocks with the random bits of `seed` and the transform's signs of
    `sign_seed`."""
    stochastic = fmt.rounding == "stochastic"
    random = _random_bits(blocks, fmt, *counter_keys(seed, blocks.device)) if stochastic else None
    signs = transform_signs(sign_seed, fmt.hadamard, blocks.device) if fmt.hadamard else None
    return _quantize(blocks, fmt, random, signs, *_plans(fmt))


def _plans(fmt: BlockFormat) -> tuple[RoundingPlan, RoundingPlan]:
    """The rounding of the elements and of a two-level format's block scales, in float32."""
    return RoundingPlan.build(fmt.element_format, FLOAT32), RoundingPlan.build(fmt.scale_format, FLOAT32)


def _transformed(values: Tensor, signs: Tensor | None, fmt: BlockFormat) -> tuple[Tensor, Tensor | None]:
    """(the values the format sees, each block's 2^P where its transform's sums could overflow, else 1;
    None without the transform or under TE's and Four Over Six's rules, which do not prescale: see the
    module)."""
    hadamard = fmt.hadamard
    if not hadamard:
        return values, None
    unscale = None
    if not fmt.from_tensor_max:
        prescale, unscale = prescales(values.abs().amax(2, keepdim=True), hadamard)
        values = values * prescale
    return _transform(values, signs, hadamard, inverse=False), unscale


def _groups(blocks: Tensor, hadamard: int) -> Tensor:
    """`torch_blocks`' blocks as (before, blocks, groups, hadamard, after): the transform's groups along
    dim 3."""
    before, count, size, after = blocks.shape
    return blocks.view(before, count, size // hadamard, hadamard, after)


def _transform(values: Tensor, signs: Tensor, hadamard: int, inverse: bool) -> Tensor:
    """H D v / sqrt(n) (or its inverse D H v / sqrt(n)) of each group of `hadamard` elements of the blocks."""
    column = signs.view(-1, 1)  # along dim 3 of the groups
    groups = _groups(values, hadamard)
    out = column * butterfly(groups, 3) if inverse else butterfly(groups * column, 3)
    return out.view(values.shape)


def _tensor_statistic(
    amax: Tensor, fmt: BlockFormat, unscale: Tensor | None, dim: int | None = None
) -> Tensor:
    """What a per-tensor scale is made of, as a maximum over blocks: TE's
    largest magnitude (and Four Over Six's); torchao's largest amax / (S_max max_value) before its floor;
    0 for MX. With `dim`, the maxima along it (kept: an outer block's, its blocks along `dim`)."""

    def largest(values: Tensor) -> Tensor:
        return values.max() if dim is None else values.amax(dim, keepdim=True)

    if fmt.from_tensor_max:
        return largest(amax)
    if fmt.per_tensor:
        ratio = amax / (fmt.scale_range[1] * fmt.element_format.max_value)
        return largest(ratio if unscale is None else ratio * unscale)
    return amax.new_zeros(())


def _finish_statistic(largest: Tensor, fmt: BlockFormat) -> Tensor:
    """The tensor's statistic from the largest candidate: torchao's per-tensor scale has a floor."""
    if fmt.per_tensor and not fmt.from_tensor_max:
        return torch.clamp_min(largest, fmt.tensor_scale_floor)
    return largest


def _quantize_finite(
    transformed: Tensor,
    unscale: Tensor | None,
    signs: Tensor | None,
    fmt: BlockFormat,
    plan: RoundingPlan,
    scale_plan: RoundingPlan,
    random: Tensor | None,
    out_max: float,
) -> _Parts:
    """Finite rows quantized after their transform (`_transformed`: the values and their blocks' unscale)
    given their random bits (`plan`: the elements' rounding, `scale_plan`: a two-level format's block
    scales'); results beyond the output dtype's largest value `out_max` saturate there."""
    magnitude = transformed.abs()
    amax = magnitude.amax(2, keepdim=True)
    if fmt.outer:  # each outer block's float32 scale, from its blocks (a line's last one may have fewer)
        before, count, _, after = amax.shape
        per_outer = fmt.outer // fmt.block_size
        groups = -(-count // per_outer)
        padding = (0, 0, 0, 0, 0, groups * per_outer - count)

        def by_outer(column: Tensor, value: float) -> Tensor:  # (before, outer blocks, per_outer, 1, after)
            padded = torch.nn.functional.pad(column, padding, value=value)
            return padded.view(before, groups, per_outer, 1, after)

        maxima = by_outer(amax, 0.0)  # padding: blocks of zeros, unscale 1
        unscales = None if unscale is None else by_outer(unscale, 1.0)
        largest = _finish_statistic(_tensor_statistic(maxima, fmt, unscales, dim=2), fmt)
        statistic = largest.expand(maxima.shape).reshape(before, -1, 1, after)[:, :count]
    else:
        statistic = _finish_statistic(_tensor_statistic(amax, fmt, unscale), fmt)
    if fmt.rule == "four_over_six":
        scaled, rounded, dequantized, scale = _four_over_six(
            magnitude, amax, statistic, plan, scale_plan, random
        )
        transformed = torch.where(scale > 0, transformed, 0.0)  # its elements are +0 (the authors' code)
    else:
        if fmt.rule == "te":
            coefficient, total = _te_scales(amax, fmt, scale_plan, statistic)
            scaled = magnitude * coefficient
        elif fmt.per_tensor:
            total = _two_level_scales(amax, fmt, scale_plan, unscale, statistic)
            scaled = magnitude / total
        else:
            exponent = mx_exponent(amax, fmt)
            if fmt.rule == "three_quarters":  # 2^(k+2) <= 2^127 as emax >= 2 (block_format)
                exponent = exponent + 2
                scaled, total = magnitude * power_of_two(-exponent) * 3.0, power_of_two(exponent)
            else:
                scaled, total = magnitude * power_of_two(-exponent), power_of_two(exponent)
        rounded = _round(torch.clamp_max(scaled, plan.max_value), random, plan, FLOAT32)
        dequantized = (rounded / 3.0 if fmt.rule == "three_quarters" else rounded) * total
    out = _apply_sign(dequantized, transformed, plan)
    if fmt.hadamard:
        out = _transform(out, signs, fmt.hadamard, inverse=True)
        out = out if unscale is None else out * unscale
    return _Parts(transformed, scaled, rounded, out.clamp(-out_max, out_max))


def block_errors(
    x: Tensor, fmt: BlockFormat, axis: int = -1, seed: int = 0, sign_seed: int | None = None
) -> tuple[float, float, float]:
    """What `quantize_block` does to x (finite, torch path), measured: the share of the non-zero values the
    format sees (after the transform) that become zero, the share beyond the largest element value times
    their block's scale (clipped), and sum (out - x)^2 / sum x^2. The shares count the elements x has (not
    a trailing block's padding)."""
    x = check_kernel_dtype(check_float(x, "block_errors"), "block_errors")
    if x.numel() == 0:
        raise ValueError("block_errors measures shares of a tensor's elements: x is empty")
    blocks = torch_blocks(lines_in_place(x, axis)[0], fmt)  # x detached by check_float
    random_signs = fmt.hadamard and fmt.signs
    parts = _quantize_seeded(
        blocks, fmt, seed, (seed if sign_seed is None else sign_seed) if random_signs else None
    )
    nonzero = parts.transformed != 0
    flushed = (nonzero & (parts.rounded == 0)).sum() / nonzero.sum().clamp_min(1)
    clipped = (parts.scaled > fmt.element_format.max_value).sum() / x.numel()
    values = blocks.reshape(parts.out.shape).double()
    error = (parts.out.double() - values).square().sum() / values.square().sum()
    return float(flushed), float(clipped), float(error)


def mx_exponent(amax: Tensor, fmt: BlockFormat) -> Tensor:
    """k of each block's scale 2^k (int32), from the bits of amax (float32, >= 0, finite)."""
    element = fmt.element_format
    normal = amax >= 2.0**-126
    bits = torch.where(normal, amax, amax * 2.0**24).view(torch.int32)
    exponent = (bits >> 23) - torch.where(normal, 127, 151) - element.emax
    if fmt.rule == "ceil":  # one binade up where amax's significand exceeds max_value's
        exponent = exponent + ((bits & 0x7FFFFF) > fmt.max_mantissa_bits).int()
    return torch.where(amax > 0, exponent, -127).clamp(-127, 127).int()


def power_of_two(exponent: Tensor) -> Tensor:
    """2^k as float32 for int32 k in [-127, 127] (2^-127 is a subnormal)."""
    return torch.where(exponent > -127, (exponent + 127) << 23, 1 << 22).view(torch.float32)


def _te_scales(
    amax: Tensor, fmt: BlockFormat, scale_plan: RoundingPlan, largest: Tensor
) -> tuple[Tensor, Tensor]:
    """Transformer Engine's NVFP4 cast (`gradcomp.formats.block`, rule "te"): each block's element
    coefficient and decode factor (float32), in TE's order of operations (`scale_plan`: E4M3's rounding);
    `largest`: the tensor's largest magnitude."""
    encode_max, reciprocal_max, decode_max = fmt.te_constants
    unclamped = constant_over(encode_max, largest)
    encode = torch.clamp_max(unclamped, FLOAT32_MAX)
    encode = torch.where((largest > 0) & (encode > 0), encode, 1.0)
    block_scale = amax * (encode * reciprocal_max)
    block_scale = _round(torch.clamp_max(block_scale, NVFP4_SCALE_MAX), None, scale_plan, FLOAT32)
    product = block_scale * (1.0 / encode)
    inverse = 1.0 / product
    coefficient = torch.clamp_max(inverse, FLOAT32_MAX)
    decode = block_scale * largest * decode_max
    # TE's order overflows where the tensor's largest magnitude exceeds FLT_MAX / 448: the other order there
    decode = torch.where(torch.isfinite(decode), decode, block_scale * (largest * decode_max))
    clamped, reciprocal = _clamped(block_scale, unclamped, product, inverse)
    return coefficient, torch.where(clamped, reciprocal, decode)


def _clamped(
    block_scale: Tensor, unclamped: Tensor, product: Tensor, inverse: Tensor
) -> tuple[Tensor, Tensor]:
    """Where gradcomp decodes TE's and Four Over Six's blocks otherwise than they do
    (`gradcomp.formats.block`): the blocks of non-zero scale where the encode scale (`unclamped`: its value
    before the clamp to float32's largest) or the block's element factor (`inverse` = 1 / `product`,
    `product` = block scale * (1 / encode)) overflowed and was clamped; and there the reciprocal of the
    factor the elements were multiplied by: `product` (exact where the encode scale was clamped: 1 / FLT_MAX
    is 2^-128), or 2^-128 where the factor was clamped."""
    factor_clamped = inverse > FLOAT32_MAX
    clamped = (block_scale > 0) & ((unclamped > FLOAT32_MAX) | factor_clamped)
    return clamped, torch.where(factor_clamped, FLOAT32_MAX_RECIPROCAL, product)


def _four_over_six(
    magnitude: Tensor,
    amax: Tensor,
    largest: Tensor,
    plan: RoundingPlan,
    scale_plan: RoundingPlan,
    random: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Four Over Six (`gradcomp.formats.block`): (the magnitudes in units of the chosen scale, their rounded
    values, the dequantized magnitudes, the chosen E4M3 scale), each block at whichever of its two scales
    errs less; `largest`: the tensor's largest magnitude."""
    unclamped = constant_over(FOUR_OVER_SIX_ENCODE, largest)
    encode = torch.clamp_max(unclamped, FLOAT32_MAX)
    decode = 1.0 / encode
    six = amax / plan.max_value * encode
    candidates = []
    for high in (six, six * 1.5):
        scale = _round(high, None, scale_plan, FLOAT32)
        product = decode * scale
        inverse = 1.0 / product
        factor = torch.clamp_max(inverse, FLOAT32_MAX)  # as the authors' CUDA kernel and TE clamp it
        scaled = torch.where(scale > 0, magnitude * factor, 0.0)
        rounded = _round(torch.clamp_max(scaled, plan.max_value), random, plan, FLOAT32)
        dequantized = rounded * scale * largest / FOUR_OVER_SIX_ENCODE
        dequantized = torch.where(
            torch.isfinite(dequantized), dequantized, rounded * scale * (largest / FOUR_OVER_SIX_ENCODE)
        )
        clamped, reciprocal = _clamped(scale, unclamped, product, inverse)
        dequantized = torch.where(clamped, rounded * reciprocal, dequantized)
        error = pairwise_sum((dequantized - magnitude).square(), 2)
        candidates.append((scaled, rounded, dequantized, scale, error))
    *six_parts, six_error = candidates[0]
    *four_parts, four_error = candidates[1]
    four = four_error < six_error
    scaled, rounded, dequantized, scale = (
        torch.where(four, b, a) for a, b in zip(six_parts, four_parts, strict=True)
    )
    return scaled, rounded, dequantized, scale


def pairwise_sum(values: Tensor, dim: int) -> Tensor:
    """The sums along `dim` (a power of two long; kept) in a fixed order: neighbours first, then
    neighbouring pairs, and so on (the kernel adds in the same order, so that both backends agree bit for
    bit)."""
    while values.shape[dim] > 1:
        values = values.unflatten(dim, (-1, 2))
        values = values.select(dim + 1, 0) + values.select(dim + 1, 1)
    return values


def _two_level_scales(
    amax: Tensor, fmt: BlockFormat, scale_plan: RoundingPlan, unscale: Tensor | None, tensor_scale: Tensor
) -> Tensor:
    """Each block's total scale: the per-tensor scale times the block's scale in the scale format
    (float32). With prescaled blocks (amax times 2^-P, `unscale` = 2^P) the result is the scale of the
    prescaled block: the divisions commute with the powers of two."""
    max_value = fmt.element_format.max_value
    block_scale = amax / max_value / tensor_scale
    if unscale is not None:
        block_scale = block_scale * unscale
    if fmt.rule == "reciprocal":  # the reciprocal clamped and rounded (a zero block: inf, clamped to S_max)
        constant = fmt.reciprocal_constant
        reciprocal = _round(
            torch.clamp(constant_over(constant, block_scale), *fmt.scale_range), None, scale_plan, FLOAT32
        )
        block_scale = constant_over(constant, reciprocal)
    else:
        block_scale = torch.clamp(block_scale, *fmt.scale_range)
        if fmt.rule == "ceil":  # up to the next value of the scale format: clear the low bits, rounding up
            ulp = fmt.scale_ulp_bits
            block_scale = ((block_scale.view(torch.int32) + ulp - 1) & -ulp).view(torch.float32)
        else:
            block_scale = _round(block_scale, None, scale_plan, FLOAT32)
    total = tensor_scale * block_scale
    return total if unscale is None else total / unscale
