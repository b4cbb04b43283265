"""Tensor parallelism's collectives as steps of a plan (the planned executor).

``CopyToParallel`` and ``AllReduceSum`` (``ops``) run in a plan without copies and with the
backward's allreduces overlapped:

* ``CopyToParallel`` forward is a view of its input (no step). Its backward sums the
  gradient of its output over the ranks **in place** (no copy: the input's gradient is that
  buffer, or that buffer is added into it), as a nonblocking allreduce in two steps, a
  ``Start`` and a ``Wait`` (``meta.lv1.plan.overlap``). The plan's scheduler puts between them
  the steps the sum does not need: the weight gradients of the column-parallel layers that
  read the copy (Q, K, V; the MLP's first layer) and of the layers after them, computed while
  the partial input gradients travel, with a test of the request after each (MPICH moves a
  nonblocking collective only inside calls that test it).
* ``AllReduceSum`` forward sums the row-parallel layer's partial output in place: its
  output is a view of the partial sum (no copy in, none out). Its backward passes the gradient
  through (a view where it can be, else a copy). Nothing in a forward can run while it waits
  (everything after reads it), but it goes through the same pair of steps.
* Sequence parallelism's collectives (``sequence``) run the same way: ``ReduceScatterRows``
  a nonblocking reduce-scatter of the partial sum into this rank's rows (backward: the
  gradient's rows written in place into the partial sum's gradient, the others gathered
  there); ``GatherRows`` an in-place all-gather into a buffer where the LayerNorm already
  wrote this rank's rows (backward: the reduce-scatter of the gradient, overlapped as the
  allreduce it replaces); ``ScatterRows`` a view of this rank's rows; ``ShareOfMean`` two
  small steps.

The steps are Python steps calling mpi4py (a few microseconds each); the bytes and the seconds
inside them are counted on the ``Group`` as its blocking ``allreduce`` counts them, so the
executor's report is the same on every path. Registered into the plan's kernel table (keyed by
the operators' domain) by ``ops.register_operators``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import Context, py_step
from meta.lv1.plan.memory import Value, root
from meta.lv1.plan.overlap import add_pair
from meta.lv3.comm.polling import poll_all
from meta.lv3.tensor_parallel.rows import row_counts, rows

PLACEMENT = "communication"  # as kernels.python_node places a communicating operator


class Allreduce:
    """One collective of a plan: an in-place nonblocking sum of ``buffer`` over the group's
    ranks, started, tested and waited by three kinds of step (their build functions below),
    counted and timed on the group."""

    def __init__(self, group: Any, name: str, buffer: str) -> None:
        self.group = group
        """The ``ops.Group`` it sums over (and counts its bytes and seconds on)."""
        self.name = name
        """Its steps' names: the node's."""
        self.buffer = buffer
        """The plan value summed in place."""
        self.request: Any = None
        """MPI's request, between a start and its wait (None otherwise)."""

    def _call(self, fn) -> Any:
        """``fn()``, its seconds counted as the group's time in collectives."""
        began = time.perf_counter()
        try:
            return fn()
        finally:
            self.group.seconds += time.perf_counter() - began

    def start(self, a) -> list:
        buf, group = a(self.buffer), self.group

        def run() -> None:
            group.bytes_sent += buf.nbytes
            group.calls += 1
            if group.comm.size > 1:
                self.request = self._call(lambda: group.comm.iallreduce(buf))
        return [py_step(run, f"{self.name} start")]

    def progress(self, a) -> list:
        def run() -> None:
            if self.request is not None:
                self._call(lambda: self.group.comm.test(self.request))
        return [py_step(run, f"{self.name} progress")]

    def wait(self, a) -> list:
        comm, poll = self.group.comm, self.group.poll

        def run() -> None:
            request, self.request = self.request, None
            if request is not None:  # polled where ranks outnumber cores (Group.poll)
                self._call(lambda: poll_all(comm, [request]) if poll else comm.wait(request))
        return [py_step(run, f"{self.name} wait")]

    def add(self, pb: PlanBuilder, phase: str) -> None:
        add_pair(pb, self.name, self.buffer, self.start, self.wait, self.progress, phase)


