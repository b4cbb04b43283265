"""The allreduce strategy's exchange among ranks of one machine: through shared memory.

An MPI allreduce between processes of one machine copies every gradient into MPI's shared
buffers, sums there and copies the sum out again, then every rank applies the same whole
update: on the MNIST MLP (2.7 MB of gradients, 2 ranks on 2 cores) 0.64 ms for the allreduce
and 0.58 ms for the update, against a 2.8 ms forward and backward, because each rank's core
does its share of all that copying itself. Here the backward writes each rank's gradient
straight into its segment of a shared window (the planned executor's gradient hook: no
packing either); after one fence each rank sums only its 1/P slice, reading the others'
segments in place, and

- with an elementwise optimizer (``ShardedOptimizer``: SGD, momentum, Adam ...) steps that
  slice of the parameters, which the ranks share too: one copy on the machine, no gather
  (ZeRO stage 1 without its allgather); a second fence and every rank sees the whole step;
- with any other (global-norm clipping, a user's transformation) writes its slice of the sum
  into a shared array and, after a fence, every rank steps its own parameters with the
  whole mean, as over MPI.

Ranks stay bit-identical (one copy, or the same arithmetic on the same sum). On more than one
machine the strategy keeps MPI's allreduce (``Allreduce.node`` is None).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from meta.lv1.gradient_hook import GradientHook
from meta.lv2.optimizers import Params
from meta.lv3.comm.communicator import MPICommunicator
from meta.lv3.comm.shared_memory import SharedSegments
from meta.lv3.data_parallel.sharded_optimizer import ShardedOptimizer
from meta.lv3.flat import FlatBuffer, shard_bounds

LINE = 64  # bytes: slices start on a cache line, so two ranks never write one line


def slice_of(n: int, itemsize: int, ranks: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of ``rank``'s slice of ``n`` values: near-equal, cut at cache lines.

    >>> [slice_of(100, 4, 2, r) for r in range(2)]
    [(0, 64), (64, 100)]
    """
    per_line = max(1, LINE // itemsize)
    lo, hi = shard_bounds(-(-n // per_line), ranks)[rank]
    return min(lo * per_line, n), min(hi * per_line, n)


class NodeExchange(GradientHook):
    """Gradients of ``strategy``'s ranks, all on ``node``, summed and applied through shared
    memory (collective to build). Also the executor's gradient hook: ``layout`` gives the
    arrays the backward writes into, ``seed`` = 1/P makes their sum the mean."""

    bucket_bytes = sys.maxsize
    """one hand-over, at the end of the backward"""
    seed: float
    """1/P: the loss's gradient is scaled by it when the backward writes through the hook, so the
    sum over the node's ranks is the mean."""

    def __init__(self, strategy: Any, node: MPICommunicator) -> None:
        self.strategy, self.node = strategy, node
        """``strategy``: the Allreduce this exchange serves. ``node``: the communicator of the
        machine's ranks."""
        flat = strategy.flat_params
        polling = strategy.oversubscribed
        self.seed = 1.0 / node.size
        self.lo, self.hi = slice_of(len(flat), flat.dtype.itemsize, node.size, node.rank)
        """This rank's slice of the flat gradient, ``[lo, hi)``: the part it sums (and, sharded,
        steps)."""
        self.grads = SharedSegments(node, len(flat), flat.dtype, polling)
        """Every rank's gradient in shared memory, one segment per rank."""
        self.mine = FlatBuffer(flat.shapes, flat.dtype, buffer=self.grads.segments[node.rank])
        """This rank's gradient segment, laid out as the parameters (what the backward writes
        into)."""
        self.peers = [segment[self.lo:self.hi] for segment in self.grads.segments]
        """This rank's slice of every rank's gradient, which it sums."""
        self.sharded: ShardedOptimizer | None = None
        """The optimizer stepping this rank's slice of shared parameters (ZeRO-1), where the
        optimizer is elementwise; None: each rank steps the whole mean."""
        # ``shared``: the one array the node shares, the parameters (sharded) or the mean
        if ShardedOptimizer.takes(strategy.optimizer):
            self.shared = SharedSegments.on_first(node, flat.buffer, polling)
            """The one array the node shares: the parameters (sharded) or the mean gradient."""
            strategy.flat_params = FlatBuffer.adopt(strategy.optimizer.params,
                                                    into=self.shared.segments[0])
            self.sharded = ShardedOptimizer(strategy.optimizer, strategy.flat_params,
                                            self.lo, self.hi, node)
            self.shared.fence()  # every slice of the state in
            self.sum = np.empty(self.hi - self.lo, flat.dtype)
            """This rank's slice of the summed gradient."""
        else:
            self.shared = SharedSegments.on_first(node, np.zeros(len(flat), flat.dtype),
                                                  polling)
            self.mean = FlatBuffer(flat.shapes, flat.dtype, buffer=self.shared.segments[0])
            """The mean gradient in shared memory, laid out as the parameters (not sharded only)."""
            self.sum = self.mean.buffer[self.lo:self.hi]
        self.used = False
        """Whether the last backward wrote its gradients through the hook."""

    # -- the executor's gradient hook ---------------------------------------------------
    def layout(self, names: list[str]) -> dict[str, np.ndarray]:
        return self.mine.views

    def use(self, names: list[str]) -> None:
        pass

    def ready(self, names: list[str]) -> None:
        self.used = True

    # -- the step -----------------------------------------------------------------------
    def step(self, grads: Params | None) -> None:
        """Average and apply: ``grads`` to copy in first, or None when the backward wrote
        them through the hook (already scaled by ``seed``). Collective over the node."""
        t = self.strategy.timeline
        scale = 1.0
        if grads is not None:
            self.mine.pack(grads)
            scale = self.seed
            t.lap("pack")
        self.grads.fence()  # every rank's gradient is in
        np.add(self.peers[0], self.peers[1], out=self.sum)
        for peer in self.peers[2:]:
            np.add(self.sum, peer, out=self.sum)
        if scale != 1.0:
            self.sum *= scale
        self.strategy.bytes_sent += self.mine.nbytes
        t.lap("communicate")
        if self.sharded is not None:
            self.sharded.step(self.sum)
            t.lap("update")
            self.shared.fence()  # every slice stepped (and every gradient read) before the
            t.lap("communicate")  # next forward reads the parameters
        else:
            self.shared.fence()  # the whole mean is in
            t.lap("communicate")
            self.strategy.optimizer.step(self.mean.views)
            t.lap("update")
        self.used = False

    def state_dict(self) -> dict:
        return self.sharded.state_dict() if self.sharded is not None \
            else self.strategy.optimizer.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        """Collective: every rank takes its slice of ``saved`` (all hold the same)."""
        if self.sharded is not None:
            self.sharded.load_state_dict(saved)
            self.shared.fence()  # every rank's slice written
        else:
            self.strategy.optimizer.load_state_dict(saved)

    def release(self) -> None:
        """Back to private memory (collective): each rank's parameters and optimizer state
        copied out of the shared windows, which are freed."""
        s = self.strategy
        self.shared.fence()
        if self.sharded is not None:
            s.optimizer.state = self.sharded.state_dict()["state"]
            s.flat_params = FlatBuffer.adopt(s.optimizer.params)  # a private copy
            self.shared.fence()  # every rank has its copy before the memory goes
            self.sharded.free()
        self.shared.free()
        self.grads.free()
        self.node.free()

