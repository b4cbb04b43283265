"""Run under mpiexec: train a recipe data-parallel, then check every rank holds the same weights.

Usage: mpiexec -n 2 python tests/e2e/rank_weights.py RECIPE [KEY=VALUE ...]
Rank 0 prints one line per parameter and 'replicas identical' or exits 1.
"""

from __future__ import annotations

import sys

import numpy as np

from meta.lv3 import FlatBuffer, world
from meta.run.recipe import load_recipe
from meta.run.runner import run_recipe


def main() -> int:
    comm = world()
    overrides = dict(arg.split("=", 1) for arg in sys.argv[2:])
    recipe = load_recipe(sys.argv[1]).with_overrides(overrides)
    outcome = run_recipe(recipe, comm, progress=False, export_onnx=False,
                         output_dir="runs/rank_weights")
    flat = FlatBuffer.like(outcome.parameters)
    gathered = comm.allgather(flat.pack(outcome.parameters))
    if comm.is_root:
        differing = [r for r in range(1, comm.size) if not np.array_equal(gathered[0], gathered[r])]
        print(f"ranks={comm.size} parameters={flat.buffer.size} "
              f"checksum={float(gathered[0].astype(np.float64).sum()):.6f}")
        if differing:
            print(f"replicas differ: ranks {differing} disagree with rank 0")
            return 1
        print("replicas identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
