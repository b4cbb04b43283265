"""Statistics for timings: robust summaries, a distribution-free median interval, A/B ratios.

Timings are skewed (a floor set by the hardware, a long tail from everything else running), so
everything here is rank based: the median and its order-statistic interval, quartiles for the
outlier fences, and a bootstrap of the ratio of medians, none of which assumes normality.

>>> s = summarize([1.0, 1.1, 0.9, 1.2, 1.0, 5.0, 1.05, 0.95])
>>> s.median, s.outliers
(1.025, (5.0,))
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
OUTLIER_RULE = "Tukey fences: below Q1 - 1.5 IQR or above Q3 + 1.5 IQR (linear quartiles)"
_BOOTSTRAP_CHUNK = 1 << 22  # values drawn per chunk: bounds memory for long samples


def _as_sample(values: Sequence[float] | np.ndarray, what: str = "sample") -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError(f"{what}: no values to summarize")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: contains NaN or infinite values")
    return x


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int, float]:
    """1-based ranks ``(j, k)`` such that ``[x(j), x(k)]`` covers the population median with
    probability at least ``confidence``, and that probability.

    The number of observations below the median is Binomial(n, 1/2) whatever the distribution
    (continuous), so ``P(x(j) <= median < x(k)) = P(j <= B <= k - 1)``. The ranks are symmetric
    and as tight as the confidence allows. For small n no such pair exists (n < 6 at 95 %):
    then it is ``(1, n)`` and the returned coverage, below ``confidence``, says so.
    """
    if n < 1:
        raise ValueError(f"median interval: need at least one value, got n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    # log C(n, i) by the recursion C(n, i+1) = C(n, i) (n - i) / (i + 1): no overflow for the
    # long samples of pooled step times (2**n overflows a float from n = 1024).
    i = np.arange(n, dtype=np.float64)
    log_comb = np.concatenate([[0.0], np.cumsum(np.log(n - i) - np.log(i + 1))])
    cdf = np.cumsum(np.exp(log_comb - n * math.log(2)))
    j = np.arange(1, (n + 1) // 2 + 1)
    coverage = cdf[n - j] - cdf[j - 1]  # P(j <= B <= n - j), falling as j grows
    ok = np.flatnonzero(coverage >= confidence)
    best = int(ok[-1]) if ok.size else 0
    return int(j[best]), n - int(j[best]) + 1, float(min(1.0, coverage[best]))


def median_ci(values: Sequence[float] | np.ndarray,
              confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(low, high, coverage)``: the order-statistic interval of the median (see
    ``median_ci_ranks``); coverage is the exact binomial probability, not a nominal one."""
    x = np.sort(_as_sample(values))
    j, k, cover = median_ci_ranks(x.size, confidence)
    return float(x[j - 1]), float(x[k - 1]), cover


