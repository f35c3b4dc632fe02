"""C1, C2: block-scaled gradient formats in training and against the lognormal theory. Settings and
registrations; the compute and draw steps are in gradcomp.analysis.blocks and gradcomp.plots.blocks."""

from __future__ import annotations

from dataclasses import dataclass

from gradcomp.experiments.base import (
    AcrossModels,
    CompareWithinModels,
    register,
)
from gradcomp.policies import Block, parse_policy


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
)


register(
    id="C2",
    slug="block_theory",
    stage="blocks",
    title="The lognormal theory of block scaling against the real gradients of each family",
    params=BlockTheory,
)
