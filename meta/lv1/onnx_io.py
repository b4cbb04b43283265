"""Loading graphs from ONNX models and saving them back.

``from_onnx`` reads what real exporters write: every numeric initializer type (float16,
bfloat16 and the other narrow float types become float32 parameters, since numpy cannot compute
in bfloat16 and float16 training loses too much; int4 types widen to int8), tensor data kept in
external files, graph inputs that shadow initializers (optional feeds with the initializer as
default), default-domain opsets 6 and up (``""`` and ``"ai.onnx"`` alike), subgraphs and
Constant nodes, and ``value_info``. Anything it cannot run fails here, at load time, with one
message naming the file and the node, op, domain, opset or tensor at fault.
"""

from __future__ import annotations

import ast
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from meta.lv1.graph import (
    Dim,
    Graph,
    GraphError,
    Node,
    TensorInfo,
    canonical_domain,
    make_operator,
)
from meta.lv1.ties import tie, tie_note

MIN_OPSET = 6  # the oldest default-domain opset we read (ONNX's model suites use 6)
Source = onnx.ModelProto | bytes | str | os.PathLike


# What PyTorch's dynamo exporter writes: each initializer's kind (PARAMETER, BUFFER) on its
# value_info, the exported program's signature on the graph, each node's module path, and, from
# its optimizer, what a new initializer was folded from.
EXPORTER_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
SCOPES = "pkg.torch.onnx.name_scopes"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
FX_NODE = "pkg.torch.onnx.fx_node"


def _literal_list(text: str) -> list[str]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def _signature(g: onnx.GraphProto) -> tuple[set[str], set[str], set[str], dict[str, str]]:
    """(parameters, buffers, mutated buffers, placeholder -> parameter) of the exported
    program's graph signature (``p_fc_weight: PARAMETER target='fc.weight'``)."""
    text = next((p.value for p in g.metadata_props if p.key == SIGNATURE), "")
    found: dict[str, set[str]] = {"PARAMETER": set(), "BUFFER": set(), "BUFFER_MUTATION": set()}
    placeholders: dict[str, str] = {}
    for holder, kind, target in re.findall(
            r"(\w+):\s*(PARAMETER|BUFFER|BUFFER_MUTATION)\s+target='([^']+)'", text):
        found[kind].add(target)
        if kind == "PARAMETER":
            placeholders[holder] = target
    return found["PARAMETER"], found["BUFFER"], found["BUFFER_MUTATION"], placeholders


def _fx_reads(node: onnx.NodeProto, placeholders: dict[str, str]) -> set[str] | None:
    """The parameters the node's source operation read, by the exporter's ``fx_node`` record
    (``aten.linear(args = (%x, %p_fc_weight, %p_fc_bias))``); None where it names none (no
    record, or a node the optimizer made): then only the module path can say."""
    text = next((p.value for p in node.metadata_props if p.key == FX_NODE), "")
    reads = {placeholders[h] for h in re.findall(r"%(\w+)", text) if h in placeholders}
    return reads or None


def _unmerge(nodes: list[Node], scopes: list[list[str]], reads: list[set[str] | None],
             initializers: dict[str, np.ndarray], marks: dict[str, str], signature: set[str],
             folded: dict[str, list[str]]) -> list[str]:
    """Parameters the exporter's optimizer merged because they were equal at export time
    (every LayerNorm's ones, zero-initialized biases, the layers of an ``nn.TransformerEncoder``,
    deep copies of one layer, and their folded W^T): each node that reads one as another
    parameter of the model gets its own copy, as in PyTorch. Equal at export is not tied: a
    node reads a parameter as its own when the exporter's fx record says so (a tied embedding
    and head read one name); without that record, when the parameter is of the node's module.
    The copy is named after the parameter the node read (a folded one ``val_1@<that name>``).
    Returns the names made."""
    missing = {p for p in signature if p not in initializers}
    made: list[str] = []
    for node, scope, read in zip(nodes, scopes, reads):
        modules = scope[:-1]  # the last entry names the op itself
        for i, x in enumerate(node.inputs):
            sources = [s for s in folded.get(x, ()) if s in signature]
            own = x if marks.get(x) == "PARAMETER" else \
                (sources[0] if len(sources) == 1 and marks.get(x) is None else None)
            if own is None or "." not in own:
                continue
            attr = own.rsplit(".", 1)[1]
            if read is not None:  # the exporter says which parameters the node read
                if own in read:
                    continue  # its own (or one tied parameter read under one name)
                names = [p for p in read if p in missing and p.rsplit(".", 1)[-1] == attr]
            else:
                if own.rsplit(".", 1)[0] in modules:
                    continue
                names = []
                for module in reversed(modules):
                    prefix = f"{module}." if module else ""
                    names = [p for p in missing if p.startswith(prefix) and
                             (p == f"{prefix}{attr}" or p.endswith(f".{attr}"))]
                    if f"{prefix}{attr}" in names:
                        names = [f"{prefix}{attr}"]
                    if names:
                        break
            if len(names) != 1:
                continue  # none, or more than one would fit: left merged (the note says so)
            name = names[0]
            copy = name if x == own else f"{x}@{name}"
            if copy not in initializers:
                initializers[copy] = initializers[x].copy()
                if x == own:
                    marks[copy] = "PARAMETER"
                else:
                    folded[copy] = [name]
                made.append(name)
            node.inputs[i] = copy
    return made


