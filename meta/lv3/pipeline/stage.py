"""Running a pipelined graph: this rank's stage, its micro-batches, its messages.

``PipelineExecutor`` is what the trainer sees as its executor under the ``pipeline`` strategy:
``inference`` and ``inference_and_backprop`` take the whole batch on every rank and return the
same values (the loss, the logits) everywhere, while each rank runs only its stage's sub-graph
(with an executor of the trainer's kind) and returns the gradients of its stage's parameters.

A batch is cut into micro-batches along axis 0 (sizes differing by at most one). Each stage
plays its schedule (``meta.lv3.pipeline.schedule``): a forward receives the micro-batch's
activations from the previous stage, runs the stage with a tape (the stored activations) and
sends its outputs on; a backward receives the gradients of those outputs from the next stage,
runs the tape back and sends the gradients of its inputs to the previous stage. The last stage
seeds each micro-batch's loss gradient with its share of the batch (size / batch size), so the
summed gradients are those of the whole batch's mean loss, as on one process. A parameter tied
across stages (``Partition.tied``) has its stages' gradients summed at the end of the step.

Messages are numpy buffers through the communicator's ``isend``/``irecv`` (tags: micro-batch
``i`` forward ``2i``, backward ``2i + 1``), one per crossing tensor. Their shapes are agreed up
front: the stages run once, in turn, on two and three examples, and broadcast what each output
looks like, so every receiver knows a tensor's shape for any micro-batch size (only tensors with
the batch on axis 0 may cross). Sends never block, so no order of the schedules can deadlock;
a stage posts the receive of its next operation before computing the current one.

A stage runs through the executor's stage interface (``forward_saving`` / ``backward_seeded``,
``meta.lv1.executor``), so any executor kind runs it, the planned one as a compiled plan per
stage. A planned executor keeps ONE forward's saved activations in its plan's arena (the next
forward overwrites them), while a schedule holds up to ``in_flight`` micro-batches' forwards
before their backwards (GPipe: all of them; 1F1B: at most p - s). So the stage has one executor
per in-flight slot (``slots``), all over the same stage graph (the weights are the graph's
arrays, shared; each compiles its own plan and arena): a micro-batch's forward takes a free
slot and its backward frees it. Recomputing the forward at the backward instead would hold one
arena but run every forward twice (a third more compute per step), which is what pipelining is
meant to save; the slots cost one arena per in-flight micro-batch, the memory the schedule's
stored activations cost anyway. The parameters' gradients a planned backward returns are its
plan's arrays: they are added into the step's sums at once, before that slot runs again.

Every rank measures per training step its busy time (forward and backward), the span of the
step's operations, and the bytes its tapes hold: the bubble and the stored activations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from meta.common import threads as _threads
from meta.lv1.executor import Executor, SavedForward
from meta.lv1.gradient_hook import GradientHook
from meta.lv1.graph import Graph, GraphError
from meta.lv1.roles import differentiable
from meta.lv3.comm import tags
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.polling import poll_all, test_all
from meta.lv1.partition import Partition, PartitionError
from meta.lv3.pipeline.schedule import SCHEDULES, schedule
from meta.lv3.timeline import Timeline

Tensors = dict[str, np.ndarray]
TAG_PROBE, TAG_VALUES = tags.PIPELINE
# micro-batch i's forward and backward tags (2i, 2i + 1) stay in tags.PIPELINE_MICRO_BATCHES
MAX_MICRO_BATCHES = len(tags.PIPELINE_MICRO_BATCHES) // 2


def stage_executor_kinds() -> tuple[type, ...]:
    """The executor classes that run a stage or a part of a split graph (pipeline, partitioned):
    exactly these, as their forward and backward are meta's own graph semantics (the stage
    interface, and the collectives as operators of the graph). A subclass that computes its own
    way (the pytorch executor) is not among them."""
    from meta.lv1.executor import NativeExecutor, ReferenceExecutor
    from meta.lv1.plan.executor import PlannedExecutor

    return (ReferenceExecutor, NativeExecutor, PlannedExecutor)


def _base(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _arrays(value: Any) -> Iterable[np.ndarray]:
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _arrays(v)


def _byte_range(a: np.ndarray) -> tuple[int, int]:
    """The addresses ``a`` spans, [first byte, past its last byte) (numpy's byte_bounds)."""
    low = high = a.__array_interface__["data"][0]
    for size, stride in zip(a.shape, a.strides):
        if stride < 0:
            low += (size - 1) * stride
        else:
            high += (size - 1) * stride
    return low, high + a.itemsize


def tape_bytes(tape: Sequence[tuple[Any, Any]], exclude: set[int]) -> int:
    """Bytes of the arrays a tape's saved contexts hold: per buffer, the union of the byte
    ranges its saved views cover (a strided view counts as its span), leaving out buffers
    whose id is in ``exclude`` (the parameters, constants and the batch: held whatever the
    schedule)."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for _node, ctx in tape:
        for value in vars(ctx).values():
            for a in _arrays(value):
                base = _base(a)
                if id(base) not in exclude and a.size:
                    low, high = _byte_range(a)
                    ranges.setdefault(id(base), []).append((low, high))
    total = 0
    for spans in ranges.values():
        end = None
        for low, high in sorted(spans):
            if end is None or low >= end:
                total += high - low
                end = high
            elif high > end:
                total += high - end
                end = high
    return total


def saved_bytes(saved: SavedForward, exclude: set[int]) -> int:
    """Bytes a saved forward holds: its tape's saved arrays (``tape_bytes``), or the arena of
    the plan whose activations it is (a planned stage's slot holds it until the backward)."""
    state = saved.state
    if isinstance(state, list):
        return tape_bytes(state, exclude)
    arena = getattr(state, "arena", None)
    return int(arena.nbytes) if arena is not None else 0


@dataclass
class StageStats:
    """What one rank measured over the training steps (the first step is a warm-up, left out)."""

    steps: int = 0
    """Training steps measured (the warm-up left out)."""
    span_s: float = 0.0
    """from entering the step to the end of its last operation"""
    forward_s: float = 0.0
    """Seconds in this stage's forward operations."""
    backward_s: float = 0.0
    """Seconds in this stage's backward operations."""
    wait_s: float = 0.0
    """blocked in receives: the bubble and the transfers"""
    forwards: int = 0
    """Forward operations run (one per micro-batch)."""
    backwards: int = 0
    """Backward operations run (one per micro-batch)."""
    peak_stored_bytes: int = 0
    """the most bytes the live saved forwards held at once (a tape's saved arrays; a plan's
    arena)"""
    peak_in_flight: int = 0
    """the most micro-batches with a live saved forward"""
    bytes_sent: int = 0
    """Bytes of activations and gradients this stage handed to MPI."""
    rows: int = 0
    """examples through those steps"""
    span_median_s: float = 0.0
    """the typical step, without a loaded machine's stalls (summary)"""

    def as_array(self) -> np.ndarray:
        """The fields in order, as floats (to gather them over ranks)."""
        return np.array([float(getattr(self, f.name)) for f in fields(self)])

    @classmethod
    def from_array(cls, row: np.ndarray) -> StageStats:
        return cls(**{f.name: type(f.default)(v) for f, v in zip(fields(cls), row)})


class PipelineExecutor(Executor):
    """This rank's stage of ``partition`` over ``comm`` (rank ``s`` runs stage ``s``), built
    collectively: the shapes of what crosses the cuts are agreed on ``sample`` (graph inputs
    with at least three examples). ``make_executor(graph)`` makes the executors of a stage's
    sub-graph (any kind with the stage interface, ``forward_saving`` / ``backward_seeded``: the
    reference, native or planned one), one per micro-batch the schedule holds in flight.
    """

    def __init__(self, graph: Graph, partition: Partition, comm: Communicator,
                 make_executor: Callable[[Graph], Any], sample: Tensors, micro_batches: int = 4,
                 schedule_name: str = "1f1b", timeline: Timeline | None = None) -> None:
        if comm.size != len(partition.stages):
            raise PartitionError(f"a pipeline of {len(partition.stages)} stages runs on as many "
                                 f"ranks, this communicator has {comm.size}")
        if schedule_name not in SCHEDULES:
            raise PartitionError(f"schedule {schedule_name!r}: expected one of {SCHEDULES}")
        if not 1 <= micro_batches <= MAX_MICRO_BATCHES:
            raise PartitionError(f"micro_batches must be between 1 and {MAX_MICRO_BATCHES}, "
                                 f"got {micro_batches}")
        self.graph, self.partition, self.comm = graph, partition, comm
        """``graph``: the whole graph. ``partition``: its stages. ``comm``: one rank per stage."""
        self.rank, self.stages = comm.rank, comm.size
        """``rank``: this stage's index. ``stages``: how many there are."""
        self.stage = partition.stages[self.rank]
        """This rank's stage of the partition."""
        self.stage_graph = partition.stage_graph(graph, self.rank)
        """The graph of this stage's nodes alone."""
        self.make_executor = make_executor
        """Makes an executor of this stage's graph (one per in-flight slot)."""
        self.executor = make_executor(self.stage_graph)
        """The executor running this stage's graph (inference, and the first slot)."""
        self.slots: list[Executor] = [self.executor]
        """One executor per micro-batch in flight (its saved forward lives in it until its
        backward): made as the schedule first needs them."""
        self.micro_batches, self.schedule_name = micro_batches, schedule_name
        """``micro_batches``: the slices a batch is cut into. ``schedule_name``: the order stages
        run them in (GPipe or 1F1B)."""
        self.timeline = Timeline() if timeline is None else timeline
        """This rank's step phases."""
        self.oversubscribed = _threads.local_ranks() > _threads.cores()
        """Whether this node runs more ranks than it has cores (waits then yield the core)."""
        self.training: bool | None = None
        """Whether the executor is in training mode; None until set."""
        self.last = self.rank == self.stages - 1
        """Whether this is the last stage (it computes the loss)."""
        self.outputs = list(partition.outputs) if self.last else list(self.stage.sends)
        """What this stage produces: the graph's outputs (last stage) or what it sends on."""
        self.stats = StageStats()
        """What this rank measured over the training steps."""
        self.shapes = self._agree_shapes(sample)
        """name -> (per-example shape, dtype)"""
        diff = differentiable(graph)
        floats = {k for k, (_, dt) in self.shapes.items() if np.issubdtype(dt, np.floating)}
        self.grad_sends = [t for t in self.stage.receives if t in diff and t in floats]
        """gradients this stage sends back (of what it received) and receives (of what it sent)"""
        self.grad_receives = [t for t in self.stage.sends if t in diff and t in floats]
        """The sent tensors whose gradients come back from the next stage."""
        self._train_steps = 0
        self.bytes_sent = 0
        """by training steps, the warm-up included"""
        self.spans: list[float] = []
        """of every measured step"""

    # -- the executor interface the trainer uses ----------------------------------------------
    @property
    def params(self) -> list[str]:
        return list(self.stage_graph.parameters)

    def _mode_changed(self) -> None:
        for ex in self.slots:
            ex.train(bool(self.training))

    def _slot(self, busy: set[int]) -> int:
        """A slot whose executor holds no saved forward (a new one if all are busy)."""
        free = next((k for k in range(len(self.slots)) if k not in busy), None)
        if free is not None:
            return free
        ex = self.make_executor(self.stage_graph)
        if self.training is not None:
            ex.train(bool(self.training))
        self.slots.append(ex)
        return len(self.slots) - 1

    def placement(self) -> dict[str, str]:
        """Where this rank's stage runs its nodes (the other stages' run elsewhere)."""
        return self.executor.placement()

    def inference(self, feeds: Tensors, outputs: Iterable[str] | None = None) -> Tensors:
        """The graph's ``outputs`` (default: all) for the batch ``feeds``, on every rank; a
        collective: every rank passes the same batch."""
        names = list(outputs) if outputs is not None else list(self.partition.outputs)
        values, _ = self._run(feeds, names, None)
        return values

    def inference_and_backprop(self, feeds: Tensors, loss: str = "loss",
                               outputs: Iterable[str] | None = None, micro_batches: int = 1,
                               wrt: Sequence[str] = (), hook: GradientHook | None = None,
                               ) -> tuple[Tensors, Tensors]:
        """One pipelined step: (values of ``loss`` and ``outputs``, the same on every rank;
        gradients of this stage's parameters). ``micro_batches`` is the pipeline's own."""
        self._refuse_hook(hook)
        if wrt:
            raise GraphError(f"a pipelined graph has no gradients with respect to {list(wrt)}: "
                             f"each rank holds one stage")
        names = list(dict.fromkeys([loss, *(outputs or [])]))
        return self._run(feeds, names, loss)

    def summary(self) -> StageStats:
        """This rank's measurements so far (the median step made exact)."""
        if self.spans:
            self.stats.span_median_s = float(np.median(self.spans))
        return self.stats

    # -- agreeing on shapes ----------------------------------------------------------------
    def _agree_shapes(self, sample: Tensors) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Run the stages in turn on two and three examples; every rank learns the shape and
        dtype of every tensor that crosses a cut or is returned."""
        seen: dict[int, dict[str, tuple[tuple[int, ...], str]]] = {}
        mode, self.executor.training = self.executor.training, False  # no state updates
        try:
            for b in (2, 3):
                seen[b] = self._probe({k: v[:b] for k, v in sample.items()})
        finally:
            self.executor.training = mode
        shapes = {}
        self.scalars: set[str] = set()  # returned scalars (the loss): weighted, not stacked
        for name, (two, dtype) in seen[2].items():
            three = seen[3][name][0]
            if name in self.partition.outputs and two == three == ():
                shapes[name] = ((), np.dtype(dtype))
                self.scalars.add(name)
            elif two[:1] == (2,) and three[:1] == (3,) and two[1:] == three[1:]:
                shapes[name] = (two[1:], np.dtype(dtype))
            else:
                raise PartitionError(
                    f"tensor {name!r} has shape {list(two)} for 2 examples and {list(three)} "
                    f"for 3: only tensors with the batch on axis 0 can cross a pipeline cut or "
                    f"be returned; choose other cut points")
        return shapes

    def _probe(self, feeds: Tensors) -> dict[str, tuple[tuple[int, ...], str]]:
        comm, everything = self.comm, {}
        received: Tensors = {}
        for s in range(self.stages):
            meta = None
            if self.rank == s:
                given = {**received, **{k: feeds[k] for k in self.stage.feeds}}
                with np.errstate(all="ignore"):
                    values = self.executor.inference(given, self.outputs)
                meta = {k: (tuple(np.shape(v)), np.asarray(v).dtype.str)
                        for k, v in values.items()}
            meta = comm.bcast_obj(meta, root=s)
            everything.update(meta)
            if self.rank == s and s + 1 < self.stages:
                for name in self.stage.sends:
                    comm.send(np.ascontiguousarray(values[name]), s + 1, tag=TAG_PROBE)
            elif self.rank == s + 1:
                for name in self.stage.receives:
                    shape, dtype = meta[name]
                    received[name] = np.empty(shape, np.dtype(dtype))
                    comm.recv(received[name], s, tag=TAG_PROBE)
        return everything

    # -- one step --------------------------------------------------------------------------
    def _buffer(self, name: str, rows: int) -> np.ndarray:
        shape, dtype = self.shapes[name]
        return np.empty((rows, *shape), dtype)

    def _wait(self, requests: list[Any]) -> None:
        if self.oversubscribed:  # MPICH's waits spin, stealing the core a busy stage needs
            poll_all(self.comm, requests)
        else:
            self.comm.waitall([r for r in requests if r is not None])

    def _post(self, posted: dict, op: tuple[str, int], rows: Sequence[int]) -> None:
        """Start receiving what operation ``op`` needs (once)."""
        if op in posted:
            return
        kind, i = op
        if kind == "F" and self.rank > 0:
            names, source, tag = self.stage.receives, self.rank - 1, 2 * i
        elif kind == "B" and not self.last:
            names, source, tag = self.grad_receives, self.rank + 1, 2 * i + 1
        else:
            names = []
        buffers = {t: self._buffer(t, rows[i]) for t in names}
        requests = [self.comm.irecv(b, source, tag) for b in buffers.values()]
        posted[op] = (requests, buffers)

    def _send(self, pending: list, arrays: Sequence[np.ndarray], dest: int, tag: int) -> int:
        """Start sending ``arrays`` (kept alive in ``pending`` until done); returns bytes."""
        nbytes = 0
        for a in arrays:
            a = np.ascontiguousarray(a)
            pending.append((self.comm.isend(a, dest, tag), a))
            nbytes += a.nbytes
        return nbytes

    def _batch_size(self, feeds: Tensors) -> int:
        for name in self.partition.stages[0].feeds + [t.name for t in self.graph.inputs]:
            if name in feeds and np.ndim(feeds[name]) >= 1:
                return int(np.shape(feeds[name])[0])
        raise GraphError("pipeline: no fed graph input has a batch axis to cut into "
                         "micro-batches")

    def _run(self, feeds: Tensors, names: list[str], loss: str | None
             ) -> tuple[Tensors, Tensors]:
        """Play this stage's schedule on ``feeds``; backward too when ``loss`` is given."""
        unknown = [n for n in names if n not in self.partition.outputs]
        if unknown:
            raise GraphError(f"pipeline: {unknown} are not outputs of graph "
                             f"{self.graph.name!r}; a pipeline returns its graph outputs "
                             f"{self.partition.outputs}")
        training = loss is not None
        step_start = time.perf_counter()
        if training:
            self.timeline.begin()
        n = self._batch_size(feeds)
        bounds = np.linspace(0, n, min(self.micro_batches, n) + 1).round().astype(int)
        rows = np.diff(bounds).tolist()
        m = len(rows)
        ops = schedule(self.schedule_name, self.rank, self.stages, m, backward=training)
        values_buffer = None
        pending: list = []
        if not self.last:  # the loss and outputs come from the last stage
            values_buffer = np.empty(self._values_size(names, n))
            values_request = self.comm.irecv(values_buffer, self.stages - 1, TAG_VALUES)
        posted: dict = {}
        tapes: dict[int, Any] = {}
        stored: dict[int, int] = {}
        parts: dict[int, Tensors] = {}
        grads = {p: np.zeros_like(v) for p, v in self.stage_graph.parameters.items()} \
            if training else {}
        exclude = {id(_base(v)) for v in self.stage_graph.initializers.values()} | {
            id(_base(feeds[t])) for t in self.stage.feeds
            if isinstance(feeds.get(t), np.ndarray)}
        busy: set[int] = set()  # slots holding a saved forward
        forward_s = backward_s = wait_s = 0.0
        peak = live = peak_flight = sent = 0
        values: Tensors = {}
        timeline = self.timeline if training else None
        for k, op in enumerate(ops):
            if k + 1 < len(ops):
                self._post(posted, ops[k + 1], rows)
            self._post(posted, op, rows)
            t0 = time.perf_counter()
            requests, buffers = posted.pop(op)
            self._wait(requests)
            t1 = time.perf_counter()
            wait_s += t1 - t0
            if timeline is not None:
                timeline.lap("communicate")
            kind, i = op
            if kind == "F":
                given = dict(buffers)
                # inference may leave out what it does not need (generation: no labels)
                given.update({t: feeds[t][bounds[i]:bounds[i + 1]] for t in self.stage.feeds
                              if t in feeds})
                wanted_out = names if self.last else self.outputs
                if training:
                    slot = self._slot(busy)
                    busy.add(slot)
                    out, saved = self.slots[slot].forward_saving(given, wanted_out,
                                                                 self.grad_sends)
                else:
                    out, saved = self.executor.inference(given, wanted_out), None
                if self.last:
                    parts[i] = {t: out[t] for t in names}
                    if len(parts) == m:
                        values = self._combine(parts, names, rows, n)
                        self._send_values(pending, values, names)
                else:
                    sent += self._send(pending, [out[t] for t in self.stage.sends],
                                       self.rank + 1, 2 * i)
                if training:
                    tapes[i] = (slot, saved, out.get(loss) if self.last else None)
                    stored[i] = saved_bytes(saved, exclude)
                    live += stored[i]
                    peak, peak_flight = max(peak, live), max(peak_flight, len(tapes))
                del out, saved, given
                t2 = time.perf_counter()
                forward_s += t2 - t1
                if timeline is not None:
                    timeline.lap("forward")
            else:
                slot, saved, loss_value = tapes.pop(i)
                if self.last:
                    seeds = {loss: np.full_like(loss_value, rows[i] / n)}
                else:
                    seeds = dict(buffers)
                g = self.slots[slot].backward_seeded(saved, seeds)
                busy.discard(slot)
                del saved, seeds
                for p in grads:  # a plan's own arrays: summed before the slot runs again
                    if p in g:
                        grads[p] += g[p]
                if self.grad_sends:
                    sent += self._send(pending, [g[t] if t in g else np.zeros(
                        (rows[i], *self.shapes[t][0]), self.shapes[t][1])
                        for t in self.grad_sends], self.rank - 1, 2 * i + 1)
                del g
                live -= stored.pop(i)
                t2 = time.perf_counter()
                backward_s += t2 - t1
                if timeline is not None:
                    timeline.lap("backward")
            test_all(self.comm, [r for r, _ in pending])  # lets large sends progress
        span = time.perf_counter() - step_start
        self._wait([r for r, _ in pending])
        if training:
            self._sum_tied(grads)
        if not self.last:
            self._wait([values_request])
            values = self._unpack_values(values_buffer, names, n)
        if timeline is not None:
            timeline.lap("communicate")
        if training:
            self._record(span, forward_s, backward_s, wait_s, m, peak, peak_flight, sent, n)
        return values, grads

    def _sum_tied(self, grads: Tensors) -> None:
        """A parameter read in several stages (``Partition.tied``: an output head tied to the
        embedding) gets every stage's share of its gradient: one allreduce over the pipeline
        per tied parameter, in name order, the stages that do not read it adding zeros. Each
        holder then makes the same update to its copy."""
        for name in sorted(self.partition.tied):
            buf = grads.get(name)
            if buf is None:
                buf = np.zeros_like(self.graph.initializers[name])
            if self.oversubscribed:
                poll_all(self.comm, [self.comm.iallreduce(buf)])
            else:
                self.comm.allreduce(buf)

    # -- the values every rank returns -----------------------------------------------------
    def _values_size(self, names: list[str], n: int) -> int:
        return sum(int(np.prod(self.shapes[t][0])) * (1 if t in self.scalars else n)
                   for t in names)

    def _combine(self, parts: dict[int, Tensors], names: list[str], rows: list[int],
                 n: int) -> Tensors:
        """The batch's values from its micro-batches': scalars (the loss) weighted by size,
        batched outputs concatenated."""
        out = {}
        for t in names:
            pieces = [parts[i][t] for i in range(len(rows))]
            if np.ndim(pieces[0]) == 0:
                out[t] = np.asarray(sum(r / n * v for r, v in zip(rows, pieces)),
                                    dtype=pieces[0].dtype)
            else:
                out[t] = np.concatenate(pieces, axis=0)
        return out

    def _send_values(self, pending: list, values: Tensors, names: list[str]) -> None:
        if self.stages == 1:
            return
        flat = np.concatenate([np.asarray(values[t], np.float64).ravel() for t in names])
        pending.extend((self.comm.isend(flat, r, TAG_VALUES), flat)
                       for r in range(self.stages - 1))

    def _unpack_values(self, flat: np.ndarray, names: list[str], n: int) -> Tensors:
        out, offset = {}, 0
        for t in names:
            shape, dtype = self.shapes[t]
            full = () if t in self.scalars else (n, *shape)
            size = int(np.prod(full))
            out[t] = flat[offset:offset + size].astype(dtype).reshape(full)
            offset += size
        return out

    def _record(self, span: float, forward_s: float, backward_s: float, wait_s: float, m: int,
                peak: int, peak_flight: int, sent: int, n: int) -> None:
        self.bytes_sent += sent
        self._train_steps += 1
        if self._train_steps == 1:  # warm-up: allocations, first messages
            return
        s = self.stats
        s.steps += 1
        s.span_s += span
        self.spans.append(span)
        s.rows += n
        s.forward_s += forward_s
        s.backward_s += backward_s
        s.wait_s += wait_s
        s.forwards += m
        s.backwards += m
        s.peak_stored_bytes = max(s.peak_stored_bytes, peak)
        s.peak_in_flight = max(s.peak_in_flight, peak_flight)
        s.bytes_sent += sent
