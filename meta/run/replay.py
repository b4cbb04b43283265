"""Deterministic replay of an asynchronous run: ``meta replay RUN_DIR``.

An asynchronous parameter server applies the workers' gradients in whatever order they
arrive, so two runs of one recipe end with different weights, and a divergence cannot be
re-run. Everything else in a worker's step is deterministic: its batches follow from
(seed, epoch, its shard), and it computes each gradient at the parameters the server sent
back after applying its previous one. So the server records the order in which it applied the
updates (the worker of each), rank 0 writes it to ``RUN_DIR/replay.json`` with the recipe, its
MUTABLE values and a sha256 digest of every final weight, and ``replay`` recomputes the run on
one process in that order: worker by worker, gradient by gradient, on the same optimizer. It
ends with bit-identical weights (the same BLAS thread count as the run's ranks is set, since a
different count may sum in another order); ``on_update`` sees every update, to find where a
run went wrong.

Replayed: ``async_parameter_server`` runs of models without pre-training, not resumed, and
Downpour runs with one server (their recorded schedule, through ``meta.planner.virtual_time``).
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from meta.run.replay_record import (  # noqa: F401  (record, REPLAY_JSON: importable from here too)
    FORMAT,
    REPLAY_JSON,
    ReplayError,
    digest,
    record,
)
from meta.run.replay_workers import Workers, apply_in_order  # noqa: F401  (importable from here)


@dataclass
class Replayed:
    """A replayed run: the final parameters, and whether they equal the run's bit for bit."""

    params: dict[str, np.ndarray]
    updates: int
    seconds: float
    differing: list[str]  # parameters whose digest differs from the run's

    @property
    def identical(self) -> bool:
        """Whether every recorded array was reproduced bit for bit."""
        return not self.differing


def _recipe(rec: dict[str, Any], where: Path) -> Any:
    from meta.run.recipe import RecipeError, load_recipe, make_recipe

    if not rec.get("recipe_file"):
        raise ReplayError(f"{where}: the run's recipe was not read from a file")
    try:
        loaded = load_recipe(rec["recipe_file"])
        mutable = {k: loaded.mutable[k] if isinstance(v, dict) and v.get("__recipe_file__")
                   else v for k, v in rec["mutable"].items()}
        recipe = make_recipe(loaded.name, loaded.fixed, mutable, loaded.metrics, loaded.path)
    except (RecipeError, KeyError) as err:
        raise ReplayError(f"{where}: cannot rebuild the run's recipe: {err}") from err
    now = json.loads(json.dumps(recipe.definitions.as_dict()))
    changed = sorted(k for k in set(now) | set(rec["definitions"])
                     if now.get(k) != rec["definitions"].get(k))
    if changed:
        raise ReplayError(f"{where}: {rec['recipe_file']} now defines another run than the one "
                          f"recorded ({', '.join(changed)}); replay needs the recipe as it was")
    return recipe


# What replay reads from replay.json, and the type of each: an edited file is refused up front,
# naming the key, rather than failing midway with a KeyError.
FIELDS = {"format": int, "strategy": str, "resumed": bool, "recipe_file": str, "mutable": dict,
          "definitions": dict, "threads": int, "ranks": int, "workers": list, "order": list,
          "final_sha256": dict}


def _check_record(rec: Any, where: Path) -> None:
    """Every field replay reads is there with its type; every update's worker is a worker."""
    if not isinstance(rec, dict):
        raise ReplayError(f"{where}: expected a JSON object, got {type(rec).__name__} (an "
                          f"edited or damaged file)")
    for key, kind in FIELDS.items():
        value = rec.get(key)
        if key not in rec or not isinstance(value, kind) or \
                (kind is int and isinstance(value, bool)):
            got = "missing" if key not in rec else f"a {type(value).__name__}"
            raise ReplayError(f"{where}: field {key!r} should be a {kind.__name__}, it is {got} "
                              f"(an edited or damaged file)")
    workers = rec["workers"]
    if not all(isinstance(w, int) and not isinstance(w, bool) for w in workers):
        raise ReplayError(f"{where}: field 'workers' should list rank numbers, got {workers}")
    stray = next(((i, w) for i, w in enumerate(rec["order"]) if w not in workers), None)
    if stray is not None:
        raise ReplayError(f"{where}: update {stray[0]} in 'order' names worker {stray[1]!r}, "
                          f"not one of the run's workers {workers} (an edited or damaged file)")


REPLAYED = ("async_parameter_server", "downpour")  # the strategies that record their order


def replay(run_dir: str | Path, on_update: Callable[[int, int, dict], None] | None = None,
           set_threads: bool = True) -> Replayed:
    """Recompute the asynchronous run recorded in ``run_dir`` on this process, applying the
    workers' gradients in the recorded order; ``on_update(i, worker, server_params)`` is
    called after every update. ``set_threads`` gives BLAS the run's thread count. A Downpour
    run is recomputed by the virtual-time simulator from its recorded schedule
    (``on_update`` then sees every push)."""
    from meta.common.threads import set_threads as set_blas_threads
    from meta.lv3 import SingleProcessCommunicator
    from meta.run.runner import RecipeRun

    where = Path(run_dir) / REPLAY_JSON
    try:
        rec = json.loads(where.read_text())
    except FileNotFoundError:
        raise ReplayError(f"{where} not found: only an asynchronous run (distributed "
                          f"async_parameter_server or downpour under mpiexec) records its "
                          f"update order") from None
    except (OSError, ValueError) as err:
        raise ReplayError(f"{where}: not readable ({err})") from err
    _check_record(rec, where)
    if rec.get("format") != FORMAT or rec.get("strategy") not in REPLAYED:
        raise ReplayError(f"{where}: format {rec.get('format')} of strategy "
                          f"{rec.get('strategy')!r} cannot be replayed by this version")
    if rec["resumed"]:
        raise ReplayError(f"{where}: a resumed run cannot be replayed (its first part ran "
                          f"before the order was recorded)")
    if rec["strategy"] == "downpour":  # its schedule, checked before the recipe is built
        from meta.planner.virtual_time import Schedule, SimulationError

        try:
            schedule = Schedule.from_record(rec, where)
        except SimulationError as err:
            raise ReplayError(str(err)) from None
    recipe = _recipe(rec, where)
    if set_threads:
        set_blas_threads(int(rec["threads"]))
    run = RecipeRun(recipe, SingleProcessCommunicator(), stream=io.StringIO(),
                    output_dir=Path(run_dir), progress=False, export_onnx=False)
    if getattr(run.model, "prepare", None) is not None:
        raise ReplayError(f"{where}: model {recipe.definitions.choices['model'].name!r} "
                          f"pre-trains; replay covers the server's training updates only")
    strategy = recipe.definitions.choices["distributed"]
    ranks, workers = int(rec["ranks"]), list(rec["workers"])
    team = Workers(run, workers,
                   lambda w: run.strategy_cls.replica(w, ranks, **strategy.values()))
    start = time.perf_counter()
    if rec["strategy"] == "downpour":
        from meta.planner.virtual_time import SimulationError, execute_downpour

        try:
            final = execute_downpour(schedule, team, on_push=on_update, where=where)
        except SimulationError as err:  # a schedule the workers cannot follow: one line
            raise ReplayError(str(err)) from None
    else:
        final = apply_in_order(rec["order"], team, on_update, where)
    seconds = time.perf_counter() - start
    differing = [k for k, v in final.items() if rec["final_sha256"].get(k) != digest(v)]
    return Replayed(final, len(rec["order"]), seconds, differing)
