"""Choosing between the torch implementation and the Triton kernel of an op, and shared input checks."""

from __future__ import annotations

import functools
import os
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from gradcomp import choices
from gradcomp.profiling import counting

Backend = Literal["auto", "torch", "triton"]
KERNEL_DTYPES = tuple(getattr(torch, name) for name in choices.KERNEL_DTYPES)


def constant_over(constant: float, tensor: Tensor) -> Tensor:
    """constant / tensor in one rounded division, as the kernels divide (torch takes `constant / tensor` as
    the reciprocal times the constant: two roundings, an ulp apart for about a quarter of float32 values, and
    a subnormal reciprocal where the tensor exceeds 2^126)."""
    return torch.div(torch.full_like(tensor, constant), tensor)


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


def check_tensor(x: object, op: str) -> Tensor:
    """x, after checking that it is a tensor (of any dtype)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(x: Tensor, op: str) -> Tensor:
    """x detached, after checking that it is a floating-point tensor.

    The ops are not differentiable (rounding and pruning have zero gradient almost everywhere): they
    compute on x.detach() and return tensors that do not require grad, whether or not x does; a gradient
    through them is the caller's choice (e.g. a straight-through autograd.Function).
    """
    if not check_tensor(x, op).is_floating_point():
        raise TypeError(f"{op}: expected a floating-point tensor, got {x.dtype}")
    return x.detach()


@dataclass(frozen=True)
class FloatLayout:
    """Bit layout of the float type an op computes in (float32, or float64 for float64 inputs)."""

    float_dtype: torch.dtype
    int_dtype: torch.dtype
    man_bits: int
    exp_bias: int

    @property
    def exp_bits(self) -> int:
        return 8 if self.float_dtype == torch.float32 else 11

    @property
    def abs_mask(self) -> int:
        return (1 << (self.man_bits + self.exp_bits)) - 1

    def pow2_bits(self, exponent: Tensor) -> Tensor:
        """Bit patterns of the normal numbers 2^exponent (an integer tensor of `int_dtype`)."""
        return (exponent + self.exp_bias) << self.man_bits


FLOAT32 = FloatLayout(torch.float32, torch.int32, 23, 127)
FLOAT64 = FloatLayout(torch.float64, torch.int64, 52, 1023)


def compute_layout(dtype: torch.dtype) -> FloatLayout:
    """float64 computes in float64; every other float dtype converts exactly to float32."""
    return FLOAT64 if dtype == torch.float64 else FLOAT32


COMPILE_ENV = "GRADCOMP_COMPILE"


def compile_enabled() -> bool:
    """Whether CPU chunk functions run compiled: on unless GRADCOMP_COMPILE is 0 (read at every call)."""
    return os.environ.get(COMPILE_ENV, "1") not in ("", "0")


_TRACING = [False]  # CpuCompiledPerLayout is tracing a function to compile it


def compiling() -> bool:
    """Whether the code runs to be compiled (by dynamo, or traced by `CpuCompiledPerLayout`): branches on
    a tensor's values must then be branch-free."""
    return _TRACING[0] or torch.compiler.is_compiling()


class CpuCompiled:
    """A chunk function of an op's torch implementation that runs, on CPU tensors, as compiled by
    `torch.compile` (inductor's C++ code: one fused loop instead of a dozen passes over memory, which is what
    makes every-step compression cheap on CPUs). It is the same function: the eager call is its oracle and
    the fallback, used where GRADCOMP_COMPILE=0, for other devices and inside `count_work`.

    Each configuration of the arguments that are not tensors (a format, a flag; hashable) gets its own
    compiled copy of the function (a copy of its code: torch.compile caches by code object and falls back
    to eager code, silently, past a few variants of one), so that any number of formats in one process
    (the pipeline's arms, the benchmarks) each run compiled.

    A compiled call that fails is retried eagerly. If the eager call fails too, the inputs are at fault: its
    error is raised and compiling stays on. If it succeeds, the compiler is missing or cannot handle these
    argument dtypes: they run eagerly from then on (same results, slower), with one warning that says why,
    while other dtypes keep compiling.
    """

    def __init__(self, fn: Callable[..., Tensor]) -> None:
        self.fn = fn
        self.compiled: dict[tuple, Callable[..., Tensor]] = {}  # by configuration, at its first call
        self.eager_signatures: set[tuple[torch.dtype, ...]] = set()  # argument dtypes compiling failed for
        functools.update_wrapper(self, fn)

    def eager(self, first: Tensor, *args) -> bool:
        """Whether a call with these tensor arguments runs eagerly."""
        if first.device.type != "cpu" or not compile_enabled() or counting():
            return True
        return tuple(arg.dtype for arg in (first, *args) if isinstance(arg, Tensor)) in self.eager_signatures

    def __call__(self, first: Tensor, *args) -> Tensor:
        if self.eager(first, *args):
            return self.fn(first, *args)
        signature = tuple(arg.dtype for arg in (first, *args) if isinstance(arg, Tensor))
        try:
            return self._compiled_for(args, first)(first, *args)
        except Exception as error:  # classified by the eager retry below
            compile_error = error
        result = self.fn(first, *args)  # outside the handler: an error of the inputs is raised as it is
        self.eager_signatures.add(signature)
        warnings.warn(
            f"gradcomp: compiling {self.fn.__qualname__} for the CPU failed for arguments of dtypes "
            f"{[str(dtype) for dtype in signature]} ({type(compile_error).__name__}: {compile_error}); "
            f"they run eagerly (same results, slower). Set {COMPILE_ENV}=0 to skip compiling.",
            RuntimeWarning,
            stacklevel=2,
        )
        return result

    def _compiled_for(self, args: tuple, first: Tensor) -> Callable[..., Tensor]:
        """The compiled copy for the configuration of `args` (importing dynamo at the first call takes
        seconds)."""
        key = tuple(None if isinstance(arg, Tensor) else arg for arg in args)
        compiled = self.compiled.get(key)
        if compiled is None:
            fn = self.fn
            copy = types.FunctionType(
                fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
            )
            compiled = self.compiled[key] = torch.compile(copy, dynamic=True, fullgraph=True)
        return compiled


