"""Communicators: collectives over numpy buffers and small Python objects (ChainerMN's split).

Buffer collectives (``allreduce``, ``bcast``, ``allgather``) move contiguous numpy arrays through
mpi4py's uppercase methods at C speed; object collectives (``*_obj``) pickle and are for small
metadata only (epoch numbers, metric dicts, shapes). Nonblocking calls (``iallreduce``, ``isend``,
``irecv``) return opaque requests, completed by ``wait``/``waitall``/``waitany`` of the same
communicator. ``SingleProcessCommunicator`` makes every
collective the identity, so the same training code runs with and without MPI; ``world()`` picks
one without importing mpi4py unless an MPI launcher started this process.

>>> comm = world()  # SingleProcessCommunicator() outside mpiexec
>>> comm.allreduce(np.ones(3)).tolist()
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import weakref
from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np

OPS = ("sum", "max", "min")
# World sizes set by MPICH's Hydra and Slurm (PMI), Open MPI and MVAPICH launchers.
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
# PMIx launchers (prterun, srun --mpi=pmix) may set only a rank; mpi4py then tells the size.
RANK_ONLY_VARIABLES = ("PMIX_RANK",)


def _check_buffer(buf: Any, what: str, writeable: bool = True) -> np.ndarray:
    """Reject what MPI cannot send in place, naming the array, before any rank blocks."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(
            f"{what}: array of shape {buf.shape} and dtype {buf.dtype} is not C-contiguous; "
            "pass np.ascontiguousarray(buf) (and copy the result back) or use a FlatBuffer"
        )
    if writeable and not buf.flags.writeable:
        raise ValueError(f"{what}: array of shape {buf.shape} and dtype {buf.dtype} is read-only")
    return buf


def _starts(counts: list[int]) -> list[int]:
    """Each part's offset where parts of ``counts`` values lie one after another."""
    return [sum(counts[:i]) for i in range(len(counts))]


def _check_alltoallv(comm: Communicator, send: np.ndarray, send_counts: list[int],
                     send_starts: list[int] | None, recv: np.ndarray, recv_counts: list[int],
                     recv_starts: list[int] | None) -> list[tuple[list[int], list[int]]]:
    """The (counts, starts) of an all-to-all's two sides, checked against the buffers (and
    each other's dtype) before any rank blocks."""
    _check_buffer(send, "ialltoallv", writeable=False)
    _check_buffer(recv, "ialltoallv")
    if send.dtype != recv.dtype:
        raise TypeError(f"ialltoallv: send is {send.dtype}, recv {recv.dtype}")
    out = []
    for counts, starts, buf, which in ((send_counts, send_starts, send, "send"),
                                       (recv_counts, recv_starts, recv, "recv")):
        counts = [int(c) for c in counts]
        starts = _starts(counts) if starts is None else [int(s) for s in starts]
        if len(counts) != comm.size or len(starts) != comm.size or min(counts) < 0 \
                or min(starts) < 0 or max(s + c for s, c in zip(starts, counts)) > buf.size:
            raise ValueError(f"ialltoallv: {which} counts {counts} from {starts} must be "
                             f"{comm.size} non-negative parts within the {which} buffer's "
                             f"{buf.size} values")
        out.append((counts, starts))
    return out


ANY_TAG = -1  # irecv: match a message of any tag (MPI.ANY_TAG)


class _Completed:
    """The request of a size-1 collective: already done."""

    def __repr__(self) -> str:
        return "<completed request>"


COMPLETED = _Completed()


def _check_op(op: str, what: str) -> str:
    if op not in OPS:
        raise ValueError(f"{what}: unknown reduction op {op!r}; expected one of {OPS}")
    return op


