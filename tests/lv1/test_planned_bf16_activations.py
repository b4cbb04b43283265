"""A bf16 plan keeps activations in bf16 between its bf16 ops (issue 42), as PyTorch's CPU
autocast does: each tensor a bf16 product reads is converted once and that copy serves the
forward and the backward products; LayerNorm and Gelu read only by bf16 products write bf16
(computing in float32); a gradient with one writer whose reader takes bf16 is bf16, one that
several steps add into float32; a fetched tensor stays float32; no step ever reads a value
the plan keeps in bf16 only as float32."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from meta.lv1 import PlannedExecutor, gpt
from meta.lv1.plan import precision, runtime
from meta.lv1.plan.builder import PlannedStep

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def tokens(n=4, t=32, seed=0):
    rng = np.random.default_rng(seed)
    return {"input": rng.integers(0, 65, (n, t)), "labels": rng.integers(0, 65, (n, t))}


def relative(ours, theirs) -> float:
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    return float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))


def step(mode, outputs=(), n=4, t=32):
    graph = gpt((t,), seed=0)
    ex = PlannedExecutor(graph, precision=mode).train()
    feeds = tokens(n, t)
    values, grads = ex.inference_and_backprop(feeds, "loss", outputs=list(outputs)) \
        if outputs else ex.inference_and_backprop(feeds, "loss")
    return ex, values, {k: g.copy() for k, g in grads.items()}


def kept(ex) -> dict[str, np.dtype]:
    return {n: v.dtype for n, v in ex._last.values.items() if v.dtype == precision.BF16}


def test_bf16_plan_keeps_norm_and_gelu_outputs_in_bf16_and_gradients_close(native):
    ex32, v32, g32 = step("f32")
    ex16, v16, g16 = step("bf16")
    assert not kept(ex32)  # the float32 plan holds nothing in bf16
    names = kept(ex16)
    # LayerNorms and Gelu written in bf16, the weights' one copy, Gelu's kept derivative
    assert any(n.startswith("h0.ln1@bf16") for n in names)
    assert any(n.startswith("h0.mlp.gelu@bf16") for n in names)
    assert any(n.startswith("h0.mlp.gelu@derivative") for n in names)
    assert any(n.startswith("h0.mlp.fc.weight@bf16") for n in names)
    plan = ex16._last
    only = plan.objects[precision.ONLY]
    for name in ("h0.ln1", "h0.mlp.gelu"):
        # never written as float32: no step touches the float32 value
        assert name in only
        assert not any(name in s.reads or name in s.writes for s in plan.order)
    # Q, K and V add into ln1's gradient: float32; the MLP's gradients have one writer
    # each and readers taking bf16: written in bf16 only
    assert "h0.ln1@grad" not in only and plan.values["h0.ln1@grad"].dtype == np.float32
    for name in ("h0.mlp.gelu@grad", "h0.mlp.fc@grad"):
        assert name in only
        holder = plan.objects[precision.COPIES][name]
        assert plan.values[holder].dtype == precision.BF16
    # one conversion per tensor: no tensor is converted to bf16 twice
    converted = [s.reads[0] for s in plan.order if s.name == "to bf16"]
    assert len(converted) == len(set(converted))
    assert abs(float(v16["loss"]) - float(v32["loss"])) < 0.02
    for name, g in g32.items():
        if name.endswith("k.bias"):  # softmax ignores a key bias: zero up to rounding
            assert np.abs(g16[name]).max() < 1e-5
            continue
        assert relative(g16[name], g) < 2e-2, name


@pytest.mark.slow
def test_bf16_activations_shrink_what_the_step_keeps(native):
    ex32, _, _ = step("f32", n=8, t=128)  # large enough for the activations to dominate
    ex16, _, _ = step("bf16", n=8, t=128)
    assert ex16._last.arena_bytes < 0.75 * ex32._last.arena_bytes


def test_a_fetched_tensor_stays_float32(native):
    _, v32, _ = step("f32", ["h0.ln1", "loss"])
    ex16, v16, _ = step("bf16", ["h0.ln1", "loss"])
    assert v16["h0.ln1"].dtype == np.float32
    assert "h0.ln1" not in ex16._last.objects.get(precision.ONLY, set())
    assert np.abs(v16["h0.ln1"] - v32["h0.ln1"]).max() < 1e-5  # LayerNorm itself float32


def test_a_step_reading_a_bf16_only_value_is_refused():
    pb = SimpleNamespace(steps=[PlannedStep("Relu", "forward", ("x",), ("y",), list, "relu")])
    ctx = SimpleNamespace(pb=pb, objects={precision.ONLY: {"x"}})
    with pytest.raises(AssertionError, match="reads 'x', which the plan keeps in bf16 only"):
        precision.check_unwritten(ctx)
    ctx.objects[precision.ONLY] = {"z"}
    precision.check_unwritten(ctx)


def test_convert_rounds_to_nearest_even_both_ways():
    rt = runtime.module()
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5e-3, np.inf, -np.inf, 3e38, 0.0],
                 np.float32)
    y = np.empty(len(x), ml_dtypes.bfloat16)
    rt.convert(x, y, len(x)).run()
    assert np.array_equal(y.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    back = np.empty(len(x), np.float32)
    rt.convert(y, back, len(x)).run()
    assert np.array_equal(back, y.astype(np.float32))


def test_gelu_in_bf16_is_float32_gelu_rounded():
    rt = runtime.module()
    x = np.random.default_rng(0).standard_normal(70000).astype(np.float32) * 3
    y32, d32 = np.empty_like(x), np.empty_like(x)
    rt.gelu(len(x), x, None, y32, False, d32).run()
    y16 = np.empty(len(x), ml_dtypes.bfloat16)
    d16 = np.empty(len(x), ml_dtypes.bfloat16)
    rt.gelu(len(x), x, None, y16, False, d16).run()
    assert np.array_equal(y16.view(np.uint16), y32.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal(d16.view(np.uint16), d32.astype(ml_dtypes.bfloat16).view(np.uint16))
    out = np.empty_like(x)
    g = np.random.default_rng(1).standard_normal(len(x)).astype(np.float32)
    rt.multiply(len(x), g, d16, out, False).run()
    assert np.array_equal(out, g * d16.astype(np.float32))
