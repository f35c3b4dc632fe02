"""A tensor as rows of consecutive elements along one axis: the layout of the ops that act on blocks."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
from torch import Tensor


def as_blocks(x: Tensor, size: int, axis: int) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """x as contiguous rows of `size` elements (axis last, zero-padded to a multiple of size), and the
    function that turns such rows back into x's shape: with x's strides where the rows are a view of x
    (e.g. the channels of a channels-last tensor: no copy either way), else contiguous. A 0-d tensor is
    one row of one element."""
    axis = check_axis(x, axis)
    if x.dim() == 0:
        blocks, restore = as_blocks(x.reshape(1), size, -1)
        return blocks, lambda out: restore(out).reshape(())
    moved = x.movedim(axis, -1)
    length = moved.shape[-1]
    padding = -length % size
    view = not padding and moved.is_contiguous()
    if padding:
        moved = torch.nn.functional.pad(moved, (0, padding))
    blocks = moved.contiguous().view(-1, size)

    def restore(out: Tensor) -> Tensor:
        out = out.reshape(*moved.shape)[..., :length]
        return out.movedim(-1, axis) if view else out.movedim(-1, axis).contiguous()

    return blocks, restore


def lines_in_place(x: Tensor, axis: int) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """x as (before, length, after): the lines along `axis`, `before` and `after` the other axes that lie
    outside and inside it in memory, each flattened, line (b, a) = b * after + a the row-major index of x's
    other axes; and the function that turns such a tensor back into x. Where x is dense with its other axes
    in memory in their own order (any contiguous tensor; a channels-last one along its channels or with the
    channels innermost), a view of x: no copy, and the result in x's strides. Elsewhere a contiguous copy
    with the axis last (`after` = 1) and a contiguous result. A 0-d tensor is one line of one element."""
    axis = check_axis(x, axis)
    if x.dim() == 0:
        lines, restore = lines_in_place(x.reshape(1), -1)
        return lines, lambda out: restore(out).reshape(())
    axis %= x.dim()
    others = [d for d in range(x.dim()) if d != axis]
    orders = ([*others[:k], axis, *others[k:]] for k in range(len(others), -1, -1))  # after = 1 first
    order = next((o for o in orders if x.permute(o).is_contiguous()), None)
    in_place = order is not None
    if not in_place:
        order = [*others, axis]
    laid_out = x.permute(order) if in_place else x.permute(order).contiguous()
    where = order.index(axis)
    before, after = math.prod(laid_out.shape[:where]), math.prod(laid_out.shape[where + 1 :])
    inverse = [order.index(d) for d in range(x.dim())]

    def restore(out: Tensor) -> Tensor:
        out = out.view(laid_out.shape).permute(inverse)
        return out if in_place else out.contiguous()

    return laid_out.view(before, x.shape[axis], after), restore


def check_axis(x: Tensor, axis: int) -> int:
    """axis as an int (numpy integers taken), if it is one of x's axes (-1 and 0 for a 0-d tensor, whose
    one element is a block of its own)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {axis!r}")
    axis = int(axis)
    if not -max(x.dim(), 1) <= axis < max(x.dim(), 1):
        raise ValueError(f"axis {axis} is not an axis of a tensor of shape {tuple(x.shape)}")
    return axis