def _restore_expands(nodes: list[Node], initializers: dict[str, np.ndarray],
                     marks: dict[str, str], signature: set[str], folded: dict[str, list[str]],
                     batch: int | None) -> list[str]:
    """Parameters the exporter's optimizer broadcast into a new initializer (a fixed batch:
    ViT's ``cls.expand(N, -1, -1)`` folded into an (N, 1, d) tensor) made one parameter again:
    the initializer becomes ``Expand(parameter, its shape)``, so every batch slot's copy trains
    as the one PyTorch parameter (the gradient summed over the slots). The axes broadcast are
    those along which the value is constant; a value that is one repeated number (a
    zero-initialized token) says nothing, so the batch axis is taken when its size is the
    fed batch. Returns notes, one per parameter restored."""
    notes = []
    for name in list(initializers):
        value = initializers[name]
        params = [s for s in folded.get(name, ()) if s in signature and s not in initializers]
        if marks.get(name) is not None or len(params) != 1 or value.ndim == 0 or \
                not np.issubdtype(value.dtype, np.floating):
            continue
        source = params[0]
        if sum(source in folded.get(k, ()) for k in initializers) != 1:
            continue  # more than one tensor holds it: not a plain broadcast
        uniform = bool(np.all(value == value.flat[0]))
        if uniform:
            axes = [0] if batch is not None and value.shape[0] == batch > 1 else []
        else:
            axes = [a for a in range(value.ndim) if value.shape[a] > 1 and
                    np.array_equal(value, np.broadcast_to(np.take(value, [0], axis=a),
                                                          value.shape))]
        if not axes:
            continue
        kept = value[tuple(slice(0, 1) if a in axes else slice(None)
                           for a in range(value.ndim))].copy()
        shape = f"{name}.shape"
        while shape in initializers:
            shape += "_"
        del initializers[name]
        folded.pop(name, None)
        initializers[source] = kept
        initializers[shape] = np.array(value.shape, np.int64)
        marks[source] = "PARAMETER"
        nodes.insert(0, Node("Expand", [source, shape], [name], f"expand/{name}"))
        guess = " (its values are all equal: the batch axis is taken as broadcast)" \
            if uniform else ""
        notes.append(f"restored {name} = Expand({source}, {list(value.shape)}), which the "
                     f"exporter's optimizer had folded: {source} {list(kept.shape)} trains "
                     f"as one parameter, as in PyTorch{guess}")
    return notes


