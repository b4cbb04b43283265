"""Attention in the planned executor (``meta.lv1.plan.lowering.attention``): MatMul, scale,
mask, Softmax, MatMul lowered as one chunked node gives the reference executor's losses and
gradients (under a causal mask too, where it skips the keys after each query, at sequences
that are and are not a multiple of its query block), and a GPT training step then keeps no
(T, T) scores across the step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor, gpt
from meta.lv1.plan import runtime
from meta.lv1.plan.lowering import attention

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def close(ours, theirs, what, tol=2e-5):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    scale = max(1e-3, float(np.abs(theirs).max(initial=0)))
    err = float(np.abs(ours - theirs).max(initial=0))
    assert err <= tol * scale, f"{what}: max abs error {err:.3g} (scale {scale:.3g})"


def tokens(n, t, vocab, seed=0):
    rng = np.random.default_rng(seed)
    return {"input": rng.integers(0, vocab, (n, t)), "labels": rng.integers(0, vocab, (n, t))}


def fused(executor) -> list[str]:
    return [k for k, v in executor.placement().items() if v.startswith("fused into")
            and k.endswith(".mix")]


def planned_matches_reference(graph, t: int, rng: np.random.Generator, folded: str) -> None:
    """The exported attention ``graph`` (q (2, 3, t, 4), k transposed, v) on the planned
    executor: node ``folded`` fused into the scores' node, the output and the gradients of
    q, k and v those of the reference executor."""
    feeds = {"q": rng.standard_normal((2, 3, t, 4)).astype(np.float32),
             "k": rng.standard_normal((2, 3, 4, t)).astype(np.float32),
             "v": rng.standard_normal((2, 3, t, 4)).astype(np.float32)}
    wrt = ["q", "k", "v"]
    ref = ReferenceExecutor(graph).train().inference_and_backprop(feeds, outputs=["mix"],
                                                                  wrt=wrt)
    planned = PlannedExecutor(graph).train()
    ours = planned.inference_and_backprop(feeds, outputs=["mix"], wrt=wrt)
    assert planned.placement()[folded] == "fused into scores"
    close(ours[0]["mix"], ref[0]["mix"], "output")
    for name in wrt:
        close(ours[1][name], ref[1][name], f"d{name}")


@pytest.mark.parametrize("scratch", [attention.SCRATCH_BYTES, 16 * 16 * 4])
def test_gpt_gradients_match_the_reference(monkeypatch, scratch):
    """One chunk of all heads, and one head per chunk (the scratch holds one (T, T) block)."""
    monkeypatch.setattr(attention, "SCRATCH_BYTES", scratch)
    graph = gpt((16,), classes=11, layers=2, heads=2, width=8, seed=1)
    feeds = tokens(3, 16, 11)
    ref_values, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(feeds)
    planned = PlannedExecutor(graph).train()
    values, grads = planned.inference_and_backprop(feeds)
    assert fused(planned) == ["h0.attn.mix", "h1.attn.mix"]
    place = planned.placement()
    for layer in ("h0", "h1"):  # K, V and the merged output read and written through strides
        assert place[f"{layer}.attn.q.t"] == "onednn"
        for t in ("k.t", "v.t", "y.t"):
            assert place[f"{layer}.attn.{t}"] == f"fused into {layer}.attn.scores", t
    ran = {s.node for steps in planned._last.records.values() for s in steps
           if s.name.startswith("Transpose")}
    # the tied head's Transpose(embedding): the product reads the embedding through strides
    assert ran == {"h0.attn.q.t", "h1.attn.q.t", "logits"}, ran
    assert place["lm_head.tied"].startswith("fused into "), place["lm_head.tied"]
    close(values["loss"], ref_values["loss"], "loss")
    for name, g in ref_grads.items():
        close(grads[name], g, name)
    logits = planned.eval().inference({"input": feeds["input"]}, ["logits"])["logits"]
    close(logits, ReferenceExecutor(graph).inference({"input": feeds["input"]},
                                                     ["logits"])["logits"], "logits")


def exported_attention(heads=3, t=5, d=4, divide=False, mask=None) -> GraphBuilder:
    """The chain as PyTorch's exporter writes it (Div by sqrt(d) when ``divide``; the
    constant ``mask`` added to the scores when given), over graph inputs whose gradients are
    asked for."""
    b = GraphBuilder("attention", 17)
    q, k, v = (b.input(n, np.float32, (2, heads, *s)) for n, s in
               (("q", (t, d)), ("k", (d, t)), ("v", (t, d))))
    s = b.node("MatMul", [q, k], name="scores")
    if divide:
        s = b.node("Div", [s, b.initializer("root_d", np.asarray(math.sqrt(d), np.float32))],
                   name="scaled")
    if mask is not None:
        s = b.node("Add", [s, b.node("Constant", [], name="mask_value", value=mask)],
                   name="masked")
    p = b.node("Softmax", [s], name="softmax", axis=-1)
    y = b.node("MatMul", [p, v], name="mix")
    w = b.initializer("w", np.linspace(-1, 1, d, dtype=np.float32))
    loss = b.node("ReduceSum", [b.node("Mul", [y, w], name="weighted")], name="loss",
                  keepdims=0)
    b.output(y, np.float32)
    b.output(loss, np.float32, ())
    return b


@pytest.mark.parametrize("divide", [False, True])
def test_exported_chain_gradients_with_respect_to_q_k_v(divide):
    graph = exported_attention(divide=divide).build()
    planned_matches_reference(graph, 5, np.random.default_rng(2), folded="softmax")


def test_a_fetched_softmax_is_not_fused():
    """The probabilities asked for must exist: the chain then lowers node by node."""
    graph = exported_attention().build()
    feeds = {n: np.ones(s, np.float32) for n, s in
             (("q", (2, 3, 5, 4)), ("k", (2, 3, 4, 5)), ("v", (2, 3, 5, 4)))}
    planned = PlannedExecutor(graph)
    out = planned.inference(feeds, ["softmax", "mix"])
    assert planned.placement()["softmax"] == "onednn"
    np.testing.assert_allclose(out["softmax"], 0.2, rtol=1e-6)


def test_gpt_step_memory_at_sequence_128_keeps_no_scores(monkeypatch):
    """The GPT benchmark's model (2 layers, 4 heads, batch 16, context 128): fused, no plan
    value holds (T, T) scores of more than a chunk of heads, and the arena is below the
    unfused plan's less every layer's scores (the probabilities the unfused softmax keeps for
    its backward), the figure computed from the graph's shapes."""
    n, t, layers, heads = 16, 128, 2, 4
    graph = gpt((t,), classes=65, layers=layers, heads=heads, width=128, seed=0)
    feeds = tokens(n, t, 65)
    scores = n * heads * t * t * 4
    monkeypatch.setattr(attention, "ENABLED", False)
    unfused = PlannedExecutor(graph).train()
    unfused.inference_and_backprop(feeds)
    unfused_bytes = unfused._last.arena_bytes
    monkeypatch.setattr(attention, "ENABLED", True)
    planned = PlannedExecutor(graph).train()
    planned.inference_and_backprop(feeds)
    plan = planned._last
    left = [v.name for v in plan.values.values() if v.shape[-2:] == (t, t)
            and v.nbytes > attention.SCRATCH_BYTES]
    assert not left, f"(T, T) scores beyond a chunk's scratch are left: {left}"
    assert plan.arena_bytes <= unfused_bytes - layers * scores, \
        (plan.arena_bytes, unfused_bytes, scores)


