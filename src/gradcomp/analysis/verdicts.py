"""Paired comparisons across seeds and their verdicts: the one place where a difference becomes a finding.

Two arms are compared on the seeds they share, paired by seed (the same seed is the same initialisation,
data order and random bits), through the per-seed differences a - b. Each comparison belongs to one family:
the deciding comparisons of a claim (declared with the claim, `family` = its ID), a named question's (e.g.
C2's theory against measurement), or a secondary comparison (`family` = ""), which is a family of its own:
exploratory, it reaches the same verdict in every experiment that prints it. Each comparison has two routes
to a verdict, tested at 0.05 after the Holm adjustment over every route of its family (equivalence and
difference tests in one family):

* for a two-sided comparison (`test` equivalence or difference, and every secondary one): *equivalent within
  +-m* when both one-sided tests (TOST) place the difference inside the declared margin m; *better* / *worse*
  when the difference lies beyond the margin (the paired t-test of |difference| > m, two-sided form; against 0
  where no margin is declared; a quantity against its target is worse on either side);
* for a directional claim (`test` non-inferiority or superiority, in the direction `higher_is_better`):
  *non-inferior within m* when the one-sided test places the difference above -m, *worse* when it lies below
  -m (non-inferiority); *better* when above +m, *worse* when below it (superiority, m = 0 where none is
  declared).

A difference inside the margin is never *worse*, so more seeds never turn a true effect's verdict around
(one rule, monotone in evidence). Otherwise the comparison is *inconclusive*: its 95 % interval is stated
(with "consistently higher/lower" where it excludes 0 but not the margin) with the seeds that would decide
it: taking the observed difference as the true one, the fewer of the seeds that give either route 80 % power
at 0.05 over the family's number of tests (Holm's first step), planned with the paired sd pooled over the
comparable comparisons of the call (same reference, scale and unit) and given as a range over that sd's 95 %
interval; never a count at or below the seeds used ("more than the N seeds used").

Every comparison also reports the sign consistency (on how many of its seeds the difference has the sign of
its mean), the minimum detectable effect (the true difference the paired t-test at 0.05, unadjusted, would
find with 80 % power, given the seeds and the observed paired sd) and the probability that an independent
replicate with as many seeds reaches the same verdict, were the observed difference the truth and the sd the
upper end of the pooled sd's 95 % interval (each route at 0.05 over the family's tests): a verdict below 80 %
is *knife-edge*. The upper end, not the pooled sd itself: an sd from 2-3 seeds can be several times too small,
and a verdict that rests on a lucky small sd is the one a rerun on another machine overturns. The 95 %
interval of a difference of bounded quantities (e.g. accuracies) is intersected with the differences they
allow, which keeps its coverage.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np
from scipy import optimize, stats

from gradcomp.analysis.seeds import ALPHA, FRACTION, LINEAR, Bounds, Estimate, number
from gradcomp.choices import CLAIM_TESTS

POWER = 0.8
MAX_SEEDS = 10_000  # beyond this, "seeds needed" reads "more than 10,000"
REPLICATES = 0.8  # a verdict an independent replicate reaches less often than this is knife-edge
BETTER, WORSE, EQUIVALENT, NONINFERIOR = "better", "worse", "equivalent", "non-inferior"
INCONCLUSIVE = "inconclusive"
VERDICTS = (BETTER, WORSE, EQUIVALENT, NONINFERIOR, INCONCLUSIVE)
# what a comparison tests: the first two are two-sided (inside the margin, or beyond it on either side), the
# last two one-sided in the better direction; a claim states its test (`gradcomp.experiments.Claim`)
TESTS = CLAIM_TESTS[:4]
EQUIVALENCE, DIFFERENCE, NON_INFERIORITY, SUPERIORITY = TESTS


@dataclass(frozen=True)
class Pair:
    """One stated comparison: arm a against arm b (seed -> value each; b may be a constant, e.g. a target),
    its difference reported times `factor` in `unit`, with the margin (in `unit`; None: none declared), which
    side is better (None: a target, missed on either side), the bounds of the compared quantity, the training
    scale the arms ran at (for tables and captions), its family (the claim it decides, "" for secondary) and
    its test (see the module)."""

    a: str
    b: str
    a_values: Mapping[int, float]
    b_values: Mapping[int, float] | float
    unit: str = "pt"
    factor: float = 100.0
    margin: float | None = None
    higher_is_better: bool | None = True
    bounds: Bounds = FRACTION
    scale: str = ""
    family: str = ""
    test: str = EQUIVALENCE
    # what the comparison is to its caller: the question it answers (e.g. GAP) and the runs in the roles of
    # arm and baseline, by which callers find it among an experiment's comparisons
    role: str = ""
    arm: str = ""
    baseline: str = ""

    def __post_init__(self) -> None:
        if self.test not in TESTS:
            raise ValueError(f"test must be one of {TESTS}, got {self.test!r}")
        if self.one_sided and self.higher_is_better is None:
            raise ValueError(f"a {self.test} test needs a better side (higher_is_better True or False)")
        if self.test == NON_INFERIORITY and self.margin is None:
            raise ValueError("a non-inferiority test needs a margin")

    @property
    def one_sided(self) -> bool:
        return self.test in (NON_INFERIORITY, SUPERIORITY)

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

    @property
    def comparable(self) -> tuple:
        """Pairs with the same key share a planning sd: the same reference, scale and unit."""
        return (self.b, self.scale, self.unit, self.factor)


@dataclass(frozen=True)
class Comparison:
    """A paired comparison a - b and its verdict (see the module docstring). `p` is the route beyond the
    margin (better / worse), `p_within` the route inside it (equivalent / non-inferior; for superiority the
    route to "worse"), each unadjusted; `p_holm` the adjusted p of the route that decided, else the smaller
    one. `seeds_needed` with its range over the pooled sd, `replicates`: see the module."""

    a: str
    b: str
    seeds: int
    difference: float
    sd: float
    ci_low: float
    ci_high: float
    p: float
    p_within: float | None
    p_holm: float
    tests: int
    margin: float | None
    agree: int  # seeds whose difference has the sign of the mean
    mde: float | None
    sd_pooled: float | None
    seeds_needed: int | None  # None: more than MAX_SEEDS, or nothing to decide
    seeds_range: tuple[int | None, int | None] | None
    route_powers: tuple[float, float] | None  # a replicate's power: beyond the margin, inside it
    verdict: str
    unit: str
    higher_is_better: bool | None
    scale: str
    family: str
    test: str
    role: str = ""
    arm: str = ""
    baseline: str = ""

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
    def replicates(self) -> float | None:
        """The probability that an independent replicate with as many seeds reaches this verdict."""
        if self.route_powers is None:
            return None
        if self.verdict == INCONCLUSIVE:
            return max(0.0, 1.0 - sum(self.route_powers))
        within = self.verdict in (EQUIVALENT, NONINFERIOR) or (
            self.test == SUPERIORITY and self.verdict == WORSE
        )
        return self.route_powers[1 if within else 0]

    @property
    def knife_edge(self) -> bool:
        """Whether an independent replicate would reach this verdict less often than REPLICATES."""
        return self.replicates is not None and self.replicates < REPLICATES

    @property
    def decision(self) -> str:
        """The verdict in words: "equivalent within ±1 pt (90 % interval [-0.6, +0.4]; Holm p = 0.01 over
        5)", "worse (Holm p = 0.01 over 5)", "inconclusive". A margin test is decided by the 90 % interval
        (two one-sided tests), which it names: the 95 % interval printed beside it may reach past the
        margin."""
        holm = f"Holm p = {self.p_holm:.2g} over {self.tests}"
        if self.verdict in (EQUIVALENT, NONINFERIOR):
            return f"{self.equivalence} ({self.tost_interval}; {holm})"
        if self.verdict in (BETTER, WORSE):
            return f"{self.verdict} ({holm})"
        return INCONCLUSIVE

    @property
    def equivalence(self) -> str:
        """e.g. "equivalent within ±1 pt", "non-inferior within 1 pt"."""
        if self.verdict == NONINFERIOR:
            return f"non-inferior within {self.margin:g} {self.unit}".rstrip()
        return f"equivalent within ±{self.margin:g} {self.unit}".rstrip()

    @property
    def tost_interval(self) -> str:
        """The 90 % interval the margin tests decide by (mean ± t(0.95) sd / sqrt(n)), e.g. "90 % interval
        [-0.6, +0.4]"."""
        if self.seeds < 2:
            return "one seed"
        half = stats.t.ppf(1 - ALPHA, self.seeds - 1) * self.sd / math.sqrt(self.seeds)
        return f"90 % interval [{self.difference - half:+.3g}, {self.difference + half:+.3g}]"

    @property
    def within_margin(self) -> bool:
        """Whether the observed difference lies on the side of the margin that the route `p_within` shows."""
        if self.margin is None:
            return False
        if self.test == NON_INFERIORITY:
            return self.good_side > -self.margin
        return abs(self.difference) < self.margin

    @property
    def good_side(self) -> float:
        """The difference in the better direction (for directional tests)."""
        return self.difference if self.higher_is_better is not False else -self.difference

    @property
    def needed(self) -> str:
        """What would decide an inconclusive comparison, in words."""
        if self.seeds < 2:
            return "a second seed would give an interval"
        if self.seeds_needed is None:
            return "more than 10,000 seeds would be needed to decide it"
        low, high = self.seeds_range or (self.seeds_needed, self.seeds_needed)
        high_text = "over 10,000" if high is None else f"{high:,}"
        if self.seeds_needed <= self.seeds:
            return (
                f"more than the {self.seeds} seeds used would decide it (it sits at the decision's edge; "
                f"up to {high_text} over the pooled sd's 95 % interval)"
            )
        low = max(low or self.seeds_needed, self.seeds + 1)  # never a count at or below the seeds used
        spread = (
            ""
            if low == high == self.seeds_needed
            else f" ({low:,} to {high_text} over the pooled sd's 95 % interval)"
        )
        about = f"about {self.seeds_needed:,} seeds{spread} would"
        unit = f" {self.unit}" if self.unit else ""
        if self.route_within and self.test == NON_INFERIORITY:
            return f"{about} show it non-inferior within {self.margin:g}{unit}"
        if self.route_within:
            return f"{about} show it within ±{self.margin:g}{unit}"
        if self.margin:
            return f"{about} find a difference of this size beyond ±{self.margin:g}{unit}"
        return f"{about} find a difference of this size"

    @property
    def route_within(self) -> bool:
        """Whether the seeds needed are those of the route inside the margin (else beyond it)."""
        return self.within_margin and self.test != SUPERIORITY

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
        return {**asdict(self), "statement": self.statement, "replicates": self.replicates}

    @classmethod
    def from_row(cls, row: Mapping) -> Comparison:
        """A comparison as `row` wrote it (JSON turns NaN into null and tuples into lists)."""
        names = {f.name: f.type for f in fields(cls)}
        values = {key: row[key] for key in names if key in row}
        for key in ("difference", "sd", "ci_low", "ci_high", "p", "p_holm"):
            values[key] = math.nan if values[key] is None else values[key]
        for key in ("seeds_range", "route_powers"):
            values[key] = None if values[key] is None else tuple(values[key])
        return cls(**values)


