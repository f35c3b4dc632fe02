"""A7-A9: stochastic pruning with the lognormal threshold (calibration, accuracy against sparsity,
heterogeneous sparsity). Settings and registrations; the compute and draw steps are in
gradcomp.analysis.sparsity and gradcomp.plots.sparsity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gradcomp.experiments.base import (
    ACCURACY_MARGIN,
    DIFFERENCE,
    EQUIVALENCE,
    LOGNORMAL,
    NON_INFERIORITY,
    PILOT,
    PRUNE_RUN,
    SPARSITY_MARGIN,
    UNCOMPRESSED,
    CompareWithinModels,
    Params,
    Plan,
    register,
)


@dataclass(frozen=True)
class SyntheticSparsity(Params):
    numel: int = 262_144
    sigmas: tuple[float, ...] = (1.0, 2.0, 3.0)
    targets: tuple[float, ...] = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95)
    zero_fractions: tuple[float, ...] = (0.0, 0.3)
    seeds: tuple[int, ...] = (0, 1, 2)  # one synthetic draw per seed


@dataclass(frozen=True)
class Calibration(Params):
    """A7: target vs achieved sparsity, on synthetic lognormal gradients and in training runs (of one model
    or several, each pruned at its own compression points); an achieved sparsity within `margin` of its
    target is on target; `claim` names the lognormal runs that decide the papers' claim."""

    runs: tuple[str, ...]
    synthetic: SyntheticSparsity = SyntheticSparsity()
    margin: float = 0.01
    claim: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        outside = sorted(set(self.claim) - set(self.runs))
        if outside:
            raise ValueError(f"claim: {outside} are not among runs")

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(self.runs)


@dataclass(frozen=True)
class Heterogeneous(Params):
    """A9: the cosine-constrained run next to homogeneous runs."""

    constrained: str
    homogeneous: tuple[str, ...]
    margin: float = 1.0

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([self.constrained, *self.homogeneous]))


register(
    id="A7",
    slug="target_vs_achieved_sparsity",
    stage="sparsity",
    title="Target vs achieved gradient sparsity for each threshold estimator",
    params=Calibration,
    claims={
        "L4": (
            LOGNORMAL,
            "The lognormal threshold sets the gradient sparsity level accurately: achieved equals target "
            "(abstract).",
            EQUIVALENCE,
            SPARSITY_MARGIN,
            Plan(
                0.00123,
                2,
                "prune 0.85 analytic vs its attainable sparsity on DeiT (noisiest of 3 deciding; on 4x4 "
                f"patches, the default's DeiT then) ({PILOT}: default, seeds 0-2)",
                0.0,
                "0: the claim is that achieved equals target",
            ),
            "the lognormal threshold hits the target sparsity",
        ),
        "L5": (
            LOGNORMAL,
            "Gaussian and Laplace priors (Ye et al. 2019) mispredict the sparsity a threshold reaches on "
            "neural gradients (abstract: such priors fail for them).",
            DIFFERENCE,
            SPARSITY_MARGIN,
            Plan(
                0.00206,
                2,
                "the Gaussian prior's achieved vs attainable sparsity (noisier of 2 deciding) "
                f"({PILOT}: default, seeds 0-2)",
                0.0331,
                "the pilot's smaller decided effect (the Laplace prior)",
            ),
            "Gaussian and Laplace priors miss the sparsity",
        ),
    },
    kinds={"runs": PRUNE_RUN},
)


register(
    id="A8",
    slug="accuracy_vs_sparsity",
    stage="sparsity",
    title="Accuracy vs gradient sparsity",
    params=CompareWithinModels,
    claims={
        "L6": (
            LOGNORMAL,
            "Up to 85 % gradient sparsity on ResNet18 without accuracy loss (abstract; ImageNet).",
            NON_INFERIORITY,
            ACCURACY_MARGIN,
            Plan(
                0.401,
                5,
                f"prune 0.85 vs fp32 at 8 epochs ({PILOT}: converged, seeds 8-13)",
                decided_in="converged",
                sensitivity=(0.5, "a stricter margin: the paper states no number ('without accuracy loss')"),
            ),
            "85 % gradient sparsity loses no accuracy",
        )
    },
    kinds={"baseline": UNCOMPRESSED, "runs": PRUNE_RUN},
)


register(
    id="A9",
    slug="heterogeneous_sparsity",
    stage="sparsity",
    title="Heterogeneous sparsity with a cosine-similarity constraint",
    params=Heterogeneous,
    kinds={"constrained": PRUNE_RUN, "homogeneous": PRUNE_RUN},
)
