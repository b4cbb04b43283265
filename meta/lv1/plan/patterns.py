"""Rewrites of subgraphs that exporters spell out op by op into the one operator they compute,
so a single kernel runs them (onnxruntime's graph transformers do the same).

``gelu``: PyTorch's TorchScript exporter writes GELU as ``x * 0.5 * (1 + erf(x / sqrt 2))``
(Div, Erf, Add, Mul, Mul); Erf alone has no oneDNN kernel and numpy's took two thirds of a
transformer's training step. The five nodes become one Gelu (ONNX opset 20's, exact form).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from meta.lv0 import Operator, lookup
from meta.lv1.graph import Node


def _scalar(values: dict[str, np.ndarray], name: str, expected: float) -> bool:
    v = values.get(name)
    return v is not None and v.size == 1 and math.isclose(float(v.reshape(())), expected,
                                                          rel_tol=1e-5)


def _other(node: Node, name: str) -> str | None:
    """The input of a binary ``node`` that is not ``name`` (None if it reads it twice)."""
    a, b = node.inputs[:2]
    return b if a == name else a if b == name else None


def gelu(nodes: list[Node], static: dict[str, np.ndarray], protected: set[str],
         backends: Sequence[str]
         ) -> tuple[list[Node], dict[str, Operator], dict[str, str]]:
    """``nodes`` with every spelled-out exact GELU replaced by one Gelu node, the operators of
    the new nodes, and each replaced node's name -> its Gelu's."""
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for x in n.inputs:
            if x:
                readers.setdefault(x, []).append(n)

    def only(name: str, op_type: str) -> Node | None:
        r = readers.get(name, [])
        if len(r) != 1 or r[0].op_type != op_type or name in protected:
            return None
        return r[0]

    producers = {o: n for n in nodes for o in n.outputs if o}
    removed: set[str] = set()
    added: dict[str, Node] = {}  # the node replaced -> the Gelu standing in its place
    ops: dict[str, Operator] = {}
    merged: dict[str, str] = {}
    gelu_op = lookup("Gelu", 20, "", backends)
    for erf in (n for n in nodes if n.op_type == "Erf"):
        div = producers.get(erf.inputs[0])
        if div is None or div.op_type not in ("Div", "Mul") or erf.inputs[0] in protected \
                or len(readers.get(erf.inputs[0], [])) != 1:
            continue
        x = div.inputs[0]
        scale = math.sqrt(2) if div.op_type == "Div" else 1 / math.sqrt(2)
        if not _scalar(static, div.inputs[1], scale):
            continue
        add = only(erf.outputs[0], "Add")
        if add is None or not _scalar(static, _other(add, erf.outputs[0]) or "", 1.0):
            continue
        mul = only(add.outputs[0], "Mul")
        if mul is None:
            continue
        other = _other(mul, add.outputs[0])
        if other == x:  # (x * (1 + erf)) * 0.5
            last = only(mul.outputs[0], "Mul")
            if last is None or not _scalar(static, _other(last, mul.outputs[0]) or "", 0.5):
                continue
            group = [div, erf, add, mul, last]
        else:  # (x * 0.5) * (1 + erf)
            half = producers.get(other or "")
            if half is None or half.op_type != "Mul" or _other(half, x) is None \
                    or not _scalar(static, _other(half, x), 0.5) \
                    or len(readers.get(other, [])) != 1 or other in protected:
                continue
            last = mul
            group = [div, erf, add, half, mul]
        node = Node("Gelu", [x], [last.outputs[0]], f"{erf.name}/gelu")
        ops[node.name] = gelu_op(approximate="none")
        removed.update(n.name for n in group)
        merged.update((n.name, node.name) for n in group)
        added[last.name] = node
    if not added:
        return nodes, {}, {}
    out = []
    for n in nodes:
        if n.name in added:
            out.append(added[n.name])
        elif n.name not in removed:
            out.append(n)
    return out, ops, merged


# -- operators that opset 23 gives one node, spelled as the nodes the plan has kernels for ----
# RMSNormalization, RotaryEmbedding and Attention have no kernel of their own: each becomes the
# chain of nodes its ONNX function body computes (Mul, ReduceMean, Sqrt, ...; Slice, Gather,
# Concat; MatMul, Softmax), whose kernels (the fused pointwise groups, the reductions, the
# slices, the embedding's gather, the fused attention) then run it forward and backward. The
# original node's placement() says what its parts run as (``place``).
class Emitter:
    """The nodes standing for one node, named ``<node>/<op>_<i>``, with the shape and dtype
    of each tensor between them (the trace never saw them) and their constants (plan
    constants, as a folded node's outputs are)."""

    def __init__(self, node: Node, traced: dict, static: set[str], values: dict,
                 backends: Sequence[str]) -> None:
        self.prefix = node.name
        self.traced, self.static, self.values, self.backends = traced, static, values, backends
        self.nodes: list[Node] = []
        self.ops: dict[str, Operator] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.traced[name].shape)

    def dtype(self, name: str) -> np.dtype:
        return self.traced[name].dtype

    def const(self, hint: str, value) -> str:
        from meta.lv1.plan.memory import Value

        name = f"{self.prefix}/{hint}"
        array = np.array(value, order="C")
        self.traced[name] = array
        self.static.add(name)
        self.values[name] = Value(name, array.shape, array.dtype, storage="owned", array=array)
        return name

    def ints(self, hint: str, values) -> str:
        return self.const(hint, np.asarray(values, np.int64))

    def node(self, op_type: str, inputs: list[str], shape, dtype=None, since: int = 13,
             **attrs) -> str:
        from meta.lv1.plan.context import Traced

        i = len(self.nodes)
        out = f"{self.prefix}/{op_type.lower()}_{i}"
        node = Node(op_type, list(inputs), [out], f"{self.prefix}/{op_type}_{i}", attrs=attrs)
        self.ops[node.name] = lookup(op_type, since, "", self.backends)(**attrs)
        self.traced[out] = Traced(tuple(int(d) for d in shape),
                                  np.dtype(dtype or self.dtype(inputs[0])))
        self.nodes.append(node)
        return out

    def binary(self, op_type: str, a: str, b: str) -> str:
        return self.node(op_type, [a, b], np.broadcast_shapes(self.shape(a), self.shape(b)))

    def slice(self, x: str, axis: int, start: int, stop: int) -> str:
        shape = list(self.shape(x))
        axis %= len(shape)
        shape[axis] = stop - start
        tag = f"{len(self.nodes)}"
        return self.node("Slice", [x, self.ints(f"starts_{tag}", [start]),
                                   self.ints(f"ends_{tag}", [stop]),
                                   self.ints(f"axes_{tag}", [axis])], shape)

    def reshape(self, x: str, shape) -> str:
        return self.node("Reshape", [x, self.ints(f"shape_{len(self.nodes)}", shape)], shape)

    def unsqueeze(self, x: str, axis: int) -> str:
        shape = list(self.shape(x))
        shape.insert(axis % (len(shape) + 1), 1)
        return self.node("Unsqueeze", [x, self.ints(f"axes_{len(self.nodes)}", [axis])], shape)

    def concat(self, parts: list[str], axis: int) -> str:
        shape = list(self.shape(parts[0]))
        axis %= len(shape)
        shape[axis] = sum(self.shape(p)[axis] for p in parts)
        return self.node("Concat", parts, shape, axis=axis)

    def transpose(self, x: str, perm: list[int]) -> str:
        shape = self.shape(x)
        return self.node("Transpose", [x], [shape[p] for p in perm], perm=list(perm))

    def name_as(self, tensor: str, output: str) -> None:
        """``tensor`` is written to ``output`` (another output of the replaced node, which the
        trace saw): its node's output renamed, its readers so far re-pointed; a tensor no
        emitted node makes (an input passed through) is copied by an Identity (a view)."""
        maker = next((n for n in self.nodes if tensor in n.outputs), None)
        if maker is None:
            self.nodes.append(Node("Identity", [tensor], [output],
                                   f"{self.prefix}/Identity_{len(self.nodes)}"))
            self.ops[self.nodes[-1].name] = lookup("Identity", 13, "", self.backends)()
            return
        maker.outputs[maker.outputs.index(tensor)] = output
        for n in self.nodes:
            n.inputs[:] = [output if x == tensor else x for x in n.inputs]
        del self.traced[tensor]

    def finish(self, output: str) -> None:
        """The last node writes ``output`` (the replaced node's, which the trace saw)."""
        last = self.nodes[-1]
        del self.traced[last.outputs[0]]
        last.outputs[0] = output


