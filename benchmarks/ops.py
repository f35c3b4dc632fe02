"""Benchmark of the public ops, side by side with the baselines they replace, in one run.

CPU (vectorised torch path, 2^22 float32 elements): lognormal threshold + prune vs the kthvalue and sort
thresholds + prune; quantize_fp vs torch's float8 cast and qtorch's float_quantize (when installed:
`pip install -e .[bench]`); quantize_int per scheme. CUDA (when present): every Triton kernel's bandwidth
against a device-to-device copy. Prints Markdown tables; all figures are ratios measured in this run.

    python benchmarks/ops.py [--numel 4194304] [--repeats 7]
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


def cuda_rows(numel: int, repeats: int) -> list[dict]:
    x = signed_lognormal(numel, sigma=2.0, zero_fraction=0.3).cuda()
    (copy_ms,) = median_ms(lambda: x.clone(), repeats=repeats, device="cuda")
    bytes_moved = 2 * x.numel() * x.element_size()
    alpha = lognormal_threshold(x, SPARSITY)
    ops = {
        "stochastic_prune": lambda: stochastic_prune(x, alpha, seed=0),
        "quantize_fp e4m3 nearest": lambda: quantize_fp(x, "e4m3"),
        "quantize_fp e4m3 stochastic": lambda: quantize_fp(x, "e4m3", rounding="stochastic", seed=0),
        "quantize_int 5-bit psq": lambda: quantize_int(x.view(256, -1), 5, "psq", seed=0),
        "log_moments (read only)": lambda: lognormal_threshold(x, SPARSITY),
    }
    rows = [
        {
            "op (CUDA)": "device copy",
            "ms": round(copy_ms, 3),
            "GB/s": round(bytes_moved / copy_ms / 1e6, 1),
            "fraction of copy": 1.0,
        }
    ]
    for name, fn in ops.items():
        (ms,) = median_ms(fn, repeats=repeats, device="cuda")
        moved = bytes_moved / 2 if name.startswith("log_moments") else bytes_moved
        rows.append(
            {
                "op (CUDA)": name,
                "ms": round(ms, 3),
                "GB/s": round(moved / ms / 1e6, 1),
                "fraction of copy": round(copy_ms / ms * moved / bytes_moved, 2),
            }
        )
    kth_ms = median_ms(lambda: kthvalue_prune(x), repeats, "cuda")
    ours_ms = median_ms(
        lambda: stochastic_prune(x, lognormal_threshold(x, SPARSITY), seed=0), repeats, "cuda"
    )
    rows.append(
        {
            "op (CUDA)": "lognormal threshold + prune vs kthvalue + prune",
            "ms": round(ours_ms, 3),
            "GB/s": "",
            "fraction of copy": f"speed-up {kth_ms / ours_ms:.1f}x",
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--numel", type=int, default=1 << 22)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    rows, notes = cpu_rows(args.numel, args.repeats)
    print(to_markdown(rows))
    for note in notes:
        print(f"note: {note}")
    if torch.cuda.is_available():
        print(f"\nCUDA: {torch.cuda.get_device_name()}")
        print(to_markdown(cuda_rows(args.numel * 16, args.repeats)))
    else:
        print("\nno CUDA device: Triton kernel bandwidths not measured")


if __name__ == "__main__":
    main()