def compare(pairs: Sequence[Pair]) -> list[Comparison]:
    """The comparisons of one experiment, each Holm-adjusted over the routes of its family (the claim it
    decides, a named question, or itself where secondary), each with its verdict."""
    tested = [_paired(pair) for pair in pairs]
    pooled = _pooled_sds(pairs, tested)
    adjusted: list[dict] = [{} for _ in pairs]
    # a secondary comparison is its own family, so that a pair of runs reaches one verdict in every
    # experiment that prints it
    keys = [pair.family or i for i, pair in enumerate(pairs)]
    counts: dict[str | int, int] = {}
    for family in dict.fromkeys(keys):
        members = [i for i, key in enumerate(keys) if key == family]
        routes = [(i, route) for i in members for route in ("p", "p_within") if tested[i][route] is not None]
        for (i, route), p_holm in zip(routes, holm([tested[i][route] for i, route in routes]), strict=True):
            adjusted[i][route] = p_holm
        counts[family] = sum(not math.isnan(tested[i][route]) for i, route in routes)
    comparisons = []
    for key, pair, t, holm_p, sd_pooled in zip(keys, pairs, tested, adjusted, pooled, strict=True):
        tests = counts[key]
        beyond, within = holm_p.get("p", math.nan), holm_p.get("p_within", math.nan)
        if within < ALPHA:
            verdict = {NON_INFERIORITY: NONINFERIOR, SUPERIORITY: WORSE}.get(pair.test, EQUIVALENT)
            decided = within
        elif beyond < ALPHA:
            verdict = _beyond_verdict(pair, t["difference"])
            decided = beyond
        else:
            verdict, decided = (
                INCONCLUSIVE,
                min((p for p in (beyond, within) if not math.isnan(p)), default=math.nan),
            )
        alpha = ALPHA / max(tests, 1)
        needed, needed_range = _seeds_needed(pair, t, alpha, sd_pooled)
        comparisons.append(
            Comparison(
                a=pair.a,
                b=pair.b,
                p_holm=decided,
                tests=tests,
                margin=pair.margin,
                sd_pooled=sd_pooled[0] if sd_pooled else None,
                seeds_needed=needed,
                seeds_range=needed_range,
                route_powers=_route_powers(pair, t, alpha, sd_pooled),
                verdict=verdict,
                unit=pair.unit,
                higher_is_better=pair.higher_is_better,
                scale=pair.scale,
                family=pair.family,
                test=pair.test,
                role=pair.role,
                arm=pair.arm,
                baseline=pair.baseline,
                **t,
            )
        )
    return comparisons


