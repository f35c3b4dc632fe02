"""A4-A6, A10: low-bit floating-point gradients (the MSE theory, formats in training, scaling and the
exponent/mantissa split, the failure cases). Settings and registrations; the compute and draw steps are in
gradcomp.analysis.fp and gradcomp.plots.fp."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gradcomp.experiments.base import (
    ACCURACY_MARGIN,
    EXACT,
    FP_RUN,
    LOGNORMAL,
    NON_INFERIORITY,
    PILOT,
    UNCOMPRESSED,
    CompareWithinModels,
    Params,
    Plan,
    register,
)
from gradcomp.formats import parse_format

# A10's declared failure criterion: a run fails where more of its non-zero gradient values are predicted
# clipped, or flushed to zero, than these shares (L7 shows it beside the noise ratio)
MAX_CLIPPED, MAX_FLUSHED = 0.01, 0.99


@dataclass(frozen=True)
class FpTheory(Params):
    bits: tuple[int, ...] = (4, 5, 6, 8)
    kinds: tuple[Literal["ideal", "saturate", "inf", "fn"], ...] = ("ideal", "saturate", "inf", "fn")
    # named formats (parse_format names: the ml_dtypes / OCP dtypes, or e{E}m{M}-...) at their optimal scale
    formats: tuple[str, ...] = (
        "float8_e5m2",
        "float8_e4m3",
        "e4m3fn",
        "e4m3fnuz",
        "e5m2fnuz",
        "e3m2fn",
        "e2m3fn",
        "e2m1fn",
        "e8m0fnu",
    )
    sigmas: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)
    monte_carlo: int = 200_000  # samples of each Monte-Carlo check
    seeds: tuple[int, ...] = (0, 1, 2)  # one Monte-Carlo estimate per seed
    # the claim's FP4 format is predicted for the measured gradients' spread: sigma2 from here up
    gradient_sigma2: tuple[float, float] = (2.0, 4.0)

    def __post_init__(self) -> None:
        for name in self.formats:
            try:
                parse_format(name)
            except (TypeError, ValueError) as error:
                raise ValueError(f"formats: {error}") from None


@dataclass(frozen=True)
class Scaling(Params):
    """A6: per model (`baseline`: each model's uncompressed run) and format, one fixed global scale per run
    (`sweep`) and the other scaling rules (`rules`) against the per-layer mean rule of the same model and
    format; splits of one bit budget between exponent and mantissa (`splits`)."""

    baseline: str | tuple[str, ...]
    # per-layer and dynamic rules; each model and format's per-layer mean rule among them
    rules: tuple[str, ...]
    sweep: tuple[str, ...]  # fixed global scales
    splits: tuple[str, ...]  # the same bits split differently between exponent and mantissa
    margin: float = 1.0

    @property
    def baselines(self) -> tuple[str, ...]:
        return (self.baseline,) if isinstance(self.baseline, str) else tuple(self.baseline)

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([*self.baselines, *self.rules, *self.sweep, *self.splits]))


@dataclass(frozen=True)
class FailurePairs(Params):
    """A10: the lognormal theory's predictions from each model's measured gradients, next to trained
    outcomes: (failing run, fixing run) pairs and every other FP run in `arms`."""

    baselines: tuple[str, ...]  # each model's uncompressed probed run: its statistics and fp32 reference
    pairs: tuple[tuple[str, str], ...]
    arms: tuple[str, ...] = ()  # more FP runs whose prediction is set next to their outcome
    format: str = "e4m1"  # the format whose global-scale window is predicted for each model
    formats: tuple[str, ...] = ("e5m2", "e4m3", "e4m2", "e4m1", "e3m2", "e3m1", "e3m0", "e5m0")
    log2_scales: tuple[int, int] = (-16, 48)  # the global scales predicted, 2^a to 2^b
    # the predicted failure: more of the non-zero values clipped, or flushed to zero, than these shares
    max_clipped: float = MAX_CLIPPED
    max_flushed: float = MAX_FLUSHED
    # the thresholds tried for their sensitivity; the pair that agrees best on `fit_on`'s model (default:
    # the first baseline's) is then tested on the other models
    clipped_grid: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03, 0.1)
    flushed_grid: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)
    fit_on: str | None = None
    margin: float = 1.0  # accuracy points: a run within it of fp32 trains, one significantly below fails

    def __post_init__(self) -> None:
        if self.fit_on is not None and self.fit_on not in self.baselines:
            raise ValueError(f"fit_on: {self.fit_on!r} is not among baselines")

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        paired = [run for pair in self.pairs for run in pair]
        return list(dict.fromkeys([*self.baselines, *paired, *self.arms]))


register(
    id="A4",
    slug="fp_mse_theory",
    stage="fp",
    title="Quantization MSE of a lognormal in low-bit FP formats",
    params=FpTheory,
    claims={
        "L2": (
            LOGNORMAL,
            "At the optimal scale the FP quantization MSE of a lognormal depends on sigma only, the optimal "
            "number of exponent bits grows with sigma, and [1,3,0] is the predicted FP4 format (analysis; "
            "the authors' code table).",
            EXACT,
            "none: computed exactly",
            None,
            "FP MSE depends on sigma; [1,3,0] is FP4",
        )
    },
)


register(
    id="A5",
    slug="fp_formats",
    stage="fp",
    title="Accuracy with FP gradient formats and per-layer scaling",
    params=CompareWithinModels,
    claims={
        "L3": (
            LOGNORMAL,
            "FP6 gradients train without accuracy degradation, with per-layer scaling (abstract; ImageNet).",
            NON_INFERIORITY,
            ACCURACY_MARGIN,
            Plan(
                0.380,
                5,
                f"FP6 [1,4,1] vs fp32 at 8 epochs ({PILOT}: converged, seeds 8-13)",
                decided_in="converged",
                sensitivity=(
                    0.5,
                    "a stricter margin: the paper states no number ('without accuracy degradation')",
                ),
            ),
            "FP6 gradients lose no accuracy",
        )
    },
    kinds={"baseline": UNCOMPRESSED, "runs": FP_RUN},
)


register(
    id="A6",
    slug="scaling_and_split",
    stage="fp",
    title="Per-layer vs global loss scaling; exponent/mantissa split",
    params=Scaling,
    kinds={"baseline": UNCOMPRESSED, "rules": FP_RUN, "sweep": FP_RUN, "splits": FP_RUN},
)


register(
    id="A10",
    slug="failure_cases",
    stage="fp_failures",
    title="Where low-precision FP gradients fail, and the fix",
    params=FailurePairs,
    kinds={"baselines": UNCOMPRESSED, "pairs": FP_RUN, "arms": FP_RUN},
)