def _restore_biases(nodes: list[Node], initializers: dict[str, np.ndarray],
                    marks: dict[str, str], signature: set[str]) -> list[str]:
    """Zero biases the exporter's optimizer removed (``x + 0`` is ``x``: a zero-initialized
    Linear or Conv bias, as nn.MultiheadAttention's out_proj has) put back as zeros, when the
    signature names the bias and the Gemm / Conv reading its module's weight has no bias
    input: PyTorch trains them. Returns the names restored."""
    restored = []
    for name in sorted(p for p in signature if p.endswith(".bias") and p not in initializers):
        weight = name[: -len("bias")] + "weight"
        w = initializers.get(weight)
        if w is None:
            continue
        for node in nodes:
            if node.op_type not in ("Gemm", "Conv") or node.inputs[1:2] != [weight] or \
                    (len(node.inputs) > 2 and node.inputs[2]):
                continue
            if node.op_type == "Conv":
                size = w.shape[0]
            else:
                size = w.shape[0] if node.attrs.get("transB", 0) else w.shape[-1]
            if name not in initializers:
                initializers[name] = np.zeros(size, w.dtype)
                marks[name] = "PARAMETER"
                restored.append(name)
            node.inputs[2:] = [name]
    return restored


# How a note that the file cannot train as its source model did begins: ``from_onnx`` refuses
# such a file (one line, with the remedy) unless the caller passes ``as_exported=True``; then
# the note begins with AS_EXPORTED instead, and says what trains.
CANNOT_TRAIN = "cannot train as its source did"
AS_EXPORTED = "trains as exported (as_exported=True), not as its source did"
REEXPORT = ("re-export with torch.onnx.export(..., optimize=False) (a dynamic batch with "
            "dynamic_shapes=...) or dynamo=False")


def _notes(g: onnx.GraphProto, nodes: list[Node], initializers: dict[str, np.ndarray],
           signature: set[str], buffers: set[str], mutated: set[str], unmerged: list[str],
           has_scopes: bool, folded: dict[str, list[str]], read: set[str] | None) -> list[str]:
    """One line per way this file cannot train as the PyTorch model it was exported from;
    ``read``: the parameters the exporter's fx records say some node read (None: no records)."""
    notes = []
    running = sorted(b for b in buffers if b.endswith("running_mean"))
    has_bn = any(n.op_type == "BatchNormalization" for n in nodes)
    if running and not has_bn and not any(b in initializers for b in running):
        layers = [b.rsplit(".", 1)[0] for b in running]
        shown = ", ".join(layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3
                                          else "")
        if any(b.endswith(("running_mean", "running_var")) for b in mutated):
            notes.append(
                f"{CANNOT_TRAIN}: the model was exported in train mode (its "
                f"BatchNorm updates running statistics) but the exporter's optimizer folded "
                f"BatchNorm {shown} with its running statistics into the convolutions, so it "
                f"trains without batch statistics; {REEXPORT}")
        else:
            # Eval mode: W' = W·γ/σ and b' = β - μ·γ/σ. Training W' and b' is not training W,
            # γ and β (another parametrisation: other gradients, other steps), and a zero b'
            # (a fresh BatchNorm) is not even in the file. No folding is exact to undo.
            notes.append(
                f"{CANNOT_TRAIN}: the exporter's optimizer folded BatchNorm {shown} "
                f"into the convolutions (weights scaled by γ/σ, biases β - μγ/σ folded or "
                f"dropped), so the convolutions' weights and BatchNorm's weight and bias "
                f"cannot train apart as in PyTorch; {REEXPORT}")
    notes += _gathered_notes(initializers, signature, folded)
    sources = {s for names in folded.values() for s in names}
    # (a parameter no node read, by the exporter's fx records, is a tied one's other name)
    lost = sorted(p for p in signature if p not in initializers and p not in sources
                  and (read is None or p in read))
    if lost and not notes:
        hint = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
        scopes = "" if has_scopes else " (the node metadata that would tell them apart is gone)"
        notes.append(f"the exporter's optimizer merged parameters {hint} into others equal at "
                     f"export{scopes}: they train as one, unlike in PyTorch; re-export with "
                     f"optimize=False")
    if unmerged:
        notes.append(f"kept apart {len(unmerged)} parameters the exporter's optimizer had merged "
                     f"because they were equal at export ({', '.join(unmerged[:4])}"
                     f"{', ...' if len(unmerged) > 4 else ''}): equal is not tied")
    return notes


# fx nodes (the exporter's records name them) that read rows of a table by index
GATHERS = frozenset({"embedding", "index", "gather", "take"})


