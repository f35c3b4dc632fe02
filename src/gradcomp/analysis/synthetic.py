"""Checks of the ops on synthetic lognormal gradients, where the truth is known."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gradcomp.analysis.seeds import FRACTION, PerSeed
from gradcomp.experiments import SyntheticSparsity
from gradcomp.ops import (
    gaussian_threshold,
    laplace_threshold,
    lognormal_threshold,
    stochastic_prune,
    topk_threshold,
)

ESTIMATORS: dict[str, Callable[[Tensor, float], Tensor]] = {
    "lognormal": lognormal_threshold,
    "gaussian": gaussian_threshold,
    "laplace": laplace_threshold,
    "topk": topk_threshold,
}


def signed_lognormal(
    numel: int, sigma: float, zero_fraction: float = 0.0, mu: float = -8.0, seed: int = 0
) -> Tensor:
    """g = +-exp(N(mu, sigma^2)) with a fraction of exact zeros (as ReLU leaves them), float32."""
    generator = torch.Generator().manual_seed(seed)
    magnitude = torch.exp(mu + sigma * torch.randn(numel, generator=generator, dtype=torch.float64))
    sign = torch.where(torch.rand(numel, generator=generator) < 0.5, -1.0, 1.0)
    values = (sign * magnitude).float()
    values[torch.rand(numel, generator=generator) < zero_fraction] = 0.0
    return values


def synthetic_sparsity(settings: SyntheticSparsity) -> list[dict]:
    """Target vs achieved fraction of zeros after stochastic pruning of synthetic lognormal gradients, for
    every threshold estimator, over the settings' seeds (one synthetic draw each)."""
    achieved = PerSeed(("sigma", "zero_fraction", "estimator", "target"), {"achieved": FRACTION})
    for seed in settings.seeds:
        for sigma in settings.sigmas:
            for zero_fraction in settings.zero_fractions:
                g = signed_lognormal(settings.numel, sigma, zero_fraction, seed=seed)
                for target in settings.targets:
                    for name, estimator in ESTIMATORS.items():
                        pruned = stochastic_prune(g, estimator(g, target), seed=seed + 1)
                        key = {
                            "sigma": sigma,
                            "zero_fraction": zero_fraction,
                            "estimator": name,
                            "target": target,
                        }
                        achieved.add(seed, key, achieved=float((pruned == 0).double().mean()))
    return achieved.rows()
