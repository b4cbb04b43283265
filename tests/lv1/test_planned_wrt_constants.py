"""A gradient asked for by an initializer's name is computed on the planned executor even where
the graph classes that initializer as a constant (issue 39: Div's operands, Clip's 0-d bounds,
OneHot's values came back as zeros: the planner had folded them into their readers).

A name in ``wrt`` is never a constant to the plan (``compiler.trace_phase``); a tensor computed
from constants alone and asked for by name keeps its value but stays a variable to its
readers. Each case checks the graph really classes the names as constants (else it would not
test the folding) and compares with the reference executor, which must be nonzero."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

RNG = np.random.default_rng(0)
X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)


def weighted_loss(b: GraphBuilder, y: str, shape) -> str:
    """sum(y * w), w fixed and uneven, so every element's gradient differs."""
    w = b.initializer("w", RNG.uniform(0.5, 1.5, shape).astype(np.float32))
    return b.node("ReduceSum", [b.node("Mul", [y, w], name="weigh")], name="loss", keepdims=0)


def compare(graph, feeds, wrt, constants):
    roles = graph.roles
    assert all(roles[c] == "constant" for c in constants), roles
    _, want = ReferenceExecutor(graph).inference_and_backprop(feeds, "loss", wrt=wrt)
    planned = PlannedExecutor(graph)
    _, got = planned.inference_and_backprop(feeds, "loss", wrt=wrt)
    assert planned.unplanned is None, planned.unplanned
    for name in wrt:
        assert np.any(want[name] != 0), name  # a gradient zeros would not match
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6,
                                   err_msg=f"gradient of {name!r}: {planned.placement()}")
    return planned


def test_clips_bounds():
    b = GraphBuilder("clip", 17)
    x = b.input("x", np.float32, X.shape)
    lo = b.initializer("lo", np.array(-1.0, np.float32))
    hi = b.initializer("hi", np.array(0.5, np.float32))
    y = b.node("Clip", [x, lo, hi], name="clip")
    b.output(weighted_loss(b, y, X.shape), np.float32, ())
    graph = b.build()
    compare(graph, {"x": X}, ["lo", "hi"], ["lo", "hi"])
    # asked for or not, the same plan otherwise: the bounds still fold when nobody asks
    planned = PlannedExecutor(graph)
    planned.inference_and_backprop({"x": X}, "loss")
    assert not planned.placement()["clip"].startswith("python"), planned.placement()


def test_div_of_initializers_and_the_quotient_by_name():
    """a / b computed from initializers alone (folded when nobody asks), then scales x; the
    gradients of a, b and of the quotient itself, asked by name."""
    b = GraphBuilder("div", 17)
    x = b.input("x", np.float32, X.shape)
    a = b.initializer("a", np.array(2.0, np.float32))
    d = b.initializer("d", np.array(3.0, np.float32))
    q = b.node("Div", [a, d], name="quotient")
    y = b.node("Mul", [x, q], name="scale")
    b.output(weighted_loss(b, y, X.shape), np.float32, ())
    graph = b.build()
    planned = compare(graph, {"x": X}, ["a", "d"], ["a", "d"])
    assert planned.placement()["quotient"] != "folded"
    planned = compare(graph, {"x": X}, [q], ["a", "d"])
    assert planned.placement()["quotient"] == "folded"  # its value fixed, not its readers'


def test_div_by_a_constant_divisor():
    b = GraphBuilder("div_fed", 17)
    x = b.input("x", np.float32, X.shape)
    d = b.initializer("d", RNG.uniform(1, 2, X.shape).astype(np.float32))
    y = b.node("Div", [x, d], name="div")
    b.output(weighted_loss(b, y, X.shape), np.float32, ())
    compare(b.build(), {"x": X}, ["d", "x"], ["d"])


