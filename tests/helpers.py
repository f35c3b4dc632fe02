"""Helpers shared by the tests."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"

# A training run small enough for a test: 160 images in batches of 32, five steps per epoch
TINY = {
    "dataset": "synthetic",
    "model": "resnet10t",
    "batch_size": 32,
    "epochs": 2,
    "lr": 0.05,
    "progress": False,
    "log_every": 2,
    "subset_per_class": 16,
    "test_subset_per_class": 8,
}


def train_run(folder: Path, name: str, **overrides) -> tuple[dict, Path]:
    """Train `TINY` (with `overrides`) into folder/name; returns its summary and folder."""
    from gradcomp.training.config import resolve_config
    from gradcomp.training.train import train

    config = resolve_config(**{**TINY, "out": str(folder / name), **overrides})
    return train(config), folder / name


def read_metrics(run_dir: Path, times: bool = True) -> list[dict]:
    """The lines of a run's metrics.jsonl (without their wall times where `times` is False)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return lines if times else [{k: v for k, v in line.items() if k != "wall_seconds"} for line in lines]


def free_ports(count: int) -> list[int]:
    """Ports free on the loopback interface right now (for process groups of the tests)."""
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def default_config() -> dict:
    """The embedded default pipeline configuration, as a fresh dict."""
    return yaml.safe_load((ROOT / "config" / "default.yaml").read_text())


def run_snakemake(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    """snakemake of this environment, with its bin folder first on PATH (the jobs' python)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return subprocess.run(
        [str(SNAKEMAKE), *args], cwd=cwd, capture_output=True, text=True, env=env, check=False
    )


def pins(lines) -> dict[str, str]:
    """name -> version of the `name==version` lines of a requirements list."""
    found = {}
    for line in lines:
        line = line.split("#")[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s]+)", line)
        if match:
            found[match[1].lower()] = match[2]
    return found


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (distinguishes -0.0 from 0.0 and compares NaN payload positions)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(int_type).cpu(), b.contiguous().view(int_type).cpu())


def lognormal_gradient(shape, sigma: float = 2.0, mu: float = -6.0, seed: int = 0, specials: bool = True):
    """Signed lognormal values plus zeros, +-0, NaN and +-Inf at the start (if `specials`)."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.exp(mu + sigma * torch.randn(shape, generator=generator))
    values *= torch.where(torch.rand(shape, generator=generator) < 0.5, -1.0, 1.0)
    if specials:
        flat = values.view(-1)
        specials_list = [0.0, -0.0, float("nan"), float("inf"), float("-inf")]
        flat[: len(specials_list)] = torch.tensor(specials_list)[: flat.numel()]
    return values


def kernel_can_hold(values: torch.Tensor) -> torch.Tensor:
    """Where the kernels see `values` as they are: the Triton interpreter's bfloat16 conversions flush
    subnormals (compiled kernels do not)."""
    from gradcomp._backend import interpreter_enabled

    if values.dtype != torch.bfloat16 or not interpreter_enabled():
        return torch.ones_like(values, dtype=torch.bool)
    return (values.double().abs() >= 2.0**-126) | (values == 0)


def ml_dtype(name: str):
    """The ml_dtypes type `name`, or a skip that says why: older ml_dtypes lack some (float8_e5m3fnu)."""
    import ml_dtypes
    import pytest

    found = getattr(ml_dtypes, name, None)
    if found is None:
        pytest.skip(
            f"ml_dtypes {ml_dtypes.__version__} has no {name}; these tests need ml_dtypes 0.7 or newer"
        )
    return found


def ml_dtypes_version() -> tuple[int, ...]:
    import ml_dtypes

    return tuple(int(part) for part in ml_dtypes.__version__.split(".")[:2])


def kernel_property(max_examples: int):
    """Hypothesis settings for a sweep that runs the kernels: the same examples every run (derandomized, no
    example database), no deadline (the interpreter is slow), and the constant `kernel_device` fixture
    shared between generated inputs."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


def hooks_and_wrappers(model: torch.nn.Module) -> dict:
    """Every hook and wrapper attach could leave on a model: each module's hook dicts and an instance
    forward, each parameter's gradient hooks, as (name, kind) -> the ids of what is registered."""
    found = {}
    for name, module in model.named_modules():
        for kind, value in vars(module).items():
            if kind.startswith("_") and kind.endswith("hooks") and isinstance(value, dict):
                found[name, kind] = tuple((key, id(hook)) for key, hook in value.items())
        found[name, "forward"] = id(vars(module).get("forward"))
    for name, parameter in model.named_parameters():
        for kind in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            hooks = getattr(parameter, kind, None) or {}
            found[name, kind] = tuple((key, id(hook)) for key, hook in hooks.items())
    return found
