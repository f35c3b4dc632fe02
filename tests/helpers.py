"""Helpers shared by the tests."""

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


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
