"""Waiting without spinning: MPI requests completed by ``Test`` loops with short sleeps.

MPICH's blocking waits spin at full speed; with more ranks than cores (3-4 ranks on the 2-core
dev machine) a spinning server steals the core its workers need. Servers and waiting workers of
the asynchronous strategies (``rma``, ``downpour``) therefore poll: test, and if nothing is done,
sleep ``POLL_S``. On a size-1 communicator there are no requests and every call returns at once.

>>> from meta.lv3.comm.communicator import SingleProcessCommunicator
>>> poll_all(SingleProcessCommunicator(), [])
"""

from __future__ import annotations

import time
from typing import Any

from meta.lv3.comm.communicator import Communicator, MPICommunicator, _import_mpi

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


def poll_any_until(comm: Communicator, requests: list[Any],
                   deadline: float) -> tuple[int, int] | None:
    """``poll_any`` that gives up at ``deadline`` (``time.monotonic()``): then None."""
    MPI = _mpi(comm, "poll_any_until")  # noqa: N806
    status = MPI.Status()
    while True:
        index, done = MPI.Request.Testany(requests, status)
        if done:
            if index == MPI.UNDEFINED:
                raise ValueError(f"poll_any_until: none of the {len(requests)} requests is "
                                 "active")
            return index, status.Get_tag()
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


def cancel_all(comm: Communicator, requests: list[Any]) -> None:
    """Cancel pending receives and complete them (one that already matched completes with its
    message, which is dropped). Sends are never cancelled: MPI deprecated that."""
    live = [r for r in requests if r is not None]
    if not live:
        return
    for request in live:
        request.Cancel()
    poll_all(comm, live)


def group_comm(comm: Communicator, ranks: list[int]) -> Communicator:
    """A communicator of ``ranks`` of ``comm`` (in that order), built by those ranks alone.

    ``MPI_Comm_create_group`` is collective over the group only, unlike ``Comm_split``: ranks
    that have left a run (and must not enter another collective) are simply not asked.
    """
    if comm.size == 1 or list(ranks) == list(range(comm.size)):
        return comm
    if comm.rank not in ranks:
        raise ValueError(f"group_comm: rank {comm.rank} is not among {ranks}")
    _mpi(comm, "group_comm")
    whole = comm.comm.Get_group()  # type: ignore[attr-defined]
    group = whole.Incl(list(ranks))
    sub = comm.comm.Create_group(group, tag=77)  # type: ignore[attr-defined]
    group.Free()
    whole.Free()
    return MPICommunicator(sub)


def survivors_comm(comm: Communicator, ranks: list[int],
                   died: bool) -> Communicator | None:
    """``group_comm(comm, ranks)``, and after a rank of ``comm`` ``died`` (survived under
    ULFM) the live ranks first shrink ``comm``: ``Create_group`` fails once a death is known
    (measured, Open MPI 5.0.11). ``Shrink`` is collective over every live rank of ``comm``,
    so each must call this (those not in ``ranks`` then get None)."""
    if not died:
        return group_comm(comm, ranks)
    live = comm.comm.Shrink()  # type: ignore[attr-defined]
    whole, kept = comm.comm.Get_group(), live.Get_group()  # type: ignore[attr-defined]
    members = list(kept.Translate_ranks(list(range(kept.Get_size())), whole))
    kept.Free()
    whole.Free()
    if comm.rank not in ranks:
        return None
    return group_comm(MPICommunicator(live), [members.index(r) for r in ranks])