def _gathered_notes(initializers: dict[str, np.ndarray], signature: set[str],
                    folded: dict[str, list[str]]) -> list[str]:
    """A parameter the exporter's optimizer gathered with repeated indices into a new
    initializer (T5's relative position bias: ``Gather(table, buckets)`` of a fixed sequence,
    many (query, key) pairs reading one bucket's row) cannot train as its source: PyTorch
    trains the table, each row's gradient summed over the pairs that read it; the file holds
    only the gathered copies, which would train apart. Told by the values: an initializer
    folded from one parameter whose values repeat (more than one distinct value, fewer than
    its size), where a transpose or a gather of distinct rows (a position embedding by
    ``arange``) repeats none. Two signs, both needed: the fold went through a gather (its
    record names an fx ``embedding``/``index``/``gather`` node; a transpose's names none) and
    the values repeat a lot (at most half distinct, more than one: random float32 weights
    collide by chance, a few in 10^5, and a zero-initialized table says nothing). The table
    itself is not in the file: nothing to restore."""
    notes = []
    for name, names in sorted(folded.items()):
        params = [s for s in names if s in signature and s not in initializers]
        value = initializers[name]
        if len(params) != 1 or value.size < 2 or not np.issubdtype(value.dtype, np.floating):
            continue
        if not any(s.split("_")[0] in GATHERS for s in names if s not in signature):
            continue
        distinct = np.unique(value).size
        if 1 < distinct <= value.size // 2:
            notes.append(
                f"{CANNOT_TRAIN}: the exporter's optimizer gathered parameter {params[0]} "
                f"with repeated indices into {name} {list(value.shape)} ({distinct} distinct "
                f"values in {value.size}; e.g. a relative position bias of a fixed sequence), "
                f"so its copies would train apart, not as the one table PyTorch trains; "
                f"{REEXPORT}")
    return notes


