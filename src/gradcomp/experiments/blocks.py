"""C1, C2, C5: block-scaled gradient formats in training and against the lognormal theory, and the scale
formats and block sizes of FP4 All the Way's comparison. Settings and registrations; the compute and draw
steps are in gradcomp.analysis.blocks and gradcomp.plots.blocks."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradcomp.choices import BLOCK_SCALES
from gradcomp.experiments.base import (
    FP_OR_BLOCK_RUN,
    UNCOMPRESSED,
    AcrossModels,
    CompareWithinModels,
    register,
)
from gradcomp.formats.block import BlockFormat
from gradcomp.training.policies import Block, parse_policy


@dataclass(frozen=True)
class BlockTheory(AcrossModels):
    """C2: on the trained models of `run` and the other families (`models`), the neural gradient of every
    compressed layer (`batches` test batches, eval mode, the seeds named) in each block format of `formats`
    (policy strings: presets such as mxfp4, or block:...; nearest rounding, blocks along the output features)
    with and without the Hadamard transform of `hadamard` elements, and with one scale per layer (the element
    format at the least predicted MSE): measured flushed and clipped shares and relative MSE next to
    `gradcomp.theory.block`'s; the theory agrees where the ln of the measured over the predicted MSE is within
    `theory_margin`. The correlated block model (a level per block, a spread within it) is compared with the
    iid one by how much closer its prediction comes."""

    formats: tuple[str, ...] = ("mxfp8", "mxfp6", "mxfp4", "nvfp4")
    hadamard: int = 16
    batches: int = 1
    theory_margin: float = 0.25

    def __post_init__(self) -> None:
        for spec in self.formats:
            policy = parse_policy(spec)
            if not isinstance(policy, Block):
                raise ValueError(f"formats: {spec!r} is not a block format (e.g. mxfp4, block:...)")
            if self.hadamard and policy.format.block_size % self.hadamard:
                raise ValueError(f"hadamard: {self.hadamard} does not divide the blocks of {spec!r}")
        if self.hadamard and self.hadamard & (self.hadamard - 1):
            raise ValueError(f"hadamard must be 0 or a power of two, got {self.hadamard}")
        if self.batches < 1 or not self.theory_margin > 0:
            raise ValueError("batches must be at least 1 and theory_margin positive")


register(
    id="C1",
    slug="block_formats",
    stage="blocks",
    title="Block-scaled gradient formats in training, next to per-layer FP formats",
    params=CompareWithinModels,
    kinds={"baseline": UNCOMPRESSED, "runs": FP_OR_BLOCK_RUN},
)


register(
    id="C2",
    slug="block_theory",
    stage="blocks",
    title="The lognormal theory of block scaling against the real gradients of each family",
    params=BlockTheory,
)


@dataclass(frozen=True)
class ScaleFormats(AcrossModels):
    """C5: on the trained models of `run` and the other families (`models`), every compressed layer's
    neural gradient (`batches` test batches, eval mode) with `element` elements in blocks of each size of
    `blocks` under each scale format of `scales` (two-level formats: torchao's rule; nearest rounding, no
    transform, blocks along the output features): the measured relative MSE, and the iid and correlated
    block models' predictions. Whether the theory ranks the arms (per seed, Spearman's correlation of the
    predicted with the measured MSE over the arms above `correlation_margin`), and FP4 All the Way's
    ordering (figures 1-2: E4M3 and E3M4 scales best and about equal, E8M0 worse; smaller blocks better,
    the gain fading below 16) on these gradients, each difference of ln MSE decided against `margin`."""

    element: str = "e2m1fn"
    scales: tuple[str, ...] = BLOCK_SCALES
    blocks: tuple[int, ...] = (8, 16, 32, 64, 128)
    batches: int = 1
    margin: float = math.log(1.25)
    correlation_margin: float = 0.5

    def __post_init__(self) -> None:
        for scale in self.scales:
            for block in self.blocks:
                BlockFormat(self.element, block, scale)  # a clear error for any bad combination
        missing = [need for need in ("e8m0fnu", "e4m3fn") if need not in self.scales]
        if missing or 16 not in self.blocks or 32 not in self.blocks:
            raise ValueError(
                "scales must include e8m0fnu and e4m3fn and blocks 16 and 32 (FP4 All the Way's "
                f"comparisons); got scales {self.scales}, blocks {self.blocks}"
            )
        if self.batches < 1 or not self.margin > 0 or not 0 <= self.correlation_margin < 1:
            raise ValueError("batches must be at least 1, margin positive, correlation_margin in [0, 1)")


register(
    id="C5",
    slug="scale_formats",
    stage="blocks",
    title="Scale formats and block sizes: the theory's ranking against the real gradients, and FP4 All the "
    "Way's ordering",
    params=ScaleFormats,
)
