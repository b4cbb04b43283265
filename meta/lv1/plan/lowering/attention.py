"""Attention as one planned node: ``softmax(A . B * scale + mask) . V``, as exporters and
meta's GPT builder write it (MatMul, Mul or Div by constants, Add of a constant mask, Softmax
over the last axis, MatMul), computed a few heads at a time so that the (T, T) scores never
exist for the whole batch.

Unfused, a training step keeps the softmax's output for every head until the backward (its
gradient needs it) and the forward holds two copies of the scores at once (each node's input
and output); at sequence 256 that is 16 MiB a layer for the GPT benchmark (batch 16, 4
heads), more than everything else a layer keeps. Fused, the scores of ``chunk`` heads live in
one scratch buffer: the forward writes them there (then scale, mask and softmax in one pass
in place) and multiplies them by V; the backward computes them again from A and B (one more
product per chunk, as FlashAttention does) and keeps nothing across the step. C++ side: the
matmul steps of cpp/plan/ on chunks (views) of the plan's arrays, and cpp/plan/attention.cpp's
softmax and its backward, which fold in the scale and the mask (two passes over the scores
fewer than oneDNN's softmax) and, under a causal mask (-inf, or at most ``CAUSAL_BELOW``,
above the diagonal), touch only the keys each query sees: the probabilities past the diagonal
are exactly 0 (exp underflows), written as such without an exp. The products that read the
probabilities or their gradient (P . V, P^T . dY, A^T . dS) then go by blocks of ``BLOCK``
query rows, each against the keys up to its last row (strided views, no copies): about 5/8 of
their work at 4 blocks. The products that make scores (A . B, dY . V^T, and dS . B^T) stay
whole: oneDNN's fast batched kernel takes only dense batches, and its fallback for strided
ones lost more than the blocks saved there (measured, 1 thread, batch 16 x 4 heads, T 128).
"""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context
from meta.lv1.plan.memory import Value

SCRATCH_BYTES = 1 << 21  # scores of this many bytes at most per chunk of heads
ENABLED = True  # False: the chain lowers node by node (to measure what the fusion saves)
CAUSAL_BELOW = -1e9  # a mask at most this strictly above its diagonal is causal
BLOCK = 32  # causal: P . V, P^T . dY and A^T . dS by query blocks of this many rows


def _scalar(ctx: Context, name: str) -> float | None:
    value = ctx.constant(name)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(()))


def _chain(ctx: Context, node: Node) -> tuple[list[Node], float, np.ndarray | None, Node] | None:
    """From the scores' MatMul ``node``: the nodes up to and including the second MatMul
    (every value between them read once and by nothing else), the scale, the mask (T, T) or
    None, and the second MatMul; None when the graph does not have that shape."""
    sa, sb = ctx.shape(node.inputs[0]), ctx.shape(node.inputs[1])
    if len(sa) < 3 or sa[:-2] != sb[:-2]:
        return None
    t_q, t_k = sa[-2], sb[-1]
    chain: list[Node] = []
    scale, mask = 1.0, None
    out = node.outputs[0]
    while True:
        readers = ctx.consumers.get(out, [])
        if out in ctx.protected or len(readers) != 1 or readers[0].name in ctx.absorbed:
            return None
        nxt = readers[0]
        other = "" if len(nxt.inputs) != 2 else \
            nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
        if nxt.op_type in ("Mul", "Div") and mask is None and len(nxt.inputs) == 2:
            c = _scalar(ctx, other)
            if c is None or nxt.op_type == "Div" and (other == nxt.inputs[0] or c == 0):
                return None
            scale = scale * c if nxt.op_type == "Mul" else scale / c
        elif nxt.op_type == "Add" and mask is None and len(nxt.inputs) == 2:
            m = ctx.constant(other)
            if m is None or not ctx.float32(other) or m.ndim > 2 and \
                    any(d != 1 for d in m.shape[:-2]):
                return None
            try:
                mask = np.ascontiguousarray(np.broadcast_to(
                    m.reshape(m.shape[-2:] if m.ndim >= 2 else m.shape), (t_q, t_k)), F32)
            except ValueError:
                return None
        elif nxt.op_type == "Softmax":
            rank = len(ctx.shape(out))  # opset < 13 flattens at axis: the same when last
            if int(ctx.ops[nxt.name].axis) % rank != rank - 1:
                return None
            chain.append(nxt)
            p = nxt.outputs[0]
            readers = ctx.consumers.get(p, [])
            if p in ctx.protected or len(readers) != 1 or readers[0].op_type != "MatMul" \
                    or readers[0].inputs[0] != p or readers[0].inputs[1] == p:
                return None
            mix = readers[0]
            v = mix.inputs[1]
            sv = ctx.shape(v)
            if v not in ctx.pb.values or sv[:-2] != sa[:-2] or sv[-2] != t_k \
                    or len({node.inputs[0], node.inputs[1], v}) != 3 \
                    or not ctx.float32(v, mix.outputs[0]):
                return None  # V not lowered yet (made after the scores), or broadcast
            return chain + [mix], scale, mask, mix
        else:
            return None
        chain.append(nxt)
        out = nxt.outputs[0]
        if not ctx.float32(out):
            return None


