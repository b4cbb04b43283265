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
from meta.lv1.plan.lowering.views import drop_transpose, transposed_source
from meta.lv1.plan.memory import Value
from meta.lv1.plan.precision import BF16, bf16_operands

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
        elif nxt.op_type == "Where" and mask is None and len(nxt.inputs) == 3 \
                and out in nxt.inputs[1:] and out not in (nxt.inputs[0], ):
            # masked_fill(cond, -inf) before the softmax: an additive mask of -inf and 0
            # (equal after the softmax, forward and backward: the masked scores' gradient
            # is 0 either way)
            m = _where_mask(ctx, nxt, out, t_q, t_k)
            if m is None:
                return None
            mask = m
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


def _where_mask(ctx: Context, node: Node, scores: str, t_q: int, t_k: int
                ) -> np.ndarray | None:
    """The additive (t_q, t_k) mask equal to ``Where(cond, scores, -inf)`` (or
    ``Where(cond, -inf, scores)``) with a constant condition, before a softmax; None for any
    other Where."""
    cond, a, b = node.inputs
    fill = b if a == scores else a
    c, f = ctx.constant(cond), ctx.constant(fill)
    if c is None or f is None or f.size != 1 or c.dtype != np.bool_ or a == b \
            or float(np.asarray(f).reshape(())) != -np.inf or not ctx.float32(fill):
        return None
    hidden = ~c if a == scores else c
    if hidden.ndim > 2 and any(d != 1 for d in hidden.shape[:-2]):
        return None
    try:
        hidden = np.broadcast_to(hidden.reshape(hidden.shape[-2:] if hidden.ndim >= 2
                                                else hidden.shape), (t_q, t_k))
    except ValueError:
        return None
    return np.where(hidden, np.float32(-np.inf), np.float32(0)).astype(F32)


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
    lead = sa[:-2]
    n_h = lead[-1] if lead else 1
    n_g = heads // n_h
    chunk = max(1, min(heads, SCRATCH_BYTES // (t_q * t_k * 4)))
    for n in chain:
        ctx.absorb(node, n)
    # K and V's split heads read through strides, their Transposes' steps dropped (their
    # backward then finds no gradient and adds nothing), and the merge of the heads after the
    # attention written through strides; Q keeps its copy: read through strides it cost the
    # products more than the copy (GPT benchmark, 1 thread), while for K, V and the output the
    # copies cost more (see views.transposed_source)
    sources = {a: None, b: transposed_source(ctx, b, [0, 2, 3, 1]),
               v: transposed_source(ctx, v, [0, 2, 1, 3])}
    for src in sorted((s for s in sources.values() if s), key=lambda s: -s[1]):
        drop_transpose(ctx, node, src)
    a_in, b_in, v_in = (sources[x][0] if sources[x] else pb.require_layout(x, "plain")
                        for x in (a, b, v))
    # what the products read for each (a bf16 plan: the one bf16 copy of each, which the
    # backward reads again: the float32 Q, K, V are then free after the forward)
    low = ctx.bf16  # every product in bf16 (float32 accumulation); the softmax float32
    reads = dict(zip((a_in, b_in, v_in), bf16_operands(ctx, "forward", a_in, b_in, v_in)))
    merge = ctx.single_consumer(out, ("Transpose",)) if len(sa) == 4 else None
    if merge is not None and (ctx.ops[merge.name].perm is None
                              or list(ctx.ops[merge.name].perm) != [0, 2, 1, 3]
                              or not ctx.float32(merge.outputs[0])):
        merge = None
    if merge is not None:
        ctx.absorb(node, merge)
        y = pb.output(merge.outputs[0], ctx.shape(merge.outputs[0]))
    else:
        y = pb.output(out, (*sa[:-2], t_q, dv))
    # how each array is laid out: its (G, H, rows, cols) view from the plan's array
    perms = {a_in: (0, 2, 1, 3) if sources[a] else None,
             b_in: (0, 2, 3, 1) if sources[b] else None,
             v_in: (0, 2, 1, 3) if sources[v] else None,
             y: (0, 2, 1, 3) if merge is not None else None}
    causal = _causal(mask)
    mask_name = ""
    if mask is not None and not (causal and not np.tril(mask).any()):
        # causal: the kernel reads only the part on and below the diagonal; none when 0
        mask_name = pb.fresh(f"{node.name}.mask")
        pb.values[mask_name] = Value(mask_name, (t_q, t_k), F32, storage="owned", array=mask)
    scores = pb.output(pb.fresh(f"{node.name}.scores"), (chunk, t_q, t_k))
    # a bf16 plan: the softmax (and its backward) also writes its output's bf16 copy, which
    # the products read (the softmax itself float32, as autocast's is)
    low16 = (lambda what: pb.output(pb.fresh(f"{node.name}.{what}@bf16"), (chunk, t_q, t_k),
                                    BF16)) if low else (lambda what: "")
    scores16 = low16("scores")
    # (first G, end G, first head, end head) of each chunk
    if chunk >= n_h:
        spans = [(g, min(g + chunk // n_h, n_g), 0, n_h) for g in range(0, n_g, chunk // n_h)]
    else:
        spans = [(g, g + 1, h, min(h + chunk, n_h)) for g in range(n_g)
                 for h in range(0, n_h, chunk)]
    # (first row, end row, keys) of each query block, the last first: it reaches every key,
    # so in the backward it writes (or adds to) all of dV and dB and the others add theirs
    blocks = [(r, min(r + BLOCK, t_q), min(r + BLOCK, t_q)) for r in range(0, t_q, BLOCK)
              ][::-1] if causal else [(0, t_q, t_k)]
    rt = pb.rt

    def view(arr: np.ndarray, like: str, shape: tuple[int, int], span) -> np.ndarray:
        """The (G, H, rows, cols) view of ``arr`` (laid out as ``like``), one chunk's heads."""
        g0, g1, h0, h1 = span
        perm = perms.get(like)
        full = arr.transpose(perm) if perm else arr.reshape(n_g, n_h, *shape)
        return full[g0:g1, h0:h1]

    def dims(span, *rest: int) -> list[int]:
        return [span[1] - span[0], span[3] - span[2], *rest]

    def flat(s, c: int) -> list:
        """``s`` as the kernels' (heads, queries, keys) argument, or no argument when None."""
        return [] if s is None else [s.reshape(c, t_q, t_k)]

    def probabilities(x, s, s16, span) -> list:
        """Steps writing softmax(A . B * scale + mask) of one chunk's heads into ``s`` (and
        its bf16 copy into ``s16``, unless None)."""
        c = (span[1] - span[0]) * (span[3] - span[2])
        return [rt.matmul(dims(span, t_q, d), dims(span, d, t_k), False, False,
                          view(x(reads[a_in]), a_in, (t_q, d), span),
                          view(x(reads[b_in]), b_in, (d, t_k), span), None, s, "", 0.0, 0.0,
                          False, low),
                rt.attention_softmax([c, t_q, t_k], scale, x(mask_name) if mask_name else None,
                                     causal, *flat(s, c), *flat(s, c), *flat(s16, c))]

    def scratch(x, name: str, span) -> np.ndarray | None:
        if not name:
            return None
        return x(name)[:(span[1] - span[0]) * (span[3] - span[2])].reshape(
            dims(span, t_q, t_k))

    def forward(x) -> list:
        steps = []
        for span in spans:
            s, s16 = scratch(x, scores, span), scratch(x, scores16, span)
            steps += probabilities(x, s, s16, span)
            p = s if s16 is None else s16
            vv = view(x(reads[v_in]), v_in, (t_k, dv), span)
            yy = view(x(y), y, (t_q, dv), span)
            for r0, r1, k in blocks:
                steps.append(rt.matmul(dims(span, r1 - r0, k), dims(span, k, dv), False, False,
                                       p[:, :, r0:r1, :k], vv[:, :, :k], None,
                                       yy[:, :, r0:r1], "", 0.0, 0.0, False, low))
        return steps

    pb.step("attention", [*reads.values(), mask_name, scores, scores16],
            [scores, scores16, y], forward)
    kind = "onednn bf16" if low else "onednn"
    if not any(ctx.needs(x) for x in (a, b, v)):
        return Lowered(node, None, kind)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        # both products reading dY read it in bf16 in a bf16 plan: one conversion step of the
        # plan (its copy in the arena, free after), not a conversion inside each product into
        # a staging buffer that would stay resident for the process
        (g,) = bf16_operands(ctx, "backward", g)
        perms[g] = perms[y]
        ps = pb.output(pb.fresh(f"{node.name}.probabilities"), (chunk, t_q, t_k))
        ds = pb.output(pb.fresh(f"{node.name}.dscores"), (chunk, t_q, t_k))
        # a bf16 plan: the probabilities' bf16 copy, which dV's products read, then the
        # scores' gradient's, which dA's and dB's read (one buffer: P's copy is read first)
        low16b = low16("backward")
        targets = {x: pb.grad_target(x_in, can_accumulate=True) if ctx.needs(x) else None
                   for x, x_in in ((a, a_in), (b, b_in), (v, v_in))}
        for x, x_in in ((a, a_in), (b, b_in), (v, v_in)):
            if targets[x] is not None:
                perms[targets[x][0]] = perms[x_in]

        def build(x) -> list:
            steps = []
            for span in spans:
                s, dsc = scratch(x, ps, span), scratch(x, ds, span)
                s16 = scratch(x, low16b, span)
                p = s if s16 is None else s16  # what the products read: P, then dS
                c = (span[1] - span[0]) * (span[3] - span[2])
                gy = view(x(g), g, (t_q, dv), span)
                qa = view(x(reads[a_in]), a_in, (t_q, d), span)
                kb = view(x(reads[b_in]), b_in, (d, t_k), span)
                vv = view(x(reads[v_in]), v_in, (t_k, dv), span)
                steps += probabilities(x, s, s16, span)
                if targets[v] is not None:  # dV = P^T . dY
                    dest, add = targets[v]
                    dvv = view(x(dest), dest, (t_k, dv), span)
                    for n, (r0, r1, k) in enumerate(blocks):
                        steps.append(rt.matmul(dims(span, r1 - r0, k), dims(span, r1 - r0, dv),
                                               True, False, p[:, :, r0:r1, :k], gy[:, :, r0:r1],
                                               None, dvv[:, :, :k], "", 0.0, 0.0,
                                               add or n > 0, low))
                if targets[a] is None and targets[b] is None:
                    continue
                # dP = dY . V^T, then the softmax's backward times the scale, in place
                steps.append(rt.matmul(dims(span, t_q, dv), dims(span, t_k, dv), False, True, gy,
                                       vv, None, dsc, "", 0.0, 0.0, False, low))
                steps.append(rt.attention_softmax_backward(
                    [c, t_q, t_k], scale, causal, s.reshape(c, t_q, t_k),
                    dsc.reshape(c, t_q, t_k), dsc.reshape(c, t_q, t_k), *flat(s16, c)))
                dsc = dsc if s16 is None else s16  # dS (its bf16 copy, over P's)
                if targets[a] is not None:  # dA = dS . B^T
                    dest, add = targets[a]
                    steps.append(rt.matmul(dims(span, t_q, t_k), dims(span, d, t_k), False, True,
                                           dsc, kb, None, view(x(dest), dest, (t_q, d), span),
                                           "", 0.0, 0.0, add, low))
                if targets[b] is not None and perms[targets[b][0]] is None:  # dB = A^T . dS
                    dest, add = targets[b]
                    db = view(x(dest), dest, (d, t_k), span)
                    for n, (r0, r1, k) in enumerate(blocks):
                        steps.append(rt.matmul(dims(span, r1 - r0, d), dims(span, r1 - r0, k),
                                               True, False, qa[:, :, r0:r1],
                                               dsc[:, :, r0:r1, :k], None, db[:, :, :, :k], "",
                                               0.0, 0.0, add or n > 0, low))
                elif targets[b] is not None:  # B is K^T read from K: dK = dS^T . A instead
                    dest, add = targets[b]  # (oneDNN has no fast kernel writing dB so)
                    g0, g1, h0, h1 = span
                    dk = x(dest).transpose(0, 2, 1, 3)[g0:g1, h0:h1]
                    for n, (r0, r1, k) in enumerate(blocks):
                        steps.append(rt.matmul(dims(span, r1 - r0, k), dims(span, r1 - r0, d),
                                               True, False, dsc[:, :, r0:r1, :k],
                                               qa[:, :, r0:r1], None, dk[:, :, :k], "",
                                               0.0, 0.0, add or n > 0, low))
            return steps

        inputs = [g, *reads.values(), mask_name, ps, ds, low16b]
        writes = [ps, ds, low16b]
        for target in targets.values():
            if target is not None:
                inputs += [target[0]] if target[1] else []
                writes.append(target[0])
        pb.step("attention backward", inputs, writes, build, "backward")
    return Lowered(node, backward, kind)
