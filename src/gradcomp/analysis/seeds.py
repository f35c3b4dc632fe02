"""Numbers over seeds: estimates with their spread, and paired comparisons with a verdict.

A number that comes from training is reported as the mean over seeds with its sample standard deviation,
a 95 % confidence interval (Student t) and the number of seeds. Two arms are compared on the seeds they
share, paired by seed (the same seed means the same initialisation and data order): a paired t-test of the
per-seed differences and its 95 % interval. The verdict is "significant" when p < 0.05 (the interval
excludes 0) and "within noise" otherwise. Each comparison is tested on its own; the Holm adjustment of the
p-values of one experiment's comparisons together is reported next to it (and in every significant
statement), since among k comparisons of arms that do not differ about 0.05 k come out significant by
chance. With 3 seeds a paired t-test has 2 degrees of freedom, so only differences several times the
seed-to-seed spread of the difference are found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

ALPHA = 0.05
SIGNIFICANT, WITHIN_NOISE, UNTESTED = "significant", "within noise", "untested (fewer than 2 seeds)"


@dataclass(frozen=True)
class Estimate:
    """Mean over seeds, sample standard deviation, 95 % confidence interval of the mean, seed count."""

    mean: float
    sd: float
    ci_low: float
    ci_high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Estimate:
        data = np.asarray([value for value in values if value is not None], dtype=np.float64)
        n = int(data.size)
        if n == 0:
            return cls(math.nan, math.nan, math.nan, math.nan, 0)
        mean = float(data.mean())
        if n < 2:
            return cls(mean, math.nan, math.nan, math.nan, 1)
        sd = float(data.std(ddof=1))
        half = float(stats.t.ppf(1 - ALPHA / 2, n - 1)) * sd / math.sqrt(n)
        return cls(mean, sd, mean - half, mean + half, n)

    def columns(self, name: str) -> dict[str, float]:
        """Table columns <name>_mean, <name>_sd, <name>_ci_low, <name>_ci_high (the seed count apart)."""
        return {f"{name}_{key}": value for key, value in asdict(self).items() if key != "n"}


@dataclass(frozen=True)
class Comparison:
    """Arm a against arm b on their shared seeds: mean and 95 % interval of a - b (times `scale`, in
    `unit`), the paired t-test's p-value, its Holm adjustment over the experiment's comparisons (of which
    there are `tests`), and the verdict."""

    a: str
    b: str
    seeds: int
    difference: float
    ci_low: float
    ci_high: float
    p: float
    p_holm: float
    tests: int
    verdict: str
    unit: str

    @property
    def statement(self) -> str:
        """e.g. "FP6 [1,4,1] vs fp32: -0.40 pt, within noise (±1.21 pt, 3 seeds)"."""
        if self.verdict == UNTESTED:
            return f"{self.a} vs {self.b}: {self.difference:+.3g} {self.unit}, {self.verdict}"
        half = (self.ci_high - self.ci_low) / 2
        if self.verdict == SIGNIFICANT:
            detail = f"significant (95 % CI [{self.ci_low:+.3g}, {self.ci_high:+.3g}] {self.unit}, "
            detail += f"p = {self.p:.2g}; {self.p_holm:.2g} after Holm over {self.tests}; {self.seeds} seeds)"
        else:
            detail = f"within noise (±{half:.3g} {self.unit}, {self.seeds} seeds)"
        return f"{self.a} vs {self.b}: {self.difference:+.3g} {self.unit}, {detail}"

    def row(self) -> dict:
        return {**asdict(self), "statement": self.statement}


Arm = tuple[str, Mapping[int, float]]  # (label, value per seed)


def compare(pairs: Sequence[tuple[Arm, Arm]], scale: float = 100.0, unit: str = "pt") -> list[Comparison]:
    """Paired comparisons a - b of every (a, b) pair of arms, Holm-adjusted together."""
    tests = [_paired(a, b, scale) for a, b in pairs]
    adjusted = holm([p for _, _, _, _, p in tests])
    count = sum(not math.isnan(p) for _, _, _, _, p in tests)
    comparisons = []
    for ((label_a, _), (label_b, _)), (n, mean, low, high, p), p_holm in zip(
        pairs, tests, adjusted, strict=True
    ):
        verdict = UNTESTED if n < 2 else SIGNIFICANT if p < ALPHA else WITHIN_NOISE
        comparisons.append(Comparison(label_a, label_b, n, mean, low, high, p, p_holm, count, verdict, unit))
    return comparisons


def _paired(a: Arm, b: Arm, scale: float) -> tuple[int, float, float, float, float]:
    """(seeds, mean, ci_low, ci_high, p) of the per-seed differences a - b."""
    shared = sorted(set(a[1]) & set(b[1]))
    differences = np.asarray([(a[1][seed] - b[1][seed]) * scale for seed in shared], dtype=np.float64)
    estimate = Estimate.of(differences)
    if estimate.n < 2:
        return estimate.n, estimate.mean, math.nan, math.nan, math.nan
    if estimate.sd == 0:  # identical differences on every seed: no spread to test against
        p = 1.0 if estimate.mean == 0 else 0.0
    else:
        p = float(stats.ttest_1samp(differences, 0.0).pvalue)
    return estimate.n, estimate.mean, estimate.ci_low, estimate.ci_high, p


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN and does not count as a test)."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, index) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[index] = running
    return adjusted
