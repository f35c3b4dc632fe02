"""The Triton kernels as a GPU sees them. Each takes at most a few constexprs (a format as named tuples and
a rule's code). Each compiles for a GPU, here, without one: the interpreter runs a kernel's Python and can
accept what Triton's compiler refuses (a constexpr named twice in an unrolled loop, a global that is not a
constexpr). The launches of every public op (formats, rules, transforms, a 16-bit dtype) are recorded under
the interpreter, then a fresh process without it compiles each distinct one for an H100 (sm_90) through PTX
to a cubin with Triton's own compiler and ptxas, and checks that a kernel launched without fused
multiply-add contraction has no fused multiply-add of floats in its PTX (its bits would differ from the
torch path's)."""

import ast
import importlib
import inspect
import os
import pickle
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.runtime.jit
from helpers import lognormal_gradient
from test_launch_budget import _ops

import gradcomp.kernels
from gradcomp import BlockFormat, hadamard, nm_prune, quantize_block, quantize_fp, quantize_luq

KERNELS = Path(gradcomp.kernels.__file__).parent
MAX_CONSTEXPRS = 20  # a kernel sees a format as a few values (named tuples, a rule's code), not as flags

BLOCK_FORMATS = [
    BlockFormat("e4m3fn"),
    BlockFormat("e2m1fn", rule="three_quarters"),
    BlockFormat("e2m1fn", rounding="stochastic", hadamard=32),
    BlockFormat("e2m1fn", 16, "e4m3fn"),
    BlockFormat("e2m1fn", 16, "e4m3fn", "reciprocal", outer=0, hadamard=16, signs=False),
    BlockFormat("e2m1fn", 16, "e5m3fnu", "ceil", outer=128, rounding="stochastic"),
    BlockFormat("e2m1fn", 16, "e4m3fn", "te", rounding="stochastic", hadamard=16),
    BlockFormat("e2m1fn", 16, "e4m3fn", "four_over_six", hadamard=16),
]


def _launches(monkeypatch) -> list[tuple]:
    """(module, kernel, signature, constexprs, options) of every launch of the ops below."""
    recorded = []

    def record(kernel, grid, *args, **kwargs):
        names = list(inspect.signature(kernel.fn).parameters)
        constexprs = {key: value for key, value in kwargs.items() if key in names}
        options = {key: value for key, value in kwargs.items() if key not in names}
        signature = {
            name: triton.runtime.jit.mangle_type(arg) for name, arg in zip(names, args, strict=False)
        }  # args: the first
        signature.update(dict.fromkeys(constexprs, "constexpr"))
        recorded.append((kernel.fn.__module__, kernel.fn.__name__, signature, constexprs, options))
        real(kernel, grid, *args, **kwargs)

    for module in pkgutil.iter_modules(gradcomp.kernels.__path__):
        module = importlib.import_module(f"gradcomp.kernels.{module.name}")
        if hasattr(module, "launch"):
            real = module.launch
            monkeypatch.setattr(module, "launch", record)
    x = lognormal_gradient(64 * 96, sigma=2.0, specials=False)
    mask = (torch.arange(x.numel()) % 3 != 0).float()
    for _, call, _ in _ops(x, mask, torch.zeros((), dtype=torch.int64)):
        call()
    rows = x.reshape(64, -1)
    quantize_luq(x, 4, 2, seed=1, backend="triton")
    nm_prune(rows, 2, 4, seed=1, backend="triton")
    hadamard(rows, 32, seed=1, backend="triton")
    for fmt in BLOCK_FORMATS:
        quantize_block(
            rows, fmt, seed=1, backend="triton", count_zeros_into=torch.zeros(1, dtype=torch.int64)
        )
    half = rows.bfloat16()  # the loads and stores of a 16-bit dtype
    quantize_fp(half, "e4m3", 4.0, "stochastic", 1, backend="triton")
    quantize_block(half, BLOCK_FORMATS[2], seed=1, backend="triton")
    return recorded


COMPILE = """
import pickle, sys
import importlib
import triton
from triton.backends.compiler import GPUTarget

failures = []
for module, name, signature, constexprs, options in pickle.load(open(sys.argv[1], "rb")):
    kernel = getattr(importlib.import_module(module), name)
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    except Exception as error:
        while error.__cause__ is not None:  # the compiler's own message, below the call sites
            error = error.__cause__
        lines = [line for line in str(error).splitlines() if line.strip() and set(line.strip()) != {"^"}]
        failures.append(f"{name} {constexprs}: {' | '.join(lines[-2:])}")
        continue
    if not options.get("enable_fp_fusion", True) and "fma.rn.f32" in compiled.asm["ptx"]:
        failures.append(f"{name} {constexprs}: a fused multiply-add in its PTX")
print("\\n".join(failures))
"""


def test_each_kernel_takes_a_few_constexprs():
    counts = {}
    for path in KERNELS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel"):
                annotations = [ast.unparse(a.annotation) for a in node.args.args if a.annotation is not None]
                counts[f"{path.stem}.{node.name}"] = annotations.count("tl.constexpr")
    assert len(counts) >= 14 and counts["block._block_kernel"] > 0, counts
    assert max(counts.values()) <= MAX_CONSTEXPRS, counts


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="records the launches under the Triton interpreter"
)
def test_every_kernel_compiles_for_a_gpu_without_fused_multiply_adds(monkeypatch, tmp_path):
    launches = {pickle.dumps(launch): launch for launch in _launches(monkeypatch)}
    kernels = {launch[1] for launch in launches.values()}
    assert len(kernels) >= 12, sorted(kernels)  # every kernel module's
    (tmp_path / "launches.pkl").write_bytes(pickle.dumps(list(launches.values())))
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", COMPILE, str(tmp_path / "launches.pkl")],
        env={**env, "TRITON_CACHE_DIR": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not result.stdout.strip(), result.stdout
