"""A weight the graph transposes before its MatMul (a tied head's ``Transpose(embedding)``, an
exporter's ``W^T``): the planned product reads the weight through strides (oneDNN's trans_b)
and the Transpose's copy is dropped, forward and backward; the weight's gradient is still
exact, also when another node reads the weight too (an embedding's Gather). Where the
transposed value is needed by anything else (fetched), the Transpose runs."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def tied_head() -> tuple:
    """ids -> Gather(w) -> ... -> MatMul(h, Transpose(w)): w is an embedding and the head."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("tied", 17)
    ids = b.input("ids", np.int64, (6,))
    x = b.input("x", np.float32, (6, 8))
    w = b.initializer("w", rng.standard_normal((10, 8)).astype(np.float32))
    h = b.node("Add", [b.node("Gather", [w, ids], name="embed"), x], name="h")
    y = b.node("MatMul", [h, b.node("Transpose", [w], name="wt", perm=[1, 0])], name="head")
    b.node("ReduceSum", [b.node("Mul", [y, y], name="sq")], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    feeds = {"ids": rng.integers(0, 10, 6),
             "x": rng.standard_normal((6, 8)).astype(np.float32)}
    return b.build(), feeds


def test_the_product_reads_the_weight_through_strides_and_its_gradient_is_exact():
    graph, feeds = tied_head()
    ref_values, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(
        feeds, wrt=["w", "x"])
    planned = PlannedExecutor(graph).train()
    values, grads = planned.inference_and_backprop(feeds, wrt=["w", "x"])
    assert planned.placement()["wt"] == "fused into head"
    assert not any(s.name.startswith("Transpose") for s in planned._last.order)
    np.testing.assert_allclose(values["loss"], ref_values["loss"], rtol=1e-6)
    for name in ("w", "x"):  # w: the Gather's and the head's gradients added
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-5, atol=1e-5)


def test_a_fetched_transpose_still_runs():
    graph, feeds = tied_head()
    planned = PlannedExecutor(graph).train()
    values, _ = planned.inference_and_backprop(feeds, outputs=["loss", "wt"], wrt=["w"])
    assert any(s.name == "Transpose" for s in planned._last.order)
    np.testing.assert_array_equal(values["wt"], np.asarray(graph.initializers["w"]).T)