# how captions state the adjustment
FAMILIES = "Holm within each family (a claim's deciding comparisons together, any other comparison alone)"
GAP = "gap"  # the role of an arm's comparison with the uncompressed run of its model and scale


def having(comparisons: Sequence[Comparison], role: str) -> list[Comparison]:
    """The comparisons in one role, in their order."""
    return [c for c in comparisons if c.role == role]


def by_arm(comparisons: Sequence[Comparison], role: str = GAP) -> dict[str, Comparison]:
    """The comparisons in one role by the run in the role of arm."""
    return {c.arm: c for c in comparisons if c.role == role}


def _beyond_verdict(pair: Pair, difference: float) -> str:
    if pair.one_sided:
        return BETTER if (difference > 0) == pair.higher_is_better else WORSE
    better = pair.higher_is_better is not None and (difference > 0) == pair.higher_is_better
    return BETTER if better else WORSE


def _paired(pair: Pair) -> dict:
    """The unadjusted p of each route, sign consistency and power of the per-seed differences of `pair`."""
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
        "p_within": None if pair.margin is None and not pair.one_sided else math.nan,
        "agree": agree,
        "mde": None,
    }
    if n < 2:
        return result
    low, high = pair.limits
    result["ci_low"], result["ci_high"] = max(estimate.ci_low, low), min(estimate.ci_high, high)
    result["mde"] = minimum_detectable_effect(n, sd) if sd > 0 else 0.0
    margin = pair.margin or 0.0
    if pair.one_sided:
        good = mean if pair.higher_is_better else -mean
        edge = -margin if pair.test == NON_INFERIORITY else margin
        above, below = _one_sided(good - edge, sd, n)  # H0 good <= edge; H0 good >= edge
        # the route beyond: worse below -m (non-inferiority), better above +m (superiority)
        result["p"], result["p_within"] = (below, above) if pair.test == NON_INFERIORITY else (above, below)
        return result
    if sd == 0:  # the same difference on every seed: nothing to test it against
        result["p"] = 0.0 if abs(mean) > margin else 1.0
        if pair.margin is not None:
            result["p_within"] = 0.0 if abs(mean) < pair.margin else 1.0
        return result
    standard_error = sd / math.sqrt(n)
    # beyond the margin on the observed side (two-sided form): against 0 without a margin
    result["p"] = float(min(1.0, 2 * stats.t.sf((abs(mean) - margin) / standard_error, n - 1)))
    if pair.margin is not None:
        upper = stats.t.sf((mean + pair.margin) / standard_error, n - 1)  # H0: difference <= -m
        lower = stats.t.cdf((mean - pair.margin) / standard_error, n - 1)  # H0: difference >= +m
        result["p_within"] = float(max(upper, lower))
    return result


