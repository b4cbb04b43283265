"""Surviving a lost worker: MPI's fault-tolerance extension (ULFM), where the MPI has it on.

By the MPI standard a job whose process died is in an undefined state, and MPICH (the default
``mpich`` wheel) ends every rank. Open MPI 5 started with ``mpiexec --with-ft ulfm`` instead
reports the loss as an error (``MPI_ERR_PROC_FAILED``) to the ranks that talk to the dead one,
and offers ``Revoke`` / ``Shrink`` / ``Agree`` / ``Ack_failed`` / ``Get_failed`` to go on
without it. The asynchronous strategies use that: their servers drop a dead worker
(``failed_ranks``), the workers' collectives run on a ``SurvivingCommunicator`` that shrinks
itself, and the end of the run is collective over the survivors only. Where ULFM is off
(``ulfm_on`` is False) nothing here changes what a run does.

Rank 0 is a worker like the others: when it dies, the lowest surviving worker takes over
writing the run's outputs (``hand_over_outputs``). Losing a rank the run cannot do without (a
server) is a ``LostRankError``: one line naming it, exit 2 under ``meta run``, never a hang.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterable

import numpy as np

from meta.common.component import ComponentError
from meta.lv3.comm.communicator import (  # noqa: F401  (ulfm_on, ULFM_VARIABLE: their old home)
    ULFM_VARIABLE,
    Communicator,
    MPICommunicator,
    _import_mpi,
    revoke_all,
    ulfm_on,
)
from meta.lv3.comm.liveness import EXIT_RANK_DIED

RESTART_HINT = "start the run again (--resume continues from its last checkpoint, if it wrote one)"


class LostRankError(ComponentError):
    """A rank the run cannot go on without died (a server)."""


def is_failure(err: BaseException) -> bool:
    """Whether ``err`` is MPI's report of a dead process (or of a communicator revoked
    because of one), rather than a bug. A test or wait on several requests reports it as
    ``ERR_IN_STATUS``: that counts when ULFM is on and a process is known to be dead, or the
    world was revoked (``MPICommunicator.abort`` does that)."""
    if type(err).__name__ != "Exception" or not hasattr(err, "Get_error_class"):
        return False
    MPI = _import_mpi()  # noqa: N806 - the module's conventional name
    classes = [getattr(MPI, name, None) for name in
               ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")]
    if err.Get_error_class() == MPI.ERR_IN_STATUS:
        return ulfm_on() and (MPI.COMM_WORLD.Is_revoked()
                              or bool(failed_ranks(MPICommunicator(MPI.COMM_WORLD))))
    return err.Get_error_class() in [c for c in classes if c is not None]


def failed_ranks(comm: Communicator) -> list[int]:
    """The ranks of ``comm`` this process knows to be dead, acknowledged (so receives from
    any source and ``Create_group`` work again). Local: no other rank takes part."""
    if not isinstance(comm, MPICommunicator):
        return []
    comm.comm.Ack_failed()
    failed, whole = comm.comm.Get_failed(), comm.comm.Get_group()
    ranks = failed.Translate_ranks(list(range(failed.Get_size())), whole)
    failed.Free()
    whole.Free()
    return sorted(ranks)


def lost(rank: int, size: int, role: str, where: str,
         why: str = "the run cannot go on without it") -> LostRankError:
    """The one-line error for losing a rank the run needs."""
    return LostRankError(f"lost {role} rank {rank} of {size} {where}: its process died "
                         f"(killed, crashed or its node lost) and {why}; {RESTART_HINT}")


def lost_peer(comm: Communicator, servers: Iterable[int], where: str,
              why: str = "the run cannot go on without it") -> LostRankError:
    """The error for a worker whose exchange with a peer failed: a dead server (or the
    worker it waited for) named, or, when this rank knows of no death (the world was revoked
    by a rank that ended the run), that."""
    dead, servers = failed_ranks(comm), list(servers)
    if not dead:
        return LostRankError(f"another rank ended the run {where}, after a rank it needs "
                             f"died; {RESTART_HINT}")
    rank = next((r for r in dead if r in servers), dead[0])
    return lost(rank, comm.size, "server" if rank in servers else "worker", where, why)


def failure_message(comm: Communicator, err: BaseException) -> str | None:
    """One line for MPI's report of a dead rank that a run could not survive (a synchronous
    strategy, or a collective outside the survivable ones); None for other errors."""
    if not is_failure(err):
        return None
    dead = ", ".join(map(str, failed_ranks(comm)))
    if not dead:  # the world was revoked by a rank that ended the run
        return f"another rank ended the run, after a rank it needs died; {RESTART_HINT}"
    return f"rank {dead} of {comm.size} died ({err}) and this run cannot go on without it; " \
        + RESTART_HINT


def world_ranks(comm: Any) -> list[int]:
    """The ``COMM_WORLD`` rank of each rank of the mpi4py communicator ``comm``."""
    MPI = _import_mpi()  # noqa: N806
    mine, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    ranks = mine.Translate_ranks(list(range(mine.Get_size())), world)
    mine.Free()
    world.Free()
    return list(ranks)


class SurvivingCommunicator(MPICommunicator):
    """A communicator whose collectives go on without a rank that died.

    Each collective is followed by an agreement (``Agree``: uniform, and it works on a
    revoked communicator) on whether it succeeded everywhere. A rank whose call failed
    revokes the communicator first, so that no other rank stays blocked in the same call
    waiting for it. When any rank failed, all of them shrink to the survivors and repeat the
    call there with their original inputs; ``rank`` and ``size`` then change in place (order
    is kept), ``lost`` names the dead (world ranks) and ``on_shrink`` callbacks run (e.g. to
    re-shard the evaluation, or hand over writing the outputs). Point-to-point calls are
    unchanged.

    The agreement costs one small extra collective per call: meant for the few collectives
    of a run (per-epoch sums, evaluation), not for a per-step exchange.
    """

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)
        self.members = world_ranks(self.comm)
        """The world ranks still in it, in order: index i is the rank now numbered i."""
        self.lost: list[int] = []
        """The world ranks found dead so far, in the order they were found."""
        self.on_shrink: list[Callable[[SurvivingCommunicator], None]] = []
        """Callbacks run with this communicator after each shrink (re-shard the evaluation, hand
        over writing the outputs)."""

    def _survive(self, call: Callable[[], Any], reset: Callable[[], None] = lambda: None) -> Any:
        MPI = self._MPI  # noqa: N806
        while True:
            try:
                result, ok = call(), True
            except MPI.Exception as err:
                if not is_failure(err):
                    raise
                result, ok = None, False
                if not self.comm.Is_revoked():
                    self.comm.Revoke()
            try:
                self.comm.Ack_failed()
                ok = bool(self.comm.Agree(int(ok)))
            except MPI.Exception as err:  # a failure not yet acknowledged: shrink all the same
                if not is_failure(err):
                    raise
                ok = False
            if ok:
                return result
            self._shrink()
            reset()

    def _shrink(self) -> None:
        smaller = self.comm.Shrink()
        kept = world_ranks(smaller)
        dead = [r for r in self.members if r not in kept]
        self.lost += dead
        self.comm, self.members = smaller, kept
        self._rank, self._size = smaller.Get_rank(), smaller.Get_size()
        for callback in self.on_shrink:
            callback(self)

    def _root(self, root: int, members: list[int]) -> int:
        """``root`` (a rank before any shrink during this call) as a rank now."""
        if members[root] not in self.members:
            raise lost(members[root], self._MPI.COMM_WORLD.Get_size(), "root",
                       "during a broadcast")
        return self.members.index(members[root])

    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        original = buf.copy()
        return self._survive(lambda: super(SurvivingCommunicator, self).allreduce(buf, op),
                             lambda: np.copyto(buf, original))

    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any:
        return self._survive(lambda: super(SurvivingCommunicator, self).allreduce_obj(obj, op))

    def bcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        members, original = list(self.members), buf.copy()
        return self._survive(lambda: super(SurvivingCommunicator, self).bcast(
            buf, self._root(root, members)), lambda: np.copyto(buf, original))

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        members = list(self.members)
        return self._survive(lambda: super(SurvivingCommunicator, self).bcast_obj(
            obj, self._root(root, members)))

    def allgather(self, buf: np.ndarray) -> np.ndarray:
        return self._survive(lambda: super(SurvivingCommunicator, self).allgather(buf))

    def gather_obj(self, obj: Any, root: int = 0) -> list[Any] | None:
        members = list(self.members)
        return self._survive(lambda: super(SurvivingCommunicator, self).gather_obj(
            obj, self._root(root, members)))

    def barrier(self) -> None:
        self._survive(lambda: super(SurvivingCommunicator, self).barrier())


# Whether this process runs a strategy that goes on without a dead worker (it asked for a
# ``surviving`` communicator): a death is then part of a run that can still pass.
_SURVIVABLE = [False]


def surviving(comm: Communicator) -> Communicator:
    """``comm`` as a ``SurvivingCommunicator`` where ULFM is on; else ``comm`` unchanged.
    Asking for one declares this run survivable (``end_without_finalize_after_a_death``)."""
    if not isinstance(comm, MPICommunicator) or not ulfm_on():
        return comm
    _SURVIVABLE[0] = True  # a lone server's group too: its run survives a worker
    return comm if comm.size == 1 else SurvivingCommunicator(comm.comm)


def follow_shrinks(group: Communicator,
                   reshard: Callable[[int, int], None] | None) -> None:
    """Re-shard the evaluation over the workers left when ``group`` shrinks: ``reshard(rank,
    size)`` with this rank's place among them, so no part of the test data goes
    unevaluated."""
    if isinstance(group, SurvivingCommunicator) and reshard is not None:
        group.on_shrink.append(lambda g: reshard(g.rank, g.size))


def hand_over_outputs(group: Communicator, take_over: Callable[[int], None]) -> None:
    """When the rank that writes the run's outputs (``group``'s first: rank 0) dies, the
    lowest surviving rank of ``group`` calls ``take_over(dead world rank)`` and writes them
    from then on; again if that one dies too. As ``torchrun`` elects a new rendezvous host,
    but without a restart: the survivors already hold the whole history of the run."""
    if not isinstance(group, SurvivingCommunicator):
        return
    writer = [group.members[0]]

    def check(g: SurvivingCommunicator) -> None:
        if writer[0] not in g.members:
            dead, writer[0] = writer[0], g.members[0]
            if g.rank == 0:
                take_over(dead)

    group.on_shrink.append(check)


def end_without_finalize_after_a_death(code: int, failed: bool = False) -> None:
    """End this process now, with ``code``, when it survived a dead rank (under ULFM);
    otherwise return. Open MPI's ``MPI_Finalize`` on the survivors now and then never returns
    (measured, Open MPI 5.0.11, runs whose rank 0 was killed: 2 of 55 on an idle machine, 2 of
    6 beside two busy loops; all survivors waiting in its closing fence), so the run ends
    without it once every output is written: ``os._exit`` after flushing.

    ``mpiexec --with-ft ulfm`` exits with the survivors' status, whatever became of the dead
    (measured: 0 when they exit 0). A run that is not survivable (no ``surviving``
    communicator: a synchronous strategy, a pipeline) and did not fail already therefore
    ends with ``EXIT_RANK_DIED``, its lowest surviving rank naming the dead in one line:
    such a run was never meant to finish without a rank, so its outputs are not a success.
    ``failed``: this rank ends the run on an error, with other ranks perhaps blocked in a call
    that waits for it; it revokes every communicator first, as ``abort`` does, so they learn."""
    if not ulfm_on():
        return
    world = MPICommunicator(_import_mpi().COMM_WORLD)
    dead = failed_ranks(world)
    if not dead:
        return
    if not _SURVIVABLE[0] and code in (0, 1):
        code = EXIT_RANK_DIED
        if world.rank == min(r for r in range(world.size) if r not in dead):
            ranks = ", ".join(map(str, dead))
            print(f"meta: error: rank {ranks} of {world.size} died during a run that cannot go "
                  f"on without it; {RESTART_HINT}", file=sys.stderr)
    if failed:  # this rank ends a run that failed: the others may be blocked on it
        revoke_all()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
