"""Gradients exchanged in bf16 and summed in float32 (``distributed.grad_dtype=bf16``).

MPI has no bf16 type and its reductions cannot be told to accumulate in a wider one, so the
sum is not MPI's: each float32 buffer is rounded to bf16 (round to nearest even, as
``torch.Tensor.to(torch.bfloat16)`` does; kept as uint16 words, which MPI moves as raw
16-bit values), and the allreduce is built from two moves of those words:

1. a reduce-scatter made of an ``Alltoallv``: rank q receives every other rank's bf16 values
   of its own 1/P of the buffer;
2. rank q sums those P rows in float32, in rank order (each bf16 value is exact in float32:
   this is the float32 sum of the same bf16 values, identical on every rank), rounds the sum
   to bf16 once, and the ranks' chunks are allgathered (``Iallgatherv``) as bf16.

Every rank then expands the whole buffer back to float32: the result is
``bf16(sum in float32 of bf16(x_r))``, bit-identical on every rank (replicas stay equal). Each
rank sends (P-1)/P of the buffer in step 1 and its 1/P to P-1 ranks in step 2: 2(P-1)/P of
the buffer's bf16 bytes, exactly half of a float32 ring allreduce's 2(P-1)/P * 4 bytes per
value; in the strategy's counting (the send buffers handed to MPI, ``Strategy.bytes_sent``)
2 bytes per value against the float32 allreduce's 4. The allgather carries the sum as bf16
rather than float32 because half cannot be met otherwise: a float32 allgather alone sends
4(P-1)/P bytes per value, the same as the whole bf16 exchange. The price is one bf16
rounding of the summed value (relative error at most 2**-9), against PyTorch DDP's
``bf16_compress_hook``, whose allreduce adds in bf16 at every hop.

Both steps are nonblocking, so an overlapped backward (``Allreduce``'s buckets) starts each
bucket's exchange as it finishes. Step 2 of a bucket can only start once its step 1 is done,
which one rank may see before another: MPI requires collectives on a communicator to start
in the same order on every rank, so step 2 runs on a second communicator, and ``Bf16Queue``
starts the buckets' step 2 in bucket order.

>>> to_bf16(np.array([1.0, 1.00390625, 1.01171875, -np.inf], np.float32)).tolist()
[16256, 16256, 16258, 65408]
>>> from_bf16(np.array([16256, 16258], np.uint16)).tolist()
[1.0, 1.015625]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from meta.lv3.comm.communicator import Communicator
from meta.lv3.flat import shard_bounds

GRAD_BYTES = {"f32": 4, "bf16": 2}
"""Bytes per value of each gradient exchange type (``distributed.grad_dtype``): the one table
the strategy's option and the planner's costs read."""
NAN = 0x7FC0  # the quiet NaN c10::BFloat16 rounds every NaN to


def to_bf16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 ``x`` rounded to bf16 (nearest, ties to even; NaN stays NaN, inf inf, values
    above bf16's largest finite round to inf), as uint16 words (the float32's top half)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    if out is None:
        out = np.empty(x.shape, np.uint16)
    # round to nearest even: add 0x7FFF plus the lowest kept bit, then drop the low half
    # (uint32 arithmetic: only NaNs, replaced below, can wrap)
    wide = u >> 16
    wide &= 1
    wide += 0x7FFF
    wide += u
    wide >>= 16
    out[...] = wide
    nan = np.isnan(x)
    if nan.any():
        out[nan] = NAN
    return out


def from_bf16(words: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bf16 ``words`` (uint16) as float32 (exact: bf16 is float32's top half)."""
    if out is None:
        out = np.empty(np.shape(words), np.float32)
    wide = out.view(np.uint32)
    wide[...] = words
    wide <<= 16
    return out


