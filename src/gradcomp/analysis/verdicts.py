"""Paired comparisons across seeds and their verdicts: the one place where a difference becomes a finding.

Two arms are compared on the seeds they share, paired by seed (the same seed is the same initialisation,
data order and random bits), through the per-seed differences a - b. Each comparison gets exactly one
verdict:

* *equivalent within +-m*: both one-sided tests (TOST) reject a difference beyond the margin m at level
  0.05, i.e. the 90 % interval lies inside (-m, m); m is declared in the experiment's settings (the smallest
  difference that matters);
* *better* / *worse*: the difference lies beyond the margin: the paired t-test of |difference| > m (two-sided
  form, so that without adjustment it is the 95 % interval lying entirely beyond +m or -m; against 0 where no
  margin is declared) stays below 0.05 after the Holm adjustment over all the comparisons of the experiment
  (which side is better is each comparison's own; a quantity against its target, e.g. achieved against
  target sparsity, is worse on either side). A difference inside the margin is never *worse*, so more seeds
  never turn a true effect's verdict around (one rule, monotone in evidence);
* *inconclusive*: neither; the 95 % interval is stated (with "consistently higher/lower" where it excludes 0
  but not the margin) with how many seeds would decide it, given the observed paired sd and taking the
  observed difference d as the true one: where |d| is inside the margin, the seeds that give the TOST 80 %
  power to show it within +-m; otherwise the seeds that give the test beyond the margin (or against 0) 80 %
  power at 0.05 divided by the number of tests (Holm's first step, so the adjustment is accounted for).
  Where that count is not above the seeds used (the estimate sits at the decision's edge), it says "more
  than" the seeds used.

Every comparison also reports the sign consistency (on how many of its seeds the difference has the sign of
its mean) and the minimum detectable effect (the true difference the paired t-test at 0.05, unadjusted,
would find with 80 % power, given the seeds and the observed paired sd). The 95 % interval of a difference of
bounded quantities (e.g. accuracies) is intersected with the differences they allow, which keeps its
coverage.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np
from scipy import optimize, stats

from gradcomp.analysis.seeds import ALPHA, FRACTION, LINEAR, Bounds, Estimate, number

POWER = 0.8
MAX_SEEDS = 10_000  # beyond this, "seeds needed" reads "more than 10,000"
BETTER, WORSE, EQUIVALENT, INCONCLUSIVE = "better", "worse", "equivalent", "inconclusive"
VERDICTS = (BETTER, WORSE, EQUIVALENT, INCONCLUSIVE)


@dataclass(frozen=True)
class Pair:
    """One stated comparison: arm a against arm b (seed -> value each; b may be a constant, e.g. a target),
    its difference reported times `factor` in `unit`, with the equivalence margin (in `unit`; None: no
    equivalence claim), which side is better, the bounds of the compared quantity and the training scale the
    arms ran at (for tables and captions)."""

    a: str
    b: str
    a_values: Mapping[int, float]
    b_values: Mapping[int, float] | float
    unit: str = "pt"
    factor: float = 100.0
    margin: float | None = None
    higher_is_better: bool | None = True  # None: a target, missed on either side
    bounds: Bounds = FRACTION
    scale: str = ""

    def differences(self) -> np.ndarray:
        """a - b on every shared seed (in seed order), times `factor`."""
        if isinstance(self.b_values, Mapping):
            shared = sorted(set(self.a_values) & set(self.b_values))
            pairs = [(self.a_values[s], self.b_values[s]) for s in shared]
        else:
            pairs = [(self.a_values[s], self.b_values) for s in sorted(self.a_values)]
        # rounded far below any reported digit, so that equal arms differ by exactly 0
        return np.round(np.asarray([(a - b) * self.factor for a, b in pairs], dtype=np.float64), 9)

    @property
    def limits(self) -> tuple[float, float]:
        """The differences the bounds allow, in `unit`."""
        span = (self.bounds.high - self.bounds.low) * self.factor
        return (-span, span) if self.bounds.bounded else (-math.inf, math.inf)


@dataclass(frozen=True)
class Comparison:
    """A paired comparison a - b and its verdict (see the module docstring)."""

    a: str
    b: str
    seeds: int
    difference: float
    sd: float
    ci_low: float
    ci_high: float
    p: float
    p_holm: float
    tests: int
    margin: float | None
    p_tost: float | None
    agree: int  # seeds whose difference has the sign of the mean
    mde: float | None
    seeds_needed: int | None  # None: more than MAX_SEEDS, or nothing to decide
    verdict: str
    unit: str
    higher_is_better: bool | None
    scale: str

    @property
    def sign(self) -> str:
        """e.g. "3 of 3 seeds lower"."""
        side = "higher" if self.difference > 0 else "lower" if self.difference < 0 else "equal"
        return f"{self.agree} of {self.seeds} seeds {side}"

    @property
    def interval(self) -> str:
        if math.isnan(self.ci_low):
            return "no interval (1 seed)"
        return f"[{self.ci_low:+.3g}, {self.ci_high:+.3g}]"

    @property
    def decision(self) -> str:
        """The verdict in words: "equivalent within ±1 pt (90 % interval [-0.6, +0.4])", "worse (Holm p = 0.01
        over 5)", "inconclusive". An equivalence is decided by the TOST's 90 % interval, which it names: the
        95 % interval printed beside it may reach past the margin."""
        if self.verdict == EQUIVALENT:
            return f"{self.equivalence} ({self.tost_interval})"
        if self.verdict in (BETTER, WORSE):
            return f"{self.verdict} (Holm p = {self.p_holm:.2g} over {self.tests})"
        return INCONCLUSIVE

    @property
    def equivalence(self) -> str:
        return f"equivalent within ±{self.margin:g} {self.unit}".rstrip()

    @property
    def tost_interval(self) -> str:
        """The 90 % interval the TOST decides by (mean ± t(0.95) sd / sqrt(n)), e.g. "90 % interval [-0.6,
        +0.4]"."""
        if self.seeds < 2:
            return "one seed"
        half = stats.t.ppf(1 - ALPHA, self.seeds - 1) * self.sd / math.sqrt(self.seeds)
        return f"90 % interval [{self.difference - half:+.3g}, {self.difference + half:+.3g}]"

    @property
    def within_margin(self) -> bool:
        """Whether the observed difference lies inside the margin (so that equivalence could be shown)."""
        return self.margin is not None and abs(self.difference) < self.margin

    @property
    def needed(self) -> str:
        """What would decide an inconclusive comparison, in words."""
        if self.seeds < 2:
            return "a second seed would give an interval"
        if self.seeds_needed is None:
            return "more than 10,000 seeds would be needed to decide it"
        if self.seeds_needed <= self.seeds:
            return f"more than the {self.seeds} seeds used would decide it (it sits at the decision's edge)"
        if self.within_margin:
            return (
                f"about {self.seeds_needed} seeds would show it within ±{self.margin:g} {self.unit}".rstrip()
            )
        if self.margin is not None:
            return (
                f"about {self.seeds_needed} seeds would find a difference of this size beyond "
                f"±{self.margin:g} {self.unit}".rstrip()
            )
        return f"about {self.seeds_needed} seeds would find a difference of this size"

    @property
    def seen(self) -> str:
        """What an inconclusive interval shows: "consistently lower, " where it excludes 0, else ""."""
        if self.ci_low > 0 or self.ci_high < 0:
            return f"consistently {'higher' if self.ci_low > 0 else 'lower'}, not shown beyond the margin; "
        return ""

    @property
    def statement(self) -> str:
        """e.g. "FP6 [1,4,1] vs fp32: -0.4 pt [-1.1, +0.3] (8 of 8 seeds lower), equivalent within ±1 pt"."""
        unit = f" {self.unit}" if self.unit else ""
        text = f"{self.a} vs {self.b}: {self.difference:+.3g}{unit} {self.interval} ({self.sign})"
        if self.verdict == INCONCLUSIVE:
            mde = f"detectable: {number(self.mde)}{unit}; " if self.mde is not None else ""
            return f"{text}, inconclusive ({self.seen}{mde}{self.needed})"
        return f"{text}, {self.decision}"

    def row(self) -> dict:
        return {**asdict(self), "statement": self.statement}

    @classmethod
    def from_row(cls, row: Mapping) -> Comparison:
        """A comparison as `row` wrote it (JSON turns NaN into null)."""
        names = {f.name: f.type for f in fields(cls)}
        values = {key: row[key] for key in names}
        for key in ("difference", "sd", "ci_low", "ci_high", "p", "p_holm"):
            values[key] = math.nan if values[key] is None else values[key]
        return cls(**values)