def softmax_reference(x, scale, mask, causal):
    """softmax(x * scale + mask) over the last axis; causal: query i of q sees keys up to
    k - q + i."""
    z = x.astype(np.float64) * scale + (0 if mask is None else mask)
    q, k = x.shape[-2:]
    if causal:
        z = z + np.triu(np.full((q, k), -np.inf), k - q + 1)
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("queries,keys,causal,masked", [
    (1, 1, True, False), (5, 5, True, False), (13, 13, True, True), (24, 24, True, False),
    (7, 19, True, False), (9, 13, False, True), (16, 16, False, False), (3, 40, False, False),
    (128, 128, True, True)])  # the last above 2^15 scores: split over the threads
def test_softmax_kernels_match_numpy(queries, keys, causal, masked):
    """cpp/plan/attention.cpp's softmax and its backward over rows of every length mod 8
    (vectors of 8 and their tails); causal rows are 0 past the diagonal whatever the scores
    there (they are never read), and so is their gradient."""
    rt = runtime.module()
    rng = np.random.default_rng(queries * 100 + keys)
    x = (rng.standard_normal((3, queries, keys)) * 4).astype(np.float32)
    mask = rng.standard_normal((queries, keys)).astype(np.float32) if masked else None
    p = np.full_like(x, 7.0)
    rt.attention_softmax([3, queries, keys], 0.3, mask, causal, x, p).run()
    ref = softmax_reference(x, 0.3, mask, causal)
    close(p, ref, "probabilities", 1e-6)
    if causal:
        hidden = np.triu_indices(queries, keys - queries + 1, keys)
        assert not p[:, hidden[0], hidden[1]].any()
    dp = rng.standard_normal(x.shape).astype(np.float32)
    dx = np.full_like(x, 7.0)
    rt.attention_softmax_backward([3, queries, keys], 0.3, causal, p, dp, dx).run()
    close(dx, 0.3 * ref * (dp - (ref * dp).sum(-1, keepdims=True)), "dscores", 1e-5)


