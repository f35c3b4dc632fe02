"""F0-F2: predicting when compressed gradients stall training, from the noise ratio of each layer's weight
gradient (FP4 All the Way, section 4), and acting on it (section 5; NVIDIA's NVFP4 report, appendix D).
Settings and registrations; the compute and draw steps are in gradcomp.analysis.failure and
gradcomp.plots.failure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gradcomp.experiments.base import (
    ACCURACY_MARGIN,
    COMPRESSED,
    EQUIVALENCE,
    LOGNORMAL,
    NON_INFERIORITY,
    PILOT,
    SUPERIORITY,
    UNCOMPRESSED,
    AcrossModels,
    CompareWithinModels,
    Params,
    Plan,
    register,
)
from gradcomp.experiments.fp import MAX_CLIPPED, MAX_FLUSHED
from gradcomp.training.policies import Chain, parse_policy


@dataclass(frozen=True)
class NoiseRatios(AcrossModels):
    """F0: on the trained models of `run` and the other families (`models`; eval mode, `batches` test
    batches, the seeds named), every convolution and linear layer's noise ratio R = ||g_W|| / ||noise in
    g_W|| under each policy of `policies` (policy strings), measured (the weight-gradient GEMMs) and
    predicted without a GEMM in two ways (`gradcomp.training.noise_monitor`: "theory", the lognormal theory's
    error; "carried", the error the compression made on the neural gradient), both carried through the input
    patches' energy. A prediction holds where the ln of the predicted over the measured R, model-wide, is
    within `margin` (default ln 2: a factor of 2 in R moves a layer across the whole band of FP4 All the
    Way's quadratic check, from tracking full precision at sigma_crit/2 to stalling at 2 sigma_crit)."""

    policies: tuple[str, ...] = (
        "prune:sparsity=0.9",
        "fp:format=e4m1",
        "fp:format=e2m1",
        "int:bits=4,weight_scheme=same",
        "mxfp4",
        "luq",
        "nm:n=2,m=4",
    )
    batches: int = 1
    margin: float = math.log(2.0)

    def __post_init__(self) -> None:
        for spec in self.policies:
            if isinstance(parse_policy(spec), Chain):
                raise ValueError(f"policies: {spec!r} is a chain, which has no predicted error")
        if self.batches < 1 or not self.margin > 0:
            raise ValueError("batches must be at least 1 and margin positive")


register(
    id="F0",
    slug="noise_ratios",
    stage="failure",
    title="The noise ratio of each layer's weight gradient, predicted without a GEMM against measured",
    params=NoiseRatios,
)


FP4_ALL_THE_WAY = "Chmiel, Fishman, Banner, Soudry, NeurIPS 2025 (FP4 All the Way)"
NVIDIA_NVFP4 = "NVIDIA, arXiv 2509.25149 (NVFP4 pretraining)"


@dataclass(frozen=True)
class Stalls(CompareWithinModels):
    """F1 and L7: every run of `runs` logs its layers' noise ratios (noise_every, measure_noise) and its
    training loss; each is compared with the uncompressed run of its model (`baseline`). A run spends the
    share of its noise steps whose model-wide R is below `threshold` (FP4 All the Way's sqrt(3)); it departs
    from fp32 at the first logged step from which its training loss exceeds fp32's (same seed) by more than
    `departure` (relative) to the end. F1: per seed, the Spearman correlation over the runs between the
    accuracy loss and the share of time with the measured R below the threshold, above
    `correlation_margin`. L7: the share of time with the R the lognormal theory predicts below the
    threshold that best tells failing runs (worse than fp32 beyond `margin`) from training ones on
    `fit_on`'s runs, then applied to the other models' runs: those it predicts to train lose less than those
    it predicts to fail, beyond `margin`. Runs whose measured R is 1 by construction (a gradient flushed or
    clipped nearly whole) decide neither; L7 needs `min_held_out` informative held-out runs on at least two
    other families, and is shown beside A10's flush/clip criterion (`flush_clip`: the largest clipped and
    flushed shares of a run that trains) on the same runs; F1 is also shown at the thresholds of
    `sensitivity`."""

    fit_on: str = "resnet18"
    threshold: float = math.sqrt(3.0)
    correlation_margin: float = 0.5
    departure: float = 0.1
    sensitivity: tuple[float, ...] = (1.2, 1.5, 2.0, 2.5, 3.0)  # F1 also shown at these thresholds
    min_held_out: int = 6  # L7 needs this many informative held-out FP runs, on at least 2 other families
    flush_clip: tuple[float, float] = (MAX_CLIPPED, MAX_FLUSHED)  # A10's criterion, shown beside L7's

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.threshold > 0 and 0 <= self.correlation_margin < 1 and self.departure > 0):
            raise ValueError("threshold and departure must be positive, correlation_margin in [0, 1)")