class Communicator(ABC):
    """The collectives a distributed optimizer needs; subclasses bind them to a transport."""

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's index among the ranks, 0 to ``size - 1``."""

    @property
    @abstractmethod
    def size(self) -> int:
        """How many ranks this communicator joins (1 without MPI)."""

    @property
    def is_root(self) -> bool:
        """Whether this is rank 0: the rank that prints and writes a run's outputs."""
        return self.rank == 0

    def _check_root(self, root: int, what: str) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"{what}: root {root} is not a rank of this size-{self.size} group")

    @abstractmethod
    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce ``buf`` over all ranks in place; returns ``buf``."""

    @abstractmethod
    def bcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """Overwrite ``buf`` on every rank with root's ``buf``; returns ``buf``."""

    @abstractmethod
    def allgather(self, buf: np.ndarray) -> np.ndarray:
        """Every rank's ``buf`` stacked by rank: shape ``(size, *buf.shape)``."""

    @abstractmethod
    def gather(self, buf: np.ndarray, root: int = 0) -> np.ndarray | None:
        """Every rank's ``buf`` stacked by rank on root: shape ``(size, *buf.shape)``; None
        elsewhere."""

    @abstractmethod
    def iallreduce(self, buf: np.ndarray, op: str = "sum") -> Any:
        """Start reducing ``buf`` in place; returns a request (``buf`` is busy until it is done)."""

    def ireduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int],
                        op: str = "sum") -> Any:
        """Start reducing ``send`` over all ranks and keeping this rank's part: rank r
        receives the ``counts[r]`` values after those of the ranks before it into ``recv``
        (``counts[rank]`` long; ``sum(counts) == send.size``); a request (ZeRO's gradients)."""
        raise NotImplementedError(f"{type(self).__name__}.ireduce_scatter")

    def iallgatherv(self, buf: np.ndarray, counts: list[int]) -> Any:
        """Start gathering in place: rank r's ``counts[r]`` values, after those of the ranks
        before it, are its own and reach every rank's ``buf``; a request (ZeRO's parameters
        after each rank's update of its shard)."""
        raise NotImplementedError(f"{type(self).__name__}.iallgatherv")

    def ialltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                   recv_counts: list[int], send_starts: list[int] | None = None,
                   recv_starts: list[int] | None = None) -> Any:
        """Start an all-to-all: the ``send_counts[q]`` values of ``send`` from
        ``send_starts[q]`` go to rank q, whose ``recv`` takes ``recv_counts[r]`` values from
        each rank r at ``recv_starts[r]`` (starts by default: the parts one after another);
        a request (the bf16 exchange's reduce-scatter, ``comm.bf16``). Any dtype: the values
        move as raw words."""
        raise NotImplementedError(f"{type(self).__name__}.ialltoallv")

    def _check_counts(self, counts: list[int], n: int, what: str) -> list[int]:
        counts = [int(c) for c in counts]
        if len(counts) != self.size or min(counts, default=0) < 0 or sum(counts) != n:
            raise ValueError(f"{what}: counts {counts} must be {self.size} non-negative "
                             f"numbers adding up to the buffer's {n} values")
        return counts

    def _check_peer(self, peer: int, what: str) -> None:
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"{what}: rank {peer} is not another rank of this size-{self.size} "
                             f"group (this is rank {self.rank})")

    @abstractmethod
    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Any:
        """Start sending ``buf`` to ``dest``; returns a request (leave ``buf`` alone until done)."""

    @abstractmethod
    def irecv(self, buf: np.ndarray, source: int, tag: int = ANY_TAG) -> Any:
        """Start receiving into ``buf`` (a message up to its size) from ``source``; a request."""

    @abstractmethod
    def send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None: ...

    @abstractmethod
    def recv(self, buf: np.ndarray, source: int, tag: int = ANY_TAG) -> int:
        """Receive into ``buf`` from ``source``; returns the message's tag."""

    @abstractmethod
    def wait(self, request: Any) -> None: ...

    @abstractmethod
    def waitall(self, requests: list[Any]) -> None: ...

    def test(self, request: Any) -> bool:
        """Whether ``request`` has completed (driving MPI's progress); waits where nothing can
        be pending."""
        self.waitall([request])
        return True

    @abstractmethod
    def waitany(self, requests: list[Any]) -> tuple[int, int]:
        """Wait for one of ``requests``; returns (its index, its message's tag).

        A completed request is replaced by an inactive one, so the list can be waited on again.
        """

    # Tests never block: ``comm.polling`` builds every wait that must leave the core to others
    # from them. Where nothing can be pending (size 1) they complete at once.
    def testall(self, requests: list[Any]) -> bool:
        """Whether every request of ``requests`` has completed (completing them all if so)."""
        self.waitall(requests)
        return True

    def testany(self, requests: list[Any]) -> tuple[int, int] | None:
        """(index, tag) of a request of ``requests`` that has completed (replaced by an inactive
        one), or None while none has; a ValueError when none is active."""
        return self.waitany(requests)

    def testsome(self, requests: list[Any]) -> list[int]:
        """Indices of the requests that have completed (each replaced by an inactive one)."""
        self.waitall(requests)
        return list(range(len(requests)))

    def cancel(self, request: Any) -> None:
        """Cancel a pending receive (it still has to be completed, by a test or a wait)."""

    def null_request(self) -> Any:
        """An inactive request: stands in a list of requests for one that is over."""
        return COMPLETED

    def free(self) -> None:
        """Release this communicator (one that ``split`` made); collective over its ranks."""

    @abstractmethod
    def split(self, color: int, key: int | None = None) -> Communicator:
        """The ranks that pass the same ``color``, ordered by ``key`` (default: rank)."""

    @abstractmethod
    def barrier(self) -> None: ...

    @abstractmethod
    def abort(self, code: int = 1) -> None:
        """End every rank of the job: one rank's failure must not leave the others waiting."""

    @abstractmethod
    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        """Root's ``obj`` on every rank (pickled: small metadata only)."""

    @abstractmethod
    def gather_obj(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Every rank's ``obj`` as a list on root, None elsewhere (pickled)."""

    @abstractmethod
    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any:
        """Reduce Python values (numbers, or anything with ``+``/ordering) over ranks (pickled)."""

    def sum_float(self, partial: float,
                  wait: Callable[[Communicator, list[Any]], None] | None = None) -> float:
        """``partial`` summed over the ranks in float64 (a collective, one 8-byte buffer, not
        pickled): what a sharded optimizer's ``global_sum`` is (a global-norm clip's squared
        norm over every rank's parameters). ``wait(comm, requests)`` completes the request
        (default ``waitall``; ``polling.poll_all`` where ranks share cores)."""
        if self.size == 1:
            return partial
        total = np.array([partial], np.float64)
        request = self.iallreduce(total)
        if wait is None:
            self.waitall([request])
        else:
            wait(self, [request])
        return float(total[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


class SingleProcessCommunicator(Communicator):
    """Size 1: each collective is the identity (or a copy), with the same argument checks as MPI.

    The checks are kept so that code developed without ``mpiexec`` fails here, not on a cluster.
    """

    rank = 0
    """The only rank."""
    size = 1
    """One process."""

    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        _check_op(op, "allreduce")
        return _check_buffer(buf, "allreduce")

    def bcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        self._check_root(root, "bcast")
        return _check_buffer(buf, "bcast")

    def allgather(self, buf: np.ndarray) -> np.ndarray:
        return _check_buffer(buf, "allgather", writeable=False)[np.newaxis].copy()

    def gather(self, buf: np.ndarray, root: int = 0) -> np.ndarray | None:
        self._check_root(root, "gather")
        return _check_buffer(buf, "gather", writeable=False)[np.newaxis].copy()

    def iallreduce(self, buf: np.ndarray, op: str = "sum") -> Any:
        self.allreduce(buf, op)
        return COMPLETED

    def ireduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int],
                        op: str = "sum") -> Any:
        _check_op(op, "ireduce_scatter")
        counts = self._check_counts(counts, _check_buffer(send, "ireduce_scatter", False).size,
                                    "ireduce_scatter")
        if _check_buffer(recv, "ireduce_scatter").size != counts[0]:
            raise ValueError(f"ireduce_scatter: recv has {recv.size} values, counts[0] is "
                             f"{counts[0]}")
        np.copyto(recv.reshape(-1), send.reshape(-1))
        return COMPLETED

    def iallgatherv(self, buf: np.ndarray, counts: list[int]) -> Any:
        self._check_counts(counts, _check_buffer(buf, "iallgatherv").size, "iallgatherv")
        return COMPLETED

    def ialltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                   recv_counts: list[int], send_starts: list[int] | None = None,
                   recv_starts: list[int] | None = None) -> Any:
        (sc, ss), (rc, rs) = _check_alltoallv(self, send, send_counts, send_starts, recv,
                                              recv_counts, recv_starts)
        if sc[0] != rc[0]:
            raise ValueError(f"ialltoallv: rank 0 sends itself {sc[0]} values but receives "
                             f"{rc[0]}")
        recv.reshape(-1)[rs[0]:rs[0] + rc[0]] = send.reshape(-1)[ss[0]:ss[0] + sc[0]]
        return COMPLETED

    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Any:
        self._check_peer(dest, "isend")

    def irecv(self, buf: np.ndarray, source: int, tag: int = ANY_TAG) -> Any:
        self._check_peer(source, "irecv")

    def send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "send")

    def recv(self, buf: np.ndarray, source: int, tag: int = ANY_TAG) -> int:
        self._check_peer(source, "recv")
        return tag

    def wait(self, request: Any) -> None:
        pass

    def waitall(self, requests: list[Any]) -> None:
        pass

    def waitany(self, requests: list[Any]) -> tuple[int, int]:
        raise ValueError("waitany: a size-1 communicator has no pending point-to-point requests")

    def split(self, color: int, key: int | None = None) -> Communicator:
        return self

    def barrier(self) -> None:
        pass

    def abort(self, code: int = 1) -> None:
        raise SystemExit(code)

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        self._check_root(root, "bcast_obj")
        return obj

    def gather_obj(self, obj: Any, root: int = 0) -> list[Any] | None:
        self._check_root(root, "gather_obj")
        return [obj]

    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any:
        _check_op(op, "allreduce_obj")
        return obj