class ONNXLoadError(GraphError):
    """An ONNX file or model that cannot be read into a graph; ``problems`` lists every node
    that cannot be run, one line each (empty for other errors)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


# -- tensors ------------------------------------------------------------------------------
def _compute_dtype(array: np.ndarray) -> np.ndarray:
    """Parameters in a type numpy computes in: narrow floats -> float32, int4 -> int8."""
    dtype = array.dtype
    if dtype == np.float16 or (dtype.kind == "V" and "float" in dtype.name):
        return array.astype(np.float32)
    if dtype.kind == "V" and "int" in dtype.name:
        return array.astype(np.uint8 if dtype.name.startswith("u") else np.int8)
    return array


def _tensor_array(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    try:
        return numpy_helper.to_array(tensor).copy()
    except Exception as err:
        dtype = onnx.TensorProto.DataType.Name(tensor.data_type) \
            if tensor.data_type in onnx.TensorProto.DataType.values() else tensor.data_type
        raise ONNXLoadError(f"{what} (type {dtype}, dims {list(tensor.dims)}): its data cannot be "
                            f"read ({err})") from err


def _np_dtype(elem_type: int) -> np.dtype | None:
    if elem_type == onnx.TensorProto.UNDEFINED:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    """A ValueInfoProto as a TensorInfo; non-tensor or untyped values have dtype None."""
    if not value.type.HasField("tensor_type"):
        return TensorInfo(value.name, None, None)
    tensor = value.type.tensor_type
    shape: tuple[Dim, ...] | None = None
    if tensor.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor.shape.dim
        )
    return TensorInfo(value.name, _np_dtype(tensor.elem_type), shape)


# -- files --------------------------------------------------------------------------------
def _all_tensors(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """Every TensorProto in a graph (initializers, tensor attributes, subgraphs), described."""
    for t in graph.initializer:
        yield f"initializer {t.name!r}", t
    for node in graph.node:
        for attr in node.attribute:
            where = f"attribute {attr.name!r} of node {node.name!r} ({node.op_type})"
            if attr.HasField("t"):
                yield where, attr.t
            yield from ((where, t) for t in attr.tensors)
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)


def _load_external(model: onnx.ModelProto, base_dir: Path, origin: str) -> None:
    """Fill tensors whose data lives in external files; a missing file is named."""
    external = [(w, t) for w, t in _all_tensors(model.graph)
                if external_data_helper.uses_external_data(t)]
    for where, tensor in external:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location")
        if not location:
            raise ONNXLoadError(f"{origin}: {where} says its data is external but names no file")
        if not (base_dir / location).is_file():
            raise ONNXLoadError(f"{origin}: {where} keeps its data in external file "
                                f"{base_dir / location}, which does not exist")
    if external:
        try:
            external_data_helper.load_external_data_for_model(model, str(base_dir))
        except Exception as err:
            raise ONNXLoadError(f"{origin}: cannot read external tensor data from {base_dir} "
                                f"({type(err).__name__}: {err})") from err


def read_model(source: Source, base_dir: str | os.PathLike | None = None) -> onnx.ModelProto:
    """Parse a model file, bytes, or pass a ModelProto through, with external data loaded from
    ``base_dir`` (default: the file's folder). Bad files give one ONNXLoadError naming them."""
    if isinstance(source, onnx.ModelProto):
        model, origin = source, f"model {source.graph.name or '(unnamed)'!r}"
        base = Path(base_dir) if base_dir is not None else None
    elif isinstance(source, bytes):
        origin, base = "model bytes", Path(base_dir) if base_dir is not None else None
        model = _parse(source, origin)
    else:
        path = Path(source)
        origin, base = str(path), Path(base_dir) if base_dir is not None else path.parent
        if not path.is_file():
            raise ONNXLoadError(f"{path}: no such ONNX file")
        model = _parse(path.read_bytes(), origin)
    if not model.HasField("graph"):
        raise ONNXLoadError(f"{origin}: not an ONNX model (it has no graph)")
    external = any(external_data_helper.uses_external_data(t) for _, t in _all_tensors(model.graph))
    if external:
        if base is None:
            raise ONNXLoadError(f"{origin}: tensors keep their data in external files; pass "
                                f"base_dir= (the folder holding them)")
        _load_external(model, base, origin)
    return model


def _parse(data: bytes, origin: str) -> onnx.ModelProto:
    if not data:
        raise ONNXLoadError(f"{origin}: empty file, not an ONNX model")
    try:
        return onnx.load_model_from_string(data)
    except Exception as err:  # protobuf raises DecodeError and friends
        raise ONNXLoadError(f"{origin}: not a readable ONNX model, truncated or not protobuf "
                            f"({type(err).__name__}: {err})") from err


# -- conversion ---------------------------------------------------------------------------
def _attr_value(attr: onnx.AttributeProto, opset: dict[str, int], scope: frozenset[str],
                where: str) -> Any:
    kind = onnx.AttributeProto
    if attr.type == kind.GRAPH:
        return _graph(attr.g, opset, scope, f"{where} attribute {attr.name!r}")
    if attr.type == kind.GRAPHS:
        return [_graph(g, opset, scope, f"{where} attribute {attr.name!r}") for g in attr.graphs]
    if attr.type == kind.TENSOR:
        return _tensor_array(attr.t, f"{where} attribute {attr.name!r}")
    if attr.type == kind.TENSORS:
        return [_tensor_array(t, f"{where} attribute {attr.name!r}") for t in attr.tensors]
    try:
        value = helper.get_attribute_value(attr)
    except Exception as err:
        raise ONNXLoadError(f"{where}: attribute {attr.name!r} cannot be read ({err})") from err
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8") for v in value]
    return value


def _graph(g: onnx.GraphProto, opset: dict[str, int], outer: frozenset[str] = frozenset(),
           where: str = "") -> Graph:
    if g.sparse_initializer:
        raise ONNXLoadError(f"{where}graph {g.name!r}: sparse initializers are not supported "
                            f"({[t.values.name for t in g.sparse_initializer][:5]})")
    initializers = {}
    for t in g.initializer:
        if not t.name:
            raise ONNXLoadError(f"{where}graph {g.name!r}: an initializer has no name")
        initializers[t.name] = _compute_dtype(_tensor_array(t, f"initializer {t.name!r}"))
    # Names a subgraph may read from outside: everything this graph defines, and its own outer.
    scope = outer | {v.name for v in g.input} | set(initializers) | \
        {o for n in g.node for o in n.output if o}
    nodes = []
    for i, n in enumerate(g.node):
        label = f"node {n.name or f'{n.op_type}_{i}'!r} ({n.op_type})"
        attrs = {a.name: _attr_value(a, opset, scope, label) for a in n.attribute}
        nodes.append(Node(n.op_type, list(n.input), list(n.output), n.name,
                          canonical_domain(n.domain), attrs))
    inputs = [tensor_info(v) for v in g.input]
    outputs = [tensor_info(v) for v in g.output]
    value_info = {v.name: tensor_info(v) for v in g.value_info}
    annotated = [*g.value_info, *g.input]
    marks = {v.name: p.value for v in annotated for p in v.metadata_props
             if p.key == EXPORTER_KIND}
    signature, buffers, mutated, placeholders = _signature(g)
    scopes = [next((_literal_list(p.value) for p in n.metadata_props if p.key == SCOPES), [])
              for n in g.node]
    folded = {v.name: _literal_list(p.value) for v in annotated for p in v.metadata_props
              if p.key == FOLDED_FROM}
    unmerged: list[str] = []
    expanded: list[str] = []
    reads: list[set[str] | None] = []
    if signature:
        reads = [_fx_reads(n, placeholders) for n in g.node]
        unmerged = _unmerge(nodes, scopes, reads, initializers, marks, signature, folded)
        fed = [t.shape[0] for t in inputs if t.name not in initializers and t.shape
               and isinstance(t.shape[0], int)]
        expanded = _restore_expands(nodes, initializers, marks, signature, folded,
                                    fed[0] if fed else None)
    restored = _restore_biases(nodes, initializers, marks, signature)
    graph = Graph(nodes, inputs, outputs, initializers, opset, g.name or "graph", value_info,
                  outer_scope=outer)
    graph.exporter_marks = {k: v for k, v in marks.items() if k in initializers}
    graph.signature_parameters = signature
    graph.folded_from = {k: v for k, v in folded.items() if k in initializers}
    if signature:
        graph.notes += _notes(g, nodes, initializers, signature, buffers, mutated, unmerged,
                              any(scopes), graph.folded_from,
                              set().union(*(r for r in reads if r)) if any(reads) else None)
    graph.notes += expanded
    if restored:
        graph.notes.append(f"restored {len(restored)} zero biases the exporter's optimizer had "
                           f"removed ({', '.join(restored[:4])}"
                           f"{', ...' if len(restored) > 4 else ''}): PyTorch trains them")
    return graph


def from_onnx(source: Source, base_dir: str | os.PathLike | None = None,
              check_operators: bool = True, trainable: Iterable[str] = (),
              frozen: Iterable[str] = (), untie: bool = False,
              as_exported: bool = False) -> Graph:
    """Build a ``Graph`` from an ONNX ModelProto, serialized bytes or file path.

    Every node is resolved against the operator registry here, so an unknown op, an opset an
    op does not support, or an unknown attribute fails now, naming the node (pass
    ``check_operators=False`` to inspect such a model anyway).

    Initializers are classified as parameters, state and constants (``meta.lv1.roles``);
    ``trainable`` (train only the initializers matching these shell-style patterns) and
    ``frozen`` (do not train these) override that, as ORT-training's ``requires_grad`` and
    ``frozen_params`` do; a pattern matching nothing is an error. Initializers an exporter
    wrote twice from one tied parameter train as one (``meta.lv1.ties``) unless ``untie=True``.
    What the loader did to train the file as its source model trained (parameters merged or
    broadcast by the exporter's optimizer made apart again, ties) is in ``graph.notes`` and
    given as a warning, one line each.

    A file that cannot train as its source did (BatchNorm folded into the convolutions by the
    exporter's optimizer, from train or eval mode) is refused with one line naming the layers
    and the remedy, unless ``as_exported=True``: then it trains as the file is (the folded
    weights), with a warning. ``check_operators=False`` (inspection) refuses nothing.

    >>> from meta.lv1 import mlp
    >>> from_onnx(to_onnx(mlp(hidden=[4]))).nodes[0].op_type
    'Flatten'
    """
    model = read_model(source, base_dir)
    origin = str(source) if isinstance(source, (str, os.PathLike)) else \
        f"model {model.graph.name or '(unnamed)'!r}"
    opset: dict[str, int] = {}
    for o in model.opset_import:
        opset[canonical_domain(o.domain)] = o.version
    if not model.opset_import:
        raise ONNXLoadError(f"{origin}: the model imports no opset")
    newest = onnx.defs.onnx_opset_version()
    if "" in opset and not MIN_OPSET <= opset[""] <= newest:
        raise ONNXLoadError(f"{origin}: default-domain opset {opset['']} is not supported "
                            f"(opsets {MIN_OPSET} to {newest})")
    if not model.graph.output:
        raise ONNXLoadError(f"{origin}: graph {model.graph.name!r} has no outputs")
    try:
        graph = _graph(model.graph, opset)
    except GraphError as err:
        raise ONNXLoadError(f"{origin}: {err}") from err
    if check_operators:
        problems = operator_problems(graph)
        if len(problems) == 1:
            raise ONNXLoadError(f"{origin}: {problems[0]}", problems)
        if problems:
            raise ONNXLoadError(f"{origin}: {len(problems)} nodes cannot be run:\n  - "
                                + "\n  - ".join(problems), problems)
    if not untie:
        found = tie(graph)
        if found:
            graph.notes.append(tie_note(found))
    refused = [n for n in graph.notes if n.startswith(CANNOT_TRAIN)]
    if refused and check_operators and not as_exported:
        raise ONNXLoadError(f"{origin}: {refused[0]}; or load it with as_exported=True (recipe: "
                            f"the onnx model's as_exported option) to train the file as it is")
    if as_exported:
        graph.notes = [AS_EXPORTED + n[len(CANNOT_TRAIN):] if n.startswith(CANNOT_TRAIN) else n
                       for n in graph.notes]
    try:
        graph.select(trainable, frozen)
    except KeyError as err:
        raise ONNXLoadError(f"{origin}: {err.args[0]}") from err
    for note in graph.notes:
        warnings.warn(f"{origin}: {note}", UserWarning, stacklevel=2)
    return graph


def operator_problems(graph: Graph, where: str = "") -> list[str]:
    """Every node (subgraphs too) that cannot be resolved to an operator, one line each:
    the node, its op, domain and opset, and why (unknown op, opset, attribute)."""
    problems = []
    for node in graph.nodes:
        try:
            make_operator(node, graph.opset)
        except GraphError as err:
            problems.append(f"{where}{err}")
        for sub in node.subgraphs():
            problems += operator_problems(sub, f"{where}{node.describe()}, subgraph "
                                               f"{sub.name!r}: ")
    return problems


# -- export -------------------------------------------------------------------------------
def _value_info(info: TensorInfo) -> onnx.ValueInfoProto:
    elem = onnx.TensorProto.UNDEFINED if info.dtype is None else \
        helper.np_dtype_to_tensor_dtype(info.dtype)
    return helper.make_tensor_value_info(info.name, elem, None if info.shape is None
                                         else list(info.shape))


def _export_attr(value: Any) -> Any:
    if isinstance(value, Graph):
        return _graph_proto(value, value.nodes, value.inputs, value.outputs)
    if isinstance(value, list) and value and isinstance(value[0], Graph):
        return [_export_attr(v) for v in value]
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(value)
    return value


def _graph_proto(graph: Graph, nodes: list[Node], inputs: list[TensorInfo],
                 outputs: list[TensorInfo]) -> onnx.GraphProto:
    used = {x for n in nodes for x in n.dependencies()} | {t.name for t in outputs}
    # A tie is written back as the file had it: both initializers, the derived one re-made.
    ties = {node: (derived, kept, kind) for derived, (kept, kind, node) in graph.ties.items()
            if derived in used}
    tied = {derived: np.asarray(graph.initializers[kept]) if kind == "equal"
            else np.ascontiguousarray(np.asarray(graph.initializers[kept]).T)
            for derived, kept, kind in ties.values()}
    nodes = [n for n in nodes if n.name not in ties]
    onnx_nodes = [
        helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name, domain=n.domain or None,
                         **{k: _export_attr(v) for k, v in n.attrs.items() if v is not None})
        for n in nodes
    ]
    value_info = [_value_info(t) for t in graph.value_info.values()
                  if t.name in used and t.dtype is not None]
    return helper.make_graph(
        onnx_nodes, graph.name, [_value_info(t) for t in inputs],
        [_value_info(t) for t in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in graph.initializers.items()
         if k in used] + [numpy_helper.from_array(v, k) for k, v in tied.items()],
        value_info=value_info,
    )