def _rms_normalization(em: Emitter, node: Node, op) -> bool:
    x, scale = node.inputs[:2]
    if em.dtype(x) != np.float32 or em.dtype(scale) != np.float32:
        return False
    shape = em.shape(x)
    axis = int(op.axis) % len(shape)
    reduced = [*shape[:axis], *[1] * (len(shape) - axis)]
    square = em.node("Mul", [x, x], shape)
    mean = em.node("ReduceMean", [square], reduced, axes=list(range(axis, len(shape))),
                   keepdims=1)
    eps = em.const("epsilon", np.float32(op.epsilon))
    inv = em.node("Reciprocal", [em.node("Sqrt", [em.binary("Add", mean, eps)], reduced)],
                  reduced)
    em.binary("Mul", em.binary("Mul", x, inv), scale)
    em.finish(node.outputs[0])
    return True


def _rotary_embedding(em: Emitter, node: Node, op) -> bool:
    x, cos, sin = node.inputs[:3]
    ids = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
    if any(em.dtype(t) != np.float32 for t in (x, cos, sin)):
        return False
    shape = em.shape(x)
    if len(shape) == 3:
        if not op.num_heads:
            return False
        b, s, hidden = shape
        h = em.reshape(x, [b, s, int(op.num_heads), hidden // int(op.num_heads)])
        head_axis = 2  # (B, S, H, D): the caches broadcast over H
    elif len(shape) == 4:
        h, head_axis = x, 1  # (B, H, S, D)
    else:
        return False
    d = em.shape(h)[3]
    dim = int(op.rotary_embedding_dim) or d
    half = dim // 2
    if dim % 2 or dim > d:
        return False

    def cache(c: str) -> str:
        if ids is not None:
            if len(em.shape(c)) != 2:
                return ""
            c = em.node("Gather", [c, ids], [*em.shape(ids), em.shape(c)[1]], axis=0)
        if em.shape(c)[-1] != half or len(em.shape(c)) != 3:
            return ""
        c = em.unsqueeze(c, head_axis)
        return em.unsqueeze(c, 4) if op.interleaved else c
    cos4, sin4 = cache(cos), cache(sin)
    if not cos4 or not sin4:
        return False
    rot = em.slice(h, 3, 0, dim) if dim < d else h
    if op.interleaved:  # (..., dim) as (..., dim/2, 2): the pairs' halves along the last axis
        pairs = em.reshape(rot, [*em.shape(rot)[:3], half, 2])
        x1, x2 = em.slice(pairs, 4, 0, 1), em.slice(pairs, 4, 1, 2)
    else:
        x1, x2 = em.slice(rot, 3, 0, half), em.slice(rot, 3, half, dim)
    real = em.binary("Sub", em.binary("Mul", x1, cos4), em.binary("Mul", x2, sin4))
    imag = em.binary("Add", em.binary("Mul", x1, sin4), em.binary("Mul", x2, cos4))
    y = em.concat([real, imag], -1)
    if op.interleaved:
        y = em.reshape(y, [*em.shape(y)[:3], dim])
    if dim < d:
        y = em.concat([y, em.slice(h, 3, dim, d)], 3)
    if len(shape) == 3:
        y = em.reshape(y, list(shape))
    em.finish(node.outputs[0])
    return True


def _attention(em: Emitter, node: Node, op) -> bool:
    """ONNX Attention (opset 23) as MatMul, scale, mask, Softmax, MatMul (the chain the fused
    attention takes when its mask is a constant (T, T) one), grouped-query K and V expanded to
    the query heads (Unsqueeze, Expand along one axis, Reshape: the GQA kernel), 3-D inputs
    split into heads, past_key/past_value concatenated before K and V (present_key/value:
    those concatenations; causal then aligned to the bottom right), softcap as Tanh between
    the scale and the mask, the QK output the logits (modes 0, 1), the masked logits (2) or
    the weights (3). A mask that may hide a whole row of keys (fed, or constant with such a
    row) gets the operator's zeros there: rows with no key allowed are given 0 logits before
    the softmax and 0 weights after it (its gradient then 0, not NaN). Not taken (the
    operator's own code): nonpad_kv_seqlen and windows (opsets 24, 25), a softmax precision
    other than float32, a fed mask shorter than the keys, other dtypes."""
    q, k, v = node.inputs[:3]
    inputs = [*node.inputs, "", "", "", ""]
    mask = inputs[3] or None
    past_k, past_v = inputs[4], inputs[5]
    outputs = [*node.outputs, "", "", ""]
    if inputs[6] or bool(past_k) != bool(past_v) or float(op.softcap or 0) < 0 \
            or op.softmax_precision not in (None, 1) \
            or any(em.dtype(t) != np.float32 for t in (q, k, v)) \
            or mask is not None and em.dtype(mask) not in (np.float32, np.bool_) \
            or past_k and (em.dtype(past_k) != np.float32 or em.dtype(past_v) != np.float32):
        return False
    flat = len(em.shape(q)) == 3
    if len(em.shape(q)) not in (3, 4) or any(len(em.shape(t)) != len(em.shape(q))
                                             for t in (k, v)):
        return False
    if flat:
        if not op.q_num_heads or not op.kv_num_heads:
            return False

        def heads(x: str, n: int) -> str:
            b, length, hidden = em.shape(x)
            return em.transpose(em.reshape(x, [b, length, n, hidden // n]), [0, 2, 1, 3])
        q, k, v = heads(q, int(op.q_num_heads)), heads(k, int(op.kv_num_heads)), \
            heads(v, int(op.kv_num_heads))
    past = em.shape(past_k)[2] if past_k else 0
    if past_k:
        k, v = em.concat([past_k, k], 2), em.concat([past_v, v], 2)
    for given, made in ((outputs[1], k), (outputs[2], v)):  # present_key, present_value
        if given:
            em.name_as(made, given)
    k, v = outputs[1] or k, outputs[2] or v
    b, hq, q_len, e = em.shape(q)
    hk, kv_len = em.shape(k)[1], em.shape(k)[2]
    if hq % hk or em.shape(v)[1] != hk or em.shape(v)[2] != kv_len \
            or mask is not None and mask not in em.static and em.shape(mask)[-1] != kv_len:
        return False
    if hq != hk:  # grouped-query attention: each K/V head serves hq / hk query heads

        def repeat(x: str) -> str:
            shape = em.shape(x)
            wide = [shape[0], hk, hq // hk, *shape[2:]]
            grown = em.node("Expand", [em.unsqueeze(x, 2), em.ints(f"to_{len(em.nodes)}", wide)],
                            wide)
            return em.reshape(grown, [shape[0], hq, *shape[2:]])
        k, v = repeat(k), repeat(v)
    scale = float(op.scale) if op.scale is not None else 1 / np.sqrt(e)
    scores = em.node("MatMul", [q, em.transpose(k, [0, 1, 3, 2])], [b, hq, q_len, kv_len])
    scores = em.binary("Mul", scores, em.const("scale", np.float32(scale)))
    if float(op.softcap or 0) > 0:  # softcap * tanh(logits / softcap)
        cap = em.const("softcap", np.float32(op.softcap))
        scores = em.binary("Mul", em.node("Tanh", [em.binary("Div", scores, cap)],
                                          em.shape(scores)), cap)
    qk = {"logits": scores}
    constant = em.traced.get(mask) if mask is not None and mask in em.static else None
    if mask is None or constant is not None:
        from meta.ops.attention import _bias

        bias, _ = _bias(q_len, kv_len, np.dtype(np.float32), constant, bool(op.is_causal),
                        past, (-1, -1), None, b)
        if not np.isneginf(np.max(bias, axis=-1)).any():  # every query sees a key
            if mask is not None or op.is_causal:
                scores = em.binary("Add", scores, em.const("bias", bias.astype(np.float32)))
            qk["biased"] = scores
            qk["probs"] = em.node("Softmax", [scores], em.shape(scores), axis=-1)
            return _attention_end(em, node, op, qk, v, flat)
        if em.shape(mask)[-1] != kv_len:
            return False
    # the masks as additive biases, as the operator adds them (the masked logits' gradient,
    # through the QK output of mode 2, is the output's)
    ninf = em.const("ninf", np.float32(-np.inf))
    zero = em.const("zero_logit", np.float32(0))
    if em.dtype(mask) == np.bool_:
        allowed = mask
        mask = em.node("Where", [mask, zero, ninf], em.shape(mask), np.float32)
    else:
        allowed = em.node("Greater", [mask, ninf], em.shape(mask), np.bool_)
    scores = em.binary("Add", scores, mask)
    if op.is_causal:
        tril = np.tril(np.ones((q_len, kv_len), np.bool_), past)
        allowed = em.node("And", [allowed, em.const("causal", tril)],
                          np.broadcast_shapes(em.shape(allowed), (q_len, kv_len)), np.bool_)
        scores = em.binary("Add", scores, em.const(
            "causal_bias", np.where(tril, np.float32(0), np.float32(-np.inf))))
    qk["biased"] = scores
    count = em.node("Cast", [allowed], em.shape(allowed), np.float32, to=1)
    rows = [*em.shape(count)[:-1], 1]
    count = em.node("ReduceSum", [count, em.ints("last_axis", [-1])], rows, keepdims=1)
    valid = em.node("Greater", [count, zero], rows, np.bool_)
    scores = em.node("Where", [valid, scores, zero], em.shape(scores), np.float32)
    probs = em.node("Softmax", [scores], em.shape(scores), axis=-1)
    qk["probs"] = em.node("Where", [valid, probs, zero], em.shape(probs), np.float32)
    return _attention_end(em, node, op, qk, v, flat)


def _attention_end(em: Emitter, node: Node, op, qk: dict[str, str], v: str,
                   flat: bool) -> bool:
    """The QK output if asked for, then Y = probs . V (as (B, S, H*Dv) for 3-D inputs),
    written to the node's outputs."""
    probs = qk["probs"]
    if len(node.outputs) > 3 and node.outputs[3]:
        mode = int(op.qk_matmul_output_mode or 0)
        if mode not in (0, 1, 2, 3):
            return False
        em.name_as(qk[("logits", "logits", "biased", "probs")[mode]], node.outputs[3])
        probs = node.outputs[3] if mode == 3 else probs
    b, h, q_len, _ = em.shape(probs)
    y = em.node("MatMul", [probs, v], [b, h, q_len, em.shape(v)[3]])
    if flat:
        y = em.reshape(em.transpose(y, [0, 2, 1, 3]), [b, q_len, h * em.shape(v)[3]])
    em.finish(node.outputs[0])
    return True


DECOMPOSED = {"RMSNormalization": _rms_normalization, "RotaryEmbedding": _rotary_embedding,
              "Attention": _attention}


def decompose(nodes: list[Node], traced: dict, static: set[str], values: dict,
              backends: Sequence[str]
              ) -> tuple[list[Node], dict[str, Operator], dict[str, list[str]]]:
    """``nodes`` with each node of ``DECOMPOSED`` whose case its function takes replaced by
    the nodes it emits; their operators; each replaced node -> the names of its parts.
    ``traced``, ``static`` and ``values`` gain the new tensors and constants."""
    out: list[Node] = []
    made: dict[str, Operator] = {}
    parts: dict[str, list[str]] = {}
    for n in nodes:
        rule = DECOMPOSED.get(n.op_type)
        if rule is not None and len(n.outputs) >= 1 and n.outputs[0] \
                and (n.op_type == "Attention" or not any(n.outputs[1:])):
            em = Emitter(n, traced, static, values, backends)
            try:
                op = lookup(n.op_type, 23, "", backends)(**n.attrs)
            except TypeError:  # an attribute of a later opset (Attention's windows)
                out.append(n)
                continue
            if rule(em, n, op):
                out.extend(em.nodes)
                made.update(em.ops)
                parts[n.name] = [m.name for m in em.nodes]
                continue
        out.append(n)
    return out, made, parts


def place(placement: dict[str, str], parts: dict[str, list[str]]) -> None:
    """A decomposed node's placement: "python (...)" naming its parts that run as Python
    steps, or "decomposed: N nodes" (each part's own placement is under its name,
    ``<node>/<Op>_<i>``)."""
    for name, names in parts.items():
        where = [placement.get(p, "") for p in names]
        python = [p.split("/")[-1] for p, w in zip(names, where) if w.startswith("python")]
        placement[name] = f"python (its parts {', '.join(python)})" if python else \
            f"decomposed: {len(names)} nodes"
