"""A Llama-style causal mask built as exporters write it (Shape -> Gather -> Range ->
Unsqueeze -> Greater, ConstantOfShape -> Trilu, IsNaN, Equal, Where, Expand to the batch):
it depends only on the input's shape and on constants, so the plan folds it at build time
and the training step runs no Python step for it (issue 41 item 2)."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import profile_share, runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

MASK_NODES = ("range", "eq", "greater", "not", "later", "full", "trilu", "trilu1", "isnan",
              "where", "where2", "expand")


def causal_graph():
    """x [B, T, D] -> self-attention scores + a causal mask built from x's shape -> loss."""
    D = 8
    b = GraphBuilder("causal", 17)
    x = b.input("x", np.float32, ("B", "T", D))

    def const(name, v):
        return b.node("Constant", [], name=name, value=np.asarray(v))

    def axes(name, *a):
        return const(name, np.array(a, np.int64))

    shape = b.node("Shape", [x], name="shape")
    t = b.node("Gather", [shape, const("one_i", np.int64(1))], name="t", axis=0)
    ar = b.node("Range", [const("zero", np.int64(0)), t, const("step", np.int64(1))],
                name="range")
    rows = b.node("Unsqueeze", [ar, axes("ax1", 1)], name="rows")
    cols = b.node("Unsqueeze", [ar, axes("ax0", 0)], name="cols")
    eq = b.node("Equal", [cols, rows], name="eq")
    later = b.node("And", [b.node("Greater", [cols, rows], name="greater"),
                           b.node("Not", [eq], name="not")], name="later")
    t1 = b.node("Unsqueeze", [t, axes("ax0b", 0)], name="t1")
    tt = b.node("Concat", [t1, t1], name="tt", axis=0)
    full = b.node("ConstantOfShape", [tt], name="full", value=np.array([-1e9], np.float32))
    tri = b.node("Trilu", [full], name="trilu", upper=1)
    tri1 = b.node("Trilu", [tri, const("k1", np.int64(1))], name="trilu1", upper=1)
    nan = b.node("IsNaN", [tri1], name="isnan")
    masked = b.node("Where", [later, const("ninf", np.float32(-1e9)), const("z", np.float32(0))],
                    name="where")
    masked = b.node("Where", [nan, const("z2", np.float32(0)), masked], name="where2")
    batch = b.node("Slice", [shape, axes("s0", 0), axes("s1", 1)], name="batch")
    bshape = b.node("Concat", [batch, axes("one_h", 1), t1, t1], name="bshape", axis=0)
    mask4 = b.node("Expand", [masked, bshape], name="expand")
    s = b.node("MatMul", [x, b.node("Transpose", [x], name="xt", perm=[0, 2, 1])], name="scores")
    s4 = b.node("Add", [b.node("Unsqueeze", [s, axes("ax1b", 1)], name="s4"), mask4],
                name="masked_scores")
    p = b.node("Squeeze", [b.node("Softmax", [s4], name="softmax", axis=-1), axes("ax1c", 1)],
               name="sq")
    w = b.initializer("W", np.random.default_rng(0).standard_normal((D, D)).astype(np.float32))
    h = b.node("MatMul", [b.node("MatMul", [p, x], name="ctx"), w], name="proj")
    b.node("ReduceSum", [h], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    return b.build()


@pytest.mark.parametrize("batch,length", [(2, 6), (3, 5)])
def test_a_causal_mask_from_shapes_and_constants_folds(batch, length):
    g = causal_graph()
    x = np.random.default_rng(1).standard_normal((batch, length, 8)).astype(np.float32)
    planned = PlannedExecutor(g).train()
    for _ in range(profile_share.SKIPPED + profile_share.WATCHED):
        values, grads = planned.inference_and_backprop({"x": x}, "loss")
    place = planned.placement()
    assert all(place[n] == "folded" for n in MASK_NODES), place
    assert not any(w.startswith("python") for w in place.values()), place
    assert planned.python_watch.result.python_share == 0.0
    ref_values, ref_grads = ReferenceExecutor(g).train().inference_and_backprop({"x": x}, "loss")
    np.testing.assert_allclose(values["loss"], ref_values["loss"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["W"], ref_grads["W"], rtol=1e-4, atol=1e-5)
