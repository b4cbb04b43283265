"""What a graph holds, for people: ``meta inspect MODEL.onnx`` prints ``summarize(graph)``.

Inputs and outputs with their shapes, the operators with meta's support for each, and the
initializers by role (trainable parameters, frozen parameters, state, constants) with shapes
and element counts, so a user sees before training what an optimizer will move, and why each
parameter is one (``roles.explain``); first, the file's notes (``graph.notes``: what keeps it
from training as its source model did, ties).
"""

from __future__ import annotations

from collections import Counter

from meta.lv1 import roles
from meta.lv1.graph import Graph, GraphError, TensorInfo, make_operator

ROLE_TITLES = {roles.PARAMETER: "trainable parameters", roles.FROZEN: "frozen parameters",
               roles.STATE: "state (updated in training mode, not by the optimizer)",
               roles.CONSTANT: "constants"}


def _shape(info: TensorInfo) -> str:
    if info.shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in info.shape) + "]"


def operator_support(graph: Graph) -> list[tuple[str, str, int, str]]:
    """(domain, op type, node count, support) per operator of the graph and its subgraphs;
    support names the backends that run it, or why meta cannot (unknown op, opset or
    attribute)."""
    counts: Counter[tuple[str, str]] = Counter()
    support: dict[tuple[str, str], str] = {}
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.nodes:
            key = (node.domain or "ai.onnx", node.op_type)
            counts[key] += 1
            stack.extend(node.subgraphs())
            if key in support and not support[key].startswith("no"):
                continue
            try:
                make_operator(node, g.opset)
                support[key] = ", ".join(b for b in ("numpy", "native")
                                         if _runs_on(node, g.opset, b))
            except GraphError as err:
                support[key] = f"no: {str(err).split(': ', 1)[-1]}"
    return [(d, op, counts[d, op], support[d, op]) for d, op in sorted(counts)]


def _runs_on(node, opset: dict[str, int], backend: str) -> bool:
    try:
        return make_operator(node, opset, (backend,)).backend == backend
    except GraphError:
        return False


def embedding_notes(graph: Graph) -> list[str]:
    """What the file cannot say about its embeddings: ONNX has no padding index, so an
    ``nn.Embedding(..., padding_idx=i)`` exported trains row i whenever token i occurs."""
    tables = sorted({n.inputs[0] for n in graph.nodes
                     if n.op_type == "Gather" and n.inputs and n.inputs[0] in graph.initializers
                     and graph.roles.get(n.inputs[0]) == roles.PARAMETER})
    if not tables:
        return []
    return [f"embedding {', '.join(tables)}: an ONNX file does not record a padding index "
            "(nn.Embedding's padding_idx), so every row trains; keep PyTorch's behaviour with "
            f"the optimizer option padding_rows, e.g. {{{tables[0]!r}: [0]}}"]


def summarize(graph: Graph, limit: int = 40) -> str:
    """A plain-text report of the graph (``limit`` rows per role; 0: all)."""
    lines = [f"graph {graph.name!r}: {len(graph.nodes)} nodes, opsets "
             + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(graph.opset.items()))]
    lines += [f"note: {note}" for note in graph.notes]
    lines += [f"note: {note}" for note in embedding_notes(graph)]
    feeds = [t for t in graph.inputs if t.name not in graph.initializers]
    for title, infos in (("inputs", feeds), ("outputs", graph.outputs)):
        lines.append(f"{title}:")
        lines += [f"  {t.name:<32} {str(t.dtype or '?'):<8} {_shape(t)}" for t in infos]
    lines.append("operators:")
    for domain, op, count, support in operator_support(graph):
        lines.append(f"  {op:<28} {domain:<10} {count:>5}  {support}")
    by_role = graph.roles
    why = roles.explain(graph)
    tied: dict[str, list[str]] = {}
    for derived, (kept, kind, _) in graph.ties.items():
        tied.setdefault(kept, []).append(derived + ("ᵀ" if kind == "transpose" else ""))
    for role, title in ROLE_TITLES.items():
        names = [k for k in graph.initializers if by_role[k] == role]
        values = [graph.initializers[k] for k in names]
        total = sum(v.size for v in values)
        nbytes = sum(v.nbytes for v in values)
        lines.append(f"{title}: {len(names)} tensors, {total:,} values, {nbytes:,} bytes")
        shown = names if not limit else names[:limit]
        for name, value in zip(shown, values):
            lines.append(f"  {name:<40} {str(value.dtype):<8} {list(value.shape)!s:<18} "
                         f"{value.size:>10,}")
            if role == roles.PARAMETER:
                also = f"; tied: also {', '.join(tied[name])}" if name in tied else ""
                lines.append(f"      why: {why.get(name, '?')}{also}")
        if len(shown) < len(names):
            lines.append(f"  ... {len(names) - len(shown)} more (--all lists them)")
    return "\n".join(lines)
