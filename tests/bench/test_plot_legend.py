"""The comparison plots' legend sits outside the axes, so it hides neither the curves nor the
recipe's bound (issue 45 item 7: a legend inside covered the bound where the curves end)."""

from __future__ import annotations

import pytest

from meta.bench import plots

pytest.importorskip("matplotlib")


def _runs(values, seconds):
    return [{"epochs": [{"elapsed_s": seconds * (i + 1), "test_accuracy": v,
                         "test_loss": 1 - v} for i, v in enumerate(values)],
             "step_loss": [1.0, 0.8, 0.6, 0.5]}]


def _drawn(monkeypatch, draw):
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    draw()
    fig = figures[0]
    fig.canvas.draw()
    return fig, fig.canvas.get_renderer()


def test_the_bound_is_drawn_and_the_legend_is_outside_the_axes(tmp_path, monkeypatch):
    # curves ending at the bound in the upper right, where an inside legend went ("best")
    variants = {"allreduce": _runs([0.90, 0.95, 0.97], 2.0),
                "downpour (median of 3 runs, band: min to max)": _runs([0.91, 0.96, 0.975], 2.5)}
    fig, renderer = _drawn(monkeypatch, lambda: plots.accuracy_vs_time(
        variants, tmp_path / "acc.png", "test accuracy against time", bound=0.97))
    ax = fig.axes[0]
    bound = [line for line in ax.get_lines() if line.get_label() == "bound 0.97"]
    assert len(bound) == 1 and list(bound[0].get_ydata()) == [0.97, 0.97]
    assert ax.get_legend() is None and len(fig.legends) == 1
    legend = fig.legends[0]
    assert "bound 0.97" in [t.get_text() for t in legend.get_texts()]
    box, axes = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert not box.overlaps(axes), (box, axes)
    assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)


def test_the_loss_curves_legend_is_outside_too(tmp_path, monkeypatch):
    fig, renderer = _drawn(monkeypatch, lambda: plots.loss_curves(
        {"a": _runs([0.9, 0.95], 1.0)}, tmp_path / "loss.png", "loss"))
    legend, ax = fig.legends[0], fig.axes[0]
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