@pytest.mark.parametrize("block,scratch", [(5, attention.SCRATCH_BYTES), (32, 19 * 19 * 4),
                                           (4, 19 * 19 * 4)])
def test_causal_gpt_gradients_at_a_sequence_not_a_multiple_of_the_block(monkeypatch, block,
                                                                        scratch):
    """Sequence 19: query blocks of 5 (the last has 4 rows) and 4 (the last has 3), or one
    block (32 > 19); all heads in one chunk, or one head per chunk."""
    monkeypatch.setattr(attention, "BLOCK", block)
    monkeypatch.setattr(attention, "SCRATCH_BYTES", scratch)
    graph = gpt((19,), classes=11, layers=2, heads=2, width=8, seed=3)
    causal = []
    monkeypatch.setattr(attention, "_causal", lambda m, f=attention._causal: causal.append(
        f(m)) or causal[-1])
    feeds = tokens(3, 19, 11, seed=4)
    ref_values, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(feeds)
    planned = PlannedExecutor(graph).train()
    values, grads = planned.inference_and_backprop(feeds)
    assert fused(planned) == ["h0.attn.mix", "h1.attn.mix"] and causal == [True, True]
    close(values["loss"], ref_values["loss"], "loss")
    for name, g in ref_grads.items():
        close(grads[name], g, name)


@pytest.mark.parametrize("kind", ["random", "causal with a bias", "causal at -inf"])
def test_masked_chain_gradients(monkeypatch, kind):
    """A mask that is not causal keeps every key; a causal one with a bias on and below the
    diagonal (ALiBi's kind) adds it; -inf above the diagonal is causal too."""
    monkeypatch.setattr(attention, "BLOCK", 4)
    t = 11
    rng = np.random.default_rng(5)
    mask = rng.standard_normal((t, t)).astype(np.float32)
    if kind != "random":
        mask = np.tril(mask) + np.triu(np.full((t, t), -1e9 if "bias" in kind else -np.inf,
                                               np.float32), 1)
        if "inf" in kind:
            mask = np.where(np.isinf(mask), mask, 0).astype(np.float32)
    assert attention._causal(mask) == (kind != "random")
    graph = exported_attention(t=t, divide=True, mask=mask).build()
    planned_matches_reference(graph, t, rng, folded="masked")