# Open MPI's mpiexec --with-ft ulfm sets this for every rank (measured: Open MPI 5.0.11).
ULFM_VARIABLE = "OMPI_MCA_mpi_ft_enable"


def ulfm_on(environ: os._Environ | dict = os.environ) -> bool:
    """Whether this job survives a dead rank: launched with ULFM, and mpi4py exposes it."""
    if environ.get(ULFM_VARIABLE, "").lower() not in ("1", "true", "yes", "enabled"):
        return False
    return hasattr(_import_mpi(), "ERR_PROC_FAILED")


def _import_mpi() -> Any:
    """Import mpi4py's MPI, asking for MPI_THREAD_MULTIPLE if MPI is not initialised yet
    (``META_MPI_THREAD_LEVEL`` chooses another level).

    meta calls MPI from one thread per rank, so "single" would do, but the MPICH wheel's
    blocking allreduce of 256 KiB-2.6 MiB is several times slower at that level: the MNIST
    MLP's 2.7 MB of gradients took 2.06 ms per step at -n 2 under "single" and 0.78 ms under
    "multiple" (benchmarks/data_parallel.py), the nonblocking allreduce the same in both.
    Under Open MPI (its launcher sets OMPI_COMM_WORLD_SIZE) meta keeps "single": with ULFM
    and a killed rank, a run at "multiple" once finished its work and then never exited.
    """
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:  # once MPI is loaded, rc changes nothing
        default = "single" if "OMPI_COMM_WORLD_SIZE" in os.environ else "multiple"
        mpi4py.rc.thread_level = os.environ.get("META_MPI_THREAD_LEVEL", default)
    from mpi4py import MPI

    return MPI