def inference_nodes(graph: Graph, nodes: list[Node], keep: Iterable[str]) -> list[Node]:
    """``nodes`` as written for inference: each op's ``inference_form`` (BatchNormalization
    without ``training_mode`` and its running outputs, Dropout without its ``training_mode``
    input), unless a dropped output is read by another node or is in ``keep``."""
    read = {x for n in nodes for x in n.dependencies()} | set(keep)
    out = []
    for node in nodes:
        try:
            cls = type(make_operator(node, graph.opset))
        except GraphError:
            out.append(node)
            continue
        attrs, inputs, outputs = cls.inference_form(dict(node.attrs), list(node.inputs),
                                                    list(node.outputs))
        if any(o and o in read for o in node.outputs[len(outputs):]):
            out.append(node)
        else:
            out.append(Node(node.op_type, inputs, outputs, node.name, node.domain, attrs))
    return out


def model_proto(graph: Graph, outputs: Iterable[str] | None = None,
                training: bool = True) -> onnx.ModelProto:
    """The graph (pruned to ``outputs`` if given) as an ONNX ModelProto, unchecked; with
    ``training=False`` written for inference (``inference_nodes``)."""
    wanted = [t for t in graph.outputs if outputs is None or t.name in set(outputs)]
    if outputs is not None and len(wanted) != len(set(outputs)):
        missing = set(outputs) - {t.name for t in wanted}
        raise GraphError(f"to_onnx: {sorted(missing)} are not outputs of graph {graph.name!r}")
    nodes = graph.nodes_for(t.name for t in wanted)
    if not training:
        nodes = inference_nodes(graph, nodes, (t.name for t in wanted))
    used = {x for n in nodes for x in n.dependencies()} | {t.name for t in wanted}
    inputs = [t for t in graph.inputs if t.name in used]
    proto = _graph_proto(graph, nodes, inputs, wanted)
    opsets = [helper.make_opsetid(d, v) for d, v in graph.opset.items()]
    return helper.make_model(proto, opset_imports=opsets, producer_name="meta")


