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
from typing import Any, Callable

from meta.lv3.comm import tags
from meta.lv3.comm.communicator import Communicator, MPICommunicator

POLL_S = 2e-4  # short enough to add little latency, long enough to yield the core


def _mpi(comm: Communicator, what: str) -> MPICommunicator:
    if not isinstance(comm, MPICommunicator):
        raise TypeError(f"{what}: needs an MPICommunicator, got {comm!r}")
    return comm


def poll(comm: Communicator, requests: list[Any], until: str = "all",
         idle: Callable[[], bool] | None = None,
         deadline: float | None = None) -> tuple[int, int] | None:
    """The one polling loop: test ``requests`` until ``all`` have completed (then None) or
    ``any`` one has (then its index and its message's tag), sleeping ``POLL_S`` between tests.

    ``idle``, if given, runs between tests and says whether it did some work (a server serving
    its workers while it waits): then the loop tests again at once, without sleeping. Past
    ``deadline`` (``time.monotonic()``) it gives up and returns None. ``all`` skips None
    entries; ``any`` raises ValueError when none of the requests is active.
    """
    if until not in ("all", "any"):
        raise ValueError(f"poll: until must be 'all' or 'any', got {until!r}")
    if until == "any":
        hits: list[tuple[int, int]] = []

        def done() -> bool:
            hit = comm.testany(requests)
            if hit is not None:
                hits.append(hit)
            return hit is not None

        return hits[0] if poll_until(done, idle, deadline) else None
    live = [r for r in requests if r is not None]
    if live:
        poll_until(lambda: comm.testall(live), idle, deadline)
    return None


def poll_until(done: Callable[[], bool], idle: Callable[[], bool] | None = None,
               deadline: float | None = None) -> bool:
    """Call ``done()`` until it is true (then True), with ``poll``'s idle policy and deadline
    (past it: False). What every wait in Level 3 is built on."""
    while not done():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if idle is None or not idle():
            time.sleep(POLL_S)
    return True


def poll_all(comm: Communicator, requests: list[Any]) -> None:
    """Complete every request of ``requests`` (None entries are skipped)."""
    poll(_mpi(comm, "poll_all") if any(r is not None for r in requests) else comm, requests)


def test_all(comm: Communicator, requests: list[Any]) -> bool:
    """Whether every request is complete (completing them if so), without waiting."""
    live = [r for r in requests if r is not None]
    return not live or _mpi(comm, "test_all").testall(live)


def poll_any(comm: Communicator, requests: list[Any]) -> tuple[int, int]:
    """Wait for one of ``requests``: (its index, its message's tag), as ``Communicator.waitany``."""
    hit = poll(_mpi(comm, "poll_any"), requests, "any")
    assert hit is not None  # no deadline
    return hit


def poll_barrier(comm: Communicator) -> None:
    """A barrier over ``comm`` that sleeps while it waits (a nonblocking ``Ibarrier``)."""
    if comm.size == 1:
        return
    poll_all(comm, [comm.comm.Ibarrier()])  # type: ignore[attr-defined]


def poll_any_until(comm: Communicator, requests: list[Any],
                   deadline: float) -> tuple[int, int] | None:
    """``poll_any`` that gives up at ``deadline`` (``time.monotonic()``): then None."""
    return poll(_mpi(comm, "poll_any_until"), requests, "any", deadline=deadline)


def cancel_all(comm: Communicator, requests: list[Any]) -> None:
    """Cancel pending receives and complete them (one that already matched completes with its
    message, which is dropped). Sends are never cancelled: MPI deprecated that."""
    live = [r for r in requests if r is not None]
    if not live:
        return
    for request in live:
        comm.cancel(request)
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
    sub = comm.comm.Create_group(group, tag=tags.GROUP_CREATE)  # type: ignore[attr-defined]
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
