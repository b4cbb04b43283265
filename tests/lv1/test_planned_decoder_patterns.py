"""Decoder patterns that left the plan as Python steps (issue 41 item 2), now plan steps,
forward and backward equal to the reference executor's: RMSNorm's ``Div(1, Sqrt(...))``,
grouped-query attention's ``Expand`` of K/V along one axis, rotary embeddings' ``Slice``
halves; and the cases they leave to the operator (a tensor numerator, a shape fed at run
time, a Slice with a step)."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, Node, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

B, KV, G, T, D = 2, 2, 3, 5, 8
BIG = np.iinfo(np.int64).max


def check(g, feeds, wrt=("x",)):
    """Planned == reference (loss, gradients of the parameters and of ``wrt``); placement."""
    ref = ReferenceExecutor(g).train().inference_and_backprop(feeds, "loss", wrt=list(wrt))
    planned = PlannedExecutor(g).train()
    ours = planned.inference_and_backprop(feeds, "loss", wrt=list(wrt))
    assert planned.unplanned is None, planned.unplanned
    np.testing.assert_allclose(ours[0]["loss"], ref[0]["loss"], rtol=1e-5, atol=1e-5)
    assert set(ours[1]) == set(ref[1])
    for k, v in ref[1].items():
        np.testing.assert_allclose(ours[1][k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    return planned.placement()


def builder(name, shape):
    b = GraphBuilder(name, 17)
    x = b.input("x", np.float32, shape)

    def const(n, v):
        return b.node("Constant", [], name=n, value=np.asarray(v))
    return b, x, const


def finish(b, y, shape):
    f = b.initializer("f", np.random.default_rng(3).standard_normal(shape).astype(np.float32))
    b.node("ReduceSum", [b.node("Mul", [y, f], name="weighted")], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    return b.build()


@pytest.mark.parametrize("numerator", [1.0, -2.5, "tensor"])
def test_rmsnorm_rsqrt_as_div_by_a_tensor(numerator):
    shape = (B, T, D)
    b, x, const = builder("rms", shape)
    ms = b.node("ReduceMean", [b.node("Mul", [x, x], name="sq")], name="ms", axes=[-1])
    root = b.node("Sqrt", [b.node("Add", [ms, const("eps", np.float32(1e-6))], name="add")],
                  name="sqrt")
    # "tensor": a numerator asked a gradient for, so no constant: the operator's code
    top = b.initializer("n", np.full((1, 1, 1), 1.5, np.float32)) if numerator == "tensor" \
        else const("one", np.float32(numerator))
    y = b.node("Mul", [x, b.node("Div", [top, root], name="div")], name="norm")
    g = finish(b, y, shape)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    place = check(g, {"x": x}, ("x", "n") if numerator == "tensor" else ("x",))
    # Add, Sqrt and Div as one fused pointwise step (lowering/fused.py), a tensor
    # numerator too
    assert place["div"] == "fused into add", place


def gqa_graph(fed_shape: bool):
    shape = (B, KV, 1, T, D)
    b, x, const = builder("gqa", shape)
    target = b.input("shape", np.int64, (5,)) if fed_shape else \
        const("target", np.array([B, KV, G, T, D], np.int64))
    y = b.node("Expand", [x, target], name="expand")
    y = b.node("Reshape", [y, const("heads_shape", np.array([B, KV * G, T, D], np.int64))],
               name="heads")
    return finish(b, y, (B, KV * G, T, D)), shape


def test_gqa_expand_of_k_and_v_is_a_plan_step():
    g, shape = gqa_graph(fed_shape=False)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    assert check(g, {"x": x})["expand"] == "native"


def test_an_expand_to_a_fed_shape_stays_the_operators():
    g, shape = gqa_graph(fed_shape=True)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    feeds = {"x": x, "shape": np.array([B, KV, G, T, D], np.int64)}
    assert check(g, feeds)["expand"] == "python"


@pytest.mark.parametrize("step", [1, 2])
def test_rotary_halves_slice_neg_concat(step):
    """rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2]) then x * cos + rotate_half * sin;
    with ``step`` 2 the Slices take every other element (the operator's code)."""
    shape = (B, KV, T, D)
    b, x, const = builder("rotary", shape)
    half = D // 2

    def cut(n, lo, hi):
        return b.node("Slice", [x, const(f"{n}_s", np.array([lo], np.int64)),
                                const(f"{n}_e", np.array([hi], np.int64)),
                                const(f"{n}_a", np.array([-1], np.int64)),
                                const(f"{n}_t", np.array([step], np.int64))], name=n)
    first = cut("first", 0, half) if step == 1 else cut("first", 0, BIG)
    second = cut("second", half, BIG) if step == 1 else cut("second", 1, BIG)
    rot = b.node("Concat", [b.node("Neg", [second], name="neg"), first], name="rot", axis=-1)
    rng = np.random.default_rng(2)
    cos = b.initializer("cos", rng.standard_normal((T, D)).astype(np.float32))
    sin = b.initializer("sin", rng.standard_normal((T, D)).astype(np.float32))
    y = b.node("Add", [b.node("Mul", [x, cos], name="xc"), b.node("Mul", [rot, sin],
                                                                   name="rs")], name="rope")
    g = finish(b, y, shape)
    x = rng.standard_normal(shape).astype(np.float32)
    place = check(g, {"x": x})
    want = "onednn" if step == 1 else "python"
    assert place["first"] == want and place["second"] == want, place


@pytest.mark.parametrize("opset,use_v", [(13, True), (18, False)])
def test_gpt2_query_key_value_split(opset, use_v):
    """Split of the fused [B, T, 3D] product into q, k, v (sizes as an input at opset 13,
    ``num_outputs`` at 18); without ``use_v`` one part takes no gradient (zeros)."""
    shape = (B, T, 3 * D)
    b = GraphBuilder("qkv", opset)
    x = b.input("x", np.float32, shape)
    if opset == 13:
        sizes = b.node("Constant", [], name="sizes", value=np.array([D, D, D], np.int64))
        b.nodes.append(Node("Split", ["x", sizes], ["q", "k", "v"], "split", attrs={"axis": -1}))
    else:
        b.nodes.append(Node("Split", ["x"], ["q", "k", "v"], "split",
                            attrs={"axis": 2, "num_outputs": 3}))
    qk = b.node("Mul", ["q", "k"], name="qk")
    y = b.node("Add", [qk, "v"], name="qkv") if use_v else qk
    g = finish(b, y, (B, T, D))
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    assert check(g, {"x": x})["split"] == "onednn"
