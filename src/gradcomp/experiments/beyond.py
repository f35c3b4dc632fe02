"""X1, X3: every run's accuracy against its bits, and pruning chained with low-bit FP. Settings and
registrations; the compute and draw steps are in gradcomp.analysis.beyond and gradcomp.plots.beyond."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gradcomp.experiments.base import (
    ALL,
    COMPRESSED,
    UNCOMPRESSED,
    Compare,
    Params,
    register,
)


@dataclass(frozen=True)
class EveryRun(Params):
    """X1: every named run (`all`: every run of the config)."""

    runs: tuple[str, ...] | Literal["all"] = ALL
    baseline: str | None = None
    margin: float = 1.0

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        named = list(all_runs) if self.runs == ALL else list(self.runs)
        return list(dict.fromkeys([*([self.baseline] if self.baseline else []), *named]))


@dataclass(frozen=True)
class PruneWithFp(Compare):
    """X3: accuracies of prune, FP and prune-then-FP runs, and the mechanism behind them measured on
    synthetic signed lognormal gradients of `elements` entries per layer with each layer's (mu, sigma) as
    the FP-alone runs measured them (seeded by `seed`)."""

    elements: int = 2**18
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.elements < 1024:
            raise ValueError(f"elements must be at least 1024, got {self.elements}")


register(
    id="X1",
    slug="accuracy_vs_bits",
    stage="beyond",
    title="Accuracy vs bits per gradient element, every compressor",
    params=EveryRun,
    kinds={"baseline": UNCOMPRESSED},
)


register(
    id="X3",
    slug="prune_plus_fp",
    stage="beyond",
    title="Pruning and low-bit FP together",
    params=PruneWithFp,
    kinds={"baseline": UNCOMPRESSED, "runs": COMPRESSED},
)