# Every MPICommunicator made in this process: under ULFM, ``abort`` revokes them all.
FOLLOW_S = 5.0  # under ULFM, how long a rank waits for another's abort to end the job
_LIVE: weakref.WeakSet[MPICommunicator] = weakref.WeakSet()


@contextlib.contextmanager
def _error_of_status(MPI: Any, statuses: list[Any]) -> Any:  # noqa: N803 - the module's name
    """Raise the error of the request that failed rather than ``ERR_IN_STATUS``: a test or
    wait on several requests reports only that one of them failed, and whether it failed
    because a peer died, or because a rank that saw the death revoked the communicator, is
    in that request's status (this rank may know of no death itself: it talks to neither)."""
    try:
        yield
    except MPI.Exception as err:
        if err.Get_error_class() != MPI.ERR_IN_STATUS:
            raise
        codes = [s.Get_error() for s in statuses]
        first = next((c for c in codes if c not in (MPI.SUCCESS, MPI.ERR_PENDING)), None)
        if first is None:
            raise
        raise MPI.Exception(first) from err


class MPICommunicator(Communicator):
    """Wraps an mpi4py communicator (``MPI.COMM_WORLD`` by default).

    Arrays go through the uppercase (buffer) methods; only ``*_obj`` pickle.
    """

    def __init__(self, comm: Any = None) -> None:
        self._MPI = _import_mpi()
        self.comm = self._MPI.COMM_WORLD if comm is None else comm
        """The mpi4py communicator wrapped, for what this interface lacks (its uppercase
        methods take numpy buffers); bytes sent through it directly are the caller's to count
        in a strategy's ``bytes_sent``."""
        _LIVE.add(self)
        self._rank = self.comm.Get_rank()
        self._size = self.comm.Get_size()
        self._ops = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}
        self._status = self._MPI.Status()

    @property
    def rank(self) -> int:
        """This process's rank in the wrapped communicator."""
        return self._rank

    @property
    def size(self) -> int:
        """The wrapped communicator's size."""
        return self._size

    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        mpi_op = self._ops[_check_op(op, "allreduce")]
        self.comm.Allreduce(self._MPI.IN_PLACE, _check_buffer(buf, "allreduce"), mpi_op)
        return buf

    def bcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        self._check_root(root, "bcast")
        self.comm.Bcast(_check_buffer(buf, "bcast"), root=root)
        return buf

    def allgather(self, buf: np.ndarray) -> np.ndarray:
        _check_buffer(buf, "allgather", writeable=False)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        self.comm.Allgather(buf, out)
        return out

    def gather(self, buf: np.ndarray, root: int = 0) -> np.ndarray | None:
        self._check_root(root, "gather")
        _check_buffer(buf, "gather", writeable=False)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype) if self._rank == root else None
        self.comm.Gather(buf, out, root=root)
        return out

    def iallreduce(self, buf: np.ndarray, op: str = "sum") -> Any:
        mpi_op = self._ops[_check_op(op, "iallreduce")]
        return self.comm.Iallreduce(self._MPI.IN_PLACE, _check_buffer(buf, "iallreduce"), mpi_op)

    def ireduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int],
                        op: str = "sum") -> Any:
        mpi_op = self._ops[_check_op(op, "ireduce_scatter")]
        counts = self._check_counts(counts, _check_buffer(send, "ireduce_scatter", False).size,
                                    "ireduce_scatter")
        if _check_buffer(recv, "ireduce_scatter").size != counts[self._rank]:
            raise ValueError(f"ireduce_scatter: recv has {recv.size} values, rank "
                             f"{self._rank}'s count is {counts[self._rank]}")
        return self.comm.Ireduce_scatter(send, recv, counts, mpi_op)

    def iallgatherv(self, buf: np.ndarray, counts: list[int]) -> Any:
        counts = self._check_counts(counts, _check_buffer(buf, "iallgatherv").size,
                                    "iallgatherv")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        return self.comm.Iallgatherv(self._MPI.IN_PLACE, [buf, counts, starts,
                                                         self._MPI._typedict[buf.dtype.char]])

    def ialltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray,
                   recv_counts: list[int], send_starts: list[int] | None = None,
                   recv_starts: list[int] | None = None) -> Any:
        (sc, ss), (rc, rs) = _check_alltoallv(self, send, send_counts, send_starts, recv,
                                              recv_counts, recv_starts)
        kind = self._MPI._typedict[send.dtype.char]
        return self.comm.Ialltoallv([send, sc, ss, kind], [recv, rc, rs, kind])

    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Any:
        self._check_peer(dest, "isend")
        return self.comm.Isend(_check_buffer(buf, "isend", writeable=False), dest, tag)

    def irecv(self, buf: np.ndarray, source: int, tag: int = ANY_TAG) -> Any:
        self._check_peer(source, "irecv")
        return self.comm.Irecv(_check_buffer(buf, "irecv"), source, tag)

    def send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None:
        self._check_peer(dest, "send")
        self.comm.Send(_check_buffer(buf, "send", writeable=False), dest, tag)

    def recv(self, buf: np.ndarray, source: int, tag: int = ANY_TAG) -> int:
        self._check_peer(source, "recv")
        self.comm.Recv(_check_buffer(buf, "recv"), source, tag, self._status)
        return self._status.Get_tag()

    def wait(self, request: Any) -> None:
        request.Wait()

    def waitall(self, requests: list[Any]) -> None:
        statuses = [self._MPI.Status() for _ in requests]
        with _error_of_status(self._MPI, statuses):
            self._MPI.Request.Waitall(requests, statuses)

    def test(self, request: Any) -> bool:
        return bool(request.Test())

    def waitany(self, requests: list[Any]) -> tuple[int, int]:
        index = self._MPI.Request.Waitany(requests, self._status)
        if index == self._MPI.UNDEFINED:
            raise ValueError(f"waitany: none of the {len(requests)} requests is active")
        return index, self._status.Get_tag()

    def testall(self, requests: list[Any]) -> bool:
        statuses = [self._MPI.Status() for _ in requests]
        with _error_of_status(self._MPI, statuses):
            return bool(self._MPI.Request.Testall(requests, statuses))

    def testany(self, requests: list[Any]) -> tuple[int, int] | None:
        status = self._MPI.Status()  # not self._status: pipeline stages test from threads
        index, done = self._MPI.Request.Testany(requests, status)
        if not done:
            return None
        if index == self._MPI.UNDEFINED:
            raise ValueError(f"testany: none of the {len(requests)} requests is active")
        return index, status.Get_tag()

    def testsome(self, requests: list[Any]) -> list[int]:
        statuses = [self._MPI.Status() for _ in requests]
        with _error_of_status(self._MPI, statuses):  # None: none is active
            return list(self._MPI.Request.Testsome(requests, statuses) or ())

    def cancel(self, request: Any) -> None:
        request.Cancel()

    def null_request(self) -> Any:
        return self._MPI.REQUEST_NULL

    def free(self) -> None:
        self.comm.Free()

    def split(self, color: int, key: int | None = None) -> Communicator:
        return MPICommunicator(self.comm.Split(color, self._rank if key is None else key))

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        """``MPI_Abort``. Under ULFM, by one rank only: the first to end the job revokes every
        communicator (each other rank's next call fails, and so it learns that the job ends)
        and aborts; a rank that finds the world already revoked waits to be ended by that
        abort (and exits after ``FOLLOW_S`` if not). Open MPI 5.0.11's ``mpiexec --with-ft
        ulfm`` hung, every rank gone, in about 1 of 40 runs where several ranks called
        ``MPI_Abort`` after a rank had died, and did not always tell the ranks of one that
        exited."""

        if ulfm_on():
            follower = self._MPI.COMM_WORLD.Is_revoked()
            revoke_all()
            sys.stdout.flush()
            sys.stderr.flush()
            if follower:
                time.sleep(FOLLOW_S)
                os._exit(code)
        self.comm.Abort(code)

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        self._check_root(root, "bcast_obj")
        return self.comm.bcast(obj, root=root)

    def gather_obj(self, obj: Any, root: int = 0) -> list[Any] | None:
        self._check_root(root, "gather_obj")
        return self.comm.gather(obj, root=root)

    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any:
        return self.comm.allreduce(obj, op=self._ops[_check_op(op, "allreduce_obj")])


