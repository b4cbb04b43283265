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

A rank that leaves normally must not look dead to the others, and no collective may tell
them (a rank that is gone cannot take part, and ranks that meet at exit all enter
``MPI_Finalize`` at once, which MPICH 5.0.2's Hydra sometimes ends with a SIGKILL when a
Downpour worker was lost: measured, 6 of 9 dropout checks with a barrier at exit, 0 of 9
without). Each host's ranks share a job folder instead. Another local user must not be able
to forge it (a folder name they predict and make first, a symbolic link in it, a marker that
makes a killed rank look as if it had left: the job would hang, or write where they chose), so
the lowest rank of each host makes it (``make_job_folder``: ``mkdtemp``, mode 0700, in this
user's private ``meta-UID`` folder of the temporary folder) with a random token, and hands
path and token to the others through MPI (an allgather); each rank checks that the folder is
this user's, open to no one else and no symbolic link, and every file in it is made with
``O_EXCL|O_NOFOLLOW`` and holds the token. At a normal exit a rank writes its marker there
(``left.R``), then calls ``MPI_Finalize`` itself, the watchdog still on: a peer gone with its
marker (holding the token) has left; one gone without it has died, also while this rank is in
``MPI_Finalize``. The last to leave (it finds every marker) removes the folder; a rank that has
left and finds the folder gone knows that every rank of its host has left. A job whose ranks
were all killed at once leaves its folder behind: each rank names itself there
(``pid.PID.STARTED``), and the next job's lowest rank of the host removes the folders whose
ranks are all gone (``sweep``, in the private folder, only folders of this user). Without a
usable temporary folder the host's lowest rank says so in one line and the host's ranks run
without the watch.

Limits: a peer on another host is not seen (no ``/proc`` across hosts); there MPICH's default
auto-cleanup, or Open MPI's, ends the job when a rank dies. A death before the world is made
(inside ``MPI_Init``) is the launcher's to see; a rank killed after it wrote its marker (inside
``MPI_Finalize``) counts as having left.

>>> from meta.lv3.comm.communicator import SingleProcessCommunicator
>>> watch_peers(SingleProcessCommunicator()) is None  # nothing to watch without peers
True
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

WATCH_S = 0.1  # how often the watchdog looks at its peers (a few syscalls each): a death is
# seen within this, and a rank that ends in reaction to it is seldom taken for a second death
# The exit status of a rank that ended itself because a peer died; under ULFM, of a run that
# is not survivable and lost a rank (``survival.end_without_finalize_after_a_death``).
EXIT_RANK_DIED = 3
LINGER_S = 1.0  # how long a survivor stays after it saw a death, before it ends
JOB_PREFIX = "meta-job-"  # the job folders' names (``mkdtemp`` adds a random suffix)
PRIVATE = "meta-{uid}"  # this user's folder of job folders, in the temporary folder
LEFT = "left."  # a marker's name, before the rank: this rank left normally
PID = "pid."  # a rank's name in its job folder: pid.PID.STARTED, for ``sweep``


class Peer(NamedTuple):
    """What a rank tells the others about itself once: where to look for it."""

    rank: int
    """Its rank in the job's world communicator."""
    host: str
    """hostname and pid namespace: pids compare only within both"""
    pid: int
    """Its process id (in ``host``'s pid namespace)."""
    started: str
    """/proc/PID/stat's start time ("" where there is no /proc)"""


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