class RowCollective(Allreduce):
    """A collective of rows (sequence parallelism, ``sequence``): an in-place all-gather of
    ``buffer``'s rows (each rank's own already there), or, with ``into``, a reduce-scatter of
    ``buffer`` into this rank's rows ``into``; started, tested and waited as ``Allreduce``."""

    def __init__(self, group: Any, name: str, buffer: str, into: str = "") -> None:
        super().__init__(group, name, buffer)
        self.into = into
        """The reduce-scatter's output (empty: an all-gather)."""

    def start(self, a) -> list:
        buf, group = a(self.buffer), self.group
        out = a(self.into) if self.into else None
        if out is not None and out.size == 0:  # no rows here (a batch of 1: generation):
            out = np.empty(1, out.dtype)[:0]  # bytes of its own, which MPI checks
        counts = row_counts(buf, group.comm.size)

        def run() -> None:
            group.bytes_sent += buf.nbytes
            group.calls += 1
            if group.comm.size > 1:
                self.request = self._call(
                    lambda: group.comm.ireduce_scatter(buf, out, counts) if out is not None
                    else group.comm.iallgatherv(buf, counts))
            elif out is not None:
                np.copyto(out, buf)
        return [py_step(run, f"{self.name} start")]

    def add(self, pb: PlanBuilder, phase: str) -> None:
        add_pair(pb, self.name, self.buffer, self.start, self.wait, self.progress, phase,
                 self.into)


def _in_place(pb: PlanBuilder, name: str) -> bool:
    """Whether ``name``'s bytes are the plan's own to overwrite (the arena's)."""
    return pb.values[root(pb.values, name)].storage == "arena"


def _float(ctx: Context, node: Node) -> bool:
    return all(np.dtype(ctx.dtype(x)).kind == "f" for x in (*node.inputs, *node.outputs) if x)


def _copy_step(pb: PlanBuilder, src: str, dest: str, add: bool, name: str) -> None:
    """``dest`` = (or +=) ``src``, both plain and of one shape."""
    def build(a):
        s, d = a(src), a(dest)

        def run() -> None:
            if add:
                np.add(d, s, out=d)
            else:
                np.copyto(d, s)
        return [py_step(run, name)]
    pb.step(name, [src, dest] if add else [src], [dest], build, "backward")


def copy_to_parallel(ctx: Context, node: Node, op) -> Lowered | None:
    """Forward: a view. Backward: the output's gradient summed over the ranks in place,
    overlapped (the module docstring)."""
    if not _float(ctx, node):
        return None
    pb = ctx.pb
    x, y = node.inputs[0], node.outputs[0]
    src = pb.require_layout(x, "plain")
    pb.view(y, src, ctx.shape(y))
    if not ctx.needs(x):
        return Lowered(node, None, PLACEMENT)
    group = op.communicator()

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        summed = g
        if not _in_place(pb, g):  # not the plan's bytes to overwrite: sum a copy
            summed = pb.temp(g)
            _copy_step(pb, g, summed, False, f"{node.name} backward copy")
        Allreduce(group, f"{node.name} allreduce", summed).add(pb, "backward")
        if summed == g and pb.alias_grad(src, y):
            return  # the input's gradient is the summed buffer itself
        target = pb.grad_target(src, can_accumulate=True)
        if target is not None:
            _copy_step(pb, summed, target[0], target[1], f"{node.name} backward")
    return Lowered(node, backward, PLACEMENT)