def round_bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bf16, as float32 values (what the exchange sums)."""
    return from_bf16(to_bf16(x))


class Bf16Sum:
    """One buffer's sum over the ranks, exchanged in bf16 (the module's two steps): ``start``
    sends; ``reduce`` (step 1 done) sums this rank's chunk and starts the allgather on
    ``gather_comm``; ``done`` writes the result into the buffer. ``bytes_sent``: the send
    buffers' bytes handed to MPI (2 per value in all)."""

    def __init__(self, comm: Communicator, gather_comm: Communicator, buf: np.ndarray) -> None:
        if buf.dtype != np.float32 or buf.ndim != 1:
            raise TypeError(f"bf16 exchange: expected a 1-D float32 buffer, got shape "
                            f"{buf.shape} and dtype {buf.dtype}")
        p, r = comm.size, comm.rank
        self.comm = comm
        """The communicator of step 1 (the reduce-scatter)."""
        self.gather_comm = gather_comm
        """A second communicator for step 2 (allgathers start in their own order there)."""
        self.buf = buf
        """The float32 buffer summed: the result is written back into it (``done``)."""
        bounds = shard_bounds(buf.size, p)
        self.counts = [hi - lo for lo, hi in bounds]
        """Values of the buffer each rank sums (near-equal, consecutive)."""
        self.lo, self.hi = bounds[r]
        """This rank's chunk [lo, hi) of the buffer: the values it sums."""
        self.words = to_bf16(buf)
        """The buffer in bf16: sent in step 1, then (this rank's chunk replaced by its sum)
        gathered into in place in step 2."""
        mine = self.counts[r]
        self.rows = np.empty((p, mine), np.uint16)
        """Every rank's bf16 values of this rank's chunk, by rank."""
        self.rows[r] = self.words[self.lo:self.hi]  # its own: no message to itself
        send = [0 if q == r else c for q, c in enumerate(self.counts)]
        recv = [0 if q == r else mine for q in range(p)]
        self.bytes_sent = 2 * (sum(send) + mine)
        """Bytes of send buffers handed to MPI for this sum (2 per value of the buffer)."""
        self.began = time.perf_counter_ns()
        """When step 1 started (ns, for the strategy's communication time)."""
        self.request: Any = comm.ialltoallv(self.words, send, self.rows, recv,
                                            [lo for lo, _ in bounds],
                                            [q * mine for q in range(p)])
        """The nonblocking collective under way: step 1's, then step 2's."""
        self.reduced = False
        """Whether step 1 is over and the allgather (``request`` now) started."""

    def reduce(self) -> None:
        """Step 1 is done: sum the rows in float32 in rank order, round once, start step 2."""
        total = from_bf16(self.rows[0])
        row = np.empty_like(total)
        with np.errstate(over="ignore", invalid="ignore"):  # inf, NaN: carried, as MPI's
            for q in range(1, len(self.rows)):
                total += from_bf16(self.rows[q], row)
        to_bf16(total, self.words[self.lo:self.hi])
        self.request = self.gather_comm.iallgatherv(self.words, self.counts)
        self.reduced = True

    def done(self) -> None:
        """Step 2 is done: the summed buffer, back in float32."""
        from_bf16(self.words, self.buf)


class Bf16Queue:
    """The bf16 sums under way, oldest first. Their allgathers start in the order their sums
    started (MPI's rule for collectives on ``gather_comm``), each as soon as its turn comes
    and its reduce-scatter is done; ``progress`` never blocks, ``finish`` waits for all."""

    def __init__(self, comm: Communicator, gather_comm: Communicator) -> None:
        self.comm = comm
        """The communicator the sums' reduce-scatters run on."""
        self.gather_comm = gather_comm
        """The communicator their allgathers run on, started in the order the sums started."""
        self.pending: list[Bf16Sum] = []
        """The sums under way, oldest first."""
        self.bytes_sent = 0
        """Bytes of send buffers handed to MPI by the sums started since ``take_bytes``."""

    def take_bytes(self) -> int:
        """``bytes_sent`` since the last call (a strategy adds them to its own count)."""
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    def start(self, buf: np.ndarray) -> None:
        """Start summing ``buf`` (1-D float32, in place) over the ranks."""
        op = Bf16Sum(self.comm, self.gather_comm, buf)
        self.bytes_sent += op.bytes_sent
        self.pending.append(op)

    def progress(self) -> list[Bf16Sum]:
        """Drive MPI without waiting; returns the sums that completed (their buffers
        written)."""
        finished, turn = [], True  # turn: every older sum's allgather has started
        for op in self.pending:
            if not op.reduced:
                if not (turn and self.comm.test(op.request)):
                    turn = False
                    continue
                op.reduce()
            if self.gather_comm.test(op.request):
                op.done()
                finished.append(op)
        self.pending = [op for op in self.pending if op not in finished]
        return finished

    def finish(self) -> list[Bf16Sum]:
        """Wait for every sum under way (its allgather started as soon as its reduce-scatter
        is over, before the next one is waited for); returns them, buffers written."""
        for op in self.pending:
            if not op.reduced:
                self.comm.wait(op.request)
                op.reduce()
        finished, self.pending = self.pending, []
        for op in finished:
            self.gather_comm.wait(op.request)
            op.done()
        return finished
