"""Liveness: a job whose rank died ends within seconds, whatever the launcher's options.

MPICH's blocking calls never return when a peer is gone, and ``mpiexec -disable-auto-cleanup``
(Hydra) then leaves the survivors in them forever: an allreduce, a server's polling loop, a
pipeline's receive, a one-sided fence. ULFM (Open MPI ``--with-ft ulfm``) reports the death as
an error instead, and ``survival`` handles it; everywhere else a ``Watchdog`` does: a daemon
thread, started by ``world()``, that never calls MPI (so it fits any thread level and any
blocking call). When the world is made the ranks exchange their host and pid once (an
allgather); the thread then checks every peer on its own host (``os.kill(pid, 0)``, the
``/proc`` state for a zombie, the start time against a reused pid) every ``WATCH_S``. When a
peer is gone, the lowest surviving rank of the host prints one line, ``meta: rank R (pid P on
HOST) died; ending this job``, and every survivor ends itself (``os._exit(EXIT_RANK_DIED)``
after flushing), so ``mpiexec`` ends, non-zero.

A rank that leaves normally must not look dead to the others: at exit (before
``MPI_Finalize``) every rank waits in one barrier that sleeps while it waits, with the
watchdog still on, and stops the watchdog once every rank is there.

Limits: a peer on another host is not seen (no ``/proc`` across hosts); there MPICH's default
auto-cleanup, or Open MPI's, ends the job when a rank dies. A death before the world is made
(inside ``MPI_Init``) is the launcher's to see.

>>> from meta.lv3.comm.communicator import SingleProcessCommunicator
>>> watch_peers(SingleProcessCommunicator()) is None  # nothing to watch without peers
True
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, NamedTuple

WATCH_S = 0.1  # how often the watchdog looks at its peers (a few syscalls each): a death is
# seen within this, and a rank that ends in reaction to it is seldom taken for a second death
LEAVE_GRACE_S = 3.0  # at exit, how long a gone peer may have passed the exit barrier before us
LEAVE_POLL_S = 2e-3  # the exit barrier's sleep between tests
# The exit status of a rank that ended itself because a peer died; under ULFM, of a run that
# is not survivable and lost a rank (``survival.end_without_finalize_after_a_death``).
EXIT_RANK_DIED = 3
LINGER_S = 1.0  # how long a survivor stays after it saw a death, before it ends


class Peer(NamedTuple):
    """What a rank tells the others about itself once: where to look for it."""

    rank: int
    host: str  # hostname and pid namespace: pids compare only within both
    pid: int
    started: str  # /proc/PID/stat's start time ("" where there is no /proc)


def _namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _started(pid: int) -> str:
    """``pid``'s start time (field 22 of /proc/PID/stat): tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def me(rank: int) -> Peer:
    pid = os.getpid()
    return Peer(rank, f"{socket.gethostname()} {_namespace()}", pid, _started(pid))


