"""Paired comparisons across seeds and their verdicts: the one place where a difference becomes a finding.

Two arms are compared on the seeds they share, paired by seed (the same seed is the same initialisation,
data order and random bits), through the per-seed differences a - b. Each comparison belongs to one family:
the deciding comparisons of a claim (declared with the claim, `family` = its ID), a named question's (e.g.
C2's theory against measurement), or a secondary comparison (`family` = ""), which is a family of its own:
exploratory, it reaches the same verdict in every experiment that prints it. Each comparison has two routes
to a verdict:

* for a two-sided comparison (`test` equivalence or difference, and every secondary one): *equivalent within
  +-m* when both one-sided tests (TOST) place the difference inside the declared margin m; *better* / *worse*
  when the difference lies beyond the margin (the paired t-test of |difference| > m, two-sided form; against 0
  where no margin is declared; a quantity against its target is worse on either side);
* for a directional claim (`test` non-inferiority or superiority, in the direction `higher_is_better`):
  *non-inferior within m* when the one-sided test places the difference above -m, *worse* when it lies below
  -m (non-inferiority); *better* when above +m, *worse* when below it (superiority, m = 0 where none is
  declared).

The two routes' null hypotheses ("outside the margin", "inside it") partition the parameter space: at most one
is true for any comparison, so a comparison counts as one hypothesis, tested by its smaller p (the
partitioning principle: Finner and Strassburger, Ann. Statist. 30, 2002; for the three-way decision,
Goeman, Solari and Stijnen, Stat. Med. 29, 2010). Holm's step-down runs over the family's comparisons, one
p each; `tests/test_multiplicity.py` simulates families at the margin and checks the family-wise error.

A difference inside the margin is never *worse*, so more seeds never turn a true effect's verdict around
(one rule, monotone in evidence). Otherwise the comparison is *inconclusive*: its 95 % interval is stated
(with "consistently higher/lower" where it excludes 0 but not the margin) with the seeds that would decide it:
the fewest giving the deciding route 90 % power at 0.05 over the family (Holm's first step) at the stated
effect (`Pair.effect`: a claim's, e.g. 0 for "no loss"; for an exploratory comparison the observed
difference where it lies a standard error or more from the margin's edge, else 0 where a margin is
declared), planned with the paired sd pooled over like comparisons only (same family, reference, scale, unit
and kind of arm, by default the arm itself) and given as a range over that sd's 95 % interval with its
degrees of freedom; never a count at or below the seeds used, and no count where the sd does not support one
(the seeds used already enough at the planning sd, or nothing to plan at).

Every comparison also reports the sign consistency (on how many of its seeds the difference has the sign of
its mean), the minimum detectable effect (the true difference the paired t-test at 0.05, unadjusted, would
find with 90 % power, given the seeds and the observed paired sd) and its per-seed values. The 95 % interval
of a difference of bounded quantities (e.g. accuracies) is intersected with the differences they allow,
which keeps its coverage.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np
from scipy import optimize, stats

from gradcomp.analysis.seeds import ALPHA, FRACTION, LINEAR, Bounds, Estimate, number
from gradcomp.choices import CLAIM_TESTS

POWER = 0.9  # every plan of seeds (a claim's, or what would decide a comparison) aims at this power
MAX_SEEDS = 10_000  # beyond this, "seeds needed" reads "more than 10,000"
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
    scale the arms ran at (for tables and captions), its family (the claim it decides, "" for secondary), its
    test (see the module), the effect the seeds to decide it are planned at (in `unit`; None: the observed
    difference) and the kind of arm it shares a planning sd with (None: none but itself)."""

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
    effect: float | None = None
    kind: str | None = None

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

    def values(self) -> list[tuple[int, float, float]]:
        """(seed, a, b) on every shared seed, in seed order."""
        if isinstance(self.b_values, Mapping):
            shared = sorted(set(self.a_values) & set(self.b_values))
            return [(s, self.a_values[s], self.b_values[s]) for s in shared]
        return [(s, self.a_values[s], self.b_values) for s in sorted(self.a_values)]

    def differences(self) -> np.ndarray:
        """a - b on every shared seed (in seed order), times `factor`."""
        pairs = [(a, b) for _, a, b in self.values()]
        # rounded far below any reported digit, so that equal arms differ by exactly 0
        return np.round(np.asarray([(a - b) * self.factor for a, b in pairs], dtype=np.float64), 9)

    @property
    def limits(self) -> tuple[float, float]:
        """The differences the bounds allow, in `unit`."""
        span = (self.bounds.high - self.bounds.low) * self.factor
        return (-span, span) if self.bounds.bounded else (-math.inf, math.inf)

    @property
    def like(self) -> tuple:
        """Pairs with the same key share a planning sd: the same family, reference, scale, unit and kind of
        arm (by default the arm itself, so that unlike arms never share one)."""
        return (self.family, self.b, self.scale, self.unit, self.factor, self.kind or self.a)