def not_private(path: Path) -> str | None:
    """Why ``path`` is no private folder of this user (a symbolic link, not a folder, another
    user's, open to others), or None where it is one. Never follows a link."""
    try:
        st = os.lstat(path)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_folder() -> tuple[Path, str | None]:
    """This user's folder of job folders, ``meta-UID`` in the temporary folder, made with mode
    0700 where it is missing; and a warning where that name is taken by what is not this user's
    private folder (another user made it first): then the temporary folder itself, where
    ``mkdtemp``'s random names are as safe. Raises OSError where there is no usable temporary
    folder (``tempfile.gettempdir`` raises FileNotFoundError, an OSError, then)."""
    temporary = Path(tempfile.gettempdir())
    mine = temporary / PRIVATE.format(uid=os.geteuid())
    try:
        os.mkdir(mine, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return temporary, None  # cannot make it (a read-only parent): mkdtemp's error says why
    problem = not_private(mine)
    if problem:
        return temporary, f"{mine} {problem}: job folders go to {temporary} instead"
    return mine, None


def make_job_folder() -> tuple[Path, str, str | None]:
    """A new job folder no other user can predict, enter or forge (``mkdtemp``: a random name,
    mode 0700), in ``private_folder()``; the token its files hold; a warning or None."""
    base, warning = private_folder()
    job = Path(tempfile.mkdtemp(prefix=JOB_PREFIX, dir=base))
    return job, secrets.token_hex(16), warning


def write_token(path: Path, token: str) -> None:
    """Make ``path`` (a new file: never one that exists, never through a symbolic link) holding
    ``token``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token)


def holds(path: Path, token: str) -> bool:
    """Whether ``path`` is a file of this job: no symbolic link, holding ``token``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as file:
        try:
            return stat.S_ISREG(os.fstat(file.fileno()).st_mode) and \
                file.read(len(token) + 1) == token.encode()
        except OSError:
            return False


def sweep(folder: Path, keep: Path) -> None:
    """Remove the job folders in ``folder`` (but ``keep``) whose ranks are all gone: a job
    whose ranks were all killed at once (``mpiexec``'s auto-cleanup, an ``MPI_Abort``) left its
    folder behind. A folder whose ranks have not all named themselves yet is kept, and so is
    what is not this user's private folder (a link, another user's)."""
    try:
        candidates = [e.path for e in os.scandir(folder)
                      if e.name.startswith(JOB_PREFIX) and e.path != str(keep)]
    except OSError:
        return
    for job in candidates:
        if not_private(Path(job)):
            continue
        try:
            ranks = [name.split(".") for name in os.listdir(job) if name.startswith(PID)]
        except OSError:  # gone meanwhile
            continue
        if ranks and not any(alive(Peer(0, "", int(pid), started)) for _, pid, started in ranks
                             if pid.isdigit()):
            shutil.rmtree(job, ignore_errors=True)


class Watchdog:
    """Checks the peers of this host every ``WATCH_S`` from a daemon thread that never calls
    MPI, and ends this process when one is gone without leaving (see the module's docstring).
    ``job`` is the host's job folder (``make_job_folder``); it must exist before any rank
    leaves. A marker counts where it holds ``token``."""

    def __init__(self, mine: Peer, peers: list[Peer], size: int, job: Path,
                 token: str) -> None:
        self.mine, self.peers, self.size, self.job, self.token = mine, peers, size, job, token
        """``mine``: what this rank told the others. ``peers``: what they told. ``size``: ranks
        in the job. ``job``: the job's private folder. ``token``: the job's secret, in every
        marker."""
        self.left = False
        """this rank has written its marker"""
        self._stop = threading.Event()
        self._ending = threading.Lock()  # the watchdog and the main thread may both end it
        self._thread = threading.Thread(target=self._watch, name="meta-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def marker(self, rank: int) -> Path:
        return self.job / f"{LEFT}{rank}"

    def dead(self) -> list[Peer]:
        """The peers gone without leaving. One that left is watched no more."""
        gone = [p for p in self.peers if not alive(p)]
        if not gone:
            return []
        # a process writes its marker before it ends: look for markers after the processes
        if self.left and not self.job.is_dir():  # the last of this host left, and removed it
            self.peers = []
            return []
        dead = [p for p in gone if not holds(self.marker(p.rank), self.token)]
        self.peers = [p for p in self.peers if p in dead or p not in gone]
        return dead

    def leave(self) -> None:
        """At a normal exit: write this rank's marker; the last to leave (it finds every rank
        of this host's marker) removes the job folder."""
        try:
            write_token(self.marker(self.mine.rank), self.token)
        except OSError:  # no folder: then its peers will take this exit for a death
            return
        self.left = True
        ranks = [self.mine.rank, *(p.rank for p in self.peers)]  # the peers not yet gone
        if all(holds(self.marker(r), self.token) for r in ranks):
            shutil.rmtree(self.job, ignore_errors=True)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            try:
                dead = self.dead()
            except Exception:  # noqa: BLE001 - an odd /proc must not end the watch
                continue
            if dead and not self._stop.is_set():
                self.end(dead)

    def end(self, dead: list[Peer]) -> None:
        """One line on the lowest surviving rank of this host, then end this process."""
        if not self._ending.acquire(blocking=False):  # the other thread is ending it already
            time.sleep(2 * LINGER_S)
            os._exit(EXIT_RANK_DIED)
        lost = {p.rank for p in dead}
        survivors = [r for r in [self.mine.rank, *(p.rank for p in self.peers)] if r not in lost]
        speaker = self.mine.rank == min(survivors)
        try:  # mpiexec may be gone already (its pipes closed): end all the same
            if speaker:
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
            if speaker:  # the others have seen the death by now: the folder is no more use
                shutil.rmtree(self.job, ignore_errors=True)
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
    collective: an allgather of host and pid, one of each host's job folder and token); None
    where there is nothing to watch (one rank; no private job folder can be made: then no
    rank's exit could be told from a death). Not
    under ULFM (``world()`` decides): there the asynchronous strategies survive a death, and
    the watchdog must not end their survivors. (No import of ``communicator`` here: that one
    starts the watchdog.)"""
    if comm.size == 1:
        return None
    mine = me(comm.rank)
    everyone = [Peer(*p) for p in comm.comm.allgather(tuple(mine))]
    # a pid of this host and namespace that is not visible now belongs to another machine
    peers = [p for p in everyone if p.host == mine.host and p.rank != mine.rank and alive(p)]
    lowest = min([mine.rank, *(p.rank for p in peers)])  # makes the folder, cleans up
    offer: tuple[str, str] | None = None
    if lowest == mine.rank:
        try:  # gettempdir() too: it raises where no temporary folder is usable
            job, token, warning = make_job_folder()
            write_token(job / f"{PID}{mine.pid}.{mine.started}", token)
            offer = (str(job), token)
            if warning:
                print(f"meta: warning: {warning}", file=sys.stderr, flush=True)
        except OSError as err:
            print(f"meta: warning: no liveness watch on the ranks of host "
                  f"{mine.host.split()[0]}: cannot make a private job folder "
                  f"({err.strerror or err}); set TMPDIR to a writable folder", file=sys.stderr,
                  flush=True)
    offers = comm.comm.allgather(offer)  # every rank takes part, whatever its host's lowest met
    if offers[lowest] is None:  # its lowest rank said why
        return None
    job, token = Path(offers[lowest][0]), offers[lowest][1]
    if lowest != mine.rank:
        # before the watch starts: no peer of this host leaves before every one made its file
        problem = not_private(job)
        try:
            if problem:
                raise OSError(problem)
            write_token(job / f"{PID}{mine.pid}.{mine.started}", token)
        except OSError as err:
            print(f"meta: warning: no liveness watch on rank {comm.rank}: job folder {job} "
                  f"{err.strerror or err}", file=sys.stderr, flush=True)
            return None
    else:
        sweep(job.parent, keep=job)
    watchdog = Watchdog(mine, peers, comm.size, job, token).start()
    _WATCHING.append(watchdog)
    if hasattr(signal, "SIGUSR1") and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        # MPICH's Hydra, without auto-cleanup, tells the others with SIGUSR1 when a rank ends
        # (measured: also when it ended normally, as its MPI_Finalize sends Hydra no word),
        # and its default action ends them at once, silently (exit string "signal 10"): then
        # the watchdog of a third rank would name them dead too. Watching is meta's job.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    atexit.register(_leave, watchdog)
    return watchdog


def _leave(watchdog: Watchdog) -> None:
    """At a normal exit: the marker, then ``MPI_Finalize`` here, with the watchdog on. (mpi4py
    would call it after the interpreter's end, when no Python thread runs any more: a peer that
    died then would leave this rank waiting in it.) ``mpi4py.rc.finalize = False`` is kept."""
    watchdog.leave()
    mpi4py, mpi = sys.modules.get("mpi4py"), sys.modules.get("mpi4py.MPI")
    if mpi is None or getattr(mpi4py.rc, "finalize", None) is False:
        return
    if mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