def to_onnx(graph: Graph, outputs: Iterable[str] | None = None,
            training: bool = False) -> onnx.ModelProto:
    """The graph (pruned to ``outputs`` if given) as a checked ONNX ModelProto, written for
    inference (BatchNormalization with its trained statistics, no dropout: what onnxruntime
    or a deployment expects) unless ``training=True`` keeps every node as it is."""
    model = model_proto(graph, outputs, training)
    onnx.checker.check_model(model, full_check=True)
    return model


def save_onnx(graph: Graph, path: str | os.PathLike, outputs: Iterable[str] | None = None,
              training: bool = False) -> Path:
    """Write the graph to an ONNX file that ``onnx.checker`` accepts (for inference unless
    ``training=True``, as ``to_onnx``); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = to_onnx(graph, outputs, training)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, path)  # never leave a half-written model behind
    return path


# -- shapes -------------------------------------------------------------------------------
def shape_inference(graph: Graph) -> dict[str, tuple[np.dtype | None, tuple[Dim, ...] | None]]:
    """Tensor name -> (dtype, shape) for every tensor ONNX shape inference can type.

    Runs ``onnx.shape_inference`` on the exported model (with our ``value_info``), so it
    knows what ONNX knows: a custom-domain op's outputs stay unknown unless ``value_info``
    says. Initializers report their actual arrays.
    """
    model = model_proto(graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as err:  # onnx raises InferenceError and friends
        raise GraphError(f"graph {graph.name!r}: shape inference failed: {err}") from err
    g = inferred.graph
    found: dict[str, tuple[np.dtype | None, tuple[Dim, ...] | None]] = {}
    for info in graph.value_info.values():
        found[info.name] = (info.dtype, info.shape)
    for value in [*g.input, *g.value_info, *g.output]:
        info = tensor_info(value)
        known = found.get(info.name)
        if info.dtype is None and known is not None:
            continue
        found[info.name] = (info.dtype, info.shape if info.shape is not None
                            else (known[1] if known else None))
    for name, value in graph.initializers.items():
        found[name] = (value.dtype, tuple(value.shape))
    return found
