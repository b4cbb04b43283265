"""Running whole recipes repeatedly: each run built from scratch, variants interleaved.

Every run gets a new ``RecipeRun`` (fresh network, optimizer state and sampler), so runs share
nothing but the in-memory dataset cache. A ``StepTimer`` attached to the trainer records step
times and losses. Step times of a run are not independent of each other (a run that landed on
a busy core is slow throughout), so the report keeps, besides the pooled steps, each run's
median step and wall time: with ``--repeat`` the spread across runs is visible too.
"""

from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, TextIO

import numpy as np

from meta.bench.events import StepTimer
from meta.run.recipe import Recipe

SKIP_STEPS = 3  # first steps of each run: caches and BLAS buffers still warming up


def dir_name(name: str) -> str:
    """A variant name made safe as a folder name (``hidden=[32]`` -> ``hidden=_32``)."""
    return re.sub(r"[^A-Za-z0-9=._,-]+", "_", name).strip("_") or "variant"


@dataclass(frozen=True)
class RecipeVariant:
    """One side of a comparison: a validated recipe and where it came from."""

    name: str
    recipe: Recipe
    path: Path
    overrides: Mapping[str, str] = field(default_factory=dict)


@dataclass
class RunRecord:
    """What one training run left: its timings, curves and final metrics."""

    wall_s: float
    step_ns: list[int]
    step_loss: list[float]
    epochs: list[dict[str, Any]]
    metrics: dict[str, float]
    passed: bool

    def step_seconds(self, skip: int = SKIP_STEPS) -> np.ndarray:
        """Step times without the first ``skip`` (all of them if the run is shorter)."""
        steps = self.step_ns[skip:] if len(self.step_ns) > skip else self.step_ns
        return np.asarray(steps, dtype=np.float64) * 1e-9

    def to_dict(self, skip: int = SKIP_STEPS) -> dict[str, Any]:
        """The run as report.json holds it; the first ``skip`` steps are left out of the median step
        time (warm-up)."""
        return {"wall_s": self.wall_s, "passed": self.passed, "metrics": self.metrics,
                "median_step_s": float(np.median(self.step_seconds(skip))),
                "step_time_s": [t * 1e-9 for t in self.step_ns],
                "step_loss": self.step_loss, "epochs": self.epochs}


@dataclass
class VariantRuns:
    variant: RecipeVariant
    runs: list[RunRecord] = field(default_factory=list)

    def step_seconds(self, skip: int = SKIP_STEPS) -> np.ndarray:
        """Every run's step times after its first ``skip``, pooled."""
        return np.concatenate([r.step_seconds(skip) for r in self.runs])

    def metric_values(self) -> dict[str, list[float]]:
        """Each final metric's value in every run (for its interval across runs)."""
        keys = dict.fromkeys(k for r in self.runs for k in r.metrics)
        return {k: [r.metrics[k] for r in self.runs if k in r.metrics] for k in keys}

    def final_metrics(self) -> dict[str, float]:
        """Median over runs of each final metric (equal in every run when training is
        deterministic; train time is not)."""
        keys = dict.fromkeys(k for r in self.runs for k in r.metrics)
        return {k: float(np.median([r.metrics[k] for r in self.runs if k in r.metrics]))
                for k in keys}


RunFactory = Callable[[RecipeVariant, Path], Any]  # -> a RecipeRun


def default_factory(comm: Any, stream: TextIO | None) -> RunFactory:
    """RecipeRuns that print to ``stream`` (None: nowhere) and export no ONNX."""
    from meta.run.runner import RecipeRun

    def make(variant: RecipeVariant, output_dir: Path) -> Any:
        return RecipeRun(variant.recipe, comm, stream=stream or io.StringIO(),
                         output_dir=output_dir, progress=False, export_onnx=False)

    return make


def run_once(run: Any) -> RunRecord:
    """Execute a prepared RecipeRun with a StepTimer attached."""
    timer = StepTimer().attach(run.trainer)
    start = time.perf_counter_ns()
    outcome = run.execute()
    wall = (time.perf_counter_ns() - start) * 1e-9
    return RunRecord(wall, timer.step_ns, timer.step_loss, timer.epochs,
                     dict(outcome.metrics), outcome.passed)


class RecipeBench:
    """Runs each variant ``repeat`` times after ``warmup`` discarded runs, taking turns."""

    def __init__(self, variants: list[RecipeVariant], factory: RunFactory, output_dir: Path,
                 repeat: int = 3, warmup: int = 0,
                 progress: Callable[[str], None] | None = None) -> None:
        if repeat < 1 or warmup < 0:
            raise ValueError(f"need --repeat >= 1 and --warmup >= 0, got {repeat}, {warmup}")
        names = [v.name for v in variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must differ, got {names}")
        self.variants, self.factory, self.output_dir = variants, factory, Path(output_dir)
        self.repeat, self.warmup = repeat, warmup
        self.progress = progress or (lambda line: None)

    def _dir(self, variant: RecipeVariant) -> Path:
        if len(self.variants) == 1:
            return self.output_dir
        return self.output_dir / dir_name(variant.name)

    def run(self, first: Any = None) -> list[VariantRuns]:
        """All runs; ``first``, an already prepared RecipeRun of the first variant, is used for
        its first run (``meta run`` has built one to check the inputs)."""
        results = [VariantRuns(v) for v in self.variants]
        for index in range(-self.warmup, self.repeat):
            for result in results:
                variant = result.variant
                prepared = first if first is not None else self.factory(variant,
                                                                        self._dir(variant))
                first = None
                record = run_once(prepared)
                label = f"warm-up {index + self.warmup + 1}/{self.warmup}" if index < 0 \
                    else f"run {index + 1}/{self.repeat}"
                steps = record.step_seconds()  # none on a server rank, which does not print
                if steps.size:
                    self.progress(f"meta: {variant.name} {label}: {record.wall_s:.2f} s, median "
                                  f"step {np.median(steps) * 1e3:.3f} ms"
                                  + "".join(f", {k} {v:.4f}" for k, v in record.metrics.items()
                                            if k.startswith("test_")))
                if index >= 0:
                    result.runs.append(record)
        return results
