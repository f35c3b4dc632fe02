"""C3: the sequels' compressors (LUQ, MVUE N:M) next to stochastic pruning. Settings and registrations; the
compute and draw steps are in gradcomp.analysis.sequels and gradcomp.plots.sequels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gradcomp.experiments.base import (
    LUQ,
    MVUE,
    NON_INFERIORITY,
    PILOT,
    SEQUEL_RUN,
    SUPERIORITY,
    UNCOMPRESSED,
    CompareWithinModels,
    Plan,
    register,
)


@dataclass(frozen=True)
class Successors(CompareWithinModels):
    """C3: the sequels' compressors (LUQ, MVUE N:M) next to stochastic pruning: every arm's accuracy against
    the uncompressed run of its model and scale, and the variance each arm's policy adds, measured on each
    baseline's trained models (`seeds`; None: every seed) over `batches` test batches and `draws` draws,
    next to `gradcomp.theory.unbiased`'s prediction; the two agree where the ln of their ratio is within
    `theory_margin`. Single-sample LUQ decides claim Q1, non-inferior within `luq_margin` (accuracy points;
    the paper's own loss, 1.1)."""

    reads_checkpoints: ClassVar[bool] = True
    seeds: tuple[int, ...] | None = None
    batches: int = 2
    draws: int = 2
    theory_margin: float = 0.25
    luq_margin: float = 1.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batches < 1 or self.draws < 1:
            raise ValueError(f"batches and draws must be at least 1, got {self.batches} and {self.draws}")
        if not self.theory_margin > 0:
            raise ValueError(f"theory_margin must be positive, got {self.theory_margin}")


register(
    id="C3",
    slug="successors",
    stage="sequels",
    title="The sequels: LUQ and unbiased N:M gradient pruning against stochastic pruning",
    params=Successors,
    claims={
        "Q1": (
            LUQ,
            "Neural gradients in LUQ's 4-bit logarithmic format (stochastic underflow, unbiased rounding "
            "between powers of two) train with little accuracy loss: ResNet-50 on ImageNet with all GEMMs in "
            "4 bits loses 1.1 % top-1 (abstract).",
            NON_INFERIORITY,
            "the paper's own loss: 1.1 accuracy points",
            Plan(
                1.15,
                2,
                f"LUQ4 vs fp32 on ResNet18 at the full scale ({PILOT}: converged F1, seeds 8-10)",
                decided_in="converged",
            ),
            "LUQ's 4-bit gradients lose little accuracy",
        ),
        "Q2": (
            MVUE,
            "The minimum-variance unbiased N:M mask of the neural gradient (1:2, 2:4) has a lower variance "
            "than other unbiased N:M estimators (theorem).",
            SUPERIORITY,
            "none: the claim is an ordering",
            Plan(
                0.0292,
                2,
                f"MVUE 2:4 vs naive unbiased 2:4 ln variance ({PILOT}: default, seeds 0-2)",
                -2.15,
                "the pilot's decided effect (the same comparison)",
            ),
            "MVUE N:M has the lowest variance",
        ),
    },
    kinds={"baseline": UNCOMPRESSED, "runs": SEQUEL_RUN},
)
