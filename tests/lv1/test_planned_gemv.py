"""Batch-1 inference (issue 41): a Gemm of 1 to 4 rows by a (N, K) weight and a 1x1 Conv of one
pixel run on ``cpp/plan/gemv.cpp`` (one pass over the weight) with the activation after them
fused, where no gradient flows; more rows in inference run on oneDNN's matmul by the weight
packed once (matmul.cpp's ``PackedMatmul``), and a training step keeps oneDNN's matmul as it
was. And a repeated inference call skips the plan lookup (``PlannedExecutor._repeat``) yet sees
every change the full path sees: new values, other shapes, replaced or touched weights, the mode."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

POSTS = {"": lambda v: v, "relu": lambda v: np.where(v > 0, v, 0.1 * v),
         "hardswish": lambda v: v * np.clip(v / 6 + 0.5, 0, 1),
         "hardsigmoid": lambda v: np.clip(0.2 * v + 0.5, 0, 1),
         "clip": lambda v: np.clip(v, -1, 1)}
ALPHA_BETA = {"": (0, 0), "relu": (0.1, 0), "hardswish": (1 / 6, 0.5),
              "hardsigmoid": (0.2, 0.5), "clip": (-1, 1)}


@pytest.mark.parametrize("m,k,n", [(1, 37, 13), (4, 16, 5), (3, 5, 4), (2, 70, 9)])
def test_the_kernel_against_numpy(m, k, n):
    rt = runtime.module()
    rng = np.random.default_rng(m * k * n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    for post, f in POSTS.items():
        for bias in (b, None):
            y = np.full((m, n), np.nan, np.float32)
            rt.gemv(m, k, n, x, w, bias, y, post, *ALPHA_BETA[post]).run()
            want = f(x.astype(np.float64) @ w.T.astype(np.float64)
                     + (0 if bias is None else b))
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, err_msg=post)


def test_the_kernel_refuses_more_rows():
    rt = runtime.module()
    z = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match="1 to 4 rows"):
        rt.gemv(5, 3, 3, z, np.zeros((3, 3), np.float32), None, z[:, :3])


def head(batch: int, act: str = "HardSwish"):
    """x (batch, 24) -> Gemm(transB) -> act -> Gemm(transB): a classifier's two layers, and
    a loss (their sum)."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("head", 17)
    x = b.input("x", np.float32, ("N", 24))
    w1 = b.initializer("w1", rng.standard_normal((40, 24)).astype(np.float32))
    b1 = b.initializer("b1", rng.standard_normal(40).astype(np.float32))
    w2 = b.initializer("w2", rng.standard_normal((7, 40)).astype(np.float32))
    h = b.node(act, [b.node("Gemm", [x, w1, b1], name="fc1", transB=1)], name="act")
    b.node("Gemm", [h, w2], name="fc2", transB=1)
    b.node("ReduceSum", ["fc2"], name="loss", keepdims=0)
    b.output("fc2", np.float32, ("N", 7))
    b.output("loss", np.float32, ())
    return b.build(), {"x": rng.standard_normal((batch, 24)).astype(np.float32)}


def steps(ex: PlannedExecutor) -> list[str]:
    return [s.name for s in ex._last.order]


@pytest.mark.parametrize("act", ["HardSwish", "Relu", "HardSigmoid", "Sigmoid"])
def test_a_batch_1_head_runs_on_gemv_with_its_activation(act):
    graph, feeds = head(1, act)
    want = ReferenceExecutor(graph).eval().inference(feeds, ["fc2"])["fc2"]
    ex = PlannedExecutor(graph).eval()
    np.testing.assert_allclose(ex.inference(feeds, ["fc2"])["fc2"], want, rtol=1e-5,
                               atol=1e-5)
    assert steps(ex).count("gemv") == 2
    # Sigmoid is not one the kernel applies: it runs as a step of its own
    fused = ex.placement()["act"] == "fused into fc1"
    assert fused == (act != "Sigmoid")


