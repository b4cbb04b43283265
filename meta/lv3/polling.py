"""Waiting without spinning: MPI requests completed by ``Test`` loops with short sleeps.

MPICH's blocking waits spin at full speed; with more ranks than cores (3-4 ranks on the 2-core
dev machine) a spinning server steals the core its workers need. Servers and waiting workers of
the asynchronous strategies (``rma``, ``downpour``) therefore poll: test, and if nothing is done,
sleep ``POLL_S``. On a size-1 communicator there are no requests and every call returns at once.

>>> from meta.lv3.communicator import SingleProcessCommunicator
>>> poll_all(SingleProcessCommunicator(), [])
"""

from __future__ import annotations

import time
from typing import Any

from meta.lv3.communicator import Communicator, MPICommunicator, _import_mpi

POLL_S = 2e-4  # short enough to add little latency, long enough to yield the core


def _mpi(comm: Communicator, what: str) -> Any:
    if not isinstance(comm, MPICommunicator):
        raise TypeError(f"{what}: needs an MPICommunicator, got {comm!r}")
    return _import_mpi()


def poll_all(comm: Communicator, requests: list[Any]) -> None:
    """Complete every request of ``requests`` (None entries are skipped)."""
    live = [r for r in requests if r is not None]
    if not live:
        return
    MPI = _mpi(comm, "poll_all")  # noqa: N806 - the module's conventional name
    while not MPI.Request.Testall(live):
        time.sleep(POLL_S)


def test_all(comm: Communicator, requests: list[Any]) -> bool:
    """Whether every request is complete (completing them if so), without waiting."""
    live = [r for r in requests if r is not None]
    return not live or bool(_mpi(comm, "test_all").Request.Testall(live))


def poll_any(comm: Communicator, requests: list[Any]) -> tuple[int, int]:
    """Wait for one of ``requests``: (its index, its message's tag), as ``Communicator.waitany``."""
    MPI = _mpi(comm, "poll_any")  # noqa: N806
    status = MPI.Status()
    while True:
        index, done = MPI.Request.Testany(requests, status)
        if done:
            if index == MPI.UNDEFINED:
                raise ValueError(f"poll_any: none of the {len(requests)} requests is active")
            return index, status.Get_tag()
        time.sleep(POLL_S)


def poll_barrier(comm: Communicator) -> None:
    """A barrier over ``comm`` that sleeps while it waits (a nonblocking ``Ibarrier``)."""
    if comm.size == 1:
        return
    poll_all(comm, [comm.comm.Ibarrier()])  # type: ignore[attr-defined]