def _one_sided(distance: float, sd: float, n: int) -> tuple[float, float]:
    """p-values of H0 "at most" and "at least" for a mean `distance` from the edge (exact where sd = 0)."""
    if sd == 0:
        return (0.0, 1.0) if distance > 0 else (1.0, 0.0) if distance < 0 else (1.0, 1.0)
    t = distance / (sd / math.sqrt(n))
    return float(stats.t.sf(t, n - 1)), float(stats.t.cdf(t, n - 1))


def _pooled_sds(pairs: Sequence[Pair], tested: Sequence[Mapping]) -> list[tuple[float, float, float] | None]:
    """Each pair's planning sd: the paired sd pooled over the comparable pairs (same reference, scale and
    unit) with its 95 % interval (chi-square), or None where no pair of its kind has 2 seeds."""
    sums: dict[tuple, list[float]] = {}
    for pair, t in zip(pairs, tested, strict=True):
        if t["seeds"] >= 2:
            total = sums.setdefault(pair.comparable, [0.0, 0.0])
            total[0] += (t["seeds"] - 1) * t["sd"] ** 2
            total[1] += t["seeds"] - 1
    pooled: list[tuple[float, float, float] | None] = []
    for pair in pairs:
        if pair.comparable not in sums:
            pooled.append(None)
            continue
        squares, df = sums[pair.comparable]
        sd = math.sqrt(squares / df)
        low = sd * math.sqrt(df / stats.chi2.ppf(1 - ALPHA / 2, df))
        high = sd * math.sqrt(df / stats.chi2.ppf(ALPHA / 2, df))
        pooled.append((sd, low, high))
    return pooled


