"""Synchronous data parallelism: average gradients over ranks, then step any Level 2 optimizer."""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv1.gradient_hook import GradientHook
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.comm.bf16 import GRAD_BYTES, Bf16Queue
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link, allgather, ring_allreduce, shared_reduce
from meta.lv3.comm.shared_memory import node_of
from meta.lv3.data_parallel import quantization  # noqa: F401  (registers qsgd and terngrad)
from meta.lv3.data_parallel.compression import (
    COMPRESSIONS,
    Compressor,
    compression_options,
    make_compressor,
)
from meta.lv3.data_parallel.node_exchange import NodeExchange
from meta.lv3.flat import FlatBuffer
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload


class Allreduce(Strategy):
    """Every rank applies the mean gradient over all ranks: one fused, chunked allreduce.

    Ranks stay bit-identical, because each applies the same update to the same values. The
    inner optimizer's state is not broadcast: build it the same way on every rank. With a
    ``compressor`` each rank's payload is exchanged by one allgather instead, and every rank
    decompresses and sums all of them (in rank order, so ranks still agree bit for bit). A
    stochastic compressor (qsgd, terngrad) draws from a stream seeded by the recipe's seed and
    the rank. With every rank on one machine (``shared_memory``) the mean goes through shared
    memory instead, and an elementwise optimizer's update is shared out among the ranks
    (``NodeExchange``); ``finish`` then gives each rank its own memory back. With
    ``grad_dtype="bf16"`` the gradients travel as bf16 and are summed in float32 (half the
    bytes: ``meta.lv3.comm.bf16``), always through MPI.

    >>> from meta.lv2.optimizers import sgd
    >>> opt = Allreduce(Optimizer(sgd(0.1), {"w": np.array([1.0])}))
    >>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
    [0.8]
    """

    name = "allreduce"
    options = {**Strategy.options,
               "compression": Option("none", "of the gradient exchange: fp16, topk, sign "
                                     "(topk and sign with error feedback), qsgd or terngrad",
                                     choices=("none", *COMPRESSIONS.names())),
               "overlap": Option(True, "start each bucket's allreduce as soon as the backward "
                                 "finishes its gradients (executors that take a gradient "
                                 "hook: planned), as DDP and Horovod do"),
               "bucket_bytes": Option(1 << 20, "bytes of gradients per overlapped allreduce",
                                      low=1024),
               "shared_memory": Option(True, "when every rank is on one machine, sum the "
                                       "gradients in shared memory and give each rank 1/P of "
                                       "the update (elementwise optimizers: one parameter "
                                       "copy) instead of MPI's allreduce (node_exchange.py)"),
               "grad_dtype": Option("f32", "type the gradients travel in: bf16 sends half the "
                                    "bytes, summed in float32 and rounded to bf16 once "
                                    "(comm/bf16.py; always through MPI, not shared memory)",
                                    choices=tuple(GRAD_BYTES)),
               **compression_options()}
    pretraining = "average"

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    compression: str = "none", **options: Any) -> Allreduce:
        n = sum(int(np.prod(np.shape(p))) for p in optimizer.params.values())
        dtypes = {np.asarray(p).dtype for p in optimizer.params.values()} or {np.dtype(float)}
        offered = compression_options()
        chosen = {k: options.pop(k) for k in list(options) if k in offered}
        seed = [workload.seed if workload is not None else 0, comm.rank]
        if compression != "none" and options.get("grad_dtype", "f32") != "f32":
            raise ComponentError(f"distributed 'allreduce': grad_dtype "
                                 f"{options['grad_dtype']!r} and compression {compression!r} "
                                 f"both shrink the gradient exchange: choose one")
        compressor = make_compressor(compression, n, dtypes.pop(), seed, **chosen)
        return cls(optimizer, comm, compressor=compressor, **options)

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None,
                 compressor: Compressor | None = None, overlap: bool = True,
                 bucket_bytes: int = 1 << 20, shared_memory: bool = True,
                 grad_dtype: str = "f32", **options) -> None:
        super().__init__(optimizer, comm, **options)
        if grad_dtype not in GRAD_BYTES:
            raise ComponentError(f"distributed 'allreduce': grad_dtype {grad_dtype!r} is not "
                                 f"one of {', '.join(GRAD_BYTES)}")
        if grad_dtype != "f32" and (compressor is not None
                                    or self.flat_grads.dtype != np.float32):
            raise ComponentError(f"distributed 'allreduce': grad_dtype {grad_dtype!r} needs "
                                 f"float32 gradients and no compression (gradients are "
                                 f"{self.flat_grads.dtype})")
        self.grad_dtype = grad_dtype
        """The type the gradients travel in: "f32" (MPI's allreduce) or "bf16" (rounded, sent
        as bf16, summed in float32: ``bf16`` below)."""
        self.bf16: Bf16Queue | None = None
        """The bf16 exchanges under way (grad_dtype "bf16" on more than one rank): its
        reduce-scatters on ``comm``, its allgathers on a second communicator of the same
        ranks (MPI's order of collectives: ``meta.lv3.comm.bf16``); None: float32."""
        if grad_dtype == "bf16" and self.comm.size > 1:
            self.bf16 = Bf16Queue(self.comm, self.comm.split(0))
        self.overlap = overlap
        """Whether a backward on an executor that takes the gradient hook starts each bucket's
        allreduce as soon as its gradients are final (``step_with``), overlapping the exchange
        with the rest of the backward."""
        self.buckets = Buckets(self, bucket_bytes)
        """The gradient hook of an overlapped step (``Buckets``): the buffer the backward writes
        into and the allreduces under way."""
        if compressor is not None and compressor.n != len(self.flat_grads):
            raise ValueError(f"Allreduce: the compressor is for {compressor.n} values, the "
                             f"gradients have {len(self.flat_grads)}")
        self.compressor = compressor
        """The gradient compressor (``meta.lv3.data_parallel.compression``) whose payloads are
        allgathered instead of an allreduce; None: the exact mean."""
        self.node: NodeExchange | None = None
        """The shared-memory exchange where every rank is on one machine (``NodeExchange``);
        None: MPI's allreduce, or after ``finish`` released it."""
        if shared_memory and compressor is None and self.bf16 is None and self.comm.size > 1:
            node = node_of(self.comm)
            if node is not None and node.size == self.comm.size:
                self.node = NodeExchange(self, node)
            elif node is not None:  # ranks on several machines: MPI's allreduce
                node.free()

    def step(self, grads: Params) -> None:
        """Average ``grads`` over ranks and apply the inner optimizer's update."""
        if callable(grads):  # a line-search optimizer's closure, on one process (``check``)
            self.optimizer.step(grads)
            return
        t = self.timeline
        t.begin()
        if self.node is not None:
            self.node.step(grads)
            return
        buffer = self.flat_grads.pack(grads)
        t.lap("pack")
        if self.bf16 is not None:
            self._average_bf16(buffer)
        elif self.compressor is None:
            self.average(self.grad_chunks, buffer)
        else:
            self._exchange_compressed(buffer)
        # The views are overwritten by the next step: a transform must not keep them in its state.
        self.optimizer.step(self.flat_grads.views)
        t.lap("update")

    def step_with(self, executor: Any, feeds: dict, loss: str = "loss",
                  outputs: list[str] | None = None) -> dict:
        """Forward, a backward that starts each bucket's allreduce as soon as its gradients
        are final (the executor runs on while MPI moves them), the rest of the exchange, the
        update. Without overlap, a compressor, or an executor that takes the hook: ``step``
        after the backward. On one machine: the shared-memory exchange, the backward writing
        its gradients straight into it where the executor takes the hook."""
        if self.node is not None:
            values, grads = executor.inference_and_backprop(
                feeds, loss=loss, outputs=outputs,
                hook=self.node if executor.supports_gradient_hook else None)
            self.timeline.begin()
            self.node.step(None if self.node.used else grads)
            return values
        if not (self.overlap and self.compressor is None and self.comm.size > 1
                and executor.supports_gradient_hook):
            return super().step_with(executor, feeds, loss, outputs)
        b = self.buckets
        b.start()
        values, grads = executor.inference_and_backprop(feeds, loss=loss, outputs=outputs,
                                                        hook=b)
        t = self.timeline
        t.begin()  # forward and backward, the overlapped allreduces under way
        if b.flat is None or not b.used:  # the executor ran unplanned: no bucket was handed
            buffer = self.flat_grads.pack(grads)
            t.lap("pack")
            if self.bf16 is not None:
                self._average_bf16(buffer)
            else:
                self.average(self.grad_chunks, buffer)
            self.optimizer.step(self.flat_grads.views)
        else:
            b.finish()
            self.bytes_sent += b.flat.nbytes if self.bf16 is None else self.bf16.take_bytes()
            t.lap("communicate")
            self.optimizer.step(b.flat.views)
        t.lap("update")
        return values

    @property
    def state(self) -> Any:
        if self.node is not None and self.node.sharded is not None:
            return self.node.sharded.state_dict()["state"]  # a copy, as of the last step
        return super().state

    def state_dict(self) -> dict:
        return self.node.state_dict() if self.node is not None else super().state_dict()

    def load_state_dict(self, saved: dict) -> None:
        if self.node is not None:
            self.node.load_state_dict(saved)
        else:
            super().load_state_dict(saved)

    def finish(self) -> None:
        """Parameters and optimizer state back in each rank's own memory (collective)."""
        if self.node is not None:
            self.node.release()
            self.node = None

    def _average_bf16(self, buffer: np.ndarray) -> None:
        """``average`` in bf16: each chunk summed by the bf16 exchange (all started, then
        waited for), then scaled by 1/P."""
        for chunk in self.grad_chunks:
            self.bf16.start(chunk)
        self.bf16.finish()
        self.bytes_sent += self.bf16.take_bytes()
        self.timeline.lap("communicate")
        buffer *= 1.0 / self.comm.size
        self.timeline.lap("unpack")

    def _exchange_compressed(self, buffer: np.ndarray) -> None:
        payload = self.compressor.compress(buffer)
        self.timeline.lap("pack")
        everyone = self.comm.allgather(payload)
        self.bytes_sent += payload.nbytes
        self.timeline.lap("communicate")
        buffer.fill(0)
        for row in everyone:
            self.compressor.decode_add(row, buffer)
        buffer *= 1.0 / self.comm.size
        self.timeline.lap("unpack")

    def predict_comm_s(self, link: Link) -> float:
        p = self.comm.size
        if self.node is not None:
            return shared_reduce(link, p, self.flat_grads.nbytes)
        if self.compressor is None:  # bf16: a reduce-scatter and an allgather of half the bytes
            return ring_allreduce(link, p, self.flat_grads.nbytes
                                  * GRAD_BYTES[self.grad_dtype] // 4)
        return allgather(link, p, self.compressor.payload_bytes)


class Buckets(GradientHook):
    """The allreduce strategy's side of a backward that hands over gradients as they finish
    (the planned executor's gradient hook). The executor gives the order in which its
    backward finishes the parameters' gradients (``layout``) and gets arrays laid out in that
    order, one buffer; after each bucket it calls ``ready``, which starts that bucket's
    nonblocking allreduce and drives those already started (MPI progresses only inside its
    calls). The loss's gradient is scaled by 1/P (``seed``), so the sum over ranks is the
    mean; ``finish`` waits for what is still under way. Parameters the backward never
    reaches keep zero gradients."""

    def __init__(self, strategy: Allreduce, bucket_bytes: int) -> None:
        self.strategy = strategy
        """The Allreduce this hook belongs to (its communicator, timeline and parameters)."""
        self.bucket_bytes = int(bucket_bytes)
        """At least this many bytes of finished gradients make a bucket whose allreduce starts."""
        self.seed = 1.0 / strategy.comm.size
        """1/P: the loss's gradient is scaled by it, so the sum of the ranks' gradients is their
        mean."""
        self.flat: FlatBuffer | None = None
        """The gradients' buffer of the plan running now, laid out in the order its backward
        finishes them; None before the first ``layout``."""
        self.layouts: dict[tuple[str, ...], tuple[FlatBuffer, dict, dict]] = {}
        """Per order of the parameters (a plan), its buffer and each parameter's start and end
        offsets in it."""
        self.requests: list[tuple[Any, int]] = []
        """The allreduces under way: (request, start time in ns) each, traced as overlapped when
        done."""
        self.used = False
        """Whether the last backward handed over any bucket (an unplanned executor hands none)."""

    def _order(self, names: list[str]) -> tuple[str, ...]:
        """The parameters in the order the backward finishes them, those it never reaches
        last."""
        shapes = self.strategy.flat_params.shapes
        return tuple([n for n in names if n in shapes] + [n for n in shapes if n not in names])

    def layout(self, names: list[str]) -> dict[str, np.ndarray]:
        """Arrays for the gradients, laid out in the order the backward finishes them; the
        same order (another batch size: another plan) gets the same arrays."""
        order = self._order(names)
        if order not in self.layouts:
            shapes = self.strategy.flat_params.shapes
            flat = FlatBuffer({n: shapes[n] for n in order}, self.strategy.flat_params.dtype)
            starts, ends, offset = {}, {}, 0
            for name in order:
                starts[name] = offset
                offset += flat.views[name].size
                ends[name] = offset
            self.layouts[order] = (flat, starts, ends)
        self.use(names)
        return self.flat.views

    def use(self, names: list[str]) -> None:
        """The layout of the plan about to run (the executor says which)."""
        self.flat, self.starts, self.ends = self.layouts[self._order(names)]

    def start(self) -> None:
        self.requests, self.used = [], False

    def ready(self, names: list[str]) -> None:
        comm, timeline = self.strategy.comm, self.strategy.timeline
        chunk = self.flat.buffer[self.starts[names[0]]:self.ends[names[-1]]]
        self.used = True
        if self.strategy.bf16 is not None:  # grad_dtype bf16: two nonblocking steps each
            self.strategy.bf16.start(chunk)
            self._traced(self.strategy.bf16.progress())
            return
        self.requests.append((comm.iallreduce(chunk), timeline.now()))
        self._progress()

    def _traced(self, sums: list) -> None:
        """Finished bf16 sums on the timeline, as the float32 allreduces are."""
        for op in sums:
            self.strategy.timeline.background("allreduce (overlapped)", op.began)

    def _progress(self) -> None:
        still = []
        for request, began in self.requests:
            if self.strategy.comm.test(request):
                self.strategy.timeline.background("allreduce (overlapped)", began)
            else:
                still.append((request, began))
        self.requests = still

    def finish(self) -> None:
        if self.strategy.bf16 is not None:
            self._traced(self.strategy.bf16.finish())
        for request, began in self.requests:
            self.strategy.comm.waitall([request])
            self.strategy.timeline.background("allreduce (overlapped)", began)
        self.requests = []


AllreduceOptimizer = Allreduce  # the name it had before the strategy family


def allreduce_mean(comm: Communicator, values: np.ndarray | float) -> np.ndarray:
    """Mean of ``values`` over ranks, as a new float64 array (for metrics such as the loss).

    >>> from meta.lv3 import world
    >>> allreduce_mean(world(), [1.0, 3.0]).tolist()
    [1.0, 3.0]
    """
    out = np.array(values, dtype=np.float64)  # a fresh contiguous copy: the input is untouched
    comm.allreduce(out, op="sum")
    out /= comm.size
    return out
