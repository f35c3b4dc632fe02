"""Numbers over seeds: each measured once per seed, reported as an `Estimate` (mean, spread, 95 % interval).

Every experiment measures per seed first (a `PerSeed` record: row keys -> quantity -> seed -> value) and
aggregates once (`PerSeed.rows`), so that one rule makes every interval. Intervals are Student-t intervals of
the mean; for a bounded quantity (a fraction, a cosine, a correlation, a variance) the interval is computed
on a scale where the quantity is unbounded (logit, Fisher z, log) and mapped back, so that it stays inside
its bounds. Estimates cross from the compute step to figures and summaries as table columns
`<name>_mean`, `_sd`, `_ci_low`, `_ci_high`, `_n`: `Estimate.columns` writes them, `Estimate.read` reads them
back, and nothing else parses those names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

ALPHA = 0.05  # every interval is a 95 % interval; every test is at this level
FIELDS = ("mean", "sd", "ci_low", "ci_high", "n")


@dataclass(frozen=True)
class Bounds:
    """The range a quantity lives in, and the map to an unbounded scale its interval is computed on (logit
    between two finite bounds, log above one, identity for none)."""

    low: float = -math.inf
    high: float = math.inf

    def _unit(self, values: np.ndarray) -> np.ndarray:
        """Values moved a hair inside the bounds, so that a value on a bound maps to a finite number."""
        span = self.high - self.low if math.isfinite(self.high - self.low) else 1.0
        eps = 1e-9 * span
        return np.clip(values, self.low + eps, self.high - eps)

    def forward(self, values: np.ndarray) -> np.ndarray:
        values = self._unit(np.asarray(values, dtype=np.float64))
        if math.isfinite(self.low) and math.isfinite(self.high):
            u = (values - self.low) / (self.high - self.low)
            return np.log(u) - np.log1p(-u)
        if math.isfinite(self.low):
            return np.log(values - self.low)
        if math.isfinite(self.high):
            return -np.log(self.high - values)
        return values

    def backward(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if math.isfinite(self.low) and math.isfinite(self.high):
            return self.low + (self.high - self.low) * (1 / (1 + np.exp(-values)))
        if math.isfinite(self.low):
            return self.low + np.exp(values)
        if math.isfinite(self.high):
            return self.high - np.exp(-values)
        return values

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) or math.isfinite(self.high)


LINEAR = Bounds()
FRACTION = Bounds(0.0, 1.0)  # accuracies, sparsities, shares, KS statistics
CORRELATION = Bounds(-1.0, 1.0)  # correlations and cosine similarities
POSITIVE = Bounds(0.0)  # variances, MSEs, ratios


@dataclass(frozen=True)
class Estimate:
    """Mean over seeds, sample standard deviation, 95 % confidence interval of the mean, seed count."""

    mean: float
    sd: float
    ci_low: float
    ci_high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None], bounds: Bounds = LINEAR) -> Estimate:
        """The estimate of `values` (None left out). A bounded quantity's interval is the t-interval on the
        unbounded scale of its `bounds`, mapped back (and widened, if need be, to hold the mean)."""
        data = np.asarray([value for value in values if value is not None], dtype=np.float64)
        data = data[np.isfinite(data)]
        n = int(data.size)
        if n == 0:
            return cls(math.nan, math.nan, math.nan, math.nan, 0)
        mean = float(data.mean())
        if n < 2:
            return cls(mean, math.nan, math.nan, math.nan, 1)
        sd = float(data.std(ddof=1))
        t = float(stats.t.ppf(1 - ALPHA / 2, n - 1))
        scaled = bounds.forward(data)
        centre, half = float(scaled.mean()), t * float(scaled.std(ddof=1)) / math.sqrt(n)
        low, high = (float(v) for v in bounds.backward(np.array([centre - half, centre + half])))
        return cls(mean, sd, min(low, mean), max(high, mean), n)

    def columns(self, name: str) -> dict[str, float | int]:
        """The table columns <name>_mean, _sd, _ci_low, _ci_high, _n."""
        return {f"{name}_{key}": value for key, value in asdict(self).items()}

    @classmethod
    def read(cls, row: Mapping[str, Any], name: str) -> Estimate | None:
        """The estimate `columns(name)` wrote into `row` (None where the row has none); a missing number
        (null in JSON) reads as NaN."""
        if f"{name}_mean" not in row:
            return None
        values = {key: row.get(f"{name}_{key}") for key in FIELDS}
        n = values.pop("n")
        numbers = {key: math.nan if value is None else float(value) for key, value in values.items()}
        return cls(**numbers, n=int(n) if n is not None else int(math.isfinite(numbers["mean"])))

    @staticmethod
    def names(row: Mapping[str, Any]) -> list[str]:
        """The estimates a row holds, in column order."""
        return [key[: -len("_mean")] for key in row if key.endswith("_mean") and f"{key[:-5]}_n" in row]

    @property
    def interval(self) -> tuple[float, float] | None:
        return None if math.isnan(self.ci_low) else (self.ci_low, self.ci_high)

    def text(self, factor: float = 1.0, unit: str = "") -> str:
        """e.g. "0.853 [0.84, 0.866]" (times `factor`), "0.85 (1 seed)" or "n/a"."""
        if self.n == 0:
            return "n/a"
        unit = f" {unit}" if unit else ""
        mean = number(factor * self.mean)
        if self.interval is None:
            return f"{mean}{unit} (1 seed)"
        return f"{mean}{unit} [{number(factor * self.ci_low)}, {number(factor * self.ci_high)}]"


def number(value: float | None, digits: int = 3) -> str:
    """A number for tables and sentences: `digits` significant digits, no exponent for ordinary sizes."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        text = f"{value:.{digits}g}"
        return text if "e" not in text else f"{value:.0f}"
    return f"{value:.{digits - 1}e}"


