"""A1-A3: the distribution of neural gradients (histograms, goodness of fit, statistics over training).
Settings and registrations; the compute and draw steps are in gradcomp.analysis.distributions and
gradcomp.plots.distributions."""

from __future__ import annotations

from dataclasses import dataclass

from gradcomp.experiments.base import (
    LOGNORMAL,
    PILOT,
    SUPERIORITY,
    AcrossModels,
    Plan,
    register,
)


@dataclass(frozen=True)
class GoodnessOfFit(AcrossModels):
    """A2: the families fitted to |g|; the claim holds where the lognormal fits better than each of the
    `light_tailed` families on every model."""

    distributions: tuple[str, ...] = (
        "lognormal",
        "halfnormal",
        "exponential",
        "weibull",
        "loglaplace",
        "loglogistic",
    )
    light_tailed: tuple[str, ...] = ("halfnormal", "exponential")

    def __post_init__(self) -> None:
        missing = sorted(set(self.light_tailed) - set(self.distributions))
        if "lognormal" not in self.distributions or missing:
            raise ValueError(f"distributions must hold lognormal and every light_tailed family {missing}")


register(
    id="A1",
    slug="gradient_histograms",
    stage="distributions",
    title="Neural gradients are near-lognormal",
    params=AcrossModels,
)


register(
    id="A2",
    slug="goodness_of_fit",
    stage="distributions",
    title="Goodness of fit: |g| against lognormal and alternatives",
    params=GoodnessOfFit,
    claims={
        "L1": (
            LOGNORMAL,
            "Neural-gradient magnitudes are heavy-tailed and near-lognormal: a lognormal fits them better "
            "than light-tailed (Gaussian, Laplace) models (abstract; Kolmogorov-Smirnov tests).",
            SUPERIORITY,
            "none: the claim is an ordering of fits (any consistent difference in the KS statistic)",
            Plan(
                0.0218,
                2,
                "lognormal vs exponential on DeiT (noisiest of 8 deciding; on 4x4 patches, the default's "
                f"DeiT then) ({PILOT}: default, seeds 0-2)",
                -0.273,
                "the pilot's smallest decided effect (the same comparison)",
            ),
            "gradient magnitudes are near-lognormal",
        )
    },
)


register(
    id="A3",
    slug="statistics_over_training",
    stage="distributions",
    title="Per-layer mu and sigma of log2|g| over training",
    params=AcrossModels,
)
