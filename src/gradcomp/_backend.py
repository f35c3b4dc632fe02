"""Choosing between the torch implementation and the Triton kernel of an op, and shared input checks."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Backend = Literal["auto", "torch", "triton"]
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreter_enabled() -> bool:
    """TRITON_INTERPRET is read when triton.language is first imported; we only read it, never set it."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(x: Tensor, backend: Backend) -> bool:
    """True when the op should run its Triton kernel on x.

    "auto" picks Triton for CUDA tensors of a kernel dtype and torch otherwise; "triton" forces the kernel and
    explains why it cannot run; "torch" forces the vectorised torch implementation.
    """
    if backend == "torch":
        return False
    supported = x.dtype in KERNEL_DTYPES
    if backend == "auto":
        return x.is_cuda and supported and triton_available()
    if backend != "triton":
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if not triton_available():
        raise RuntimeError("backend='triton' needs the triton package, which failed to import")
    if not supported:
        raise TypeError(f"Triton kernels take {KERNEL_DTYPES}; use backend='torch' for {x.dtype}")
    if not x.is_cuda and not interpreter_enabled():
        raise RuntimeError(
            "backend='triton' on a CPU tensor needs the Triton interpreter: set TRITON_INTERPRET=1 in the "
            "environment before Python starts (it is read when triton.language is first imported)"
        )
    return True


def check_float(x: Tensor, op: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{op}: expected a floating-point tensor, got {x.dtype}")


@dataclass(frozen=True)
class FloatLayout:
    """Bit layout of the float type an op computes in (float32, or float64 for float64 inputs)."""

    float_dtype: torch.dtype
    int_dtype: torch.dtype
    man_bits: int
    exp_bias: int

    @property
    def sign_mask(self) -> int:
        return -(1 << (self.man_bits + self.exp_bits))

    @property
    def exp_bits(self) -> int:
        return 8 if self.float_dtype == torch.float32 else 11

    @property
    def abs_mask(self) -> int:
        return (1 << (self.man_bits + self.exp_bits)) - 1

    def pow2_bits(self, exponent: int) -> int:
        """Bit pattern of the normal number 2^exponent."""
        return (exponent + self.exp_bias) << self.man_bits


FLOAT32 = FloatLayout(torch.float32, torch.int32, 23, 127)
FLOAT64 = FloatLayout(torch.float64, torch.int64, 52, 1023)


def compute_layout(dtype: torch.dtype) -> FloatLayout:
    """float64 computes in float64; every other float dtype converts exactly to float32."""
    return FLOAT64 if dtype == torch.float64 else FLOAT32