def tukey_fences(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """``(low, high)`` fences: Q1 - 1.5 IQR and Q3 + 1.5 IQR."""
    q1, q3 = np.percentile(_as_sample(values), [25, 75])
    iqr = q3 - q1
    return float(q1 - 1.5 * iqr), float(q3 + 1.5 * iqr)


def tukey_outliers(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Indices of the values outside the Tukey fences, in sample order."""
    x = _as_sample(values)
    low, high = tukey_fences(x)
    return np.flatnonzero((x < low) | (x > high))


@dataclass(frozen=True)
class Summary:
    """A sample's robust summary; the interval is for the median at ``ci_coverage``."""

    n: int
    min: float
    median: float
    max: float
    ci_low: float
    ci_high: float
    ci_coverage: float
    mean: float
    std: float
    cv: float  # std / mean: run-to-run noise relative to the size of the quantity
    q1: float
    q3: float
    outliers: tuple[float, ...]
    outlier_rule: str = OUTLIER_RULE

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        d = asdict(self)
        d["outliers"] = list(self.outliers)
        return d

    def scaled(self, factor: float) -> Summary:
        """The same summary in other units (seconds to milliseconds: ``factor=1e3``)."""
        keys = ("min", "median", "max", "ci_low", "ci_high", "mean", "std", "q1", "q3")
        d = self.to_dict() | {k: getattr(self, k) * factor for k in keys}
        d["outliers"] = tuple(v * factor for v in self.outliers)
        return Summary(**d)


def summarize(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Summary:
    """Min, median with its order-statistic interval, max, quartiles, CV and Tukey outliers."""
    x = _as_sample(values)
    low, high, cover = median_ci(x, confidence)
    q1, q3 = np.percentile(x, [25, 75])
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    return Summary(
        n=int(x.size), min=float(x.min()), median=float(np.median(x)), max=float(x.max()),
        ci_low=low, ci_high=high, ci_coverage=cover, mean=mean, std=std,
        cv=std / mean if mean else math.nan, q1=float(q1), q3=float(q3),
        outliers=tuple(float(v) for v in x[tukey_outliers(x)]))


def _bootstrap_medians(x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    out = np.empty(resamples)
    chunk = max(1, _BOOTSTRAP_CHUNK // x.size)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        out[start:stop] = np.median(x[idx], axis=1)
    return out


@dataclass(frozen=True)
class Ratio:
    """``median(b) / median(a)`` with a percentile-bootstrap interval.

    For times, a ratio above 1 means B is slower; ``contains(1.0)`` asks whether the data can
    tell the variants apart at this confidence.
    """

    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    resamples: int
    seed: int
    method: str = "percentile bootstrap of the ratio of medians, a and b resampled independently"

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies within the interval (1.0 inside: no difference shown)."""
        return self.ci_low <= value <= self.ci_high

    def to_dict(self) -> dict[str, Any]:
        """The ratio as a JSON-ready dict."""
        return asdict(self)


def ratio_of_medians(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                     resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                     seed: int = 0) -> Ratio:
    """``median(b) / median(a)`` and its bootstrap interval, reproducible through ``seed``."""
    xa, xb = _as_sample(a, "variant A"), _as_sample(b, "variant B")
    if np.median(xa) <= 0 or np.any(xa <= 0):
        raise ValueError("ratio of medians: variant A must be positive (a time, a rate)")
    if resamples < 100:
        raise ValueError(f"ratio of medians: {resamples} resamples are too few for a "
                         f"{confidence:.0%} interval; use at least 100")
    rng = np.random.default_rng(seed)
    ratios = _bootstrap_medians(xb, resamples, rng) / _bootstrap_medians(xa, resamples, rng)
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return Ratio(float(np.median(xb) / np.median(xa)), float(low), float(high), confidence,
                 resamples, seed)


def _two_stage_medians(runs: list[np.ndarray], resamples: int,
                       rng: np.random.Generator) -> np.ndarray:
    out = np.empty(resamples)
    sizes = {r.size for r in runs}
    if len(sizes) == 1:  # the usual case (runs of one recipe): all resamples at once
        stacked, n = np.stack(runs), sizes.pop()
        chunk = max(1, _BOOTSTRAP_CHUNK // stacked.size)
        for start in range(0, resamples, chunk):
            m = min(resamples, start + chunk) - start
            picked = rng.integers(0, len(runs), size=(m, len(runs), 1))
            values = stacked[picked, rng.integers(0, n, size=(m, len(runs), n))]
            out[start : start + m] = np.median(values.reshape(m, -1), axis=1)
        return out
    for r in range(resamples):
        picked = rng.integers(0, len(runs), size=len(runs))
        out[r] = np.median(np.concatenate(
            [runs[k][rng.integers(0, runs[k].size, size=runs[k].size)] for k in picked]))
    return out


def ratio_of_medians_by_run(a_runs: Sequence[Sequence[float]],
                            b_runs: Sequence[Sequence[float]], resamples: int = RESAMPLES,
                            confidence: float = CONFIDENCE, seed: int = 0) -> Ratio:
    """Like ``ratio_of_medians`` for values that come in runs (the steps of a training run):
    a two-stage bootstrap resamples the runs, then the values within each drawn run.

    Steps of one run share its luck (a core shared with another job slows all of them), so
    resampling steps alone gives an interval that is too narrow when runs differ; resampling
    runs first carries the run-to-run spread into the interval. With one run per variant it
    is the plain bootstrap of the values.
    """
    runs = {}
    for side, given in (("A", a_runs), ("B", b_runs)):
        if not given:
            raise ValueError(f"variant {side}: no runs to compare")
        runs[side] = [_as_sample(r, f"variant {side}, run {i + 1}") for i, r in enumerate(given)]
    point = ratio_of_medians(np.concatenate(runs["A"]), np.concatenate(runs["B"]), 100,
                             confidence, seed)  # also checks positivity and resamples
    if resamples < 100:
        raise ValueError(f"ratio of medians: {resamples} resamples are too few for a "
                         f"{confidence:.0%} interval; use at least 100")
    rng = np.random.default_rng(seed)
    ratios = _two_stage_medians(runs["B"], resamples, rng) / \
        _two_stage_medians(runs["A"], resamples, rng)
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return Ratio(point.ratio, float(low), float(high), confidence, resamples, seed,
                 "two-stage percentile bootstrap of the ratio of medians: runs resampled, then "
                 "values within each run; a and b independently")
