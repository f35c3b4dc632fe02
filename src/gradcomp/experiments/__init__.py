"""The experiments, by ID: what each one reads, its typed settings, and where its two steps live.

An experiment is one registration here plus two functions named after its slug: a compute step in
``gradcomp.analysis.<stage>`` (finished runs -> a `Result`: tables aggregated over seeds, paired comparisons
with their verdicts, findings, the papers' claims it decides and a caption generated from the settings and the
data) and a draw step in ``gradcomp.plots.<stage>`` (that `Result` -> a figure, and nothing else). The papers'
verified claims are registered with the experiment that decides them (`CLAIMS`). One module per stage
(``gradcomp.experiments.<stage>``) holds its experiments' settings and registrations; `base` what they share.
Each experiment's settings are a frozen dataclass built from its section of a pipeline config: unknown keys
and wrong types are errors that name the key; the margins of its equivalence tests and the runs deciding its
claim are settings too. Runs are read with every seed the config trains them with (accuracy comparisons are
paired by seed); experiments that measure gradients at a trained checkpoint read the seeds their `seeds`
setting names (default: every seed of the run).

This module imports neither torch nor matplotlib: the Snakemake workflow parses it.
"""

from __future__ import annotations

from gradcomp.experiments.base import (
    ACCURACY_MARGIN,
    ALL,
    CLAIMS,
    COMPUTED,
    DRAWN,
    EXPERIMENTS,
    SPARSITY_MARGIN,
    AcrossModels,
    AtCheckpoint,
    Claim,
    Compare,
    CompareWithinModels,
    Experiment,
    Params,
    register,
)
from gradcomp.experiments.beyond import EveryRun, PruneWithFp
from gradcomp.experiments.blocks import BlockTheory, ScaleFormats
from gradcomp.experiments.convergence import Budgets
from gradcomp.experiments.distributions import GoodnessOfFit
from gradcomp.experiments.failure import LateSwitch, NoiseRatios, Stalls
from gradcomp.experiments.fp import FailurePairs, FpTheory, Scaling
from gradcomp.experiments.recipes import Recipes
from gradcomp.experiments.sequels import Successors
from gradcomp.experiments.sparsity import Calibration, Heterogeneous, SyntheticSparsity
from gradcomp.experiments.statquant import BinUsage, FqtAccuracy, RangePredictor, Unbiasedness, VarianceVsBits


def _by_id(item: tuple[str, object]) -> tuple[str, int]:
    """A1, A2, ..., A10, B1, ...: the letter, then the number."""
    return item[0][0], int(item[0][1:])


def experiments() -> dict[str, Experiment]:
    """The registry, sorted by ID (A1, A2, ..., A10, B1, ..., X4)."""
    return dict(sorted(EXPERIMENTS.items(), key=_by_id))


# the claims in the papers' order (the lognormal paper's, the framework's, the sequels', the FP4 recipes'),
# whichever stage
# registered them first
_ORDER = "LSQF"
_claims = sorted(CLAIMS.items(), key=lambda item: (_ORDER.index(item[0][0]), _by_id(item)[1]))
CLAIMS.clear()
CLAIMS.update(_claims)


__all__ = [
    "ACCURACY_MARGIN",
    "ALL",
    "CLAIMS",
    "COMPUTED",
    "DRAWN",
    "EXPERIMENTS",
    "SPARSITY_MARGIN",
    "AcrossModels",
    "AtCheckpoint",
    "BinUsage",
    "BlockTheory",
    "Budgets",
    "Calibration",
    "Claim",
    "Compare",
    "CompareWithinModels",
    "EveryRun",
    "Experiment",
    "FailurePairs",
    "FpTheory",
    "FqtAccuracy",
    "GoodnessOfFit",
    "Heterogeneous",
    "LateSwitch",
    "NoiseRatios",
    "Params",
    "PruneWithFp",
    "RangePredictor",
    "Recipes",
    "ScaleFormats",
    "Scaling",
    "Stalls",
    "Successors",
    "SyntheticSparsity",
    "Unbiasedness",
    "VarianceVsBits",
    "experiments",
    "register",
]