def compare(pairs: Sequence[Pair]) -> list[Comparison]:
    """The comparisons of one experiment, Holm-adjusted together, each with its verdict."""
    tested = [_paired(pair) for pair in pairs]
    adjusted = holm([t["p"] for t in tested])
    count = sum(not math.isnan(t["p"]) for t in tested)
    comparisons = []
    for pair, t, p_holm in zip(pairs, tested, adjusted, strict=True):
        t["seeds_needed"] = _seeds_needed(pair, t, count)
        if t["p_tost"] is not None and t["p_tost"] < ALPHA:
            verdict = EQUIVALENT
        elif p_holm < ALPHA:
            better = pair.higher_is_better is not None and (t["difference"] > 0) == pair.higher_is_better
            verdict = BETTER if better else WORSE
        else:
            verdict = INCONCLUSIVE
        comparisons.append(
            Comparison(
                a=pair.a,
                b=pair.b,
                p_holm=p_holm,
                tests=count,
                margin=pair.margin,
                verdict=verdict,
                unit=pair.unit,
                higher_is_better=pair.higher_is_better,
                scale=pair.scale,
                **t,
            )
        )
    return comparisons


def _paired(pair: Pair) -> dict:
    """The paired t-test, TOST, sign consistency and power of the per-seed differences of `pair`."""
    differences = pair.differences()
    estimate = Estimate.of(differences)
    n, mean, sd = estimate.n, estimate.mean, estimate.sd
    agree = int(np.sum(np.sign(differences) == np.sign(mean))) if n else 0
    result = {
        "seeds": n,
        "difference": mean,
        "sd": sd,
        "ci_low": math.nan,
        "ci_high": math.nan,
        "p": math.nan,
        "p_tost": None,
        "agree": agree,
        "mde": None,
        "seeds_needed": None,
    }
    if n < 2:
        return result
    low, high = pair.limits
    result["ci_low"], result["ci_high"] = max(estimate.ci_low, low), min(estimate.ci_high, high)
    if sd == 0:  # the same difference on every seed: nothing to test it against
        result["p"] = 0.0 if abs(mean) > (pair.margin or 0.0) else 1.0
        if pair.margin is not None:
            result["p_tost"] = 0.0 if abs(mean) < pair.margin else 1.0
        result["mde"] = 0.0
        return result
    standard_error = sd / math.sqrt(n)
    margin = pair.margin or 0.0
    # beyond the margin on the observed side (two-sided form): against 0 without a margin
    result["p"] = float(min(1.0, 2 * stats.t.sf((abs(mean) - margin) / standard_error, n - 1)))
    result["mde"] = minimum_detectable_effect(n, sd)
    if pair.margin is not None:
        upper = stats.t.sf((mean + pair.margin) / standard_error, n - 1)  # H0: difference <= -m
        lower = stats.t.cdf((mean - pair.margin) / standard_error, n - 1)  # H0: difference >= +m
        result["p_tost"] = float(max(upper, lower))
    return result