class CpuCompiledPerLayout(CpuCompiled):
    """A `CpuCompiled` chunk function compiled once per configuration and layout of its tensor arguments
    (shapes, strides, dtypes): traced to ATen operations (`make_fx`) and compiled by inductor for those
    static shapes, then called directly, with this class's dictionary as the only guard. A call costs a few
    microseconds where dynamo's guards over dynamic shapes took 40-300 (a training step quantizes every
    layer's gradient twice: the block formats), and the static shapes give inductor's best loops (with
    symbolic ones, a block's length was symbolic too). The price is a compile per new layout (about a
    second, seconds the first time; inductor caches them on disk): for ops called on a few shapes again
    and again. Past MAX_LAYOUTS layouts of one configuration, further ones run eagerly (same results)."""

    MAX_LAYOUTS = 64

    def __init__(self, fn: Callable[..., Tensor]) -> None:
        super().__init__(fn)
        self.layouts: dict[tuple, dict[tuple, Callable[..., Tensor]]] = {}  # by configuration, then layout

    def _compiled_for(self, args: tuple, first: Tensor) -> Callable[..., Tensor]:
        tensors = [arg for arg in (first, *args) if isinstance(arg, Tensor)]
        config = tuple(None if isinstance(arg, Tensor) else arg for arg in args)
        layout = tuple((t.shape, t.stride(), t.dtype) for t in tensors)
        compiled = self.layouts.setdefault(config, {})
        call = compiled.get(layout)
        if call is None and len(compiled) >= self.MAX_LAYOUTS:
            if len(compiled) == self.MAX_LAYOUTS:
                compiled[None] = self.fn  # type: ignore[index]  # warned once
                warnings.warn(
                    f"gradcomp: {self.fn.__qualname__} was compiled for {self.MAX_LAYOUTS} tensor layouts of "
                    "one configuration; further ones run eagerly (same results, slower)",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return self.fn
        if call is None:
            call = compiled[layout] = self._compile(first, args)
        return call

    def _compile(self, first: Tensor, args: tuple) -> Callable[..., Tensor]:
        """The function (returning a tensor, or a tuple of tensors and Nones) traced on these arguments and
        compiled for their tensors' layouts."""
        from torch.fx.experimental.proxy_tensor import make_fx

        full = [first, *args]
        where = [i for i, arg in enumerate(full) if isinstance(arg, Tensor)]
        returned: list[object] = []

        def traced(*tensors: Tensor) -> list[Tensor]:
            values = list(full)
            for i, tensor in zip(where, tensors, strict=True):
                values[i] = tensor
            out = self.fn(*values)
            returned.append(out)
            return [out] if isinstance(out, Tensor) else [value for value in out if value is not None]

        tensors = [full[i] for i in where]
        _TRACING[0] = True
        try:
            with torch.no_grad():
                graph = make_fx(traced)(*tensors)
        finally:
            _TRACING[0] = False
        kernel = torch._inductor.compile(graph, tensors)
        if isinstance(returned[0], Tensor):
            return lambda *arguments: kernel(*(arg for arg in arguments if isinstance(arg, Tensor)))[0]
        nones = [value is None for value in returned[0]]  # type: ignore[union-attr]

        def call(*arguments) -> tuple[Tensor | None, ...]:
            outputs = iter(kernel(*(arg for arg in arguments if isinstance(arg, Tensor))))
            return tuple(None if none else next(outputs) for none in nones)

        return call
