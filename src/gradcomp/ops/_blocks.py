"""A tensor as rows of consecutive elements along one axis: the layout of the ops that act on blocks."""

from __future__ import annotations

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


def check_axis(x: Tensor, axis: int) -> int:
    """axis as an int (numpy integers taken), if it is one of x's axes (-1 and 0 for a 0-d tensor, whose
    one element is a block of its own)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {axis!r}")
    axis = int(axis)
    if not -max(x.dim(), 1) <= axis < max(x.dim(), 1):
        raise ValueError(f"axis {axis} is not an axis of a tensor of shape {tuple(x.shape)}")
    return axis