def _seeds_needed(pair: Pair, t: Mapping, tests: int) -> int | None:
    """The seeds that would decide the comparison (see the module): None with fewer than 2 seeds, no spread,
    or nothing to find."""
    n, mean, sd = t["seeds"], t["difference"], t["sd"]
    if n < 2 or not sd > 0:
        return None
    margin = pair.margin or 0.0
    if pair.margin is not None and abs(mean) < margin:
        return seeds_for_equivalence(sd, margin, mean)
    if abs(mean) > margin:
        return seeds_for_difference(sd, abs(mean) - margin, ALPHA / max(tests, 1))
    return None


def summarise(comparisons: Sequence[Comparison]) -> str:
    """The comparisons in one sentence, grouped by verdict, e.g. "against fp32: equivalent within ±1 pt: FP8
    [1,5,2] (+0.2 pt [-0.4, +0.8]); worse: FP4 [1,3,0] (-17 pt [-25, -9]); inconclusive: FP5 [1,3,1] (-1.5
    pt [-4.1, +1.1]; about 21 seeds would decide it at ±1 pt)"."""
    references = {c.b for c in comparisons}
    common = next(iter(references)) if len(references) == 1 else None
    groups: dict[str, list[str]] = {}
    for c in comparisons:
        name = c.a if common else f"{c.a} vs {c.b}"
        unit = f" {c.unit}" if c.unit else ""
        detail = f"{c.difference:+.3g}{unit} {c.interval}"
        if c.verdict == INCONCLUSIVE:
            detail += f"; {c.needed}"
        groups.setdefault(c.equivalence if c.verdict == EQUIVALENT else c.verdict, []).append(
            f"{name} ({detail})"
        )
    parts = [f"{verdict}: {', '.join(items)}" for verdict, items in groups.items()]
    return (f"against {common}: " if common else "") + "; ".join(parts)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN and does not count as a test)."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, index) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[index] = running
    return adjusted


