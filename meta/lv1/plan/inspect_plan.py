"""``meta inspect --plan MODEL.onnx``: where each node of a model runs in the planned executor
(a oneDNN kernel, meta's native loop, a compiled C++ operator, a Python step, folded, fused)
and, measured on a few training steps on random feeds of the model's input shapes, each
node's share of a step and the share spent in Python steps (issue 41: one ``Pow`` left to
numpy took 92 % of GPT-2's step, and nothing said so).

The feeds: floats standard normal, integers and booleans zeros (always a valid index or
label); a symbolic dimension takes ``--dim NAME=VALUE``, else 1. The loss: the model's first
scalar float output; a model without one gets ``ReduceSum`` of its first float output added
(node ``meta.inspect.loss``), so the backward runs as in training.

``--precision bf16`` plans as ``PlannedExecutor(precision="bf16")`` does; the ``precision``
column says per node what it computes in (``precision.of_placement``: bf16 where its products
read bf16, f32 elsewhere, blank where the node computes nothing of its own), and the head
line what was asked for and what runs here (float32 where bf16 is not native).
"""

from __future__ import annotations

import numpy as np

from meta.lv1.graph import Graph, GraphError, Node, TensorInfo
from meta.lv1.plan import profile_share

ADDED_LOSS = "meta.inspect.loss"


def feeds_for(graph: Graph, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """Random feeds of the graph's input shapes and dtypes (see the module)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for t in graph.inputs:
        if t.name in graph.initializers:
            continue
        if t.dtype is None or t.shape is None:
            raise GraphError(f"input {t.name!r}: its {'dtype' if t.dtype is None else 'rank'} "
                             f"is not in the file, so no feed can be made for it")
        shape = tuple(d if isinstance(d, int) and d >= 0 else dims.get(str(d), 1)
                      for d in t.shape)
        if t.dtype.kind == "f":
            feeds[t.name] = rng.standard_normal(shape).astype(t.dtype)
        else:
            feeds[t.name] = np.zeros(shape, t.dtype)
    return feeds


def loss_of(graph: Graph) -> tuple[str, bool]:
    """The name of the loss to differentiate, and whether it was added here."""
    for t in graph.outputs:
        if t.dtype is not None and t.dtype.kind == "f" and t.shape == ():
            return t.name, False
    for t in graph.outputs:
        if t.dtype is not None and t.dtype.kind == "f":
            graph.insert(Node("ReduceSum", [t.name], [ADDED_LOSS], ADDED_LOSS,
                              attrs={"keepdims": 0}))
            graph.outputs.append(TensorInfo(ADDED_LOSS, t.dtype, ()))
            return ADDED_LOSS, True
    raise GraphError(f"graph {graph.name!r} has no float output to train on")


def report(graph: Graph, dims: dict[str, int] | None = None,
           steps: int = 5, precision: str = "f32") -> str:
    """The plan's placement, precision and measured share of every node, Python's share
    last."""
    from meta.lv1.plan.executor import PlannedExecutor
    from meta.lv1.plan.precision import native_bf16, of_placement

    feeds = feeds_for(graph, dims or {})
    loss, added = loss_of(graph)
    ex = PlannedExecutor(graph, precision=precision).train()
    ex.python_watch.done = True  # measured here, not said again on stderr
    share = profile_share.measure(ex, feeds, loss, steps)
    times = {t.node: t for t in share.nodes}
    shapes = ", ".join(f"{n} {list(v.shape)}" for n, v in feeds.items())
    lines = [f"plan of {graph.name!r} (training step, feeds {shapes or 'none'}; loss {loss!r}"
             f"{', added by inspect' if added else ''}; each step's fastest of {steps} calls "
             f"timed after one):",
             precision_line(ex.precision, ex.plan_precision, native_bf16()[1]),
             f"  {'node':<32} {'op':<22} {'placement':<28} {'precision':<9} {'ms/step':>9} "
             f"{'share':>7}"]
    for node in graph.nodes:
        where = ex.placement().get(node.name, "not run")
        t = node_time(times, node.name)
        ms = f"{t.ns / 1e6:>9.3f}" if t else f"{'':>9}"
        pct = f"{share.share(t):>7.1%}" if t else f"{'':>7}"
        lines.append(f"  {node.name:<32} {node.op_type:<22} {where:<28} "
                     f"{of_placement(where):<9} {ms} {pct}")
    own = times.get("(the plan's own steps)")
    if own is not None:
        lines.append(f"  {'(the plan: reorders, gradient sums)':<94} "
                     f"{own.ns / 1e6:>9.3f} {share.share(own):>7.1%}")
    top = ", ".join(f"{t.node!r} {share.share(t):.1%}" for t in share.top_python())
    lines.append(f"step: {share.total_ns / 1e6:.3f} ms; Python steps: "
                 f"{share.python_share * 100:.1f} % of it" + (f" ({top})" if top else ""))
    return "\n".join(lines)


def node_time(times: dict[str, profile_share.NodeTime], name: str):
    """A node's time in the step: its own steps' and, for a node the plan rewrote into parts
    (``patterns.decompose``: opset 23's Attention, RMSNormalization, RotaryEmbedding), the
    parts' steps, which the plan names ``<node>/<Op>_<i>``. None when nothing of it ran."""
    parts = [t for n, t in times.items() if n == name or n.startswith(name + "/")]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return profile_share.NodeTime(name, parts[0].op_type, parts[0].placement,
                                  sum(t.ns for t in parts))


def precision_line(asked: str, runs: str, why_not: str) -> str:
    """What precision was asked for and what the plan runs in."""
    if asked == runs == "f32":
        return "precision f32: every node computes in float32"
    if asked == runs:
        return (f"precision {asked}: matrix products and convolutions read {asked}, accumulate "
                f"float32; the rest float32 (parameters, optimizer, softmax, losses, norms)")
    return (f"precision {asked} asked for; this plan runs {runs} (every node float32): "
            f"{asked} is not native here ({why_not})")