@dataclass(frozen=True)
class Comparison:
    """A paired comparison a - b and its verdict (see the module docstring). `p` is the route beyond the
    margin (better / worse), `p_within` the route inside it (equivalent / non-inferior; for superiority the
    route to "worse"), each unadjusted; `p_holm` the comparison's Holm-adjusted p (of its smaller route, the
    one that decides). `seeds_needed` with its range over the planning sd's interval (`sd_pooled`, with
    `sd_df` degrees of freedom), planned at the effect `planned_at`; `values`: (seed, a, b) behind it."""

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
    sd_df: int | None
    planned_at: float | None
    seeds_needed: int | None  # None: more than MAX_SEEDS, or nothing to decide
    seeds_range: tuple[int | None, int | None] | None
    verdict: str
    unit: str
    higher_is_better: bool | None
    scale: str
    family: str
    test: str
    role: str = ""
    arm: str = ""
    baseline: str = ""
    values: tuple[tuple[int, float, float], ...] = ()

    @property
    def one_sided(self) -> bool:
        return self.test in (NON_INFERIORITY, SUPERIORITY)

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
    def needed(self) -> str:
        """What would decide an inconclusive comparison, in words."""
        if self.seeds < 2:
            return "a second seed would give an interval"
        if self.sd_pooled is None or not self.sd_pooled > 0:
            return "its seeds agree exactly: no spread to plan seeds with"
        if self.planned_at is None:
            return "its difference lies within a standard error of 0: no seed count the sd supports would do"
        unit = f" {self.unit}" if self.unit else ""
        at = (
            "at the observed difference"
            if self.planned_at == self.difference
            else f"were the true difference {self.planned_at:+g}{unit}".replace("+0 ", "0 ")
        )
        sd = f"the planning sd {number(self.sd_pooled)}{unit}, {self.sd_df} df"
        if self.seeds_needed is None:
            return f"more than 10,000 seeds would be needed {at} ({sd})"
        if self.seeds_needed <= self.seeds:
            return (
                f"the {self.seeds} seeds used give {100 * POWER:.0f} % power {at} ({sd}): the difference "
                "seen is not that one, and no seed count the sd supports would decide it"
            )
        low, high = self.seeds_range or (self.seeds_needed, self.seeds_needed)
        low = max(low or self.seeds_needed, self.seeds + 1)  # never a count at or below the seeds used
        high_text = "over 10,000" if high is None else f"{high:,}"
        spread = (
            "" if low == high == self.seeds_needed else f"{low:,} to {high_text} over its 95 % interval; "
        )
        about = f"about {self.seeds_needed:,} seeds ({spread}{sd}) would"
        if self.route_within and self.test == NON_INFERIORITY:
            return f"{about} show it non-inferior within {self.margin:g}{unit} {at}"
        if self.route_within:
            return f"{about} show it within ±{self.margin:g}{unit} {at}"
        if self.margin:
            return f"{about} find it beyond ±{self.margin:g}{unit} {at}"
        return f"{about} find it {at}"

    @property
    def route_within(self) -> bool:
        """Whether the seeds needed are those of the route inside the margin (else beyond it)."""
        if self.margin is None or self.planned_at is None or self.test == SUPERIORITY:
            return False
        if self.test == NON_INFERIORITY:
            good = self.planned_at if self.higher_is_better is not False else -self.planned_at
            return good > -self.margin
        return abs(self.planned_at) < self.margin

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
        """A comparison as `row` wrote it (JSON turns NaN into null and tuples into lists)."""
        names = {f.name: f.type for f in fields(cls)}
        values = {key: row[key] for key in names if key in row}
        for key in ("difference", "sd", "ci_low", "ci_high", "p", "p_holm"):
            values[key] = math.nan if values[key] is None else values[key]
        values["seeds_range"] = None if values["seeds_range"] is None else tuple(values["seeds_range"])
        for key in ("sd_df", "planned_at"):  # records written before plans were stated lack them
            values.setdefault(key, None)
        values["values"] = tuple(tuple(item) for item in values.get("values", ()))
        return cls(**values)


