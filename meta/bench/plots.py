"""PNG figures of a report: box plots of step (or call) times, and loss curves.

Figures are drawn on matplotlib's Agg canvas directly, without pyplot: no window, no display
needed, and no change to the backend of a program that imports meta.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from meta.bench.stats import median_ci
from meta.files import atomic_write

WIDTH_IN, DPI = 6.4, 100


def _figure(width: float = WIDTH_IN, height: float = 3.6) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("plots need matplotlib: pip install matplotlib") from err
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> Path:
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format=path.suffix[1:] or "png")
    return path


def box_plot(samples_ms: Mapping[str, Sequence[float]], path: Path, title: str,
             ylabel: str = "step time (ms)") -> Path:
    """One box per variant (whiskers at the Tukey fences, outliers as points) with its median's
    confidence interval as the notch."""
    fig = _figure(height=3.2 + 0.1 * len(samples_ms))
    ax = fig.add_subplot()
    names = list(samples_ms)
    data = [np.asarray(samples_ms[n], dtype=float) for n in names]
    notches = [median_ci(x)[:2] for x in data]  # ours, not matplotlib's normal approximation
    ax.boxplot(data, whis=1.5, notch=True, conf_intervals=notches, orientation="horizontal",
               tick_labels=names, flierprops={"markersize": 3})
    ax.invert_yaxis()  # first variant on top, as in the table
    low, high = min(float(x.min()) for x in data), max(float(x.max()) for x in data)
    if low > 0 and high / low > 20:  # variants of different magnitudes: keep each box readable
        ax.set_xscale("log")
    ax.set_xlabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def loss_curves(variants: Mapping[str, Sequence[Mapping[str, Any]]], path: Path,
                title: str) -> Path:
    """Training loss per step (one thin line per run) and test loss at each epoch's end."""
    fig = _figure()
    ax = fig.add_subplot()
    colors = [f"C{i}" for i in range(10)]
    for (name, runs), color in zip(variants.items(), colors):
        for i, run in enumerate(runs):
            losses = run["step_loss"]
            ax.plot(np.arange(1, len(losses) + 1), losses, color=color, alpha=0.5, lw=0.8,
                    label=f"{name} train" if i == 0 else None)
            steps_per_epoch = len(losses) / max(1, len(run["epochs"]))
            tests = [(e["epoch"] * steps_per_epoch, e["test_loss"]) for e in run["epochs"]
                     if "test_loss" in e]
            if tests:
                ax.plot(*zip(*tests), "o", color=color, markersize=5, markeredgecolor="black",
                        label=f"{name} test" if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def accuracy_vs_time(variants: Mapping[str, Sequence[Mapping[str, Any]]], path: Path,
                     title: str, metric: str = "test_accuracy",
                     bound: float | None = None) -> Path:
    """``metric`` at each epoch's end against the wall time since training began: one line per
    run, one colour per variant; the recipe's bound as a dashed line."""
    fig = _figure()
    ax = fig.add_subplot()
    for (name, runs), color in zip(variants.items(), [f"C{i}" for i in range(10)]):
        for i, run in enumerate(runs):
            points = [(e["elapsed_s"], e[metric]) for e in run["epochs"]
                      if metric in e and "elapsed_s" in e]
            if points:
                ax.plot(*zip(*points), "o-", color=color, alpha=0.8, lw=1.2, markersize=4,
                        label=name if i == 0 else None)
    if bound is not None:
        ax.axhline(bound, color="black", ls="--", lw=0.8, label=f"bound {bound:g}")
    ax.set_xlabel("wall time since training began (s)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
