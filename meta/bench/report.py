"""Benchmark reports: one JSON document (schema ``meta.bench/1``, in the README) and its table.

A report holds the environment record, the settings that shaped the statistics, one entry per
variant with its summaries and raw data, and the comparisons (ratios of medians with their
bootstrap intervals), so that a reader can recompute every figure from the file alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from meta.bench.recipes import SKIP_STEPS, VariantRuns
from meta.bench.stats import (
    CONFIDENCE,
    RESAMPLES,
    Ratio,
    Summary,
    ratio_of_medians_by_run,
    summarize,
)

SCHEMA = "meta.bench/1"
TABLE_METRICS = ("test_accuracy", "test_loss")


def settings(repeat: int, warmup: int, seed: int, resamples: int = RESAMPLES,
             skip_steps: int | None = None) -> dict[str, Any]:
    out = {"repeat": repeat, "warmup": warmup, "confidence": CONFIDENCE,
           "resamples": resamples, "seed": seed, "timer": "time.perf_counter_ns"}
    if skip_steps is not None:
        out["skip_steps"] = skip_steps
    return out


def comparison(baseline: str, candidate: str, quantity: str, ratio: Ratio) -> dict[str, Any]:
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
            "definitions": {k: list(x) if isinstance(x, tuple) else x
                            for k, x in vars(v.recipe.definitions).items()},
            "step_time_s": summarize(result.step_seconds(skip)).to_dict(),
            "run_time_s": summarize([r.wall_s for r in result.runs]).to_dict(),
            "final_metrics": result.final_metrics(),
            "passed": all(r.passed for r in result.runs),
            "runs": [r.to_dict(skip) for r in result.runs]})
    comparisons = []
    if len(results) == 2:
        a, b = results
        ratio = ratio_of_medians_by_run([r.step_seconds(skip) for r in a.runs],
                                        [r.step_seconds(skip) for r in b.runs],
                                        run_settings["resamples"], seed=run_settings["seed"])
        comparisons.append(comparison(a.variant.name, b.variant.name, "step_time_s", ratio))
    return {"schema": SCHEMA, "kind": kind, "environment": dict(environment),
            "settings": dict(run_settings), "variants": variants, "comparisons": comparisons}


def write_json(report: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def _ms(s: Summary | Mapping[str, Any]) -> tuple[str, str]:
    d = s.to_dict() if isinstance(s, Summary) else s
    return (f"{d['median'] * 1e3:.3f}",
            f"[{d['ci_low'] * 1e3:.3f}, {d['ci_high'] * 1e3:.3f}]")


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             .rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_ratio(c: Mapping[str, Any], what: str) -> str:
    kind = "two-stage " if c["method"].startswith("two-stage") else ""
    verdict = "no difference shown" if c["ci_low"] <= 1 <= c["ci_high"] else (
        f"{c['candidate']} {'slower' if c['ratio'] > 1 else 'faster'}")
    return (f"{what} {c['candidate']} / {c['baseline']}: {c['ratio']:.3f} "
            f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}] ({c['confidence']:.0%} {kind}bootstrap, "
            f"{c['resamples']} resamples, seed {c['seed']}): {verdict}")


def recipe_table(report: Mapping[str, Any]) -> str:
    """Median step time per variant with its interval, run time, final metrics, the ratio."""
    ci = f"{report['settings']['confidence']:.0%} CI"
    rows = [["variant", "runs", "steps", "median step ms", ci, "cv", "outliers",
             "run time s", *TABLE_METRICS]]
    for v in report["variants"]:
        step, run = v["step_time_s"], v["run_time_s"]
        metrics = [f"{v['final_metrics'][k]:.4f}" if k in v["final_metrics"] else "-"
                   for k in TABLE_METRICS]
        rows.append([v["name"], str(run["n"]), str(step["n"]), *_ms(step), f"{step['cv']:.2f}",
                     str(len(step["outliers"])), f"{run['median']:.2f}", *metrics])
    lines = [format_table(rows)]
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