def test_more_rows_run_on_a_packed_weight_packed_again_when_it_changes():
    graph, feeds = head(8)
    ex = PlannedExecutor(graph).eval()
    ref = ReferenceExecutor(graph).eval()

    def same():
        np.testing.assert_allclose(ex.inference(feeds, ["fc2"])["fc2"],
                                   ref.inference(feeds, ["fc2"])["fc2"], rtol=1e-5, atol=1e-5)
    same()
    assert "gemv" not in steps(ex) and steps(ex).count("matmul packed") == 2
    assert steps(ex).count("matmul weights -> packed") == 2
    assert ex.placement()["act"] == "fused into fc1"
    graph.initializers["w1"][...] *= -1  # written in place, then said: packed again
    graph.touch()
    same()
    graph.parameters["w2"] = graph.initializers["w2"] + 1  # replaced through the graph's API
    same()


def test_training_keeps_onednn():
    graph, feeds = head(1)
    ex = PlannedExecutor(graph).train()
    _, grads = ex.inference_and_backprop(feeds, loss="loss")
    assert "gemv" not in steps(ex) and "matmul packed" not in steps(ex)
    _, want = ReferenceExecutor(graph).train().inference_and_backprop(feeds, loss="loss")
    for name in ("w1", "b1", "w2"):
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-5, atol=1e-5)
    ex.inference(feeds, ["fc2"])  # a training-mode inference takes no gradient: gemv
    assert steps(ex).count("gemv") == 2


def squeeze_excite(batch: int):
    """x (batch, 12, 5, 5) -> mean -> 1x1 Conv -> Relu -> 1x1 Conv -> HardSigmoid -> x * s."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("se", 17)
    x = b.input("x", np.float32, (batch, 12, 5, 5))
    w1 = b.initializer("w1", rng.standard_normal((6, 12, 1, 1)).astype(np.float32))
    b1 = b.initializer("b1", rng.standard_normal(6).astype(np.float32))
    w2 = b.initializer("w2", rng.standard_normal((12, 6, 1, 1)).astype(np.float32))
    b2 = b.initializer("b2", rng.standard_normal(12).astype(np.float32))
    s = b.node("ReduceMean", [x], name="mean", axes=[2, 3], keepdims=1)
    s = b.node("Relu", [b.node("Conv", [s, w1, b1], name="fc1")], name="relu")
    s = b.node("HardSigmoid", [b.node("Conv", [s, w2, b2], name="fc2")], name="gate",
               alpha=1 / 6, beta=0.5)
    b.node("Mul", [x, s], name="y")
    b.output("y", np.float32, (batch, 12, 5, 5))
    return b.build(), {"x": rng.standard_normal((batch, 12, 5, 5)).astype(np.float32)}


@pytest.mark.parametrize("batch,gemv", [(1, 2), (2, 2), (5, 0)])
def test_squeeze_excite_convolutions_of_one_pixel(batch, gemv):
    graph, feeds = squeeze_excite(batch)
    want = ReferenceExecutor(graph).eval().inference(feeds)["y"]
    ex = PlannedExecutor(graph).eval()
    np.testing.assert_allclose(ex.inference(feeds)["y"], want, rtol=1e-5, atol=1e-5)
    assert steps(ex).count("gemv") == gemv


def test_a_repeated_call_sees_every_change():
    graph, feeds = head(1)
    ex = PlannedExecutor(graph).eval()
    ref = ReferenceExecutor(graph).eval()

    def same(f):
        np.testing.assert_allclose(ex.inference(f, ["fc2"])["fc2"],
                                   ref.inference(f, ["fc2"])["fc2"], rtol=1e-5, atol=1e-5)
    same(feeds)
    assert ex._last_inference is not None  # the next call takes the short path
    same({"x": feeds["x"] * 2})  # new values
    same(head(3)[1])  # another shape: another plan, and back
    same(feeds)
    graph.initializers["w2"] = graph.initializers["w2"] * 3  # replaced: the plan is stale
    same(feeds)
    graph.initializers["b1"][...] += 1  # written in place, then said
    graph.touch()
    same(feeds)
    ex.train()  # the mode: the weights are prepared again
    ref.train()
    same(feeds)
    with pytest.raises(Exception, match="expected"):  # another dtype: the full path says no
        ex.inference({"x": feeds["x"].astype(np.float64)}, ["fc2"])
    assert ex.inference(feeds, ["fc1"])["fc1"].shape == (1, 40)  # other outputs
    same(feeds)