def allreduce_sum(ctx: Context, node: Node, op) -> Lowered | None:
    """Forward: the partial sum reduced in place, the output a view of it. Backward: the
    gradient passed through (the module docstring)."""
    if not _float(ctx, node):
        return None
    pb = ctx.pb
    x, y = node.inputs[0], node.outputs[0]
    src = pb.require_layout(x, "plain")
    group = op.communicator()
    if _in_place(pb, src) and len(ctx.consumers.get(x, [])) == 1 and x not in ctx.protected:
        pb.view(y, src, ctx.shape(y))
    else:  # read elsewhere too (or not the plan's bytes): the sum in an output of its own
        pb.output(y, ctx.shape(y), ctx.dtype(y))
        def build(a):
            s, d = a(src), a(y)
            return [py_step(lambda: np.copyto(d, s), f"{node.name} copy")]
        pb.step("AllReduceSum copy", [src], [y], build)
    Allreduce(group, node.name, y).add(pb, "forward")
    if not ctx.needs(x):
        return Lowered(node, None, PLACEMENT)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None or pb.alias_grad(src, y):
            return
        target = pb.grad_target(src, can_accumulate=True)
        if target is not None:
            _copy_step(pb, g, target[0], target[1], f"{node.name} backward")
    return Lowered(node, backward, PLACEMENT)


def _f32(ctx: Context, node: Node) -> bool:
    x = node.inputs[0]
    return np.dtype(ctx.dtype(x)) == np.float32 and \
        all(np.dtype(ctx.dtype(y)) == np.float32 for y in node.outputs if y)


def _rows_step(pb: PlanBuilder, whole: str, part: str, into_whole: bool, name: str,
               phase: str, group: Any, alias: bool = False) -> None:
    """Copy this rank's rows between ``whole`` and ``part`` (into ``whole``'s rows, or out of
    them), one C++ copy; with ``alias``, into ``whole`` without a copy where ``part`` is an
    arena value of its own: its bytes become ``whole``'s rows (the step that computes it
    writes them there)."""
    mine = rows(pb.values[whole].shape[0], group.comm.size, group.comm.rank)
    v, w = pb.values[part], pb.values[whole]
    if alias and into_whole and v.storage == "arena" and v.layout == w.layout == "plain" \
            and v.dtype == w.dtype and v.shape == (mine.stop - mine.start, *w.shape[1:]):
        per_row = int(np.prod(w.shape[1:], dtype=np.int64))
        pb.values[part] = Value(part, v.shape, v.dtype, "plain", "view", whole,
                                mine.start * per_row)
        return

    def build(a):
        w, p = a(whole), a(part)
        src, dest = (p, w[mine]) if into_whole else (w[mine], p)
        return [pb.rt.copy(src, dest, p.size)] if p.size else []
    pb.step(name, [part] if into_whole else [whole], [whole] if into_whole else [part], build,
            phase)


def _gathered_gradient(node: Node, group: Any, src: str, y: str):
    """The backward of a node whose output is this rank's rows of ``src``: the gradient's
    rows (written straight into ``src``'s gradient where they can be) gathered from every
    rank in place."""
    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        target = pb.grad_target(src)
        if target is None:
            return
        _rows_step(pb, target[0], g, True, f"{node.name} backward rows", "backward",
                   group, True)
        RowCollective(group, f"{node.name} allgather", target[0]).add(pb, "backward")
    return backward


def scatter_rows(ctx: Context, node: Node, op) -> Lowered | None:
    """Forward: this rank's rows of the input, a view of them. Backward: the gradient's rows
    gathered from every rank (into a whole buffer, in place), added to the input's."""
    pb = ctx.pb
    x, y = node.inputs[0], node.outputs[0]
    src = pb.require_layout(x, "plain")
    group = op.communicator()
    shape = ctx.shape(x)
    mine = rows(shape[0], group.comm.size, group.comm.rank)
    per_row = int(np.prod(shape[1:], dtype=np.int64))
    if ctx.needs(x) and not _f32(ctx, node):
        return None
    pb.view(y, src, ctx.shape(y), mine.start * per_row)
    if not ctx.needs(x):
        return Lowered(node, None, PLACEMENT)

    return Lowered(node, _gathered_gradient(node, group, src, y), PLACEMENT)