# --- power of the paired t-test and of the TOST ----------------------------------------------------------
def t_test_power(n: int, effect: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at `alpha` with n seeds for a true difference of `effect`
    paired sds (noncentral t)."""
    df, critical = n - 1, stats.t.ppf(1 - alpha / 2, n - 1)
    shift = effect * math.sqrt(n)
    beyond = np.nan_to_num(stats.nct.sf(critical, df, shift), nan=1.0)  # NaN only far in the tail
    below = np.nan_to_num(stats.nct.cdf(-critical, df, shift), nan=0.0)
    return float(beyond + below)


def tost_power(n: int, margin: float, difference: float = 0.0) -> float:
    """Power of the TOST at ALPHA with n seeds when the margin is `margin` and the true difference
    `difference`, both in paired sds (the usual approximation: each one-sided test's miss, noncentral t,
    counted apart)."""
    df, critical, root = n - 1, stats.t.ppf(1 - ALPHA, n - 1), math.sqrt(n)
    miss_low = np.nan_to_num(stats.nct.cdf(critical, df, (margin + difference) * root), nan=0.0)
    miss_high = np.nan_to_num(stats.nct.cdf(critical, df, (margin - difference) * root), nan=0.0)
    return max(0.0, float(1 - miss_low - miss_high))


@functools.lru_cache(maxsize=256)
def _mde_in_sds(n: int) -> float:
    return float(optimize.brentq(lambda d: t_test_power(n, d) - POWER, 1e-6, 20.0))


def minimum_detectable_effect(n: int, sd: float) -> float:
    """The true difference the paired t-test (two-sided, ALPHA, unadjusted) finds with 80 % power."""
    return _mde_in_sds(n) * sd


def _smallest_n(power) -> int | None:
    """The smallest seed count (2 ... MAX_SEEDS) where `power(n)` reaches POWER (bisection: power grows
    with n)."""
    if power(MAX_SEEDS) < POWER:
        return None
    low, high = 1, MAX_SEEDS
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if power(middle) < POWER else (low, middle)
    return max(high, 2)


def seeds_for_equivalence(sd: float, margin: float, difference: float = 0.0) -> int | None:
    """Seeds at which the TOST at `margin` has 80 % power, were the true difference `difference`."""
    return _smallest_n(lambda n: tost_power(n, margin / sd, difference / sd))


def seeds_for_difference(sd: float, difference: float, alpha: float = ALPHA) -> int | None:
    """Seeds at which the paired t-test at `alpha` finds `difference` with 80 % power."""
    return _smallest_n(lambda n: t_test_power(n, difference / sd, alpha))


def one_sample(
    name: str,
    values: Mapping[int, float],
    target: float | Mapping[int, float],
    reference: str | None = None,
    **pair,
) -> Pair:
    """A quantity against a target (e.g. achieved against target sparsity; a number, or one per seed) as a
    `Pair` (the target named `reference`, else by its value), in the quantity's own unit (none unless
    given)."""
    defaults = {"factor": 1.0, "bounds": LINEAR, "unit": ""}
    return Pair(name, reference or number(target), values, target, **{**defaults, **pair})
