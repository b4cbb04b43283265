"""The comparison report's time to a bound and its plots of several runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from meta.bench import plots
from meta.bench.recipes import RecipeVariant, RunRecord, VariantRuns
from meta.bench.report import reach_cell, reach_summary, recipe_table, time_to
from meta.run.recipe import AtLeast, AtMost, make_recipe

PNG = b"\x89PNG\r\n\x1a\n"


def run(accuracies: list[float], seconds_per_epoch: float = 3.0) -> RunRecord:
    epochs = [{"epoch": i + 1, "elapsed_s": seconds_per_epoch * (i + 1), "test_accuracy": a,
               "test_loss": 1 - a} for i, a in enumerate(accuracies)]
    return RunRecord(wall_s=seconds_per_epoch * len(accuracies), step_ns=[10**6] * 8,
                     step_loss=list(np.linspace(2, 0.5, 8)), epochs=epochs,
                     metrics={"test_accuracy": accuracies[-1]}, passed=True)


def variant(runs: list[RunRecord], bound: float = 0.97) -> VariantRuns:
    recipe = make_recipe("t", {}, {}, {"test_accuracy": AtLeast(bound),
                                       "test_loss": AtMost(0.5)})
    return VariantRuns(RecipeVariant("v", recipe, Path("t.py")), runs)


def test_time_to_is_each_runs_first_epoch_at_the_bound():
    result = variant([run([0.95, 0.971, 0.96]), run([0.96, 0.965, 0.975]), run([0.9, 0.92])])
    times = time_to(result)
    assert times["test_accuracy"] == [6.0, 9.0, math.inf]
    assert times["test_loss"] == [3.0, 3.0, 3.0]  # 1 - 0.95 <= 0.5 at once


def test_a_run_that_missed_the_bound_does_not_make_the_time_infinite():
    # One of two runs reached 97 % after 9 s, the other never: 9 s over 1 of 2 runs, not inf.
    reach = reach_summary([9.0, math.inf])
    assert reach["reached"] == 1 and reach["of"] == 2 and reach["median"] == 9.0
    assert reach["runs_s"] == [9.0, None] and reach["of_reached"]["n"] == 1
    assert reach_cell(reach) == "9.0 (1 of 2 runs)"
    assert reach_cell(reach_summary([4.0, 6.0, 11.0])) == "6.0"
    never = reach_summary([math.inf, math.inf])
    assert never["median"] is None and "of_reached" not in never
    assert reach_cell(never) == "never (0 of 2 runs)"
    json.dumps(never, allow_nan=False)  # no Infinity in the report: it is valid JSON


def test_the_table_says_how_many_runs_reached_the_bound():
    from meta.bench.report import recipe_report, settings

    results = [variant([run([0.95, 0.971]), run([0.96, 0.965])])]
    report = recipe_report("repeat", results, {}, settings(2, 0, 0, resamples=50))
    json.dumps(report, allow_nan=False)
    table = recipe_table(report)
    header, _, row = table.splitlines()[:3]
    assert "time to test_accuracy s" in header and "6.0 (1 of 2 runs)" in row
    assert "median over the runs that reached it" in table


@pytest.mark.parametrize("runs", [1, 3])
def test_several_runs_are_drawn_as_a_median_with_a_band(tmp_path, runs):
    records = [run([0.95 + 0.005 * i, 0.97 + 0.003 * i], 3.0 + i) for i in range(runs)]
    report_runs = [r.to_dict() for r in records]
    long = ", ".join(f"distributed=strategy_{i},momentum=0.{i}" for i in range(6))
    path = plots.accuracy_vs_time({"a": report_runs, "b": report_runs}, tmp_path / "acc.png",
                                  f"{long}: test accuracy against time", bound=0.97)
    assert path.read_bytes()[:8] == PNG
    path = plots.loss_curves({"a": report_runs}, tmp_path / "loss.png", f"{long}: loss")
    assert path.read_bytes()[:8] == PNG


def test_median_band_and_title_wrapping():
    median, low, high = plots._median_band([[1, 5, 9], [3, 4], [2, 6, 7]])
    assert median.tolist() == [2, 5] and low.tolist() == [1, 4] and high.tolist() == [3, 6]
    assert plots._runs_label("a", 3) == "a (median of 3 runs, band: min to max)"
    assert plots._runs_label("a", 1) == "a"
    fig = plots._figure()
    ax = fig.add_subplot()
    plots._title(ax, "x" * 30 + " " + "y" * 200)
    lines = fig.get_suptitle().splitlines()
    assert len(lines) > 1 and max(map(len, lines)) <= 110
