"""A custom operator's backward is checked where the executor uses it: one gradient (or None)
per input, each of its input's shape; anything else is a BackwardError naming the node, the
operator and what it returned, never zero gradients for the weights before it."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv0 import BackwardError, Operator, register, unregister
from meta.lv1 import GraphBuilder, ReferenceExecutor


def scaled_sum_graph(op: type[Operator], n_inputs: int = 2):
    """loss = ReduceSum(op(w, b...)): ``w`` (3, 2) is a parameter, the other inputs data."""
    b = GraphBuilder("g")
    x = b.input("x", np.float64, (3, 2))
    w = b.initializer("w", np.ones((3, 2)))
    extra = [b.input(f"i{k}", np.float64, (3, 2)) for k in range(n_inputs - 2)]
    y = b.node("Custom", [w, x, *extra], domain="test.ops", name="custom")
    loss = b.node("ReduceSum", [y], keepdims=0, name="loss")
    b.output(loss, np.float64, ())
    graph = b.build()
    register("Custom", domain="test.ops")(op)
    try:
        return ReferenceExecutor(graph)  # the executor holds the op's instance from here
    finally:
        unregister("Custom", domain="test.ops")


def backward_returning(result):
    class Custom(Operator):
        def forward(self, ctx, w, x, *rest):
            ctx.save(x=x)
            return w * x

        def backward(self, ctx, dy):
            return result(ctx, dy)

    return Custom


def run(result, n_inputs: int = 2):
    ex = scaled_sum_graph(backward_returning(result), n_inputs)
    feeds = {"x": np.full((3, 2), 2.0), **{f"i{k}": np.zeros((3, 2))
                                             for k in range(n_inputs - 2)}}
    return ex.inference_and_backprop(feeds, loss="loss")[1]


@pytest.mark.parametrize("result,message", [
    (lambda ctx, dy: None, "returned None; it must return a sequence"),
    (lambda ctx, dy: (), "returned (); it must return a gradient (or None) for every input "
                         "that needs one: 2 input(s) here ('w', 'x')"),
    (lambda ctx, dy: dy * ctx.x, "returned an array of shape (3, 2)"),
    (lambda ctx, dy: (dy * ctx.x, None, dy), "returned 3 value(s) (shape (3, 2), None, shape "
                                             "(3, 2)); it must return no more gradients"),
    (lambda ctx, dy: ((dy * ctx.x)[:1], None), "returned a gradient of shape (1, 2) for input "
                                               "0 ('w') of shape (3, 2)"),
], ids=["None", "empty", "bare-array", "too-many", "wrong-shape"])
def test_a_bad_backward_is_refused_naming_node_op_and_result(result, message):
    with pytest.raises(BackwardError, match="node 'custom' \\(Custom\\): the backward of "
                                            "operator Custom") as info:
        run(result)
    assert message in str(info.value)


@pytest.mark.parametrize("result", [
    lambda ctx, dy: (dy * ctx.x, None),
    lambda ctx, dy: [dy * ctx.x, None, None, None],  # trailing Nones: absent optional inputs
    lambda ctx, dy: (dy * ctx.x,),  # the data input needs no gradient
], ids=["one-per-input", "trailing-none", "short"])
def test_good_backwards_pass(result):
    assert run(result)["w"].tolist() == [[2.0, 2.0]] * 3

