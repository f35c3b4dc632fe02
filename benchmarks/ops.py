"""Benchmark of the public ops, side by side with the baselines they replace, in one run.

CPU (vectorised torch path, 2^22 float32 elements): lognormal threshold + prune vs the kthvalue and sort
thresholds + prune; quantize_fp vs torch's float8 cast and qtorch's float_quantize (when installed:
`pip install -e .[bench]`); quantize_int per scheme; quantize_luq, nm_prune, quantize_block and
hadamard. CUDA (when present; 2^24 and 2^28 elements): per op the launches and host syncs of one call, the
host time (until the call returns) and the device time (its kernels' durations), and the fraction of a
device copy's bandwidth it reaches, with lognormal threshold + prune against the torch.topk threshold +
prune and quantize_fp against torch's float8 cast. Without a GPU and with TRITON_INTERPRET=1, the device
path's launches per call (no times). Prints Markdown tables; all figures are ratios measured in this run.

    python benchmarks/ops.py [--numel 4194304] [--repeats 11] [--device auto|cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from records import save

from gradcomp import (
    BlockFormat,
    hadamard,
    log_moments,
    lognormal_threshold,
    nm_prune,
    quantize_block,
    quantize_fp,
    quantize_int,
    quantize_luq,
    stochastic_prune,
    topk_threshold,
)
from gradcomp._backend import interpreter_enabled
from gradcomp.analysis.synthetic import signed_lognormal
from gradcomp.analysis.tables import to_markdown
from gradcomp.profiling import count_work

SPARSITY = 0.85


def _time_ms(fn: Callable[[], object], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def median_ms(*fns: Callable[[], object], repeats: int, device: str) -> list[float]:
    """Median times of several functions, run interleaved so that machine noise hits them alike."""
    for fn in fns:
        fn()  # warm-up (and compilation of kernels)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, samples in zip(fns, times, strict=True):
            samples.append(_time_ms(fn, device))
    return [statistics.median(samples) for samples in times]


def kthvalue_prune(x: torch.Tensor) -> torch.Tensor:
    """Baseline: the magnitude at the target quantile as threshold (selection), then the same pruning."""
    k = max(1, int(SPARSITY * x.numel()))
    return stochastic_prune(x, torch.kthvalue(x.abs().flatten(), k).values, seed=0)


def qtorch_quantizer():
    try:
        from qtorch.quant import float_quantize
    except Exception as error:  # a C++ extension built at import: any failure means "not available"
        return None, f"qtorch unavailable ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
    return float_quantize, None


def cpu_rows(numel: int, repeats: int) -> tuple[list[dict], list[str]]:
    x = signed_lognormal(numel, sigma=2.0, zero_fraction=0.3)  # ln|g| ~ N(-8, 2^2), 30% zeros
    # FP formats see the gradient after its per-layer power-of-two scale (median magnitude at 1)
    x_scaled = x * 2.0 ** round(8 / math.log(2))
    notes = []
    rows = []
    label = f"op (CPU, {numel} fp32)"

    def row(op: str, fn, baseline: str, baseline_fn, goal: str = "") -> None:
        if baseline_fn:
            ours, theirs = median_ms(fn, baseline_fn, repeats=repeats, device="cpu")
        else:
            (ours,), theirs = median_ms(fn, repeats=repeats, device="cpu"), float("nan")
        rows.append(
            {
                label: op,
                "ms": round(ours, 1),
                "baseline": baseline,
                "baseline ms": round(theirs, 1),
                "speed-up": round(theirs / ours, 2) if baseline_fn else "",
                "goal": goal,
            }
        )

    prune_ours = lambda: stochastic_prune(x, lognormal_threshold(x, SPARSITY), seed=0)  # noqa: E731
    row(
        "lognormal_threshold + stochastic_prune",
        prune_ours,
        "kthvalue threshold + prune",
        lambda: kthvalue_prune(x),
        ">= 2x (required)",
    )
    row(
        "lognormal_threshold + stochastic_prune",
        prune_ours,
        "topk_threshold (sort) + prune",
        lambda: stochastic_prune(x, topk_threshold(x, SPARSITY), seed=0),
    )
    row(
        "lognormal_threshold",
        lambda: lognormal_threshold(x, SPARSITY),
        "torch.kthvalue threshold",
        lambda: torch.kthvalue(x.abs(), int(SPARSITY * numel)),
    )
    cast = lambda: x_scaled.to(torch.float8_e5m2).float()  # noqa: E731
    row(
        "quantize_fp e5m2-inf nearest",
        lambda: quantize_fp(x_scaled, "e5m2-inf"),
        "x.to(float8_e5m2).float()",
        cast,
        ">= 0.2x (within 5x)",
    )
    row(
        "quantize_fp e4m3 nearest",
        lambda: quantize_fp(x_scaled, "e4m3"),
        "x.to(float8_e4m3fn).float()",
        lambda: x_scaled.to(torch.float8_e4m3fn).float(),
    )
    float_quantize, why = qtorch_quantizer()
    if float_quantize is None:
        notes.append(why)
    for rounding, goal in (("nearest", ""), ("stochastic", ">= 3x")):
        baseline = (lambda r=rounding: float_quantize(x_scaled, 4, 3, rounding=r)) if float_quantize else None
        row(
            f"quantize_fp e4m3 {rounding}",
            lambda r=rounding: quantize_fp(x_scaled, "e4m3", rounding=r, seed=0),
            f"qtorch float_quantize(4, 3, {rounding})",
            baseline,
            goal,
        )
    rows_2d = x.view(256, -1)
    for scheme in ("ptq", "psq", "bhq"):
        row(
            f"quantize_int 5-bit {scheme} (256 rows)",
            lambda s=scheme: quantize_int(rows_2d, 5, s, seed=0),
            "",
            None,
        )
    row("quantize_luq 4-bit", lambda: quantize_luq(x, seed=0), "", None)
    row("nm_prune 2:4 (last axis)", lambda: nm_prune(rows_2d, 2, 4, seed=0), "", None)
    mxfp4_stochastic = BlockFormat("e2m1fn", rounding="stochastic")
    row("quantize_block mxfp4 stochastic", lambda: quantize_block(x, mxfp4_stochastic, seed=0), "", None)
    row(
        "quantize_block mxfp4 + hadamard 32",
        lambda: quantize_block(x, BlockFormat("e2m1fn", hadamard=32), seed=0),
        "",
        None,
    )
    row("quantize_block nvfp4", lambda: quantize_block(x, BlockFormat("e2m1fn", 16, "e4m3fn")), "", None)
    row("hadamard 16", lambda: hadamard(x, 16, seed=0), "", None)
    return rows, notes


def _work(fn: Callable[[], object]):
    """Launches and syncs of one call (after a warm-up call)."""
    fn()
    with count_work() as work:
        fn()
    return work


def _device_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median device time of one call: the summed durations of its kernels (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    total_us = sum(event.self_device_time_total for event in prof.key_averages())
    return total_us / repeats / 1e3


def _host_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median time for the call to return on the host (the device works on asynchronously, unless the call
    waits for it: a host sync)."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(samples)


def _device_ops(x: torch.Tensor, backend: str = "auto") -> list[tuple[str, Callable[[], object], float, str]]:
    """(op, call, bytes it must move at least, baseline label): the rows of the device table."""
    x_scaled = x * 2.0 ** round(8 / math.log(2))  # as in cpu_rows
    alpha = lognormal_threshold(x, SPARSITY, backend)
    rows = x.view(256, -1)
    moved = 2 * x.numel() * x.element_size()  # read + write, as a copy
    read = moved / 2
    k = max(1, int((1 - SPARSITY) * x.numel()))
    # TetraJet-v2's copies: NVFP4 with an outer scale per 128, the transform, stochastic rounding
    tetrajet = BlockFormat("e2m1fn", 16, "e4m3fn", outer=128, rounding="stochastic", hadamard=16)

    def topk_prune() -> torch.Tensor:  # the exact magnitude at the target quantile by selection
        return stochastic_prune(x, torch.topk(x.abs().flatten(), k, sorted=False).values.min(), 0, backend)

    return [
        ("device copy", lambda: x.clone(), moved, ""),
        ("read-only pass (x.sum())", lambda: x.sum(), read, ""),
        ("stochastic_prune (tensor alpha)", lambda: stochastic_prune(x, alpha, 0, backend), moved, ""),
        ("log_moments", lambda: log_moments(x, backend), read, "read-only pass (x.sum())"),
        ("lognormal_threshold", lambda: lognormal_threshold(x, SPARSITY, backend), read, ""),
        (
            "lognormal_threshold + stochastic_prune",
            lambda: stochastic_prune(x, lognormal_threshold(x, SPARSITY, backend), 0, backend),
            moved + read,
            "topk threshold + prune",
        ),
        ("topk threshold + prune", topk_prune, moved + read, ""),
        (
            "quantize_fp e4m3 nearest",
            lambda: quantize_fp(x_scaled, "e4m3", backend=backend),
            moved,
            "float8_e4m3fn cast",
        ),
        (
            "quantize_fp e4m3 stochastic",
            lambda: quantize_fp(x_scaled, "e4m3", rounding="stochastic", seed=0, backend=backend),
            moved,
            "",
        ),
        ("float8_e4m3fn cast", lambda: x_scaled.to(torch.float8_e4m3fn).float(), moved, ""),
        ("quantize_int 5-bit ptq", lambda: quantize_int(rows, 5, "ptq", 0, backend), moved, ""),
        ("quantize_int 5-bit psq (256 rows)", lambda: quantize_int(rows, 5, "psq", 0, backend), moved, ""),
        ("quantize_int 5-bit bhq (256 rows)", lambda: quantize_int(rows, 5, "bhq", 0, backend), moved, ""),
        ("quantize_luq 4-bit", lambda: quantize_luq(x, seed=0, backend=backend), moved + read, ""),
        ("nm_prune 2:4", lambda: nm_prune(rows, 2, 4, seed=0, backend=backend), moved, ""),
        (
            "quantize_block mxfp8 nearest",
            lambda: quantize_block(x, BlockFormat("e4m3fn"), backend=backend),
            moved,
            "",
        ),
        (
            "quantize_block mxfp4 stochastic",
            lambda: quantize_block(x, BlockFormat("e2m1fn", rounding="stochastic"), seed=0, backend=backend),
            moved,
            "",
        ),
        (
            "quantize_block mxfp4 + hadamard 32",
            lambda: quantize_block(x, BlockFormat("e2m1fn", hadamard=32), seed=0, backend=backend),
            moved,
            "",
        ),
        (
            "quantize_block nvfp4",
            lambda: quantize_block(x, BlockFormat("e2m1fn", 16, "e4m3fn"), backend=backend),
            moved + read,
            "",
        ),
        (
            "quantize_block e2m1/16 ue5m3",
            lambda: quantize_block(x, BlockFormat("e2m1fn", 16, "e5m3fnu"), backend=backend),
            moved + read,
            "quantize_block nvfp4",
        ),
        (
            "quantize_block nvfp4 four over six",
            lambda: quantize_block(
                x, BlockFormat("e2m1fn", 16, "e4m3fn", rule="four_over_six"), backend=backend
            ),
            moved + read,
            "quantize_block nvfp4",
        ),
        (
            "quantize_block nvfp4 outer 128 + hadamard 16 stochastic",
            lambda: quantize_block(x, tetrajet, seed=0, backend=backend),
            moved,
            "",
        ),
        ("hadamard 16", lambda: hadamard(x, 16, seed=0, backend=backend), moved, ""),
    ]


def device_rows(numel: int, repeats: int) -> list[dict]:
    """On CUDA: each op's kernel launches and syncs per call, host and device time, and the fraction of a
    device copy's bandwidth its device time reaches (bytes it must move / device time, against the copy's;
    read-only ops against a read-only pass), with the baselines in the same run."""
    x = signed_lognormal(numel, sigma=2.0, zero_fraction=0.3).cuda()
    ops = _device_ops(x)
    device = {name: _device_ms(fn, repeats) for name, fn, _, _ in ops}
    rate = {"copy": ops[0][2] / device["device copy"], "read": ops[1][2] / device["read-only pass (x.sum())"]}
    rows = []
    for name, fn, moved, baseline in ops:
        work = _work(fn)
        reference = rate["read"] if moved == ops[1][2] else rate["copy"]
        rows.append(
            {
                f"op (CUDA, 2^{int(math.log2(numel))} fp32)": name,
                "launches": work.total_launches,
                "syncs": sum(work.syncs.values()),
                "host ms": round(_host_ms(fn, repeats), 3),
                "device ms": round(device[name], 3),
                "fraction of copy": round(moved / device[name] / reference, 2),
                "vs baseline": round(device[baseline] / device[name], 2) if baseline in device else "",
            }
        )
    return rows


def launch_rows(numel: int) -> list[dict]:
    """Without a GPU, under the Triton interpreter: the launches and syncs per call of each op's device path
    (its Triton kernels on CPU tensors), which is what a GPU would run; times are not measured."""
    x = signed_lognormal(numel, sigma=2.0, zero_fraction=0.3)
    rows = []
    for name, fn, _, _ in _device_ops(x, "triton"):
        work = _work(fn)
        rows.append(
            {
                "op (Triton path, interpreter)": name,
                "Triton launches": sum(work.launches.values()),
                "torch ops": sum(work.torch_ops.values()),
                "syncs": sum(work.syncs.values()),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--numel", type=int, default=1 << 22, help="CPU size; the device table uses 16x")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="the device table: CUDA when available (auto); cpu: launch counts of the Triton path under "
        "the interpreter (TRITON_INTERPRET=1), no times",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 3 repeats: checks that it runs")
    parser.add_argument(
        "--record", action="store_true", help="save the timed tables to benchmarks/records/ (see records.py)"
    )
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repeats = 1 << 16, 3
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    rows, notes = cpu_rows(args.numel, args.repeats)
    print(to_markdown(rows))
    for note in notes:
        print(f"note: {note}")
    settings = {"numel": args.numel, "repeats": args.repeats, "threads": torch.get_num_threads()}
    record = args.record and not args.quick
    if record:
        print(save("ops-cpu", rows, settings | {"torch": torch.__version__}))
    if device == "cpu":
        if not interpreter_enabled():
            print("\nno CUDA device: run with TRITON_INTERPRET=1 for the launch counts of the device path")
            return
        print("\nno CUDA device: launches per call of the device path (Triton interpreter), times unmeasured")
        print(to_markdown(launch_rows(1 << 16)))
        return
    print(f"\nCUDA: {torch.cuda.get_device_name()}")
    measured = []
    for log2_numel in (16,) if args.quick else (24, 28):
        table = device_rows(1 << log2_numel, args.repeats)
        print(to_markdown(table))
        measured += table
    if record:
        print(
            save("ops-cuda", measured, settings | {"torch": torch.__version__}, torch.cuda.get_device_name())
        )


if __name__ == "__main__":
    main()