def compare(pairs: Sequence[Pair]) -> list[Comparison]:
    """The comparisons of one experiment, each Holm-adjusted over its family (the claim it decides, a named
    question, or itself where secondary; one hypothesis per comparison, see the module), each with its
    verdict and the seeds that would decide it."""
    tested = [_paired(pair) for pair in pairs]
    pooled = _pooled_sds(pairs, tested)
    # a secondary comparison is its own family, so that a pair of runs reaches one verdict in every
    # experiment that prints it
    keys = [pair.family or i for i, pair in enumerate(pairs)]
    routes = [(t["p"], t["p_within"]) for t in tested]
    decided = _decide(keys, pairs, routes, [t["difference"] for t in tested])
    comparisons = []
    for pair, t, (verdict, p_holm, tests), sd_pooled in zip(pairs, tested, decided, pooled, strict=True):
        planned_at, needed, needed_range = _seeds_needed(pair, t, ALPHA / max(tests, 1), sd_pooled)
        comparisons.append(
            Comparison(
                a=pair.a,
                b=pair.b,
                p_holm=p_holm,
                tests=tests,
                margin=pair.margin,
                sd_pooled=sd_pooled[0] if sd_pooled else None,
                sd_df=sd_pooled[3] if sd_pooled else None,
                planned_at=planned_at,
                seeds_needed=needed,
                seeds_range=needed_range,
                verdict=verdict,
                unit=pair.unit,
                higher_is_better=pair.higher_is_better,
                scale=pair.scale,
                family=pair.family,
                test=pair.test,
                role=pair.role,
                arm=pair.arm,
                baseline=pair.baseline,
                values=tuple(pair.values()),
                **t,
            )
        )
    return comparisons


class _Spec(typing.Protocol):
    """What a verdict or a plan needs of a comparison besides its numbers (a `Pair` or a `Comparison`)."""

    test: str
    margin: float | None
    higher_is_better: bool | None

    @property
    def one_sided(self) -> bool: ...


def _decide(
    keys: Sequence[object],
    specs: Sequence[_Spec],
    routes: Sequence[tuple[float, float | None]],
    differences: Sequence[float],
) -> list[tuple[str, float, int]]:
    """Each comparison's verdict, Holm-adjusted p and family size, from its routes' unadjusted p-values
    (beyond the margin, inside it): Holm over each family (comparisons of one key) with one p per comparison,
    the smaller of its two routes, which decides where the adjusted p is below ALPHA."""
    smaller = [min((p for p in route if p is not None and p == p), default=math.nan) for route in routes]
    adjusted = [math.nan] * len(keys)
    counts: dict[object, int] = {}
    for family in dict.fromkeys(keys):
        members = [i for i, key in enumerate(keys) if key == family]
        for i, p_holm in zip(members, holm([smaller[i] for i in members]), strict=True):
            adjusted[i] = p_holm
        counts[family] = sum(not math.isnan(smaller[i]) for i in members)
    decided = []
    for key, spec, (_, within), p, p_holm, difference in zip(
        keys, specs, routes, smaller, adjusted, differences, strict=True
    ):
        if not p_holm < ALPHA:
            verdict = INCONCLUSIVE
        elif within is not None and within == p:
            verdict = {NON_INFERIORITY: NONINFERIOR, SUPERIORITY: WORSE}.get(spec.test, EQUIVALENT)
        else:
            verdict = _beyond_verdict(spec, difference)
        decided.append((verdict, p_holm, counts[key]))
    return decided


def at_margin(comparisons: Sequence[Comparison], margin: float) -> list[str]:
    """The verdicts `comparisons` (one family) would reach were their margin `margin`: the same tests on the
    same seeds (for a claim's sensitivity to its margin)."""
    routes = [_routes(c.test, margin, c.higher_is_better, c.seeds, c.difference, c.sd) for c in comparisons]
    decided = _decide([0] * len(comparisons), comparisons, routes, [c.difference for c in comparisons])
    return [verdict for verdict, _, _ in decided]


