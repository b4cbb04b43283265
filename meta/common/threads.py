"""Threads per process, set before numpy loads its BLAS.

Under ``mpiexec`` every rank would otherwise start one BLAS and one OpenMP thread per core, so
P ranks on C cores run P*C threads: on a 2-core machine two ranks doing small GEMMs plus an
allreduce ran 80x slower. Like torchrun, meta gives each rank ``cores // local ranks`` threads
unless the user chose (any of the variables below already set). This module imports nothing
heavy so that it can run before numpy.
"""

from __future__ import annotations

import os
import sys

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# Local rank counts, as set by MPICH's Hydra, Open MPI and Slurm launchers.
LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def local_ranks(environ: os._Environ | dict = os.environ) -> int:
    """Number of ranks the launcher placed on this node (1 when not launched by MPI)."""
    for name in LOCAL_SIZE_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def cores() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads(environ: os._Environ | dict = os.environ) -> int:
    return max(1, cores() // local_ranks(environ))


def user_chose(environ: os._Environ | dict = os.environ) -> bool:
    return any(name in environ for name in THREAD_VARIABLES)


def apply_default(environ: os._Environ | dict = os.environ) -> None:
    """Set the thread variables for this rank unless the user set any of them."""
    if user_chose(environ) or local_ranks(environ) == 1:
        return
    threads = default_threads(environ)
    for name in THREAD_VARIABLES:
        environ[name] = str(threads)
    if "numpy" in sys.modules:  # too late for the variables: BLAS already started its pool
        set_threads(threads)


def set_threads(n: int) -> None:
    """Change BLAS and OpenMP threads of this process now (numpy may already be loaded)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(n)
    try:
        from meta import _native
    except ImportError:
        return
    _native.set_threads(n)
