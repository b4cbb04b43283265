"""Timing callables: warm-up, then N measurements, each from fresh state, variants interleaved.

A measurement times one call with ``time.perf_counter_ns``. Whatever the call needs (a fresh
operator context, the saved activations of a forward pass) comes from ``setup``, run untimed
before every measurement, so no measurement inherits state from the previous one. Variants
take turns (A, B, A, B, ...) so that a slow minute of the machine hits them alike, and the
garbage collector is off during the timed call, as in ``timeit``, so that one variant does not
pay for the other's garbage.

>>> samples = measure_many({"sum": Variant(lambda x: x.sum(), lambda: (np.ones(1000),))},
...                        repeat=5, warmup=1)
>>> samples["sum"].summary().n
5
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from meta.bench.stats import Summary, summarize


def _no_arguments() -> tuple:
    """No arguments: the default ``setup`` of a ``Variant``."""
    return ()


@dataclass(frozen=True)
class Variant:
    """What to time (``run(*setup())``) and how to prepare each call (``setup``, untimed)."""

    run: Callable[..., Any]
    setup: Callable[[], tuple] = _no_arguments


@dataclass
class Sample:
    """The timings of one variant, in nanoseconds, in the order they were taken."""

    name: str
    times_ns: list[int] = field(default_factory=list)

    @property
    def seconds(self) -> np.ndarray:
        """The timings in seconds, as a float64 array."""
        return np.asarray(self.times_ns, dtype=np.float64) * 1e-9

    def summary(self) -> Summary:
        """Median, bootstrap interval, spread and outliers of the timings
        (``meta.bench.stats.summarize``)."""
        return summarize(self.seconds)


def time_once(variant: Variant) -> int:
    """Nanoseconds of one call of ``variant.run`` on a fresh ``variant.setup()``."""
    args = variant.setup()
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        variant.run(*args)
        return time.perf_counter_ns() - start
    finally:
        if enabled:
            gc.enable()


def measure_many(variants: Mapping[str, Variant], repeat: int = 30,
                 warmup: int = 3) -> dict[str, Sample]:
    """Each variant's ``repeat`` timings after ``warmup`` untimed calls, variants interleaved."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0, got repeat={repeat}, "
                         f"warmup={warmup}")
    if not variants:
        raise ValueError("nothing to measure: no variants given")
    for _ in range(warmup):
        for variant in variants.values():
            time_once(variant)
    samples = {name: Sample(name) for name in variants}
    for _ in range(repeat):
        for name, variant in variants.items():
            samples[name].times_ns.append(time_once(variant))
    return samples


def measure(run: Callable[..., Any], repeat: int = 30, warmup: int = 3,
            setup: Callable[[], tuple] = _no_arguments) -> Sample:
    """Time ``run(*setup())`` ``repeat`` times after ``warmup`` untimed calls."""
    name = getattr(run, "__name__", "callable")
    return measure_many({name: Variant(run, setup)}, repeat, warmup)[name]
