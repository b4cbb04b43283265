"""Inference acceptance (issue 41): in an inference plan, a MatMul by a 2-D weight the graph
holds (an exporter's Linear without bias, a tied head's transposed embedding) reads it packed
once by the prepare program (``lowering.matmul.packed_product``), packed again when the weight
changes, with the ReLU after it fused even without a bias and the residual added after it
(x + o(h)) added as the product writes; a training step keeps the plain product and its
gradients."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def encoder_mlp():
    """x (N, 6, 16) -> r = x + Relu(x . w1 (16, 32)) . w2 (32, 16) -> r . Transpose(e (12, 16))
    + b: a T5-style MLP without bias and its residual into a tied head, and a loss (the sum)."""
    rng = np.random.default_rng(3)
    g = GraphBuilder("mlp", 17)
    x = g.input("x", np.float32, ("N", 6, 16))
    w1 = g.initializer("w1", rng.standard_normal((16, 32)).astype(np.float32))
    w2 = g.initializer("w2", rng.standard_normal((32, 16)).astype(np.float32))
    e = g.initializer("e", rng.standard_normal((12, 16)).astype(np.float32))
    b = g.initializer("b", rng.standard_normal(12).astype(np.float32))
    h = g.node("Relu", [g.node("MatMul", [x, w1], name="wi")], name="act")
    r = g.node("Add", [x, g.node("MatMul", [h, w2], name="wo")], name="res")
    et = g.node("Transpose", [e], name="et", perm=[1, 0])
    g.node("Add", [g.node("MatMul", [r, et], name="head"), b], name="y")
    g.node("ReduceSum", ["y"], name="loss", keepdims=0)
    g.output("y", np.float32, ("N", 6, 12))
    g.output("loss", np.float32, ())
    return g.build(), {"x": rng.standard_normal((2, 6, 16)).astype(np.float32)}


def numpy_mlp(graph, x):
    w1, w2, e, b = (graph.initializers[n].astype(np.float64) for n in ("w1", "w2", "e", "b"))
    return (x + np.maximum(x @ w1, 0) @ w2) @ e.T + b


def steps(ex: PlannedExecutor) -> list[str]:
    return [s.name for s in ex._last.order]


def test_inference_reads_packed_weights_packed_again_when_they_change():
    graph, feeds = encoder_mlp()
    ex = PlannedExecutor(graph).eval()

    def same():
        np.testing.assert_allclose(ex.inference(feeds, ["y"])["y"],
                                   numpy_mlp(graph, feeds["x"]), rtol=1e-5, atol=1e-5)
    same()
    assert steps(ex).count("matmul packed") == 3
    assert steps(ex).count("matmul weights -> packed") == 3
    place = ex.placement()
    assert place["act"] == "fused into wi" and place["y"] == "fused into head"
    assert place["res"] == "fused into wo"  # the residual added as the product writes
    assert place["et"] == "fused into head"  # read transposed by the packing, not copied
    graph.initializers["w2"][...] *= -1  # written in place, then said: packed again
    graph.touch()
    same()
    graph.parameters["e"] = graph.initializers["e"] + 1  # replaced through the graph's API
    same()


def test_training_keeps_the_plain_product_and_its_gradients():
    graph, feeds = encoder_mlp()
    ex = PlannedExecutor(graph).train()
    _, grads = ex.inference_and_backprop(feeds, loss="loss")
    assert "matmul packed" not in steps(ex) and "matmul" in steps(ex)
    _, want = ReferenceExecutor(graph).train().inference_and_backprop(feeds, loss="loss")
    for name in ("w1", "w2", "e", "b"):
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-5, atol=1e-5)


def test_a_residual_made_after_the_product_is_added_by_its_own_step():
    rng = np.random.default_rng(4)
    g = GraphBuilder("late", 17)
    x = g.input("x", np.float32, (5, 8))
    w = g.initializer("w", rng.standard_normal((8, 8)).astype(np.float32))
    m = g.node("MatMul", [x, w], name="mm")
    z = g.node("Sigmoid", [x], name="z")  # listed after the product: not there when it runs
    g.node("Add", [m, z], name="y")
    g.output("y", np.float32, (5, 8))
    graph, feeds = g.build(), {"x": rng.standard_normal((5, 8)).astype(np.float32)}
    ex = PlannedExecutor(graph).eval()
    got = ex.inference(feeds, ["y"])["y"]
    xs = feeds["x"].astype(np.float64)
    np.testing.assert_allclose(got, xs @ graph.initializers["w"] + 1 / (1 + np.exp(-xs)),
                               rtol=1e-5, atol=1e-5)
    assert "matmul packed" in steps(ex) and ex.placement()["y"] != "fused into mm"


def split_heads():
    """Q = Transpose(x (N, 5, 2, 4), (0, 2, 1, 3)) . K = Transpose(z, (0, 2, 3, 1)): an
    attention's scores with no softmax after them (nothing fuses the attention), and a loss."""
    rng = np.random.default_rng(6)
    g = GraphBuilder("heads", 17)
    x = g.input("x", np.float32, ("N", 5, 2, 4))
    z = g.input("z", np.float32, ("N", 5, 2, 4))
    q = g.node("Transpose", [x], name="q", perm=[0, 2, 1, 3])
    k = g.node("Transpose", [z], name="k", perm=[0, 2, 3, 1])
    g.node("MatMul", [q, k], name="scores")
    g.node("ReduceSum", ["scores"], name="loss", keepdims=0)
    g.output("scores", np.float32, ("N", 2, 5, 5))
    g.output("loss", np.float32, ())
    feeds = {n: rng.standard_normal((3, 5, 2, 4)).astype(np.float32) for n in ("x", "z")}
    return g.build(), feeds


def test_inference_reads_split_heads_through_strides():
    graph, feeds = split_heads()
    ex = PlannedExecutor(graph).eval()
    got = ex.inference(feeds, ["scores"])["scores"]
    want = feeds["x"].transpose(0, 2, 1, 3) @ feeds["z"].transpose(0, 2, 3, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert "Transpose" not in steps(ex)
    assert ex.placement()["q"] == ex.placement()["k"] == "fused into scores"
    train = PlannedExecutor(graph).train()  # a training step keeps its copies
    _, grads = train.inference_and_backprop(feeds, loss="loss", wrt=["x", "z"])
    assert steps(train).count("Transpose") == 2
    _, ref = ReferenceExecutor(graph).train().inference_and_backprop(feeds, loss="loss",
                                                                     wrt=["x", "z"])
    for name in ("x", "z"):
        np.testing.assert_allclose(grads[name], ref[name], rtol=1e-5, atol=1e-5)
