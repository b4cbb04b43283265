"""Attention in the planned executor (``meta.lv1.plan.lowering.attention``): MatMul, scale,
mask, Softmax, MatMul lowered as one chunked node gives the reference executor's losses and
gradients, and a GPT training step then keeps no (T, T) scores across the step."""

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
    close(values["loss"], ref_values["loss"], "loss")
    for name, g in ref_grads.items():
        close(grads[name], g, name)
    logits = planned.eval().inference({"input": feeds["input"]}, ["logits"])["logits"]
    close(logits, ReferenceExecutor(graph).inference({"input": feeds["input"]},
                                                     ["logits"])["logits"], "logits")


def exported_attention(heads=3, t=5, d=4, divide=False) -> GraphBuilder:
    """The chain as PyTorch's exporter writes it (no mask; Div by sqrt(d) when ``divide``),
    over graph inputs whose gradients are asked for."""
    b = GraphBuilder("attention", 17)
    q, k, v = (b.input(n, np.float32, (2, heads, *s)) for n, s in
               (("q", (t, d)), ("k", (d, t)), ("v", (t, d))))
    s = b.node("MatMul", [q, k], name="scores")
    if divide:
        s = b.node("Div", [s, b.initializer("root_d", np.asarray(math.sqrt(d), np.float32))],
                   name="scaled")
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
    rng = np.random.default_rng(2)
    feeds = {"q": rng.standard_normal((2, 3, 5, 4)).astype(np.float32),
             "k": rng.standard_normal((2, 3, 4, 5)).astype(np.float32),
             "v": rng.standard_normal((2, 3, 5, 4)).astype(np.float32)}
    wrt = ["q", "k", "v"]
    ref = ReferenceExecutor(graph).train().inference_and_backprop(feeds, outputs=["mix"],
                                                                  wrt=wrt)
    planned = PlannedExecutor(graph).train()
    ours = planned.inference_and_backprop(feeds, outputs=["mix"], wrt=wrt)
    assert planned.placement()["softmax"] == "fused into scores"
    close(ours[0]["mix"], ref[0]["mix"], "output")
    for name in wrt:
        close(ours[1][name], ref[1][name], f"d{name}")


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
