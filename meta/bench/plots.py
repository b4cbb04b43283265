"""PNG figures of a report: box plots of step (or call) times, and loss curves.

Figures are drawn on matplotlib's Agg canvas directly, without pyplot: no window, no display
needed, and no change to the backend of a program that imports meta.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from meta.bench.stats import median_ci
from meta.common.files import atomic_write

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


def _title(ax: Any, text: str, fontsize: float = 10) -> None:
    """The title, wrapped to the figure's width and centred on the figure, not on the axes
    that long variant names push aside (a list of variants ran off both edges)."""
    chars = int(ax.figure.get_figwidth() * 72 / (0.62 * fontsize))  # ~0.62 em a character
    ax.figure.suptitle(textwrap.fill(text, max(20, chars)), fontsize=fontsize)


def _legend_below(ax: Any) -> Any:
    """The axes' legend below the plot, outside the axes (constrained layout makes room): a
    legend inside covered the recipe's bound, drawn where the curves end."""
    handles, labels = ax.get_legend_handles_labels()
    return ax.figure.legend(handles, labels, loc="outside lower center", fontsize=8,
                            ncols=min(2, max(1, len(labels))))


def _runs_label(name: str, n: int) -> str:
    return f"{name} (median of {n} runs, band: min to max)" if n > 1 else name


def _median_band(curves: Sequence[Sequence[float]]) -> tuple[np.ndarray, ...]:
    """Pointwise median, min and max of runs' curves, over the points every run has."""
    length = min(len(c) for c in curves)
    stacked = np.array([np.asarray(c[:length], dtype=float) for c in curves])
    return np.median(stacked, axis=0), stacked.min(axis=0), stacked.max(axis=0)


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
    _title(ax, title)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def loss_curves(variants: Mapping[str, Sequence[Mapping[str, Any]]], path: Path,
                title: str) -> Path:
    """Training loss per step and test loss at each epoch's end, per variant: one run as it
    is; several as their median with a band from the lowest to the highest run."""
    fig = _figure()
    ax = fig.add_subplot()
    colors = [f"C{i}" for i in range(10)]
    for (name, runs), color in zip(variants.items(), colors):
        runs = [r for r in runs if r["step_loss"]]
        if not runs:
            continue
        median, low, high = _median_band([r["step_loss"] for r in runs])
        steps = np.arange(1, len(median) + 1)
        ax.plot(steps, median, color=color, alpha=0.7, lw=0.8,
                label=f"{_runs_label(name, len(runs))} train")
        if len(runs) > 1:
            ax.fill_between(steps, low, high, color=color, alpha=0.2, lw=0)
        steps_per_epoch = len(runs[0]["step_loss"]) / max(1, len(runs[0]["epochs"]))
        tests = [[e["test_loss"] for e in r["epochs"] if "test_loss" in e] for r in runs]
        if all(tests):
            median, low, high = _median_band(tests)
            at = steps_per_epoch * np.arange(1, len(median) + 1)
            ax.errorbar(at, median, yerr=[median - low, high - median], fmt="o", color=color,
                        markersize=5, markeredgecolor="black", capsize=2,
                        label=f"{name} test")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    _title(ax, title)
    ax.grid(alpha=0.3)
    _legend_below(ax)
    return _save(fig, path)


def accuracy_vs_time(variants: Mapping[str, Sequence[Mapping[str, Any]]], path: Path,
                     title: str, metric: str = "test_accuracy",
                     bound: float | None = None) -> Path:
    """``metric`` at each epoch's end against the wall time since training began, one colour
    per variant: one run as it is; several as, per epoch, the median time and the median
    metric, with a band from the lowest to the highest run. The recipe's bound is dashed."""
    fig = _figure()
    ax = fig.add_subplot()
    for (name, runs), color in zip(variants.items(), [f"C{i}" for i in range(10)]):
        curves = [[(e["elapsed_s"], e[metric]) for e in run["epochs"]
                   if metric in e and "elapsed_s" in e] for run in runs]
        curves = [c for c in curves if c]
        if not curves:
            continue
        times, _, _ = _median_band([[s for s, _ in c] for c in curves])
        values, low, high = _median_band([[v for _, v in c] for c in curves])
        ax.plot(times, values, "o-", color=color, alpha=0.8, lw=1.2, markersize=4,
                label=_runs_label(name, len(curves)))
        if len(curves) > 1:
            ax.fill_between(times, low, high, color=color, alpha=0.2, lw=0)
    if bound is not None:
        ax.axhline(bound, color="black", ls="--", lw=0.8, label=f"bound {bound:g}")
    ax.set_xlabel("wall time since training began (s)")
    ax.set_ylabel(metric.replace("_", " "))
    _title(ax, title)
    ax.grid(alpha=0.3)
    _legend_below(ax)
    return _save(fig, path)