def test_onehots_values():
    """OneHot of stored indices (computed from initializers alone: folded when nobody asks)
    scales x."""
    b = GraphBuilder("onehot", 17)
    x = b.input("x", np.float32, (5, 4))
    idx = b.initializer("idx", np.array([0, 3, 1, 3, 2], np.int64))
    depth = b.initializer("depth", np.array(4, np.int64))
    values = b.initializer("values", np.array([0.5, 2.0], np.float32))
    y = b.node("OneHot", [idx, depth, values], name="onehot", axis=-1)
    b.output(weighted_loss(b, b.node("Mul", [x, y], name="scale"), (5, 4)), np.float32, ())
    compare(b.build(), {"x": X[:, :4].repeat(2, 0)[:5]}, ["values"], ["values"])


def test_a_0d_scale():
    """x * s, s 0-d: a constant to the graph, a scale the binary kernel would take as a
    number."""
    b = GraphBuilder("scalar", 17)
    x = b.input("x", np.float32, X.shape)
    s = b.initializer("s", np.array(1.5, np.float32))
    y = b.node("Mul", [x, s], name="scale")
    b.output(weighted_loss(b, y, X.shape), np.float32, ())
    compare(b.build(), {"x": X}, ["s"], ["s"])


def test_a_gradient_the_kernels_do_not_give_is_never_zeros(monkeypatch):
    """Where the lowered kernels would leave a gradient asked for (that the loss depends on)
    without a value, no plan is made: the reference path computes it, ``unplanned`` says why.
    Simulated with a Relu kernel that has no backward."""
    from meta.lv1.plan import kernels
    from meta.lv1.plan.builder import Lowered

    def forward_only(ctx, node, op):
        lowered = kernels.python_node(ctx, node)
        return Lowered(node, None, lowered.kind)

    monkeypatch.setitem(kernels.KERNELS, "Relu", forward_only)
    b = GraphBuilder("relu", 17)
    x = b.input("x", np.float32, X.shape)
    y = b.node("Relu", [x], name="relu")
    b.output(weighted_loss(b, y, X.shape), np.float32, ())
    graph = b.build()
    _, want = ReferenceExecutor(graph).inference_and_backprop({"x": X}, "loss", wrt=["x"])
    planned = PlannedExecutor(graph)
    _, got = planned.inference_and_backprop({"x": X}, "loss", wrt=["x"])
    assert planned.unplanned is not None and "wrt 'x'" in planned.unplanned, planned.unplanned
    assert np.any(want["x"] != 0)
    np.testing.assert_allclose(got["x"], want["x"], rtol=1e-6)


@pytest.mark.parametrize("equation,shapes", [("->", [()]), ("ij,->ij", [(2, 3), ()]),
                                             (",->", [(), ()])])
def test_einsum_gives_0d_operands_0d_gradients(equation, shapes):
    """ONNX's test_einsum_scalar: a 0-d operand's gradient is 0-d (numpy's ascontiguousarray
    made it (1,), and the reference refused the backward), on both executors."""
    b = GraphBuilder("einsum0", 20)
    names = [b.input(f"x{i}", np.float32, s) for i, s in enumerate(shapes)]
    b.node("ReduceSum", [b.node("Einsum", names, name="e", equation=equation)], name="loss",
           keepdims=0)
    b.output("loss", np.float32, ())
    graph = b.build()
    rng = np.random.default_rng(0)
    feeds = {n: np.asarray(rng.standard_normal(s), np.float32) for n, s in zip(names, shapes)}
    ref = ReferenceExecutor(graph).train().inference_and_backprop(feeds, wrt=list(feeds))[1]
    ours = PlannedExecutor(graph).train().inference_and_backprop(feeds, wrt=list(feeds))[1]
    for n, s in zip(names, shapes):
        assert ref[n].shape == s and ours[n].shape == s
        np.testing.assert_allclose(ours[n], ref[n], rtol=1e-6)
    other = feeds[names[-1]] if len(names) > 1 else np.float32(1)
    if equation == "ij,->ij":
        np.testing.assert_allclose(ref[names[1]], feeds[names[0]].sum(), rtol=1e-5)
    elif equation == ",->":
        np.testing.assert_allclose(ref[names[0]], other, rtol=1e-6)
