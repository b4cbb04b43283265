"""What a timing depends on, recorded next to it: software, hardware, threads, MPI, seeds, recipe.

A number in a report is only comparable with another when these match, so every report carries
this record. Gathering it must not change what it describes: MPI is reported only when mpi4py
is already loaded (importing it would initialise MPI) or, from package metadata only, when a
launcher started the process.

>>> record = environment()
>>> {"cpu", "created", "git", "meta"} <= set(record)
True
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from meta.common.threads import THREAD_VARIABLES, cores

REPO = Path(__file__).resolve().parents[2]
# Thread and placement settings that change timings, beyond the ones meta itself sets.
THREAD_SETTINGS = (*THREAD_VARIABLES, "OMP_PROC_BIND", "OMP_PLACES", "OMP_DYNAMIC",
                   "OMP_WAIT_POLICY", "GOTO_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                   "NUMEXPR_NUM_THREADS")


def recipe_hash(path: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> str:
    """sha256 of the recipe file's bytes followed by its overrides as sorted JSON: two runs with
    the same hash ran the same experiment (same file, same ``--set`` values)."""
    digest = hashlib.sha256(Path(path).read_bytes())
    digest.update(json.dumps(dict(overrides or {}), sort_keys=True, default=str).encode())
    return digest.hexdigest()


def git_state(repo: Path = REPO) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the checkout meta runs from; None outside a git checkout."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo, else ``platform``), for the report's
    environment."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def threadpools() -> list[dict[str, Any]]:
    """BLAS and OpenMP pools loaded in this process, as threadpoolctl sees them."""
    from threadpoolctl import threadpool_info

    keep = ("user_api", "internal_api", "prefix", "version", "num_threads", "threading_layer",
            "architecture")
    return [{k: pool.get(k) for k in keep} for pool in threadpool_info()]


def native_threads() -> int | None:
    """OpenMP threads of meta's C++ kernels; None when the extension is not built."""
    try:
        from meta import _native
    except ImportError:
        return None
    return int(_native.max_threads())


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def mpi_record() -> dict[str, Any] | None:
    """MPI library and version, without ever initialising MPI; None when MPI is not in play."""
    from meta.lv3.comm.communicator import launched_size

    mpi = sys.modules.get("mpi4py.MPI")
    launched = launched_size()
    if mpi is None and launched is None:
        return None
    record: dict[str, Any] = {"mpi4py": _version("mpi4py"), "mpich_wheel": _version("mpich"),
                              "launcher_size": launched}
    if mpi is not None:  # loaded already, so asking costs nothing and initialises nothing new
        record["library"] = mpi.Get_library_version().strip().splitlines()[0]
        record["standard"] = ".".join(map(str, mpi.Get_version()))
        if mpi.Is_initialized() and not mpi.Is_finalized():
            record["size"] = mpi.COMM_WORLD.Get_size()
    return record


def frameworks_record() -> dict[str, Any]:
    """Each other framework a comparison may have run, with its version and threads: only
    those already imported (asking imports nothing), plus oneDNN's under the planned executor
    when its runtime is loaded."""
    record: dict[str, Any] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        record["torch"] = {"version": getattr(torch, "__version__", None),
                           "threads": torch.get_num_threads(),
                           "cuda": bool(torch.cuda.is_available())}
    ort = sys.modules.get("onnxruntime")
    if ort is not None:
        record["onnxruntime"] = {"version": getattr(ort, "__version__", None)}
    plan = sys.modules.get("meta._plan")
    if plan is not None:
        from meta.lv1.plan.precision import native_bf16

        record["onednn"] = {"version": plan.onednn_version, "threads": plan.max_threads(),
                            "bf16_native": native_bf16()[0]}  # precision="bf16" pays here
    return record


def recipe_record(path: str | os.PathLike, overrides: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """What a report records of a recipe: its path, the overrides and the SHA-256 of both, so a
    figure can be traced to the exact recipe that made it."""
    return {"path": str(path), "overrides": dict(overrides or {}),
            "sha256": recipe_hash(path, overrides)}


def environment(recipes: Mapping[str, dict[str, Any]] | None = None, ranks: int = 1,
                seeds: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The record attached to every report (see the README's "Benchmark reports").

    ``recipes`` maps a variant name to its ``recipe_record``; ``seeds`` names every seed used.
    """
    import numpy as np

    import meta

    pools = threadpools()
    return {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": {"version": platform.python_version(),
                   "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": platform.platform(),
        "numpy": {"version": np.__version__,
                  "blas": [p for p in pools if p["user_api"] == "blas"]},
        "meta": {"version": meta.__version__},
        "git": git_state(),
        "cpu": {"model": cpu_model(), "cores": cores(), "cpu_count": os.cpu_count(),
                # Above the core count, other processes shared the machine: times are suspect.
                "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "threads": {"env": {k: os.environ[k] for k in THREAD_SETTINGS if k in os.environ},
                    "threadpools": pools, "native_omp": native_threads()},
        "mpi": mpi_record(),
        "frameworks": frameworks_record(),
        "ranks": ranks,
        "seeds": dict(seeds or {}),
        "recipes": dict(recipes or {}),
    }
