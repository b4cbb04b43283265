"""What a run records so that ``meta replay`` can recompute it: the ``replay.json`` format.

Written by rank 0 with the run's other outputs (``meta.run.run_dir``, below the runner); read by
the replay command (``meta.run.replay``, above it). Holding the format here, apart from the
command, keeps the runner from importing the command that imports the runner.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

REPLAY_JSON = "replay.json"
FORMAT = 1


class ReplayError(Exception):
    """A run folder that cannot be replayed (names the file and the reason)."""


def digest(array: np.ndarray) -> str:
    """The SHA-256 of an array's bytes (C order): what a replay compares."""
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def record(run: Any) -> dict[str, Any] | None:
    """What ``replay`` needs from a finished run (rank 0's RecipeRun), or None when its
    strategy recorded no update order (a synchronous run, or one process). A Downpour run
    also records its ``schedule``, which ``meta replay`` hands to the virtual-time
    simulator (a worker's local steps and fetches make the order of pushes not enough)."""
    strategy = run.trainer.optimizer
    order = getattr(strategy, "update_order", None)
    if order is None:
        return None
    recipe = run.recipe
    threads = _blas_threads()
    return {"format": FORMAT, "strategy": strategy.name, "recipe": recipe.name,
            "recipe_file": str(Path(recipe.path).resolve()) if recipe.path else None,
            # --set values are plain data; what the file itself holds (a class) is read again
            "mutable": {k: v if _jsonable(v) else {"__recipe_file__": True}
                        for k, v in recipe.mutable.items()},
            "definitions": recipe.definitions.as_dict(), "resumed": run.resumed,
            "ranks": strategy.comm.size, "workers": list(strategy.workers),
            "threads": threads, "order": [int(w) for w in order],
            "final_sha256": {k: digest(v) for k, v in
                             run.trainer.executor.graph.parameters.items()},
            # Downpour's: the server's pushes and fetches in order, each worker's early
            # landings (meta.planner.virtual_time replays it)
            **({"schedule": strategy.schedule} if getattr(strategy, "schedule", None) else {})}


def _blas_threads() -> int:
    from threadpoolctl import threadpool_info

    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return max(counts, default=1)
