"""B1-B4, X2: the statistical framework of fully quantized training (bin usage, variance against bits,
unbiasedness, accuracy; the range predictor). Settings and registrations; the compute and draw steps are in
gradcomp.analysis.statquant and gradcomp.plots.statquant."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gradcomp.experiments.base import (
    ACCURACY_MARGIN,
    EQUIVALENCE,
    EXACT_RUN,
    FQT_RUN,
    NON_INFERIORITY,
    PILOT,
    QAT_RUN,
    QUANTIZED_FORWARD,
    STATQUANT,
    SUPERIORITY,
    AtCheckpoint,
    Params,
    Plan,
    register,
)


@dataclass(frozen=True)
class BinUsage(AtCheckpoint):
    """B1. How many of the `bits`-bit codes each scheme uses on the output gradient of every quantized layer
    (its code entropy against PTQ's decides S1 on each); `layer` is the one shown in detail, and the only one
    whose quantization variance (`draws` stochastic draws per scheme) is measured."""

    bits: int = 8
    layer: str = "layer2.0.conv1"
    draws: int = 10  # stochastic draws of each scheme's variance on `layer`


@dataclass(frozen=True)
class VarianceVsBits(AtCheckpoint):
    """B2. `batches` x `draws` FQT gradients per (bits, scheme) give the quantization variance;
    `sampling_batches` QAT gradients (one pass each, far cheaper) give the unbiased minibatch sampling
    variance and its standard error; the first `batches` of them are the quantization draws' batches. A
    scheme's variance falls by 4 per bit where ln(its per-bit factor / 4) is within `per_bit_margin`."""

    bits: tuple[int, ...] = (4, 5, 6, 7, 8)
    batches: int = 4
    draws: int = 2
    sampling_batches: int = 16
    weight_bits: int | None = None  # None: the swept bits on the weight path too
    per_bit_margin: float = 0.25

    def __post_init__(self) -> None:
        if len(self.bits) < 2:
            raise ValueError("bits must name at least two bit widths (the per-bit factor is a slope)")
        if self.batches < 1 or self.draws < 1:
            raise ValueError(f"batches and draws must be at least 1, got {self.batches} and {self.draws}")
        if self.sampling_batches < 2:
            raise ValueError(
                f"sampling_batches must be at least 2 (the unbiased variance divides by B - 1), "
                f"got {self.sampling_batches}"
            )


@dataclass(frozen=True)
class Unbiasedness(AtCheckpoint):
    """B3; an unbiased quantizer's error falls with log-log slope -1/2 in the draws, within `slope_margin`."""

    bits: int = 4
    draws: int = 64
    slope_margin: float = 0.1


@dataclass(frozen=True)
class FqtAccuracy(Params):
    """B4: exact, QAT and FQT (int policy + the same forward quantization) runs; `claim`: the FQT run whose
    comparison with QAT decides the papers' claim, within `margin` points."""

    exact: str
    qat: str
    runs: tuple[str, ...]
    margin: float = 1.0
    claim: str | None = None

    def __post_init__(self) -> None:
        if self.claim is not None and self.claim not in self.runs:
            raise ValueError(f"claim: {self.claim!r} is not among runs")

    def named_runs(self, all_runs: Sequence[str]) -> list[str]:
        return list(dict.fromkeys([self.exact, self.qat, *self.runs]))


@dataclass(frozen=True)
class RangePredictor(AtCheckpoint):
    bits: int = 5
    draws: int = 4
    batches: int = 1


register(
    id="B1",
    slug="bin_usage",
    stage="statquant",
    title="Quantization bins used by PTQ, PSQ and BHQ on the neural gradient of every quantized layer",
    params=BinUsage,
    claims={
        "S1": (
            STATQUANT,
            "Per-tensor quantization (PTQ) wastes its range on neural gradients, whose samples have very "
            "different ranges; per-sample scales (PSQ, BHQ) use more of the bins (analysis).",
            SUPERIORITY,
            "none: the claim is an ordering",
            Plan(
                0.0963,
                2,
                "PSQ vs PTQ code entropy on layer2.0.conv1, the one layer the pilot measured (noisier of "
                f"its 2; {PILOT}: default, seeds 0-2)",
                4.44,
                "the pilot's smaller decided effect (PSQ, on that layer; no pilot measured every layer)",
            ),
            "per-sample scales use more bins than PTQ",
        )
    },
    kinds={"run": QUANTIZED_FORWARD},
)


register(
    id="B2",
    slug="variance_vs_bits",
    stage="statquant",
    title="Gradient quantization variance against bits: PTQ, PSQ, BHQ",
    params=VarianceVsBits,
    claims={
        "S2": (
            STATQUANT,
            "PSQ and BHQ have a lower gradient variance than PTQ (theorem).",
            SUPERIORITY,
            "none: the claim is an ordering",
            Plan(
                0.188,
                2,
                f"PSQ vs PTQ ln variance (noisier of 2 deciding) ({PILOT}: default, seeds 0-2)",
                -3.15,
                "the pilot's smaller decided effect (PSQ)",
            ),
            "PSQ and BHQ have lower variance than PTQ",
        ),
        "S3": (
            STATQUANT,
            "The quantization variance falls about 4x per extra gradient bit (variance bound "
            "N D R^2 / 4B^2).",
            EQUIVALENCE,
            "0.25 in ln of the per-bit factor: 4x within a factor 1.28, between 3.1x and 5.1x per bit",
            Plan(
                0.0315,
                2,
                f"PTQ's ln(per-bit factor / 4) (noisiest of 3 deciding) ({PILOT}: default, seeds 0-2)",
                0.0,
                "0: the claim is a factor of 4 per bit",
            ),
            "variance falls 4x per extra bit",
        ),
    },
    kinds={"run": QUANTIZED_FORWARD},
)


register(
    id="B3",
    slug="unbiasedness",
    stage="statquant",
    title="FQT gradients average to the QAT gradient",
    params=Unbiasedness,
    claims={
        "S4": (
            STATQUANT,
            "With unbiased gradient quantizers the FQT gradient is an unbiased estimator of the QAT gradient "
            "(theorem).",
            EQUIVALENCE,
            "0.1 in the log-log slope of the error against draws: an unbiased mean falls with slope -1/2, "
            "a bias flattens it",
            Plan(
                0.0355,
                5,
                f"PSQ's slope against -1/2 (noisiest of 3 deciding) ({PILOT}: default, seeds 0-5)",
                0.0,
                "0: an unbiased estimator's slope is -1/2",
            ),
            "FQT's gradient is unbiased for QAT's",
        )
    },
    kinds={"run": QUANTIZED_FORWARD},
)


register(
    id="B4",
    slug="accuracy_table",
    stage="statquant",
    title="Test accuracy: Exact, QAT and FQT with integer gradients",
    params=FqtAccuracy,
    claims={
        "S5": (
            STATQUANT,
            "5-bit BHQ gradients lose only about 0.5 % top-1 accuracy against QAT (abstract; ResNet-50 on "
            "ImageNet).",
            NON_INFERIORITY,
            ACCURACY_MARGIN,
            Plan(
                0.340,
                5,
                f"5-bit BHQ vs QAT at 8 epochs ({PILOT}: converged, seeds 8-13)",
                -0.5,
                "the paper's own loss: 'only about 0.5 %'",
                decided_in="converged",
                sensitivity=(0.5, "the paper's own number ('only about 0.5 %' lost)"),
            ),
            "5-bit BHQ loses only about 0.5 pt",
        )
    },
    kinds={"exact": EXACT_RUN, "qat": QAT_RUN, "runs": FQT_RUN},
)


register(
    id="X2",
    slug="range_sigma_predictor",
    stage="statquant",
    title="Spread of per-sample gradient ranges as a predictor of the PSQ and BHQ gains",
    params=RangePredictor,
    kinds={"run": QUANTIZED_FORWARD},
)