# how captions state the adjustment
FAMILIES = "Holm within each family (a claim's deciding comparisons together, any other comparison alone)"
GAP = "gap"  # the role of an arm's comparison with the uncompressed run of its model and scale


def having(comparisons: Sequence[Comparison], role: str) -> list[Comparison]:
    """The comparisons in one role, in their order."""
    return [c for c in comparisons if c.role == role]


def by_arm(comparisons: Sequence[Comparison], role: str = GAP) -> dict[str, Comparison]:
    """The comparisons in one role by the run in the role of arm."""
    return {c.arm: c for c in comparisons if c.role == role}


def _beyond_verdict(spec: _Spec, difference: float) -> str:
    if spec.test in (NON_INFERIORITY, SUPERIORITY):
        return BETTER if (difference > 0) == spec.higher_is_better else WORSE
    better = spec.higher_is_better is not None and (difference > 0) == spec.higher_is_better
    return BETTER if better else WORSE


def _paired(pair: Pair) -> dict:
    """The unadjusted p of each route, sign consistency and power of the per-seed differences of `pair`."""
    differences = pair.differences()
    estimate = Estimate.of(differences)
    n, mean, sd = estimate.n, estimate.mean, estimate.sd
    agree = int(np.sum(np.sign(differences) == np.sign(mean))) if n else 0
    p, p_within = _routes(pair.test, pair.margin, pair.higher_is_better, n, mean, sd)
    result = {
        "seeds": n,
        "difference": mean,
        "sd": sd,
        "ci_low": math.nan,
        "ci_high": math.nan,
        "p": p,
        "p_within": p_within,
        "agree": agree,
        "mde": None,
    }
    if n >= 2:
        low, high = pair.limits
        result["ci_low"], result["ci_high"] = max(estimate.ci_low, low), min(estimate.ci_high, high)
        result["mde"] = minimum_detectable_effect(n, sd) if sd > 0 else 0.0
    return result


def _routes(
    test: str, margin: float | None, higher_is_better: bool | None, n: int, mean: float, sd: float
) -> tuple[float, float | None]:
    """The unadjusted p of the route beyond the margin and of the route inside it (None: no such route, a
    two-sided comparison without a margin; NaN: fewer than 2 seeds)."""
    one_sided = test in (NON_INFERIORITY, SUPERIORITY)
    within: float | None = None if margin is None and not one_sided else math.nan
    if n < 2:
        return math.nan, within
    edge = margin or 0.0
    if one_sided:
        good = mean if higher_is_better else -mean
        edge = -edge if test == NON_INFERIORITY else edge
        above, below = _one_sided(good - edge, sd, n)  # H0 good <= edge; H0 good >= edge
        # the route beyond: worse below -m (non-inferiority), better above +m (superiority)
        return (below, above) if test == NON_INFERIORITY else (above, below)
    if sd == 0:  # the same difference on every seed: nothing to test it against
        beyond = 0.0 if abs(mean) > edge else 1.0
        return beyond, None if margin is None else (0.0 if abs(mean) < margin else 1.0)
    standard_error = sd / math.sqrt(n)
    # beyond the margin on the observed side (two-sided form): against 0 without a margin
    beyond = float(min(1.0, 2 * stats.t.sf((abs(mean) - edge) / standard_error, n - 1)))
    if margin is None:
        return beyond, None
    upper = stats.t.sf((mean + margin) / standard_error, n - 1)  # H0: difference <= -m
    lower = stats.t.cdf((mean - margin) / standard_error, n - 1)  # H0: difference >= +m
    return beyond, float(max(upper, lower))


def _one_sided(distance: float, sd: float, n: int) -> tuple[float, float]:
    """p-values of H0 "at most" and "at least" for a mean `distance` from the edge (exact where sd = 0)."""
    if sd == 0:
        return (0.0, 1.0) if distance > 0 else (1.0, 0.0) if distance < 0 else (1.0, 1.0)
    t = distance / (sd / math.sqrt(n))
    return float(stats.t.sf(t, n - 1)), float(stats.t.cdf(t, n - 1))