def revoke_all() -> None:
    """Under ULFM, revoke every live communicator: each other rank's pending or next call on
    one fails, so a rank that ends the job leaves none blocked waiting for it (a pipeline stage
    waiting for activations from a stage that has exited, say)."""
    for comm in {id(c.comm): c.comm for c in list(_LIVE)}.values():
        if not comm.Is_revoked():
            comm.Revoke()


def launched_size(environ: os._Environ | dict = os.environ) -> int | None:
    """World size an MPI launcher announced in the environment; None when not launched.

    Returns 0 when a launcher is present but set no size (PMIx), meaning "ask MPI".
    """
    for name in SIZE_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    if any(name in environ for name in RANK_ONLY_VARIABLES):
        return 0
    return None


# The exit status of a job that a rank's uncaught exception ended: meta's "error" status (as
# ``meta run`` aborts with when training raises), not 1, which says that a metric missed.
UNCAUGHT_EXIT = 2
ABORT_GRACE_S = 0.3  # between a rank's last words and MPI_Abort


def abort_on_uncaught_exception(comm: MPICommunicator, code: int = UNCAUGHT_EXIT) -> None:
    """An uncaught exception on this rank ends the whole job (``MPI_Abort``) once Python has
    printed it. Without this the rank's exit runs ``MPI_Finalize``, which waits for the other
    ranks, while they wait in their next collective for this one: the job hangs forever (what
    ``python -m mpi4py`` also prevents)."""
    from meta.lv3.comm.liveness import end_if_a_peer_died

    previous = sys.excepthook

    def abort(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        end_if_a_peer_died()  # an MPI error because a peer died: say that, not a traceback
        try:
            previous(kind, value, tb)
            print(f"meta: rank {comm.rank} of {comm.size} stopped on an uncaught "
                  f"{kind.__name__}; ending all {comm.size} ranks", file=sys.stderr, flush=True)
        finally:
            # MPI_Abort tears the launcher's forwarding down with the ranks: give it a moment
            # to pass on what this rank just wrote (under CI's load the traceback was cut off
            # mid-line and the one line above never arrived)
            sys.stderr.flush()
            time.sleep(ABORT_GRACE_S)
            comm.abort(code)

    sys.excepthook = abort


@functools.cache
def world() -> Communicator:
    """All ranks of this job: MPI's world when launched with >1 rank, else a size-1 communicator.

    Outside a launcher mpi4py is never imported, so single-process runs need no MPI at all.
    Under MPI, a rank's uncaught exception ends every rank (``abort_on_uncaught_exception``),
    and a rank that dies ends the job within seconds (``liveness.watch_peers``; ULFM's
    errors instead where it is on).
    """
    from meta.lv3.comm.liveness import watch_peers

    size = launched_size()
    if size is None or size == 1:
        return SingleProcessCommunicator()
    comm = MPICommunicator()
    if comm.size == 1:
        return SingleProcessCommunicator()
    abort_on_uncaught_exception(comm)
    if not ulfm_on():  # under ULFM, survival's errors report a death instead
        watch_peers(comm)
    return comm
