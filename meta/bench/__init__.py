"""Reproducible benchmarking: timing with statistics, environment records, A/B reports.

Sits beside the four levels, above them: it times operators (Level 0) and whole recipes (through
``meta.run.runner``) and needs nothing from them in return.

>>> import numpy as np
>>> from meta.bench import measure, ratio_of_medians
>>> a = measure(lambda: np.ones(10_000).sum(), repeat=20, warmup=2)
>>> b = measure(lambda: np.ones(10_000).sum(), repeat=20, warmup=2)
>>> s = a.summary()
>>> s.n, s.ci_low <= s.median <= s.ci_high
(20, True)
>>> r = ratio_of_medians(a.seconds, b.seconds, seed=0)  # B's median over A's, with a 95 % CI
"""

from meta.bench.environment import environment, recipe_hash, recipe_record
from meta.bench.events import StepTimer
from meta.bench.measure import Sample, Variant, measure, measure_many
from meta.bench.opbench import OpBenchError, bench_op
from meta.bench.recipes import RecipeBench, RecipeVariant
from meta.bench.stats import (
    Ratio,
    Summary,
    median_ci,
    median_ci_ranks,
    ratio_of_medians,
    ratio_of_medians_by_run,
    summarize,
    tukey_fences,
    tukey_outliers,
)

__all__ = [
    "OpBenchError",
    "Ratio",
    "RecipeBench",
    "RecipeVariant",
    "Sample",
    "StepTimer",
    "Summary",
    "Variant",
    "bench_op",
    "environment",
    "measure",
    "measure_many",
    "median_ci",
    "median_ci_ranks",
    "ratio_of_medians",
    "ratio_of_medians_by_run",
    "recipe_hash",
    "recipe_record",
    "summarize",
    "tukey_fences",
    "tukey_outliers",
]
