"""How each node becomes steps of a plan.

``lower(context, node)`` picks the node's kernel from ``KERNELS`` (op type -> a function that
returns a ``Lowered`` node, or None when it does not take this case: another dtype, a rank or
an attribute it does not cover; or a string saying why not, which ``placement()`` then shows,
as the recurrent kernels do) and otherwise runs the operator's own Python code in one step
(``python_node``): every node runs, the kernels make the common ones fast. The kernels
(oneDNN through ``meta._plan``) work in float32; 4-D activations stay in the layout the
convolutions chose (channels-last for most) through pooling, normalization, activations,
additions and concatenations, and are reordered to plain row-major only where a node needs it.

Fusions, decided here because only here is it known what the kernels can absorb:
Conv/Gemm + the activation after it (ReLU, Clip as ReLU6, LeakyRelu, Sigmoid, Tanh, Elu, and
in inference any oneDNN activation), Conv + an eval-mode BatchNormalization (+ activation)
as a per-channel scale and shift applied in the convolution's output loop,
BatchNormalization + ReLU, and views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout
in inference) that cost nothing.

Each kernel family's lowerings live in ``meta.lv1.plan.lowering``, one module per file of
``cpp/plan/`` (conv, eltwise, loss, matmul, norm, pool, rnn, tensor; views for what costs no
kernel); this module keeps the dispatch (``lower``), the fallback (``python_node``) and the
table.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from meta.lv0 import Context as OpContext
from meta.lv0 import InferenceContext, check_backward
from meta.lv1.graph import Node
from meta.lv1.plan import custom
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context, py_step
from meta.lv1.plan.lowering.broadcast import div, expand, tile
from meta.lv1.plan.lowering.conv import conv
from meta.lv1.plan.lowering.eltwise import (
    ACTIVATIONS,
    BINARY,
    binary,
    eltwise,
    reduce_mean,
    sum_node,
)
from meta.lv1.plan.lowering.fused import fused
from meta.lv1.plan.lowering.loss import cross_entropy
from meta.lv1.plan.lowering.mask import range_node, trilu
from meta.lv1.plan.lowering.matmul import gemm, matmul
from meta.lv1.plan.lowering.norm import batchnorm, layernorm
from meta.lv1.plan.lowering.pool import pool
from meta.lv1.plan.lowering.rnn import recurrent
from meta.lv1.plan.lowering.scan import cumsum
from meta.lv1.plan.lowering.scatter import scatter_nd
from meta.lv1.plan.lowering.slicing import slice_node, split
from meta.lv1.plan.lowering.tensor import concat, softmax
from meta.lv1.plan.lowering.views import gather, transpose, view_node

__all__ = ["F32", "KERNELS", "Context", "lower", "py_step", "python_node"]


def lower(ctx: Context, node: Node) -> Lowered:
    grouped = fused(ctx, node, ctx.ops[node.name])  # a pointwise group (lowering/fused.py)
    if grouped is not None:
        return grouped
    kernel = KERNELS.get(node.op_type)
    if kernel is not None:
        lowered = kernel(ctx, node, ctx.ops[node.name])
        if isinstance(lowered, str):  # the kernel cannot do this case exactly: why not
            fallback = python_node(ctx, node)
            fallback.kind = f"python ({node.op_type}: {lowered})"
            return fallback
        if lowered is not None:
            return lowered
    return custom.lower(ctx, node) or python_node(ctx, node)


# -- the operator's own code, one step ---------------------------------------------------------
def python_node(ctx: Context, node: Node) -> Lowered:
    """Forward and backward of ``node`` as its operator computes them (numpy, or meta's native
    twin), on plain arrays of the plan; its context is kept for the backward."""
    from meta.lv1.executor import ExecutionError

    pb, op = ctx.pb, ctx.ops[node.name]
    ins = [pb.require_layout(x, "plain") if x else "" for x in node.inputs]
    outs = list(node.outputs)
    for o in outs:
        if o:
            pb.output(o, ctx.shape(o), ctx.dtype(o))
    training = ctx.training
    needs = [bool(x) and ctx.needs(x) and i not in op.no_grad_inputs
             for i, x in enumerate(node.inputs)]
    record = ctx.backprop and any(needs)
    kind = "communication" if op.communicates else "python"
    updates = [i for i, x in enumerate(node.inputs) if x in ctx.state and i in op.state_inputs]
    slot: dict = {}

    def build(a):
        arrays = [a(x) if x else None for x in ins]
        targets = [a(o) if o else None for o in outs]
        state = [(i, a(node.inputs[i])) for i in updates]

        def run() -> None:
            c = OpContext(needs, training) if record or updates else \
                InferenceContext(training=training)
            try:
                results = op.apply(c, *arrays)
            except Exception as err:
                shapes = ", ".join(f"{x or '-'}: {getattr(v, 'dtype', '')}"
                                   f"{list(np.shape(v)) if v is not None else 'absent'}"
                                   for x, v in zip(node.inputs, arrays))
                raise ExecutionError(f"{node.describe()} failed on inputs ({shapes}): {err}") \
                    from err
            for name, result, target in zip(outs, results, targets):
                if target is None:
                    continue
                if np.shape(result) != target.shape:
                    raise ExecutionError(
                        f"{node.describe()}: output {name!r} has shape {list(np.shape(result))} "
                        f"where the plan traced {list(target.shape)} (a shape that depends on "
                        f"the data cannot be planned)")
                np.copyto(target, result, casting="unsafe")
            if updates:
                new = op.update_state(c, *(array for _, array in state))
                if new is not None:
                    for (_, array), value in zip(state, new):
                        array[...] = value
            slot["ctx"] = c
        return [py_step(run, node.name)]

    pb.step(node.op_type, ins, [o for o in outs if o], build)
    if not record:
        return Lowered(node, None, kind)

    def backward(pb: PlanBuilder) -> None:
        grads = [pb.grad(o) if o else None for o in outs]
        if all(g is None for g in grads):
            return
        targets = [pb.grad_target(x, can_accumulate=True) if need else None
                   for x, need in zip(ins, needs)]
        writes = [t[0] for t in targets if t]

        def build(a):
            gys = [a(g) if g else None for g in grads]
            dests = [(a(t[0]), t[1]) if t else None for t in targets]

            def run() -> None:
                c = slot["ctx"]
                try:
                    result = op.backward(c, *gys)
                except Exception as err:
                    raise ExecutionError(f"{node.describe()} backward failed: {err}") from err
                result = check_backward(result, c, node)
                for g, dest in zip(result, dests):
                    if dest is None or g is None:
                        continue
                    target, add = dest
                    if add:
                        np.add(target, g, out=target, casting="unsafe")
                    else:
                        np.copyto(target, g, casting="unsafe")
            return [py_step(run, f"{node.name} backward")]
        # what forward kept (in its context) must outlive this step
        pb.step(f"{node.op_type} backward", [*ins, *outs, *(g for g in grads if g)], writes,
                build, "backward")
    return Lowered(node, backward, kind)


KERNELS: dict[str, Callable] = {
    "Gather": gather,
    "ReduceMean": reduce_mean,
    "ReduceSum": reduce_mean,
    "Conv": conv,
    "Gemm": gemm,
    "MatMul": matmul,
    "MaxPool": pool,
    "AveragePool": pool,
    "GlobalAveragePool": pool,
    "GlobalMaxPool": pool,
    "BatchNormalization": batchnorm,
    "LayerNormalization": layernorm,
    "Softmax": softmax,
    "LogSoftmax": softmax,
    "SoftmaxCrossEntropyLoss": cross_entropy,
    "Concat": concat,
    "Transpose": transpose,
    "Sum": sum_node,
    "LSTM": recurrent,
    "GRU": recurrent,
    "Slice": slice_node,  # one axis (rotary halves); recurrent weights' Slices: fold_slice
    "Split": split,  # GPT-2's query/key/value split (lowering/slicing.py)
    **{t: binary for t in BINARY},
    "Div": div,  # Div(c, x): RMSNorm's rsqrt (lowering/broadcast.py)
    "Expand": expand,  # one run of broadcast axes: grouped-query attention's K and V
    "Tile": tile,  # a broadcast copy (lowering/broadcast.py)
    "CumSum": cumsum,  # cpp/plan/scan.cpp
    "ScatterND": scatter_nd,  # cpp/plan/scatter.cpp
    "Trilu": trilu,  # cpp/plan/mask.cpp
    "Range": range_node,
    **{t: eltwise for t in ACTIVATIONS},
    **{t: view_node for t in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                              "Dropout")},
}