def _causal(mask: np.ndarray | None) -> bool:
    """Whether a square ``mask`` hides every key after the query: softmax then gives those
    exactly 0 (exp(-1e9 + s) underflows), so the kernels skip them."""
    if mask is None or mask.shape[0] != mask.shape[1]:
        return False
    return bool(np.all(mask[np.triu_indices(mask.shape[0], 1)] <= CAUSAL_BELOW))


def attention(ctx: Context, node: Node) -> Lowered | None:
    """The scores' MatMul ``node`` and the chain after it as one chunked attention, or None
    (the nodes then lower one by one)."""
    pb = ctx.pb
    a, b = node.inputs
    if not ENABLED or not ctx.float32(a, b, node.outputs[0]):
        return None
    found = _chain(ctx, node)
    if found is None:
        return None
    chain, scale, mask, mix = found
    v, out = mix.inputs[1], mix.outputs[0]
    sa, sb, sv = ctx.shape(a), ctx.shape(b), ctx.shape(v)
    heads, t_q, d, t_k, dv = prod(sa[:-2]), sa[-2], sa[-1], sb[-1], sv[-1]
    chunk = max(1, min(heads, SCRATCH_BYTES // (t_q * t_k * 4)))
    for n in chain:
        ctx.absorb(node, n)
    a_in, b_in, v_in = (pb.require_layout(x, "plain") for x in (a, b, v))
    y = pb.output(out, (*sa[:-2], t_q, dv))
    causal = _causal(mask)
    mask_name = ""
    if mask is not None and not (causal and not np.tril(mask).any()):
        # causal: the kernel reads only the part on and below the diagonal; none when 0
        mask_name = pb.fresh(f"{node.name}.mask")
        pb.values[mask_name] = Value(mask_name, (t_q, t_k), F32, storage="owned", array=mask)
    scores = pb.output(pb.fresh(f"{node.name}.scores"), (chunk, t_q, t_k))
    spans = [(i, min(i + chunk, heads)) for i in range(0, heads, chunk)]
    # (first row, end row, keys) of each query block, the last first: it reaches every key,
    # so in the backward it writes (or adds to) all of dV and dB and the others add theirs
    blocks = [(r, min(r + BLOCK, t_q), min(r + BLOCK, t_q)) for r in range(0, t_q, BLOCK)
              ][::-1] if causal else [(0, t_q, t_k)]
    rt = pb.rt

    def rows(arr: np.ndarray, shape: tuple[int, int], i: int, j: int) -> np.ndarray:
        return arr.reshape(heads, *shape)[i:j]

    def probabilities(x, s, i: int, j: int) -> list:
        """Steps writing softmax(A . B * scale + mask) of heads i:j into ``s``."""
        c = j - i
        return [rt.matmul([c, t_q, d], [c, d, t_k], False, False, rows(x(a_in), (t_q, d), i, j),
                          rows(x(b_in), (d, t_k), i, j), None, s, "", 0.0, 0.0, False),
                rt.attention_softmax([c, t_q, t_k], scale, x(mask_name) if mask_name else None,
                                     causal, s, s)]

    def forward(x) -> list:
        steps = []
        for i, j in spans:
            s = x(scores)[:j - i]
            steps += probabilities(x, s, i, j)
            for r0, r1, k in blocks:
                steps.append(rt.matmul([j - i, r1 - r0, k], [j - i, k, dv], False, False,
                                       s[:, r0:r1, :k], rows(x(v_in), (t_k, dv), i, j)[:, :k],
                                       None, rows(x(y), (t_q, dv), i, j)[:, r0:r1], "", 0.0,
                                       0.0, False))
        return steps

    pb.step("attention", [a_in, b_in, v_in, mask_name, scores], [scores, y], forward)
    if not any(ctx.needs(x) for x in (a, b, v)):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        ps = pb.output(pb.fresh(f"{node.name}.probabilities"), (chunk, t_q, t_k))
        ds = pb.output(pb.fresh(f"{node.name}.dscores"), (chunk, t_q, t_k))
        targets = {x: pb.grad_target(x, can_accumulate=True) if ctx.needs(x) else None
                   for x in (a_in, b_in, v_in)}

        def build(x) -> list:
            steps = []
            for i, j in spans:
                c = j - i
                s, dsc = x(ps)[:c], x(ds)[:c]
                gy = rows(x(g), (t_q, dv), i, j)
                steps += probabilities(x, s, i, j)
                if targets[v_in] is not None:  # dV = P^T . dY
                    dest, add = targets[v_in]
                    for n, (r0, r1, k) in enumerate(blocks):
                        steps.append(rt.matmul([c, r1 - r0, k], [c, r1 - r0, dv], True, False,
                                               s[:, r0:r1, :k], gy[:, r0:r1], None,
                                               rows(x(dest), (t_k, dv), i, j)[:, :k], "", 0.0,
                                               0.0, add or n > 0))
                if targets[a_in] is None and targets[b_in] is None:
                    continue
                # dP = dY . V^T, then the softmax's backward times the scale, in place
                steps.append(rt.matmul([c, t_q, dv], [c, t_k, dv], False, True, gy,
                                       rows(x(v_in), (t_k, dv), i, j), None, dsc, "", 0.0, 0.0,
                                       False))
                steps.append(rt.attention_softmax_backward([c, t_q, t_k], scale, causal, s, dsc,
                                                           dsc))
                if targets[a_in] is not None:  # dA = dS . B^T
                    dest, add = targets[a_in]
                    steps.append(rt.matmul([c, t_q, t_k], [c, d, t_k], False, True, dsc,
                                           rows(x(b_in), (d, t_k), i, j), None,
                                           rows(x(dest), (t_q, d), i, j), "", 0.0, 0.0, add))
                if targets[b_in] is not None:  # dB = A^T . dS
                    dest, add = targets[b_in]
                    for n, (r0, r1, k) in enumerate(blocks):
                        steps.append(rt.matmul([c, r1 - r0, d], [c, r1 - r0, k], True, False,
                                               rows(x(a_in), (t_q, d), i, j)[:, r0:r1],
                                               dsc[:, r0:r1, :k], None,
                                               rows(x(dest), (d, t_k), i, j)[:, :, :k], "",
                                               0.0, 0.0, add or n > 0))
            return steps

        reads = [g, a_in, b_in, v_in, mask_name, ps, ds]
        writes = [ps, ds]
        for target in targets.values():
            if target is not None:
                reads += [target[0]] if target[1] else []
                writes.append(target[0])
        pb.step("attention backward", reads, writes, build, "backward")
    return Lowered(node, backward, "onednn")
