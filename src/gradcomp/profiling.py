"""Counting what an op costs the host: kernel launches, torch operations and host syncs.

On a GPU a compression op's kernels take microseconds, while each extra torch operation costs a launch
(several microseconds of host time) and each host sync stalls the host until the device catches up.
`count_work()` counts all three for whatever runs inside it, on any device: on CPU tensors (the Triton
kernels run under the interpreter, TRITON_INTERPRET=1) it shows what the same code would launch on CUDA, so
tests keep the budget without a GPU. Every Triton kernel of gradcomp is started through `launch`, which the
counter sees; torch operations are seen through a dispatch mode. Allocations and views (empty, view,
select, detach, ...) launch nothing and are not counted; operations that read a device value on the host
(`.item()`, `bool()`, `.tolist()`, `.numpy()`, `.cpu()` of a device tensor, `nonzero`, ...) are syncs.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# operations that launch nothing: allocations and metadata (views)
_FREE = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "view",
    "_unsafe_view",
    "as_strided",
    "t",
    "transpose",
    "permute",
    "expand",
    "select",
    "slice",
    "alias",
    "detach",
    "unsqueeze",
    "squeeze",
    "unbind",
    "split",
    "split_with_sizes",
    "view_as_real",
    "_reshape_alias",
}
# operations that make the host wait for the device on CUDA
_SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive"}


@dataclass
class Work:
    """What ran inside `count_work`: Triton kernel launches by kernel name, torch operations (each a kernel
    launch on CUDA) and host syncs by aten name."""

    launches: Counter[str] = field(default_factory=Counter)
    torch_ops: Counter[str] = field(default_factory=Counter)
    syncs: Counter[str] = field(default_factory=Counter)

    @property
    def total_launches(self) -> int:
        """Kernels the device would run: Triton launches plus torch operations."""
        return sum(self.launches.values()) + sum(self.torch_ops.values())

    def __str__(self) -> str:
        return (
            f"{sum(self.launches.values())} Triton launches {dict(self.launches)}, "
            f"{sum(self.torch_ops.values())} torch ops {dict(self.torch_ops)}, "
            f"{sum(self.syncs.values())} syncs {dict(self.syncs)}"
        )


_state = threading.local()


def _current() -> Work | None:
    return getattr(_state, "work", None)


def counting() -> bool:
    """Whether a `count_work` block is active in this thread (torch.compile cannot run inside one)."""
    return _current() is not None


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """kernel[grid](*args, **kwargs), counted by an active `count_work` (what the launch does internally,
    e.g. the interpreter's copies, is not the op's work and is not counted)."""
    work = _current()
    if work is None:
        kernel[grid](*args, **kwargs)
        return
    work.launches[getattr(kernel, "__name__", str(kernel))] += 1
    _state.work = None
    try:
        kernel[grid](*args, **kwargs)
    finally:
        _state.work = work


class _OpCounter(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        work = _current()
        if work is not None:
            name = func.overloadpacket.__name__
            if name in _SYNCS or _copies_to_host(name, args, kwargs or {}):
                work.syncs[name] += 1
            elif name not in _FREE:
                work.torch_ops[name] += 1
        return func(*args, **(kwargs or {}))


def _copies_to_host(name: str, args: tuple, kwargs: dict) -> bool:
    """A copy from a device tensor into host memory (e.g. `.cpu()`): the host waits for the device."""
    if name not in ("_to_copy", "copy_") or not args or not isinstance(args[0], torch.Tensor):
        return False
    if name == "copy_":
        source = args[1]
        on_device = isinstance(source, torch.Tensor) and source.device.type != "cpu"
        return args[0].device.type == "cpu" and on_device
    target = kwargs.get("device")
    return args[0].device.type != "cpu" and target is not None and torch.device(target).type == "cpu"


def _host_read(method):
    """A Tensor method that reads the values on the host (`tolist`, `numpy`), counted as a sync: on CUDA it
    waits for the device, and on CPU tensors the dispatch mode does not see it."""

    @functools.wraps(method)
    def read(tensor, *args, **kwargs):
        work = _current()
        if work is not None:
            work.syncs[method.__name__] += 1
            _state.work = None  # what the read does inside is not counted again
            try:
                return method(tensor, *args, **kwargs)
            finally:
                _state.work = work
        return method(tensor, *args, **kwargs)

    return read


_HOST_READS = ("tolist", "numpy")


@contextmanager
def count_work() -> Iterator[Work]:
    """Count the launches, torch operations and syncs of the code inside the block (this thread only)."""
    outer = _current()
    work = Work()
    _state.work = work
    originals = {name: getattr(torch.Tensor, name) for name in _HOST_READS}
    for name, method in originals.items():
        setattr(torch.Tensor, name, _host_read(method))
    try:
        with _OpCounter():
            yield work
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
        _state.work = outer
