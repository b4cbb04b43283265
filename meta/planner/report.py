"""The planner's outputs: the ranked table, the winner as ``--set`` lines, and the plot of
predicted throughput against P (1 to 4,096) for each strategy's best option."""

from __future__ import annotations

import json
from pathlib import Path

from meta.planner.costs import Prediction, predict_all
from meta.planner.machine import Machine, MachineError
from meta.planner.workload import Workload
from meta.run.recipe import Recipe, RecipeError

MB = 1 << 20
SCALES = tuple(2 ** k for k in range(13))  # 1 ... 4,096


def load_validation(paths: str | Path | list[str | Path], recipe: str) -> dict[str, dict]:
    """Rows of ``benchmarks/planner_validation.py``'s JSON files for ``recipe``, by
    configuration: of a configuration measured at several P (or on several machines), the
    row with the largest error (the one a user should know about)."""
    rows = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        try:
            rows += json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise MachineError(f"validation file {str(path)!r} cannot be read: {err}") \
                from err
    worst: dict[str, dict] = {}
    for r in rows:
        known = worst.get(r.get("configuration", ""))
        if r.get("recipe") == recipe and (known is None or abs(r["error"]) >= abs(
                known["error"])):
            worst[r["configuration"]] = r
    return worst


def _validated(pr: Prediction, validation: dict[str, dict], bound: float) -> str:
    row = validation.get(pr.label)
    if row is None:
        return "-"
    flag = " beyond" if abs(row["error"]) > bound else ""
    return f"{row['error']:+.0%} at P={row['ranks']}{flag}"


def table(predictions: list[Prediction], top: int = 15,
          validation: dict[str, dict] | None = None, bound: float = 0.20) -> str:
    """The ranking; with ``validation`` (measured rows), each configuration's model error
    where it was measured, marked "beyond" past ``bound``."""
    rows = [("#", "configuration", "samples/s", "step ms", "comm ms", "MB/rank",
             "params+grads+state+act+buf+tmp+run MB", "MB sent", "batch")
            + (("measured error",) if validation is not None else ())]
    for i, pr in enumerate(predictions[:top], 1):
        name = pr.label + ("" if pr.fits else " (does not fit)") + (
            f" [{', '.join(pr.notes)}]" if pr.notes else "")
        rows.append((str(i), name, f"{pr.throughput:,.0f}", f"{pr.step_s * 1e3:.3f}",
                     f"{pr.comm_s * 1e3:.3f}", f"{pr.memory_bytes / MB:.1f}",
                     pr.memory.parts_mb(),
                     f"{pr.bytes_sent / MB:.2f}", str(pr.samples))
                    + ((_validated(pr, validation, bound),) if validation is not None else ()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 1 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if len(predictions) > top:
        lines.append(f"... {len(predictions) - top} more configuration(s) (--top N)")
    return "\n".join(lines)


def _literal(text: str) -> object:
    """A --set value as the recipe's Python would write it."""
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text


def settable(pr: Prediction, recipe: Recipe) -> bool:
    """Whether the recipe accepts ``pr``'s --set lines (its MUTABLE holds ``distributed``)."""
    try:
        recipe.with_overrides(pr.sets)
    except RecipeError:
        return False
    return True


def best_sets(predictions: list[Prediction], recipe: Recipe) -> str:
    """The winner as arguments of ``meta run`` (the --set lines checked against the recipe);
    where the recipe fixes its strategy, the winner as the recipe's ``distributed`` entry and
    the best configuration its --set lines can choose."""
    best = predictions[0]
    where = recipe.path or recipe.name
    lines = [f"meta plan: best: {best.label}"]
    if settable(best, recipe):
        sets = " ".join(f"--set {k}={v}" for k, v in best.sets.items())
        return "\n".join(lines + [f"  mpiexec -n {best.ranks} meta run {where} {sets}"])
    entry = {k.partition(".")[2] or "name": _literal(v) for k, v in best.sets.items()}
    lines.append(f"  {recipe.name} does not let --set choose it; put in its MUTABLE: "
                 f'"distributed": {entry}')
    ok = [pr for pr in predictions if pr.fits and settable(pr, recipe)]
    if ok:
        sets = " ".join(f"--set {k}={v}" for k, v in ok[0].sets.items())
        lines.append(f"  best the recipe can be set to: {ok[0].label}: mpiexec -n "
                     f"{ok[0].ranks} meta run {where} {sets}".rstrip())
    return "\n".join(lines)


def scaling(work: Workload, machine: Machine) -> dict[str, list[tuple[int, float]]]:
    """Per strategy, its best option's predicted samples/s at each P that fits."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for p in SCALES:
        best: dict[str, float] = {}
        for pr in predict_all(work, machine, p):
            if pr.fits:
                best[pr.strategy] = max(best.get(pr.strategy, 0.0), pr.throughput)
        for name, value in best.items():
            curves.setdefault(name, []).append((p, value))
    return curves


def plot_scaling(work: Workload, machine: Machine, path: str | Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in sorted(scaling(work, machine).items()):
        ax.plot([p for p, _ in points], [v for _, v in points], marker="o", ms=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks P")
    ax.set_ylabel("predicted samples/s (best option of each strategy)")
    ax.set_title(f"{title} on {machine.name} ({machine.ranks_per_node} ranks/node)",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