def alive(peer: Peer) -> bool:
    """Whether ``peer``'s process still runs: it exists, is not a zombie (killed, not yet
    reaped by its launcher) and is the same process (not a new one under its pid)."""
    try:
        os.kill(peer.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's: a reused pid
        return False
    try:
        with open(f"/proc/{peer.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return not os.path.isdir("/proc/self")  # no /proc here: os.kill said it exists
    if fields[0] in ("Z", "X"):
        return False
    return not peer.started or fields[19] == peer.started


class Watchdog:
    """Checks the peers of this host every ``WATCH_S`` from a daemon thread that never calls
    MPI, and ends this process when one is gone (see the module's docstring)."""

    def __init__(self, mine: Peer, peers: list[Peer], size: int) -> None:
        self.mine, self.peers, self.size = mine, peers, size
        self.leaving_since: float | None = None  # set when this rank enters the exit barrier
        self._stop = threading.Event()
        self._ending = threading.Lock()  # the watchdog and the main thread may both end it
        self._thread = threading.Thread(target=self._watch, name="meta-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def dead(self) -> list[Peer]:
        return [p for p in self.peers if not alive(p)]

    def _watch(self) -> None:
        gone_since: float | None = None
        while not self._stop.wait(WATCH_S):
            try:
                dead = self.dead()
            except Exception:  # noqa: BLE001 - an odd /proc must not end the watch
                continue
            if not dead:
                gone_since = None
                continue
            now = time.monotonic()
            gone_since = now if gone_since is None else gone_since
            if self.leaving_since is not None and now - gone_since < LEAVE_GRACE_S:
                continue  # it may have passed the exit barrier just before this rank
            if self._stop.is_set():
                return
            self.end(dead)

    def end(self, dead: list[Peer]) -> None:
        """One line on the lowest surviving rank of this host, then end this process."""
        if not self._ending.acquire(blocking=False):  # the other thread is ending it already
            time.sleep(2 * LINGER_S)
            os._exit(EXIT_RANK_DIED)
        lost = {p.rank for p in dead}
        survivors = [r for r in [self.mine.rank, *(p.rank for p in self.peers)] if r not in lost]
        try:  # mpiexec may be gone already (its pipes closed): end all the same
            if self.mine.rank == min(survivors):
                who = ", ".join(f"rank {p.rank} (pid {p.pid} on {p.host.split()[0]})"
                                for p in dead)
                print(f"meta: {who} died; ending this job", file=sys.stderr, flush=True)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        except (OSError, ValueError):
            pass
        finally:
            # every survivor stays a moment, so that the others see the dead alone: not this
            # rank gone too (named with it), nor the one that speaks (another would speak)
            time.sleep(LINGER_S)
            os._exit(EXIT_RANK_DIED)


_WATCHING: list[Watchdog] = []  # this process's watchdog, once started


def end_if_a_peer_died() -> None:
    """End this process as the watchdog does (one line on the lowest survivor, exit 3) when a
    peer is gone; else return. For a rank whose MPI call failed (MPICH reports some deaths as
    an error in a status): the death, not a traceback, is what the user needs. It looks for
    ``LINGER_S``: MPICH sees a killed peer's sockets close a moment before the process is gone
    from ``/proc``, and a rank that ends on another error (a lost server) would be named as
    a second death."""
    until = time.monotonic() + LINGER_S
    while _WATCHING:
        dead = _WATCHING[0].dead()
        if dead:
            _WATCHING[0].end(dead)
        if time.monotonic() >= until:
            return
        time.sleep(0.05)


def watch_peers(comm: Any) -> Watchdog | None:
    """Start the watchdog of this process over the ranks of ``comm`` (an ``MPICommunicator``;
    collective: an allgather of host and pid); None where there is nothing to watch. Not
    under ULFM (``world()`` decides): there the asynchronous strategies survive a death, and
    the watchdog must not end their survivors. (No import of ``communicator`` here: that one
    starts the watchdog.)"""
    if comm.size == 1:
        return None
    mine = me(comm.rank)
    everyone = [Peer(*p) for p in comm.comm.allgather(tuple(mine))]
    # a pid of this host and namespace that is not visible now belongs to another machine
    peers = [p for p in everyone if p.host == mine.host and p.rank != mine.rank and alive(p)]
    watchdog = Watchdog(mine, peers, comm.size).start()
    _WATCHING.append(watchdog)
    if hasattr(signal, "SIGUSR1") and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        # MPICH's Hydra, without auto-cleanup, tells the survivors of a death with SIGUSR1,
        # whose default action ends them at once, silently (exit string "signal 10"): then
        # the watchdog of a third rank would name them dead too. It names the dead instead.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    atexit.register(_leave, comm, watchdog)
    return watchdog


def _leave(comm: Any, watchdog: Watchdog) -> None:
    """At a normal exit: wait (sleeping) until every rank is leaving, the watchdog still on,
    then stop it, so that no rank takes another's normal exit for a death."""
    watchdog.leaving_since = time.monotonic()
    request = comm.comm.Ibarrier()
    while not request.Test():
        time.sleep(LEAVE_POLL_S)
    watchdog.stop()
