"""C4: the block recipes the field trains with (NVIDIA's NVFP4, TetraJet-v2, Quartet, Tseng et al., Four Over
Six, kept layers), side by side. Settings and registration; the compute and draw steps are in
gradcomp.analysis.recipes and gradcomp.plots.recipes."""

from __future__ import annotations

from dataclasses import dataclass

from gradcomp.experiments.base import (
    BLOCK_RUN,
    UNCOMPRESSED,
    CompareWithinModels,
    register,
)


@dataclass(frozen=True)
class Recipes(CompareWithinModels):
    """C4: each recipe's run against the uncompressed run of its model and scale, and every two recipes of
    one model against each other (paired by seed; accuracy differences within `margin` points count as
    none), with each run's measured and predicted noise ratio of its weight gradients (model-wide, mean over
    the noise steps it logged: noise_every with measure_noise)."""


register(
    id="C4",
    slug="recipes",
    stage="recipes",
    title="The block recipes the field trains with, side by side",
    params=Recipes,
    kinds={"baseline": UNCOMPRESSED, "runs": BLOCK_RUN},
)
