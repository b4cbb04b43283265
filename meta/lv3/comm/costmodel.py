"""The alpha-beta cost model: a message of n bytes costs alpha + n * beta.

``measure_link`` times a ping-pong between ranks 0 and 1 and fits alpha (latency, s) and beta
(inverse bandwidth, s/byte) by least squares; each strategy's ``predict_comm_s`` then applies
the textbook formula for its exchange (e.g. ring allreduce, 2(P-1)alpha + 2(P-1)/P n beta).

>>> link = Link(alpha=1e-6, beta=1e-9)
>>> round(ring_allreduce(link, 2, 1000) * 1e6, 3)  # 2 us latency + 1000 bytes at 1 GB/s
3.0
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from meta.lv3.comm import tags
from meta.lv3.comm.communicator import Communicator

PING_BYTES = (8, 1024, 16 * 1024, 128 * 1024, 1024 * 1024)
EVICT_BYTES = 8 << 20  # more than the caches a core has to itself


@dataclass(frozen=True)
class Link:
    alpha: float
    """seconds per message"""
    beta: float
    """seconds per byte"""

    def message(self, nbytes: float) -> float:
        return self.alpha + nbytes * self.beta

    def __str__(self) -> str:
        """Both figures as rates a reader knows; a fit of 0 (the measured times did not
        grow above the timer's noise: ``measure_link`` keeps a fitted slope or intercept
        of 0 or below as 0) said as not measurable, never as an infinite rate."""
        alpha = f"alpha {self.alpha * 1e6:.2f} us" if self.alpha > 0 else \
            "alpha not measurable (fitted 0: below the timer's noise)"
        if self.beta > 0 and math.isfinite(self.beta):
            beta = f"beta {self.beta * 1e9:.3f} ns/B ({1 / self.beta / 1e9:.2f} GB/s)"
        else:
            beta = ("beta not measurable (fitted 0: the times did not grow with the bytes "
                    "above the noise; measure larger messages)")
        return f"{alpha}, {beta}"


def ring_allreduce(link: Link, p: int, nbytes: float) -> float:
    """Reduce-scatter then allgather around a ring: 2(P-1) messages of n/P bytes."""
    if p < 2:
        return 0.0
    return 2 * (p - 1) * link.alpha + 2 * (p - 1) / p * nbytes * link.beta


def shared_reduce(link: Link, p: int, nbytes: float, read_beta: float | None = None) -> float:
    """The shared-memory exchange of one machine (``node_exchange.py``): two fences (one
    latency each) and each rank reading its 1/P slice of the P-1 other gradients, which is
    reduce-scatter's volume, moved at the speed of a message between two of its ranks.
    ``read_beta`` (``measure_shared_reads``), where measured: those reads at its rate, and as
    many bytes again for the parameters the other ranks stepped, which this rank's next
    forward reads from their cores (ZeRO-1 keeps one copy on the machine)."""
    if p < 2:
        return 0.0
    if read_beta is not None:
        return 2 * link.alpha + 2 * (p - 1) / p * nbytes * read_beta
    return 2 * link.alpha + (p - 1) / p * nbytes * link.beta


def measure_shared_reads(comm: Communicator, nbytes: int, repeats: int = 40) -> float | None:
    """Seconds per byte of reading what other ranks of this machine have just written, the
    pattern of the shared-memory exchange (``node_exchange.py``): each rank adds to its 1/P
    slice of one shared array, a fence, every rank reads the whole array, a fence; less the
    same on a private array (the rank's own writes, read back from its own caches), over the
    (P-1)/P of the bytes that others wrote. MPI's messages do not show it: on a 2-vCPU VM it
    was 0.06 ns/B in some runs and 0.43 in others (the host placing the vCPUs near or far
    apart), the ping-pong's beta 0.3 in both, and the MLP's ZeRO-1 step followed it (4.8 ms
    or 6.1). Collective over ``comm``; the slowest node's figure, or None where no node has
    two ranks sharing memory."""
    from meta.common import threads as _threads
    from meta.lv3.comm.shared_memory import SharedSegments, node_of

    node = node_of(comm)
    beta, sharing = 0.0, 0.0
    if node is not None and node.size > 1:
        sharing = 1.0
        count = max(int(nbytes) // 4, 4096)
        lo, hi = node.rank * count // node.size, (node.rank + 1) * count // node.size
        # wait in the fences as the exchange does (Strategy.oversubscribed)
        polling = node.size > _threads.cores()
        shared = SharedSegments.on_first(node, np.zeros(count, np.float32), polling)
        private = np.zeros(count, np.float32)

        def rounds(array: np.ndarray) -> float:
            samples = []
            for i in range(repeats + 2):
                start = time.perf_counter()
                array[lo:hi] += 1.0
                shared.fence()
                float(array.sum())
                shared.fence()
                if i >= 2:
                    samples.append(time.perf_counter() - start)
            return float(np.median(samples))

        excess = rounds(shared.segments[0]) - rounds(private)
        beta = max(excess, 0.0) / ((node.size - 1) / node.size * count * 4)
        shared.free()
    if node is not None:
        node.free()
    if comm.size > 1:
        beta, sharing = (float(x) for x in comm.allreduce(np.array([beta, sharing]), op="max"))
    return beta if sharing else None


def allgather(link: Link, p: int, nbytes: float) -> float:
    """Ring allgather of n bytes per rank: P-1 messages of n bytes."""
    return (p - 1) * link.message(nbytes) if p > 1 else 0.0


def gather_bcast(link: Link, p: int, nbytes: float) -> float:
    """Root receives P-1 messages one after another, then a binomial-tree broadcast."""
    if p < 2:
        return 0.0
    return (p - 1) * link.message(nbytes) + math.ceil(math.log2(p)) * link.message(nbytes)


def measure_link(comm: Communicator, sizes: tuple[int, ...] = PING_BYTES,
                 repeats: int = 20, polled: bool = False,
                 pair: tuple[int, int] = (0, 1)) -> Link:
    """Fit alpha and beta from ping-pongs between the ranks of ``pair`` (0 and 1 unless given:
    two ranks on different nodes measure the link between nodes). Collective: all ranks call
    it; the others wait. Every rank returns the same Link; at size 1 it is free (zeros).

    ``polled``: each side waits as the asynchronous strategies' servers and workers do, by
    ``polling.poll_all`` (test, sleep, test): MPI moves a large message only inside those
    tests, a piece per test, so such a wait costs far more than a blocking one (on the 2-core
    machine about 10x for a 1 MB message)."""
    if comm.size < 2:
        return Link(0.0, 0.0)
    if polled:
        from meta.lv3.comm.polling import poll_all

        def send(buf: np.ndarray, peer: int) -> None:
            poll_all(comm, [comm.isend(buf, peer, tags.LINK_PROBE)])

        def recv(buf: np.ndarray, peer: int) -> None:
            poll_all(comm, [comm.irecv(buf, peer, tags.LINK_PROBE)])
    else:
        def send(buf: np.ndarray, peer: int) -> None:
            comm.send(buf, peer, tag=tags.LINK_PROBE)

        def recv(buf: np.ndarray, peer: int) -> None:
            comm.recv(buf, peer, tag=tags.LINK_PROBE)
    times = np.zeros(len(sizes))
    first, second = pair
    if comm.rank in pair:
        other = second if comm.rank == first else first
        for i, nbytes in enumerate(sizes):
            buf = np.zeros(nbytes, np.uint8)
            samples = []
            for _ in range(repeats + 2):
                start = time.perf_counter()
                if comm.rank == first:
                    send(buf, other)
                    recv(buf, other)
                else:
                    recv(buf, other)
                    send(buf, other)
                samples.append((time.perf_counter() - start) / 2)
            times[i] = np.median(samples[2:])  # the first round trips set up the connection
    times = comm.bcast(times, root=first)
    beta, alpha = np.polyfit(np.array(sizes, dtype=np.float64), times, 1)
    return Link(max(float(alpha), 0.0), max(float(beta), 0.0))


def measure_allreduce(comm: Communicator, sizes: list[int] | tuple[int, ...],
                      repeats: int = 20) -> Link:
    """A Link calibrated on the calls an allreduce strategy makes: the median time of a
    blocking allreduce of each size (bytes of float32) is fitted as a + b n, then read back
    through the ring formula (a = 2(P-1) alpha, b = 2(P-1)/P beta), so ``ring_allreduce``
    reproduces the measured calls. Collective; at size 1 it is free (zeros)."""
    p = comm.size
    if p < 2:
        return Link(0.0, 0.0)
    sizes = sorted(set(int(s) for s in sizes)) or [4]
    if len(sizes) == 1:  # a line needs two points: add a small message
        sizes = [min(4096, sizes[0] // 4) or 4, *sizes]
    times = np.zeros(len(sizes))
    # a step's computation leaves the caches full of other data: so does a pass over this
    # before every call (back to back, with MPI's buffers hot, 247 KB took 0.05 ms here; after
    # computing, 0.09 ms, and 0.13 ms inside training steps)
    other = np.zeros(EVICT_BYTES // 4, np.float32)
    for i, nbytes in enumerate(sizes):
        buf = np.zeros(max(1, nbytes // 4), np.float32)
        samples = []
        for _ in range(repeats + 2):
            other += 1
            comm.barrier()
            buf += 1  # written just before, as a step's gradients are
            start = time.perf_counter()
            comm.allreduce(buf)
            samples.append(time.perf_counter() - start)
        times[i] = np.median(samples[2:])
    times = comm.allreduce(times) / p  # every rank: the same fit
    b, a = np.polyfit(np.array(sizes, dtype=np.float64), times, 1)
    return Link(max(float(a), 0.0) / (2 * (p - 1)), max(float(b), 0.0) / (2 * (p - 1) / p))
