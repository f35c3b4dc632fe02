"""Benchmark of the public ops, side by side with the baselines they replace, in one run.

CPU (vectorised torch path, 2^22 float32 elements): lognormal threshold + prune vs the kthvalue and sort
thresholds + prune; quantize_fp vs torch's float8 cast and qtorch's float_quantize (when installed:
`pip install -e .[bench]`); quantize_int per scheme. CUDA (when present, 16x the elements): every Triton
kernel's bandwidth against a device-to-device copy, and lognormal threshold + prune and quantize_fp against
the kthvalue threshold and torch's float8 casts on the GPU. Prints Markdown tables; all figures are ratios
measured in this run.

    python benchmarks/ops.py [--numel 4194304] [--repeats 11] [--device auto|cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch

from gradcomp import lognormal_threshold, quantize_fp, quantize_int, stochastic_prune, topk_threshold
from gradcomp.analysis.synthetic import signed_lognormal
from gradcomp.analysis.tables import to_markdown

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
    return rows, notes


def device_rows(numel: int, repeats: int, device: str) -> list[dict]:
    """On `device` (CUDA: the Triton kernels): each op's bandwidth against a device-to-device copy, and its
    time against the baseline it replaces (kthvalue threshold + prune, torch's float8 casts)."""
    x = signed_lognormal(numel, sigma=2.0, zero_fraction=0.3).to(device)
    x_scaled = x * 2.0 ** round(8 / math.log(2))  # as in cpu_rows
    alpha = lognormal_threshold(x, SPARSITY)
    (copy_ms,) = median_ms(lambda: x.clone(), repeats=repeats, device=device)
    copy_bytes = 2 * x.numel() * x.element_size()
    label = f"op ({device}, {numel} fp32)"
    rows = [
        {
            label: "device copy",
            "ms": round(copy_ms, 3),
            "GB/s": round(copy_bytes / copy_ms / 1e6, 1),
            "fraction of copy": 1.0,
            "baseline": "",
            "baseline ms": "",
            "speed-up": "",
        }
    ]
    # (op, fn, bytes moved, baseline, baseline fn)
    ops = [
        ("stochastic_prune", lambda: stochastic_prune(x, alpha, seed=0), copy_bytes, "", None),
        (
            "lognormal_threshold + stochastic_prune",
            lambda: stochastic_prune(x, lognormal_threshold(x, SPARSITY), seed=0),
            1.5 * copy_bytes,
            "kthvalue threshold + prune",
            lambda: kthvalue_prune(x),
        ),
        ("log_moments (read only)", lambda: lognormal_threshold(x, SPARSITY), copy_bytes / 2, "", None),
        (
            "quantize_fp e5m2-inf nearest",
            lambda: quantize_fp(x_scaled, "e5m2-inf"),
            copy_bytes,
            "x.to(float8_e5m2).float()",
            lambda: x_scaled.to(torch.float8_e5m2).float(),
        ),
        (
            "quantize_fp e4m3 nearest",
            lambda: quantize_fp(x_scaled, "e4m3"),
            copy_bytes,
            "x.to(float8_e4m3fn).float()",
            lambda: x_scaled.to(torch.float8_e4m3fn).float(),
        ),
        (
            "quantize_fp e4m3 stochastic",
            lambda: quantize_fp(x_scaled, "e4m3", rounding="stochastic", seed=0),
            copy_bytes,
            "",
            None,
        ),
        (
            "quantize_int 5-bit psq",
            lambda: quantize_int(x.view(256, -1), 5, "psq", seed=0),
            copy_bytes,
            "",
            None,
        ),
    ]
    for name, fn, moved, baseline, baseline_fn in ops:
        fns = (fn, baseline_fn) if baseline_fn else (fn,)
        ms, *baseline_ms = median_ms(*fns, repeats=repeats, device=device)
        rows.append(
            {
                label: name,
                "ms": round(ms, 3),
                "GB/s": round(moved / ms / 1e6, 1),
                "fraction of copy": round(copy_ms / ms * moved / copy_bytes, 2),
                "baseline": baseline,
                "baseline ms": round(baseline_ms[0], 3) if baseline_ms else "",
                "speed-up": round(baseline_ms[0] / ms, 2) if baseline_ms else "",
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
        help="where the bandwidth table runs: CUDA when available (auto), or forced (cpu: a dry run)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 3 repeats: checks that it runs")
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repeats = 1 << 16, 3
    device = ("cuda" if torch.cuda.is_available() else None) if args.device == "auto" else args.device
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    rows, notes = cpu_rows(args.numel, args.repeats)
    print(to_markdown(rows))
    for note in notes:
        print(f"note: {note}")
    if device is None:
        print("\nno CUDA device: Triton kernel bandwidths not measured")
        return
    if device == "cuda":
        print(f"\nCUDA: {torch.cuda.get_device_name()}")
    print(to_markdown(device_rows(args.numel * (1 if args.quick else 16), args.repeats, device)))


if __name__ == "__main__":
    main()
