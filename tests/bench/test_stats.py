"""The statistics: interval coverage on known distributions, ratio intervals, the outlier rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meta.bench.stats import (
    median_ci,
    median_ci_ranks,
    ratio_of_medians,
    ratio_of_medians_by_run,
    summarize,
    tukey_fences,
    tukey_outliers,
)


@pytest.mark.parametrize("draw,true_median", [
    (lambda rng, n: rng.exponential(size=n), math.log(2)),
    (lambda rng, n: rng.lognormal(0.0, 1.0, size=n), 1.0),
    (lambda rng, n: rng.uniform(3.0, 4.0, size=n), 3.5),
])
def test_median_interval_covers_the_true_median_at_the_stated_rate(draw, true_median):
    rng = np.random.default_rng(2024)
    trials = 1000
    hits = 0
    for _ in range(trials):
        low, high, coverage = median_ci(draw(rng, 30))
        hits += low <= true_median <= high
    assert coverage == pytest.approx(0.9572, abs=1e-4)  # exact binomial, n = 30
    assert 0.92 <= hits / trials <= 0.98


def test_interval_ranks_are_the_binomial_order_statistics():
    assert median_ci_ranks(30)[:2] == (10, 21)
    assert median_ci_ranks(100)[:2] == (40, 61)  # the textbook pair for n = 100
    # Below n = 6 no pair reaches 95 %: the whole range, with its honest (lower) coverage.
    assert median_ci_ranks(5) == (1, 5, pytest.approx(0.9375))
    j, k, coverage = median_ci_ranks(6)
    assert (j, k) == (1, 6) and coverage >= 0.95
    assert median_ci_ranks(1) == (1, 1, 0.0)


def test_interval_ranks_for_long_samples():
    # Pooled step times run to many thousands: no overflow, and the normal approximation's
    # n/2 -+ 1.96 sqrt(n)/2 ranks agree.
    n = 100_000
    j, k, coverage = median_ci_ranks(n)
    assert abs(j - (n / 2 - 1.96 * n**0.5 / 2)) <= 2 and k == n - j + 1
    assert 0.95 <= coverage < 0.951


def test_summary_fields():
    values = [3.0, 1.0, 2.0, 4.0, 100.0, 2.5, 3.5]
    s = summarize(values)
    assert (s.n, s.min, s.median, s.max) == (7, 1.0, 3.0, 100.0)
    assert s.ci_low <= s.median <= s.ci_high
    assert s.outliers == (100.0,)
    assert s.cv == pytest.approx(np.std(values, ddof=1) / np.mean(values))
    assert "Tukey" in s.outlier_rule and "1.5 IQR" in s.outlier_rule
    ms = s.scaled(1e3)
    assert ms.median == 3000.0 and ms.outliers == (100000.0,) and ms.cv == s.cv


def test_tukey_fences_on_a_known_sample():
    x = [*range(1, 11), 100]  # quartiles 3.5 and 8.5, IQR 5: fences -4 and 16
    assert tukey_fences(x) == (-4.0, 16.0)
    assert tukey_outliers(x).tolist() == [10]
    assert tukey_outliers([*range(1, 11), -20, 16]).tolist() == [10]  # 16 sits on the fence


def test_ratio_of_identical_variants_contains_one():
    rng = np.random.default_rng(7)
    a = rng.exponential(size=40) + 1.0
    same = ratio_of_medians(a, a.copy(), seed=3)
    assert same.ratio == 1.0 and same.contains(1.0)
    hits = sum(ratio_of_medians(rng.exponential(size=30), rng.exponential(size=30),
                                resamples=1000, seed=t).contains(1.0) for t in range(200))
    assert hits / 200 >= 0.9  # two draws of one distribution: 1 is covered ~95 % of the time


def test_ratio_detects_a_real_difference_and_is_reproducible():
    rng = np.random.default_rng(11)
    a = rng.lognormal(0.0, 0.1, size=50)
    b = 1.5 * rng.lognormal(0.0, 0.1, size=50)
    r = ratio_of_medians(a, b, seed=5)
    assert not r.contains(1.0) and r.contains(1.5) and r.ci_low < r.ratio < r.ci_high
    assert r == ratio_of_medians(a, b, seed=5)
    assert (r.resamples, r.confidence) == (2000, 0.95)


def test_ratio_by_run_carries_the_spread_between_runs():
    # Each run has its own level (a busy core slows all its steps): steps alone understate
    # the uncertainty, runs then steps do not.
    rng = np.random.default_rng(5)

    def runs() -> list[np.ndarray]:
        return [1 + rng.exponential() * 0.5 + 0.2 * rng.exponential(size=30) for _ in range(5)]

    by_run = steps_only = 0
    trials = 60
    for t in range(trials):
        a, b = runs(), runs()
        by_run += ratio_of_medians_by_run(a, b, resamples=500, seed=t).contains(1.0)
        steps_only += ratio_of_medians(np.concatenate(a), np.concatenate(b), resamples=500,
                                       seed=t).contains(1.0)
    assert by_run / trials >= 0.85 and steps_only / trials <= 0.7


def test_ratio_by_run_of_identical_runs_and_of_uneven_runs():
    rng = np.random.default_rng(8)
    a = [rng.exponential(size=20) + 1 for _ in range(3)]
    same = ratio_of_medians_by_run(a, [r.copy() for r in a], seed=2)
    assert same.ratio == 1.0 and same.contains(1.0) and same.method.startswith("two-stage")
    uneven = ratio_of_medians_by_run(a, [a[0][:5], a[1], a[2][:12]], seed=2)  # the slow path
    assert uneven.ci_low <= uneven.ratio <= uneven.ci_high
    with pytest.raises(ValueError, match="variant B: no runs"):
        ratio_of_medians_by_run(a, [])


@pytest.mark.parametrize("values,message", [
    ([], "no values"),
    ([1.0, float("nan")], "NaN"),
])
def test_bad_samples_are_named(values, message):
    with pytest.raises(ValueError, match=message):
        summarize(values)


def test_ratio_refuses_too_few_resamples_and_non_positive_baselines():
    with pytest.raises(ValueError, match="too few"):
        ratio_of_medians([1.0, 2.0], [1.0, 2.0], resamples=10)
    with pytest.raises(ValueError, match="variant A must be positive"):
        ratio_of_medians([0.0, 1.0], [1.0, 2.0])