def gather_rows(ctx: Context, node: Node, op) -> Lowered | None:
    """Forward: this rank's rows in the whole output (computed there by the node that makes
    them, where they are its own arena value; else copied), the others gathered into it in
    place from every rank. Backward: the output's gradient reduce-scattered into the input's (``reduce``:
    overlapped with the weight gradients of the column layers reading the output, as the
    allreduce it stands for), or its rows copied (a graph output)."""
    if not _f32(ctx, node):
        return None
    pb = ctx.pb
    x, y = node.inputs[0], node.outputs[0]
    src = pb.require_layout(x, "plain")
    group = op.communicator()
    pb.output(y, ctx.shape(y), ctx.dtype(y))
    alone = len(ctx.consumers.get(x, [])) == 1 and x not in ctx.protected
    _rows_step(pb, y, src, True, f"{node.name} rows", "forward", group, alone)
    RowCollective(group, f"{node.name} allgather", y).add(pb, "forward")
    if not ctx.needs(x):
        return Lowered(node, None, PLACEMENT)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        target = pb.grad_target(src)
        if target is None:
            return
        if op.reduce:
            RowCollective(group, f"{node.name} reduce_scatter", g, target[0]).add(
                pb, "backward")
        else:
            _rows_step(pb, g, target[0], False, f"{node.name} backward rows", "backward",
                       group)
    return Lowered(node, backward, PLACEMENT)


def reduce_scatter_rows(ctx: Context, node: Node, op) -> Lowered | None:
    """Forward: the row-parallel layer's partial sum reduce-scattered into this rank's rows.
    Backward: the gradient's rows gathered from every rank into the partial sum's gradient
    (its own rows copied in, the rest gathered in place)."""
    if not _f32(ctx, node):
        return None
    pb = ctx.pb
    x, y = node.inputs[0], node.outputs[0]
    src = pb.require_layout(x, "plain")
    group = op.communicator()
    pb.output(y, ctx.shape(y), ctx.dtype(y))
    RowCollective(group, node.name, src, y).add(pb, "forward")
    if not ctx.needs(x):
        return Lowered(node, None, PLACEMENT)

    return Lowered(node, _gathered_gradient(node, group, src, y), PLACEMENT)


def share_of_mean(ctx: Context, node: Node, op) -> Lowered | None:
    """This rank's part of the mean loss (a scalar times its share of the counted labels),
    two small steps; placed with the collectives: it is the loss's half of the sum over the
    ranks that the strategy's allreduce completes."""
    pb = ctx.pb
    x, mine, labels = node.inputs
    y = node.outputs[0]
    pb.output(y, ctx.shape(y), ctx.dtype(y))
    ignore = op.ignore_index
    share = [0.0]

    def build(a):
        xs, ms, ls, ys = a(x), a(mine), a(labels), a(y)

        def run() -> None:
            counted = np.count_nonzero(ls != ignore)
            share[0] = np.count_nonzero(ms != ignore) / counted if counted else 0.0
            np.multiply(xs, share[0], out=ys, casting="unsafe")
        return [py_step(run, node.name)]
    pb.step("ShareOfMean", [x, mine, labels], [y], build)
    if not ctx.needs(x):
        return Lowered(node, None, PLACEMENT)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        target = pb.grad_target(x, can_accumulate=True)
        if target is None:
            return
        dest, add = target

        def build(a):
            gs, ds = a(g), a(dest)

            def run() -> None:
                if add:
                    np.add(ds, gs * share[0], out=ds, casting="unsafe")
                else:
                    np.multiply(gs, share[0], out=ds, casting="unsafe")
            return [py_step(run, f"{node.name} backward")]
        pb.step("ShareOfMean backward", [g, dest] if add else [g], [dest], build, "backward")
    return Lowered(node, backward, PLACEMENT)


KERNELS = {"CopyToParallel": copy_to_parallel, "AllReduceSum": allreduce_sum,
           "ScatterRows": scatter_rows, "GatherRows": gather_rows,
           "ReduceScatterRows": reduce_scatter_rows, "ShareOfMean": share_of_mean}
"""op type -> its lowering (``ops.register_operators`` enters them in the plan's table)."""