@dataclass(frozen=True)
class LateSwitch(Params):
    """F2: one format trained `throughout`, with the precision guard (`guarded`: fp32 from where a layer's
    predicted R stays below sqrt(3)) and with a fixed late switch of the whole backward pass to fp32
    (`late`), against fp32 (`baseline`), all of one model and scale; accuracy differences within `margin`
    points count as none. F2 is in its regime where the format's measured R first falls below sqrt(3) after
    `late_from` of training (else it is recorded as not tested there); F3 compares the share of the gap to
    fp32 the late switch recovers with none, within `fraction_margin`."""

    baseline: str
    throughout: str
    guarded: str
    late: str
    margin: float = 1.0
    late_from: float = 0.5  # F2's regime: the format's measured R crosses sqrt(3) after this share of steps
    fraction_margin: float = 0.2  # F3: a share of the gap recovered within this counts as none

    def __post_init__(self) -> None:
        if not (self.margin > 0 and 0 < self.late_from < 1 and 0 < self.fraction_margin < 1):
            raise ValueError(
                f"margin must be positive, late_from and fraction_margin in (0, 1), got {self.margin}, "
                f"{self.late_from}, {self.fraction_margin}"
            )

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return [self.baseline, self.throughout, self.guarded, self.late]


register(
    id="F1",
    slug="stalls",
    stage="failure",
    title="Does a noise ratio below sqrt(3) predict where compressed training stalls?",
    params=Stalls,
    claims={
        "F1": (
            FP4_ALL_THE_WAY,
            "Quantized training stalls once the gradient's noise ratio ||grad L|| / (sigma_q sqrt(d)) falls "
            "below sqrt(3) (section 4, appendix B.1): the accuracy lost grows with the time spent below it.",
            SUPERIORITY,
            "a rank correlation above 0.5: the criterion must order most runs to serve as a guard, not "
            "merely correlate",
            Plan(
                0.0446,
                2,
                f"the per-seed Spearman rho at the short scale ({PILOT}: default, seeds 0-2)",
                0.83,
                "the pilot's decided effect (the same comparison)",
            ),
            "time below sqrt(3) ranks the accuracy lost",
        ),
        "L7": (
            LOGNORMAL,
            "The lognormal model explains the workloads where low-precision FP gradients fail: too few "
            "exponent bits for sigma, or one scale for layers with different mu (v1 abstract); tested as "
            "the noise ratio its fit predicts, fixed on one model and applied to the others.",
            SUPERIORITY,
            "a run fails when it is worse than fp32 of its model beyond the accuracy margin",
            Plan(
                1.88,
                2,
                "held-out runs predicted to train vs those predicted to fail at the short scale, the runs "
                f"whose R is 1 by construction left out ({PILOT}: default, seeds 0-2)",
                5.0,
                "5 pt: a failing run loses 5 pt more than a training one, the least separation that explains "
                "failures (the pilot's effect without trivial runs, -1.8 pt, lies on the wrong side)",
            ),
            "the lognormal noise ratio explains FP failures",
        ),
    },
    kinds={"baseline": UNCOMPRESSED, "runs": COMPRESSED},
)


register(
    id="F2",
    slug="late_switch",
    stage="failure",
    title="Switching the backward pass to fp32 late, or where the guard says, against one format throughout",
    params=LateSwitch,
    claims={
        "F2": (
            FP4_ALL_THE_WAY,
            "Switching the backward pass to high precision late in training closes the gap to full "
            "precision (section 5, quantization-aware finetuning).",
            NON_INFERIORITY,
            ACCURACY_MARGIN,
            Plan(
                0.813,
                5,
                f"FP4 [1,3,0] switched late vs fp32 at the full scale ({PILOT}: converged, seeds 8-13)",
                decided_in="failure",
            ),
            "a late switch to fp32 closes the gap",
        ),
        "F3": (
            NVIDIA_NVFP4,
            "Switching only the backward pass to high precision late in training recovers nothing of the "
            "gap (appendix D, in contrast to FP4 All the Way).",
            EQUIVALENCE,
            "0.2 of the gap to fp32, as the share the late switch recovers: the paper states none; a fifth "
            "is the least a user would call a partial recovery (FP4 All the Way's finetuning claims it all)",
            Plan(
                0.05,
                5,
                "the late switch's share of the gap at the full scale, from the pilot's paired sds (0.165 pt "
                f"of recovery over a 3.38 pt gap; {PILOT}: converged, seeds 8-13)",
                0.0,
                "0: the claim is that the switch recovers nothing",
                decided_in="failure",
            ),
            "a late switch recovers nothing",
        ),
    },
    kinds={"baseline": UNCOMPRESSED, "throughout": COMPRESSED, "guarded": COMPRESSED, "late": COMPRESSED},
)
