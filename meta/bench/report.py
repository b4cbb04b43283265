"""Benchmark reports: one JSON document (schema ``meta.bench/1``, in the README) and its table.

A report holds the environment record, the settings that shaped the statistics, one entry per
variant with its summaries and raw data, and the comparisons (ratios of medians with their
bootstrap intervals), so that a reader can recompute every figure from the file alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from meta.bench.recipes import SKIP_STEPS, VariantRuns
from meta.bench.stats import (
    CONFIDENCE,
    RESAMPLES,
    Ratio,
    Summary,
    ratio_of_medians_by_run,
    summarize,
)
from meta.common.files import write_text

SCHEMA = "meta.bench/1"
TABLE_METRICS = ("test_accuracy", "test_loss")


def settings(repeat: int, warmup: int, seed: int, resamples: int = RESAMPLES,
             skip_steps: int | None = None) -> dict[str, Any]:
    """The report's ``settings``: how it was measured (repeats, warm-up, bootstrap confidence,
    resamples, seed, timer)."""
    out = {"repeat": repeat, "warmup": warmup, "confidence": CONFIDENCE,
           "resamples": resamples, "seed": seed, "timer": "time.perf_counter_ns"}
    if skip_steps is not None:
        out["skip_steps"] = skip_steps
    return out


def comparison(baseline: str, candidate: str, quantity: str, ratio: Ratio) -> dict[str, Any]:
    """One entry of the report's ``comparisons``: ``median(candidate) / median(baseline)`` of
    ``quantity`` with its bootstrap interval."""
    return {"baseline": baseline, "candidate": candidate, "quantity": quantity,
            "ratio": f"median({candidate}) / median({baseline})", **ratio.to_dict()}


def recipe_report(kind: str, results: Sequence[VariantRuns], environment: Mapping[str, Any],
                  run_settings: Mapping[str, Any]) -> dict[str, Any]:
    """The report of ``meta run --repeat`` (kind "repeat") or ``meta compare`` ("compare")."""
    skip = run_settings.get("skip_steps", SKIP_STEPS)
    variants = []
    for result in results:
        v = result.variant
        variants.append({
            "name": v.name, "recipe": v.recipe.name,
            "definitions": v.recipe.definitions.as_dict(),
            "step_time_s": summarize(result.step_seconds(skip)).to_dict(),
            "run_time_s": summarize([r.wall_s for r in result.runs]).to_dict(),
            "final_metrics": result.final_metrics(),
            "final_metrics_ci": {k: summarize(vals).to_dict()
                                 for k, vals in result.metric_values().items()},
            "time_to": {k: reach_summary(t) for k, t in time_to(result).items()},
            "samples_per_s": throughput(result),
            "passed": all(r.passed for r in result.runs),
            "runs": [r.to_dict(skip) for r in result.runs]})
    comparisons = []
    for other in results[1:]:  # every variant against the first
        a = results[0]
        ratio = ratio_of_medians_by_run([r.step_seconds(skip) for r in a.runs],
                                        [r.step_seconds(skip) for r in other.runs],
                                        run_settings["resamples"], seed=run_settings["seed"])
        comparisons.append(comparison(a.variant.name, other.variant.name, "step_time_s", ratio))
    return {"schema": SCHEMA, "kind": kind, "environment": dict(environment),
            "settings": dict(run_settings), "variants": variants, "comparisons": comparisons}


def time_to(result: VariantRuns) -> dict[str, list[float]]:
    """Per bounded epoch metric of the recipe (test_accuracy >= 0.97, ...), each run's wall
    time until an epoch first met the bound (inf: never)."""
    out: dict[str, list[float]] = {}
    for key, threshold in result.variant.recipe.metrics.items():
        if not any(key in e for r in result.runs for e in r.epochs):
            continue
        out[key] = [next((e["elapsed_s"] for e in r.epochs
                          if key in e and threshold.accepts(e[key])), math.inf)
                    for r in result.runs]
    return out


def reach_summary(times: Sequence[float]) -> dict[str, Any]:
    """Times to a bound over runs: each run's (None: never reached), how many reached it, and
    over the runs that did the median (None when none did) and the usual summary. A run that
    never got there has no time to average in: counting it as infinite made the median of a
    variant whose one run of two missed ``inf``, though its other run was there in 9 s."""
    finite = [t for t in times if math.isfinite(t)]
    out: dict[str, Any] = {"runs_s": [t if math.isfinite(t) else None for t in times],
                           "reached": len(finite), "of": len(times),
                           "median": float(np.median(finite)) if finite else None}
    if finite:
        out["of_reached"] = summarize(finite).to_dict()
    return out


def reach_cell(reach: Mapping[str, Any]) -> str:
    """A table's time to a bound: the median over the runs that reached it, and how many did
    when not all: ``9.3``, ``9.3 (1 of 2 runs)``, ``never (0 of 2 runs)``."""
    if not reach["reached"]:
        return f"never (0 of {reach['of']} runs)"
    median = f"{reach['median']:.1f}"
    return median if reach["reached"] == reach["of"] else \
        f"{median} ({reach['reached']} of {reach['of']} runs)"


def throughput(result: VariantRuns) -> dict[str, Any]:
    """Training samples per second (each run's mean over its epochs), summarized over runs."""
    rates = [float(np.mean(r)) for r in ([e["samples_per_s"] for e in run.epochs
                                          if "samples_per_s" in e] for run in result.runs) if r]
    return summarize(rates).to_dict() if rates else {}


def write_json(report: Mapping[str, Any], path: Path) -> Path:
    """Write ``report`` as indented JSON to ``path`` atomically; returns the path."""
    return write_text(path, json.dumps(report, indent=1) + "\n")


def _ms(s: Summary | Mapping[str, Any]) -> tuple[str, str]:
    d = s.to_dict() if isinstance(s, Summary) else s
    return (f"{d['median'] * 1e3:.3f}",
            f"[{d['ci_low'] * 1e3:.3f}, {d['ci_high'] * 1e3:.3f}]")


def format_table(rows: list[list[str]]) -> str:
    """Rows of strings as an aligned text table, the first row its header.

            >>> print(format_table([["op", "us"], ["Relu", "1.5"]]))
            op     us
            ----  ---
            Relu  1.5
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             .rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_ratio(c: Mapping[str, Any], what: str) -> str:
    """A comparison (``comparison``'s dict) as one line: the ratio, its interval and the verdict
    (faster, slower, or no difference shown when the interval holds 1)."""
    kind = "two-stage " if c["method"].startswith("two-stage") else ""
    verdict = "no difference shown" if c["ci_low"] <= 1 <= c["ci_high"] else (
        f"{c['candidate']} {'slower' if c['ratio'] > 1 else 'faster'}")
    return (f"{what} {c['candidate']} / {c['baseline']}: {c['ratio']:.3f} "
            f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}] ({c['confidence']:.0%} {kind}bootstrap, "
            f"{c['resamples']} resamples, seed {c['seed']}): {verdict}")


def recipe_table(report: Mapping[str, Any]) -> str:
    """Median step time per variant with its interval, run time, final metrics, the ratio."""
    ci = f"{report['settings']['confidence']:.0%} CI"
    reached = list(dict.fromkeys(k for v in report["variants"] for k in v.get("time_to", {})))
    rows = [["variant", "runs", "steps", "median step ms", ci, "cv", "outliers",
             "run time s", "samples/s", *(f"time to {k} s" for k in reached), *TABLE_METRICS]]
    for v in report["variants"]:
        step, run = v["step_time_s"], v["run_time_s"]
        metrics = [f"{v['final_metrics'][k]:.4f}" if k in v["final_metrics"] else "-"
                   for k in TABLE_METRICS]
        times = [reach_cell(v["time_to"][k]) if k in v.get("time_to", {}) else "-"
                 for k in reached]
        throughput = v.get("samples_per_s", {}).get("median", math.nan)
        rows.append([v["name"], str(run["n"]), str(step["n"]), *_ms(step), f"{step['cv']:.2f}",
                     str(len(step["outliers"])), f"{run['median']:.2f}", f"{throughput:.0f}",
                     *times, *metrics])
    lines = [format_table(rows)]
    if any(r["reached"] < r["of"] for v in report["variants"] for r in v.get("time_to", {})
           .values()):
        lines.append("note: time to a bound is the median over the runs that reached it; "
                     "\"k of n runs\" says how many did")
    lines += [format_ratio(c, "median step time") for c in report["comparisons"]]
    lines += coverage_notes([v["step_time_s"] for v in report["variants"]],
                            report["settings"]["confidence"])
    lines += load_note(report["environment"])
    return "\n".join(lines)


def load_note(environment: Mapping[str, Any]) -> list[str]:
    """A warning when more runnable processes than cores were there as the report started."""
    cpu = environment.get("cpu", {})
    load = (cpu.get("load_average") or [0.0])[0]
    if load <= cpu.get("cores", 1):
        return []
    return [f"note: load average {load:.1f} on {cpu['cores']} cores: other processes were "
            f"running, so absolute times are inflated; compare variants of this run only"]


def coverage_notes(summaries: Sequence[Mapping[str, Any]], confidence: float) -> list[str]:
    """A warning for each interval that cannot reach ``confidence`` (too few values)."""
    return [f"note: with n={s['n']} the median's interval is the whole range and covers it "
            f"with probability {s['ci_coverage']:.2f} only; repeat more for a {confidence:.0%} "
            f"interval" for s in summaries if s["ci_coverage"] < confidence]