class PerSeed:
    """Per-seed measurements of an experiment, one row per key: `add` records a seed's values, `rows` gives
    one table row per key with every quantity as an `Estimate` over the seeds, and `values` gives one
    quantity's seed -> value map (for paired comparisons)."""

    def __init__(self, keys: Sequence[str], bounds: Mapping[str, Bounds] | None = None) -> None:
        self.keys = tuple(keys)
        self.bounds = dict(bounds or {})
        self._values: dict[tuple, dict[str, dict[int, float]]] = {}

    def add(self, seed: int, key: Mapping[str, Any], **values: float | None) -> None:
        """Record one seed's `values` for the row `key` (a mapping of the key columns); None is left out."""
        cells = self._values.setdefault(tuple(key[name] for name in self.keys), {})
        for name, value in values.items():
            if value is not None:
                cells.setdefault(name, {})[seed] = float(value)

    def values(self, key: Mapping[str, Any], name: str) -> dict[int, float]:
        return dict(self._values.get(tuple(key[k] for k in self.keys), {}).get(name, {}))

    def __len__(self) -> int:
        return len(self._values)

    def rows(self) -> list[dict[str, Any]]:
        """One row per key (in order of first `add`): the key columns, each quantity's estimate columns
        (over the seeds that measured it) and `seeds`, the most seeds any quantity of the row has."""
        rows = []
        for key, quantities in self._values.items():
            row: dict[str, Any] = dict(zip(self.keys, key, strict=True))
            for name, by_seed in quantities.items():
                row |= Estimate.of(by_seed.values(), self.bounds.get(name, LINEAR)).columns(name)
            row["seeds"] = max((len(by_seed) for by_seed in quantities.values()), default=0)
            rows.append(row)
        return rows


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float, int]:
    """Spearman's rank correlation of paired values with its 95 % interval (Fisher z with the standard
    error sqrt(1.06 / (n - 3)) of Fieller et al.), which stays inside [-1, 1]: (rho, low, high, n); NaNs
    where n < 4."""
    n = len(x)
    if n < 4:
        return math.nan, math.nan, math.nan, n
    rho = float(stats.spearmanr(x, y).statistic)
    z, half = math.atanh(max(-0.999999, min(0.999999, rho))), 1.96 * math.sqrt(1.06 / (n - 3))
    return rho, math.tanh(z - half), math.tanh(z + half), n
