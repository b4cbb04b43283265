"""Running named checks on every rank of an MPI job (the ``*_checks.py`` scripts' ``main``)."""

from __future__ import annotations

import sys
import traceback
from typing import Callable, Iterable

from meta.lv3 import Communicator, MPICommunicator


def run_checks(comm: Communicator, checks: dict[str, Callable[[Communicator], None]],
               names: Iterable[str], barrier_after: Callable[[str], bool] = lambda name: True,
               suffix: str = "") -> int:
    """Run ``checks[name](comm)`` for each name; print ``rank R/N: K checks passed{suffix}`` or,
    on the first failure, its traceback and ``rank R/N: FAILED name{suffix}``, then abort the
    whole job so that no other rank waits forever in a collective. Returns the exit code."""
    names = list(names)
    tag = f"rank {comm.rank}/{comm.size}"
    for name in names:
        try:
            checks[name](comm)
        except BaseException:
            traceback.print_exc()
            print(f"{tag}: FAILED {name}{suffix}", flush=True)
            sys.stderr.flush()
            if isinstance(comm, MPICommunicator):
                comm.comm.Abort(1)
            return 1
        if barrier_after(name):
            comm.barrier()
    print(f"{tag}: {len(names)} checks passed{suffix}", flush=True)
    return 0


def main(checks: dict[str, Callable[[Communicator], None]], argv: list[str]) -> int:
    """A check script's entry point: the named checks (all by default) on ``world()``, or on
    MPI's world with ``--mpi`` (the MPI code path at size 1, without a launcher)."""
    from meta.lv3 import world

    use_mpi = "--mpi" in argv
    names = [a for a in argv if a != "--mpi"] or list(checks)
    comm = MPICommunicator() if use_mpi else world()
    return run_checks(comm, checks, names, suffix=f" on {type(comm).__name__}")
