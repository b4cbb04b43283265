"""Communicators: collectives over numpy buffers and small Python objects (ChainerMN's split).

Buffer collectives (``allreduce``, ``bcast``, ``allgather``) move contiguous numpy arrays through
mpi4py's uppercase methods at C speed; object collectives (``*_obj``) pickle and are for small
metadata only (epoch numbers, metric dicts, shapes). ``SingleProcessCommunicator`` makes every
collective the identity, so the same training code runs with and without MPI; ``world()`` picks
one without importing mpi4py unless an MPI launcher started this process.

>>> comm = world()  # SingleProcessCommunicator() outside mpiexec
>>> comm.allreduce(np.ones(3)).tolist()
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import functools
import os
import sys
from abc import ABC, abstractmethod
from typing import Any

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


def _check_op(op: str, what: str) -> str:
    if op not in OPS:
        raise ValueError(f"{what}: unknown reduction op {op!r}; expected one of {OPS}")
    return op


class Communicator(ABC):
    """The collectives a distributed optimizer needs; subclasses bind them to a transport."""

    @property
    @abstractmethod
    def rank(self) -> int: ...

    @property
    @abstractmethod
    def size(self) -> int: ...

    @property
    def is_root(self) -> bool:
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


class SingleProcessCommunicator(Communicator):
    """Size 1: each collective is the identity (or a copy), with the same argument checks as MPI.

    The checks are kept so that code developed without ``mpiexec`` fails here, not on a cluster.
    """

    rank = 0
    size = 1

    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        _check_op(op, "allreduce")
        return _check_buffer(buf, "allreduce")

    def bcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        self._check_root(root, "bcast")
        return _check_buffer(buf, "bcast")

    def allgather(self, buf: np.ndarray) -> np.ndarray:
        return _check_buffer(buf, "allgather", writeable=False)[np.newaxis].copy()

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


def _import_mpi() -> Any:
    """Import mpi4py's MPI, asking for MPI_THREAD_SINGLE if MPI is not initialised yet.

    mpi4py defaults to MPI_THREAD_MULTIPLE, whose locking measurably slowed small allreduces;
    meta calls MPI from one thread per rank only.
    """
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:  # once MPI is loaded, rc changes nothing
        mpi4py.rc.thread_level = "single"
    from mpi4py import MPI

    return MPI


class MPICommunicator(Communicator):
    """Wraps an mpi4py communicator (``MPI.COMM_WORLD`` by default).

    Arrays go through the uppercase (buffer) methods; only ``*_obj`` pickle.
    """

    def __init__(self, comm: Any = None) -> None:
        self._MPI = _import_mpi()
        self.comm = self._MPI.COMM_WORLD if comm is None else comm
        self._rank = self.comm.Get_rank()
        self._size = self.comm.Get_size()
        self._ops = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
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

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        self._check_root(root, "bcast_obj")
        return self.comm.bcast(obj, root=root)

    def gather_obj(self, obj: Any, root: int = 0) -> list[Any] | None:
        self._check_root(root, "gather_obj")
        return self.comm.gather(obj, root=root)

    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any:
        return self.comm.allreduce(obj, op=self._ops[_check_op(op, "allreduce_obj")])


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


@functools.cache
def world() -> Communicator:
    """All ranks of this job: MPI's world when launched with >1 rank, else a size-1 communicator.

    Outside a launcher mpi4py is never imported, so single-process runs need no MPI at all.
    """
    size = launched_size()
    if size is None or size == 1:
        return SingleProcessCommunicator()
    comm = MPICommunicator()
    return comm if comm.size > 1 else SingleProcessCommunicator()
