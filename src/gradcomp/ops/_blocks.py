"""A tensor as rows of consecutive elements along one axis: the layout of the ops that act on blocks."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def as_blocks(x: Tensor, size: int, axis: int) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """x as contiguous rows of `size` elements (axis last, zero-padded to a multiple of size), and the
    function that turns such rows back into x's shape."""
    check_axis(x, axis)
    moved = x.movedim(axis, -1)
    length = moved.shape[-1]
    padding = -length % size
    if padding:
        moved = torch.nn.functional.pad(moved, (0, padding))
    blocks = moved.contiguous().view(-1, size)

    def restore(out: Tensor) -> Tensor:
        out = out.view(*moved.shape)[..., :length]
        return out.movedim(-1, axis).contiguous() if axis not in (-1, x.dim() - 1) or padding else out

    return blocks, restore


def check_axis(x: Tensor, axis: int) -> None:
    if x.dim() == 0 or not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is not an axis of a tensor of shape {tuple(x.shape)}")