def _pooled_sds(
    pairs: Sequence[Pair], tested: Sequence[Mapping]
) -> list[tuple[float, float, float, int] | None]:
    """Each pair's planning sd: the paired sd pooled over its like pairs (`Pair.like`) with its 95 % interval
    (chi-square) and degrees of freedom, or None where no pair of its kind has 2 seeds."""
    sums: dict[tuple, list[float]] = {}
    for pair, t in zip(pairs, tested, strict=True):
        if t["seeds"] >= 2:
            total = sums.setdefault(pair.like, [0.0, 0])
            total[0] += (t["seeds"] - 1) * t["sd"] ** 2
            total[1] += t["seeds"] - 1
    pooled: list[tuple[float, float, float, int] | None] = []
    for pair in pairs:
        if pair.like not in sums:
            pooled.append(None)
            continue
        squares, df = sums[pair.like]
        sd = math.sqrt(squares / df)
        pooled.append((sd, *sd_interval(sd, df), int(df)))
    return pooled


def sd_interval(sd: float, df: int) -> tuple[float, float]:
    """The 95 % interval of a standard deviation estimated with `df` degrees of freedom (chi-square)."""
    return (
        sd * math.sqrt(df / stats.chi2.ppf(1 - ALPHA / 2, df)),
        sd * math.sqrt(df / stats.chi2.ppf(ALPHA / 2, df)),
    )


def _seeds_needed(
    pair: Pair, t: Mapping, alpha: float, pooled: tuple[float, float, float, int] | None
) -> tuple[float | None, int | None, tuple[int | None, int | None] | None]:
    """The effect the plan is at, and the seeds that would decide the comparison at it at the planning sd and
    over its interval: the stated effect where there is one, else the observed difference where it lies a
    standard error or more from the margin's edge, else 0 where a margin is declared (None with fewer than 2
    seeds, no spread, or nothing to plan at)."""
    if t["seeds"] < 2 or pooled is None or not pooled[0] > 0:
        return None, None, None
    effect = pair.effect
    if effect is None:  # exploratory: at the observed difference where the seeds place it off the edge
        standard_error = t["sd"] / math.sqrt(t["seeds"])
        supported = _distance(pair, t["difference"]) >= standard_error
        effect = t["difference"] if supported else 0.0 if pair.margin is not None else None
    route = None if effect is None else _route_at(pair, effect)
    if effect is None or route is None:
        return None, None, None

    def needed(sd: float) -> int | None:
        return _route_seeds(pair, effect, sd, alpha, route)

    return effect, needed(pooled[0]), (needed(pooled[1]), needed(pooled[2]))


def _distance(pair: _Spec, effect: float) -> float:
    """How far `effect` lies from the edge between the comparison's two conclusions."""
    margin = pair.margin or 0.0
    if pair.one_sided:
        good = effect if pair.higher_is_better else -effect
        return abs(good - (-margin if pair.test == NON_INFERIORITY else margin))
    return abs(abs(effect) - margin)


def _route_at(pair: _Spec, effect: float) -> int | None:
    """The route (0 beyond the margin, 1 inside it) a true difference `effect` would decide by; None at the
    edge between them, where no seed count decides."""
    if _distance(pair, effect) == 0:
        return None
    margin = pair.margin or 0.0
    if pair.one_sided:
        good = effect if pair.higher_is_better else -effect
        above = good > (-margin if pair.test == NON_INFERIORITY else margin)
        return int(above) if pair.test == NON_INFERIORITY else int(not above)
    if pair.margin is None:
        return 0
    return int(abs(effect) < margin)


def planned_seeds(spec: _Spec, effect: float, sd: float, tests: int) -> int | None:
    """The seeds at which a comparison's test reaches the conclusion a true difference `effect` implies with
    POWER at ALPHA over `tests` comparisons (Holm's first step), were `sd` the paired sd (None: none up to
    MAX_SEEDS, or the effect on the margin's edge)."""
    route = _route_at(spec, effect)
    return None if route is None else _route_seeds(spec, effect, sd, ALPHA / max(tests, 1), route)


def _route_power(pair: _Spec, difference: float, sd: float, alpha: float, route: int, n: int) -> float:
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


def _route_seeds(pair: _Spec, difference: float, sd: float, alpha: float, route: int) -> int | None:
    if _route_power(pair, difference, sd, alpha, route, MAX_SEEDS) < POWER:
        return None
    return _smallest_n(lambda n: _route_power(pair, difference, sd, alpha, route, n))


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
    """The true difference the paired t-test (two-sided, ALPHA, unadjusted) finds with POWER."""
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
    """Seeds at which the TOST at `margin` has POWER, were the true difference `difference`."""
    return _smallest_n(lambda n: tost_power(n, margin / sd, difference / sd))


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