def _seeds_needed(
    pair: Pair, t: Mapping, alpha: float, pooled: tuple[float, float, float] | None
) -> tuple[int | None, tuple[int | None, int | None] | None]:
    """The seeds that would decide the comparison by its nearer route (see the module), at the pooled sd and
    over its interval: None with fewer than 2 seeds, no spread, or nothing to find."""
    if t["seeds"] < 2 or pooled is None or not pooled[0] > 0:
        return None, None

    def needed(sd: float) -> int | None:
        counts = [n for n in (_route_seeds(pair, t["difference"], sd, alpha, r) for r in (0, 1)) if n]
        return min(counts, default=None)

    return needed(pooled[0]), (needed(pooled[1]), needed(pooled[2]))


def _route_power(pair: Pair, difference: float, sd: float, alpha: float, route: int, n: int) -> float:
    """Power at n seeds of route 0 (beyond the margin) or 1 (inside it), were `difference` and `sd` true."""
    margin = pair.margin or 0.0
    if pair.one_sided:
        good = difference if pair.higher_is_better else -difference
        edge = -margin if pair.test == NON_INFERIORITY else margin
        toward_within = route == 1 if pair.test == NON_INFERIORITY else route == 0
        shift = (good - edge) / sd if toward_within else (edge - good) / sd
        return one_sided_power(n, shift, alpha)
    if route == 0:
        return (
            t_test_power(n, max(abs(difference) - margin, 0.0) / sd, alpha)
            if abs(difference) > margin
            else 0.0
        )
    if pair.margin is None:
        return 0.0
    return tost_power(n, margin / sd, difference / sd, alpha)


def _route_seeds(pair: Pair, difference: float, sd: float, alpha: float, route: int) -> int | None:
    if _route_power(pair, difference, sd, alpha, route, MAX_SEEDS) < POWER:
        return None
    return _smallest_n(lambda n: _route_power(pair, difference, sd, alpha, route, n))


def _route_powers(
    pair: Pair, t: Mapping, alpha: float, pooled: tuple[float, float, float] | None
) -> tuple[float, float] | None:
    """Each route's power for an independent replicate with as many seeds, at the upper end of the pooled
    sd's interval (see the module)."""
    n = t["seeds"]
    if n < 2 or pooled is None or not pooled[0] > 0:
        return None
    beyond, within = (_route_power(pair, t["difference"], pooled[2], alpha, route, n) for route in (0, 1))
    return beyond, within


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


def tost_power(n: int, margin: float, difference: float = 0.0, alpha: float = ALPHA) -> float:
    """Power of the TOST at `alpha` with n seeds when the margin is `margin` and the true difference
    `difference`, both in paired sds (the usual approximation: each one-sided test's miss, noncentral t,
    counted apart)."""
    df, critical, root = n - 1, stats.t.ppf(1 - alpha, n - 1), math.sqrt(n)
    miss_low = np.nan_to_num(stats.nct.cdf(critical, df, (margin + difference) * root), nan=0.0)
    miss_high = np.nan_to_num(stats.nct.cdf(critical, df, (margin - difference) * root), nan=0.0)
    return max(0.0, float(1 - miss_low - miss_high))


def one_sided_power(n: int, effect: float, alpha: float = ALPHA) -> float:
    """Power of the one-sided paired t-test at `alpha` with n seeds for a true distance of `effect` paired
    sds beyond its edge (negative: on the wrong side)."""
    critical = stats.t.ppf(1 - alpha, n - 1)
    return float(np.nan_to_num(stats.nct.sf(critical, n - 1, effect * math.sqrt(n)), nan=float(effect > 0)))


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


def correlation_pair(name: str, per_seed: Mapping[int, float], margin: float, **pair) -> Pair:
    """A rank correlation per seed (NaNs left out) against none: superiority beyond `margin`, where it
    orders most of what it ranks rather than merely correlating."""
    values = {seed: rho for seed, rho in per_seed.items() if not math.isnan(rho)}
    return one_sample(name, values, 0.0, "no association", margin=margin, higher_is_better=True, **pair)


def prediction_pair(name: str, ln_ratios: Mapping[int, float], reference: str, margin: float, **pair) -> Pair:
    """A measurement against its prediction as the ln of their ratio per seed, against 0: the prediction
    holds where the ratio is equivalent to 1 within exp(+-margin)."""
    return one_sample(
        name, ln_ratios, 0.0, reference, margin=margin, higher_is_better=None, unit="ln", **pair
    )
