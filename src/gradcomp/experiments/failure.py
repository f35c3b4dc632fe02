"""F0: predicting when compressed gradients stall training, from the noise ratio of each layer's weight
gradient (FP4 All the Way, section 4). Settings and registrations; the compute and draw steps are in
gradcomp.analysis.failure and gradcomp.plots.failure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradcomp.experiments.base import AcrossModels, register
from gradcomp.policies import Chain, parse_policy


@dataclass(frozen=True)
class NoiseRatios(AcrossModels):
    """F0: on the trained models of `run` and the other families (`models`; eval mode, `batches` test
    batches, the seeds named), every convolution and linear layer's noise ratio R = ||g_W|| / ||noise in
    g_W|| under each policy of `policies` (policy strings), measured (the weight-gradient GEMMs) and
    predicted without a GEMM in two ways (`gradcomp.noise_monitor`: "theory", the lognormal theory's error;
    "carried", the error the compression made on the neural gradient), both carried through the input
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
