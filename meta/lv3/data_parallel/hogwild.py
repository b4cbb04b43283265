"""Hogwild on one node (seed 003; Niu et al.): lock-free SGD on parameters in shared memory.

The ranks of one node share one copy of the parameters: an MPI shared-memory window
(``Win.Allocate_shared`` on the node's ``Split_type(COMM_TYPE_SHARED)`` communicator), mapped
into every rank as a numpy array. The trainer's parameter dict is pointed at views of that
memory, so each rank's forward pass reads whatever the others have written so far and its
optimizer's in-place update (``params += update``) writes straight into it: no message, no
lock, no server. Races lose a little (two read-modify-writes of one value may overlap), which
sparse or small updates make rare; the seed's "Hogwild + async begets momentum": the staleness
acts as extra momentum, so a lower explicit momentum fits.

Against ``async_rma`` (the same asynchrony through a locked one-sided window on a server rank)
it saves the lock, the two copies a step and the rank that only serves. It needs the ranks on
one node; elsewhere it refuses in one line (``check``).

>>> from meta.lv2.optimizers import Optimizer, sgd
>>> opt = Hogwild(Optimizer(sgd(0.1), {"w": np.array([1.0])}))  # size 1: trains locally
>>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
[0.8]
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np

from meta.common import threads as _threads
from meta.common.component import ComponentError, Option
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.comm.communicator import Communicator, MPICommunicator
from meta.lv3.comm.costmodel import Link
from meta.lv3.comm.shared_memory import SharedSegments, node_of
from meta.lv3.flat import FlatBuffer
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload


def ranks_on_this_node(environ: os._Environ | dict = os.environ) -> int | None:
    """The local rank count the launcher announced (Hydra, Open MPI, Slurm); None if none."""
    for name in _threads.LOCAL_SIZE_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def refusal(size: int, on_node: int | None) -> str | None:
    """The one-line reason Hogwild cannot run ``size`` ranks with ``on_node`` on this node."""
    if size > 1 and on_node is not None and on_node != size:
        return (f"distributed 'hogwild' shares the parameters in one node's memory, but only "
                f"{on_node} of the {size} ranks run on this node; start all ranks on one node "
                "or use distributed 'async_rma' (one-sided, across nodes)")
    return None


class SharedParameters:
    """``flat``'s values in a shared-memory window of ``comm``'s ranks (collective), and a
    FlatBuffer whose buffer and views are that memory; ``release`` copies them out and frees
    the window (collective)."""

    def __init__(self, comm: MPICommunicator, flat: FlatBuffer) -> None:
        node = node_of(comm)
        on_node = node.size if node is not None else 1
        if on_node != comm.size:
            if node is not None:
                node.free()
            raise ComponentError(refusal(comm.size, on_node))
        self.window = SharedSegments.on_first(node, flat.buffer)
        """The node's shared window holding the parameters, filled with ``flat``'s values
        on its first rank (nobody reads before it)."""
        self.flat = FlatBuffer(flat.shapes, flat.dtype, buffer=self.window.segments[0])
        """The parameters laid out in the node's shared window (buffer and views are that
        memory); None after ``release``."""
        self.node = node
        """The communicator of this node's ranks that share the window."""

    def fence(self) -> None:
        """Make this rank's writes visible to the others (a memory barrier, not a lock)."""
        self.window.sync()

    def release(self, into: FlatBuffer) -> None:
        """Copy the final values into ``into`` and free the window (every rank, collective)."""
        self.window.polling = True  # a rank done early yields its core to the others
        self.window.fence()  # everyone's last write is in
        np.copyto(into.buffer, self.flat.buffer)
        self.window.fence()  # every rank has its copy before the memory goes
        self.flat = None
        self.window.free()
        self.node.free()


class Hogwild(Strategy):
    """Lock-free asynchronous SGD: every rank trains on parameters in one node's shared memory.

    Each rank steps the wrapped optimizer on its own gradients (its momentum stays local);
    the update lands in the shared parameters as it is computed, unlocked. ``finish`` waits for
    every rank and gives each a private copy of the final parameters. At size 1 it trains
    locally. Nothing is sent (``bytes_sent`` stays 0); ``shared_bytes_written_per_step`` says
    how much a step writes into the shared memory.
    """

    name = "hogwild"
    options: ClassVar[dict[str, Option]] = {}
    """None of ``Strategy``'s: it never averages in chunks, so ``chunk_bytes`` would do
    nothing (``meta components`` lists only the options that apply)."""
    consistent = False
    """a rank's last evaluation may race the others' last steps"""

    @classmethod
    def check(cls, optimizer: Any, comm: Communicator, workload: Workload | None) -> None:
        super().check(optimizer, comm, workload)
        reason = refusal(comm.size, ranks_on_this_node())
        if reason:
            raise ComponentError(reason)

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None,
                 **options: Any) -> None:
        super().__init__(optimizer, comm, **options)
        self.shared: SharedParameters | None = None
        """The parameters in shared memory that every rank trains (None on one process or after
        ``finish``)."""
        self.private = self.flat_params
        """This rank's own parameter buffer, which ``finish`` copies the final shared values
        into."""
        if self.comm.size > 1:
            if not isinstance(self.comm, MPICommunicator):
                raise TypeError(f"Hogwild: shared memory needs an MPICommunicator, got "
                                f"{self.comm!r}")
            self.shared = SharedParameters(self.comm, self.flat_params)
            self._bind(self.shared.flat)

    def _bind(self, flat: FlatBuffer) -> None:
        """Point the optimizer's (the trainer's) parameter dict at ``flat``'s views."""
        self.flat_params = flat
        self.optimizer.params.update(flat.views)

    def step(self, grads: Params) -> None:
        t = self.timeline
        t.begin()
        self.optimizer.step(grads)  # in place: straight into the shared memory
        t.lap("update")
        if self.shared is not None:
            self.shared.fence()
            t.lap("communicate")

    def finish(self) -> None:
        if self.shared is not None:
            self.shared.release(self.private)
            self.shared = None
            self._bind(self.private)

    def report(self) -> dict[str, float]:
        out = super().report()
        out["shared_bytes_written_per_step"] = float(self.private.nbytes) \
            if self.comm.size > 1 else 0.0
        return out

    def predict_comm_s(self, link: Link) -> float:
        """No message: the network's link is not used."""
        return 0.0
