"""Fused pointwise groups (meta/lv1/plan/lowering/fused.py, cpp/plan/fused.cpp): each covered
op, with broadcasting, forward and backward equal to the reference executor's (gradients asked
by an initializer's name and by a feed, feeds pickled on the way in); a chain (GPT-2's
tanh-GELU) as one step; bool results leaving a group as bool; the masked_fill ``Where``
before a softmax taken into the fused attention; the ONNX node suite's cases of the covered
ops through the fused path."""

from __future__ import annotations

import importlib.util
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor, from_onnx
from meta.lv1.plan import kernels, runtime
from meta.lv1.plan.lowering import fused

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

RNG = np.random.default_rng(0)
SHAPE = (3, 4, 5)
ROOT = Path(__file__).resolve().parents[2]


def loss_of(b: GraphBuilder, y: str) -> str:
    """sum(y * w), w uneven, so every element's gradient differs (and the Mul joins y's group)."""
    w = b.initializer("loss_w", RNG.uniform(0.5, 1.5, SHAPE).astype(np.float32))
    return b.node("ReduceSum", [b.node("Mul", [y, w], name="weigh")], name="loss", keepdims=0)


def positive(shape):
    return RNG.uniform(0.5, 2.0, shape).astype(np.float32)


def normal(shape):
    return RNG.standard_normal(shape).astype(np.float32)


def with_ties(shape):
    """Values with repeats (Min/Max ties, Equal true somewhere)."""
    return np.round(RNG.standard_normal(shape) * 2).astype(np.float32) / 2


# op -> (build(b, x, p) -> output, x's values, p's values (broadcast: shape (4, 1)))
def binary(op):
    return lambda b, x, p: b.node(op, [x, p], name="op")


def unary(op):
    return lambda b, x, p: b.node(op, [b.node("Mul", [x, p], name="pre")], name="op")


def compare(op):
    def build(b, x, p):
        return b.node("Where", [b.node(op, [x, p], name="op"), x, p], name="pick")
    return build


CASES = {
    "Add": (binary("Add"), normal, normal),
    "Sub": (binary("Sub"), normal, normal),
    "Mul": (binary("Mul"), normal, normal),
    "Div": (binary("Div"), normal, positive),
    "Pow_tensor": (binary("Pow"), positive, normal),
    "Pow_3": (lambda b, x, p: b.node("Pow", [b.node("Mul", [x, p], name="pre"), b.initializer(
        "three", np.array(3.0, np.float32))], name="op"), normal, normal),
    "Pow_int_exponent": (lambda b, x, p: b.node("Pow", [b.node("Add", [x, p], name="pre"),
                                                        b.initializer("two", np.array(
                                                            2, np.int64))], name="op"),
                         normal, normal),
    "Sqrt": (unary("Sqrt"), positive, positive),
    "Reciprocal": (unary("Reciprocal"), positive, positive),
    "Exp": (unary("Exp"), normal, normal),
    "Log": (unary("Log"), positive, positive),
    "Tanh": (unary("Tanh"), normal, normal),
    "Erf": (unary("Erf"), normal, normal),
    "Sigmoid": (unary("Sigmoid"), normal, normal),
    "Softplus": (unary("Softplus"), normal, normal),
    "Neg": (unary("Neg"), normal, normal),
    "Abs": (unary("Abs"), normal, normal),
    "Min": (binary("Min"), with_ties, with_ties),
    "Max": (lambda b, x, p: b.node("Max", [x, p, b.initializer("third", with_ties((5,)))],
                                   name="op"), with_ties, with_ties),
    "Clip": (lambda b, x, p: b.node("Clip", [b.node("Mul", [x, p], name="pre"),
                                             b.initializer("lo", np.array(-0.5, np.float32)),
                                             b.initializer("hi", np.array(0.5, np.float32))],
                                    name="op"), with_ties, with_ties),
    "Where": (lambda b, x, p: b.node("Where", [b.initializer("cond", RNG.uniform(
        size=SHAPE) < 0.5), x, p], name="op"), normal, normal),
    "Equal": (compare("Equal"), with_ties, with_ties),
    "Less": (compare("Less"), with_ties, with_ties),
    "LessOrEqual": (compare("LessOrEqual"), with_ties, with_ties),
    "Greater": (compare("Greater"), with_ties, with_ties),
    "GreaterOrEqual": (compare("GreaterOrEqual"), with_ties, with_ties),
    "Cast_and_Not": (lambda b, x, p: b.node("Mul", [x, b.node("Cast", [b.node(
        "Not", [b.node("Less", [x, p])])], to=1)], name="op"), with_ties, with_ties),
}


def build(case: str, x_values: np.ndarray, p_values: np.ndarray):
    make = CASES[case][0]
    b = GraphBuilder(f"fused_{case}", 17)
    x = b.input("x", np.float32, x_values.shape)
    p = b.initializer("p", p_values)
    y = make(b, x, p)
    b.output(loss_of(b, y), np.float32, ())
    return b.build()


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_op_equals_the_reference_forward_and_backward(case):
    _, xs, ps = CASES[case]
    x_values, p_values = xs(SHAPE), ps((4, 1))  # p broadcast over axes 0 and 2
    graph = build(case, x_values, p_values)
    feeds = {"x": pickle.loads(pickle.dumps(x_values))}
    wrt = ["x", "p"]
    ref_out, ref_grads = ReferenceExecutor(graph).inference_and_backprop(feeds, "loss", wrt=wrt)
    planned = PlannedExecutor(graph)
    out, grads = planned.inference_and_backprop(feeds, "loss", wrt=wrt)
    assert planned.unplanned is None, planned.unplanned
    placement = planned.placement()
    assert placement["weigh"].startswith("fused into"), placement
    assert not any(v.startswith("python") for v in placement.values()), placement
    np.testing.assert_allclose(out["loss"], ref_out["loss"], rtol=1e-6, atol=1e-6)
    for name in wrt:
        assert grads[name].shape == ref_grads[name].shape
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-6, atol=1e-6,
                                   err_msg=f"d loss / d {name}: {placement}")


def gelu_tanh(b: GraphBuilder, x: str) -> str:
    """GPT-2's tanh-GELU as torch.onnx.export writes it: 0.5 x (1 + tanh(c (x + k x^3)))."""
    def const(v):
        return b.initializer(f"c{len(b.build().initializers)}", np.array(v, np.float32))
    half = b.node("Mul", [x, const(0.5)])
    cube = b.node("Pow", [x, const(3.0)])
    inner = b.node("Add", [x, b.node("Mul", [cube, const(0.044715)])])
    t = b.node("Tanh", [b.node("Mul", [inner, const(np.sqrt(2 / np.pi))])])
    return b.node("Mul", [half, b.node("Add", [t, const(1.0)])], name="gelu_out")


def test_the_tanh_gelu_chain_is_one_step_forward_and_backward():
    b = GraphBuilder("gelu_tanh", 17)
    x = b.input("x", np.float32, SHAPE)
    h = b.node("Mul", [x, b.initializer("p", positive((5,)))], name="scale")
    b.output(loss_of(b, gelu_tanh(b, h)), np.float32, ())
    graph = b.build()
    feeds = {"x": normal(SHAPE)}
    ref = ReferenceExecutor(graph).inference_and_backprop(feeds, "loss", wrt=["x", "p"])
    planned = PlannedExecutor(graph)
    out, grads = planned.inference_and_backprop(feeds, "loss", wrt=["x", "p"])
    placement = planned.placement()
    fused_into = {v for v in placement.values() if v.startswith("fused into")}
    assert fused_into == {"fused into scale"}, placement  # scale, the 8 GELU nodes, weigh
    assert sum(v == "fused into scale" for v in placement.values()) == 9, placement
    np.testing.assert_allclose(out["loss"], ref[0]["loss"], rtol=1e-6)
    for name in ("x", "p"):
        np.testing.assert_allclose(grads[name], ref[1][name], rtol=1e-5, atol=1e-6)


def test_a_comparison_leaving_the_group_is_written_as_bool():
    b = GraphBuilder("bool_out", 17)
    x = b.input("x", np.float32, SHAPE)
    scaled = b.node("Mul", [x, b.initializer("s", np.array(2.0, np.float32))], name="scale")
    below = b.node("Less", [scaled, b.initializer("z", np.array(0.5, np.float32))],
                   name="below")
    y = b.node("Where", [below, scaled, x], name="pick")
    b.output(y, np.float32, SHAPE)
    b.output(below, np.bool_, SHAPE)
    graph = b.build()
    feeds = {"x": normal(SHAPE)}
    want = ReferenceExecutor(graph).inference(feeds)
    planned = PlannedExecutor(graph)
    got = planned.inference(feeds)
    assert planned.placement()["below"] == "fused into scale", planned.placement()
    assert got[below].dtype == np.bool_
    np.testing.assert_array_equal(got[below], want[below])
    np.testing.assert_array_equal(got[y], want[y])


def test_a_node_whose_input_comes_later_stays_out_of_the_group():
    """exp(x) and exp(x) * relu(x): the Mul reads the Relu's output, made after the Exp, so
    it cannot run in the Exp's step (it forms its own)."""
    b = GraphBuilder("later", 17)
    x = b.input("x", np.float32, SHAPE)
    e = b.node("Exp", [x], name="exp")
    e2 = b.node("Sigmoid", [e], name="sig")
    r = b.node("Relu", [x], name="relu")
    y = b.node("Mul", [e2, r], name="mul")
    b.output(loss_of(b, b.node("Add", [y, e], name="add")), np.float32, ())
    graph = b.build()
    feeds = {"x": normal(SHAPE)}
    ref = ReferenceExecutor(graph).inference_and_backprop(feeds, "loss", wrt=["x"])
    planned = PlannedExecutor(graph)
    out, grads = planned.inference_and_backprop(feeds, "loss", wrt=["x"])
    placement = planned.placement()
    assert placement["sig"] == "fused into exp" and placement["mul"] != "fused into exp", \
        placement
    np.testing.assert_allclose(grads["x"], ref[1]["x"], rtol=1e-6, atol=1e-6)


def test_gpt_masked_fill_joins_the_fused_attention():
    """The GPT fixture's Where(mask, -inf, scores) before its Softmax: no Python step left."""
    graph = from_onnx(str(ROOT / "tests/fixtures/pytorch/exports/gpt_default.onnx"))
    feeds = {"input": np.array([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]], np.int64)}
    want = ReferenceExecutor(graph).inference(feeds)
    planned = PlannedExecutor(graph)
    got = planned.inference(feeds)
    placement = planned.placement()
    assert placement["node_masked_fill"] == "fused into node_matmul", placement
    assert not any(v.startswith("python") for v in placement.values()), placement
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


def test_a_causal_where_mask_trains_as_the_reference():
    """softmax(Where(tril, scores, -inf)) . V through the fused attention: gradients too."""
    t, d = 6, 4
    b = GraphBuilder("where_attention", 17)
    q = b.input("q", np.float32, (2, t, d))
    k = b.initializer("k", normal((2, d, t)))
    v = b.initializer("v", normal((2, t, d)))
    s = b.node("Div", [b.node("MatMul", [q, k], name="scores"),
                       b.initializer("sqrt_d", np.array(2.0, np.float32))])
    keep = b.initializer("keep", np.tril(np.ones((t, t), bool)))
    m = b.node("Where", [keep, s, b.initializer("ninf", np.array(-np.inf, np.float32))],
               name="mask")
    y = b.node("MatMul", [b.node("Softmax", [m], axis=-1), v])
    w = b.initializer("w", RNG.uniform(0.5, 1.5, (2, t, d)).astype(np.float32))
    b.output(b.node("ReduceSum", [b.node("Mul", [y, w])], name="loss", keepdims=0),
             np.float32, ())
    graph = b.build()
    feeds = {"q": normal((2, t, d))}
    ref = ReferenceExecutor(graph).inference_and_backprop(feeds, "loss", wrt=["q", "k", "v"])
    planned = PlannedExecutor(graph)
    out, grads = planned.inference_and_backprop(feeds, "loss", wrt=["q", "k", "v"])
    assert planned.placement()["mask"] == "fused into scores", planned.placement()
    for name in ("q", "k", "v"):
        np.testing.assert_allclose(grads[name], ref[1][name], rtol=1e-5, atol=1e-6)


COVERED = (r"^test_(add|sub|mul|div|pow|sqrt|reciprocal|exp|log|tanh|erf|sigmoid|softplus|"
           r"neg|abs|min|max|clip|where|equal|less|greater|less_equal|greater_equal|not|and|"
           r"or)(_.*)?$")


@pytest.mark.slow  # about 80 s on the shared machine
def test_the_node_suite_cases_of_the_covered_ops_pass_through_the_fused_path(monkeypatch):
    spec = importlib.util.spec_from_file_location("onnx_node_suite",
                                                  ROOT / "tools" / "onnx_node_suite.py")
    suite = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = suite
    spec.loader.exec_module(suite)
    groups: set[str] = set()  # the op types of every node that ran in a fused step
    members = []
    group_of = fused.group_of

    def recording(ctx, node):
        members[:] = group_of(ctx, node)
        return list(members)

    def counting(ctx, node, op):
        members.clear()
        lowered = fused.fused(ctx, node, op)
        if lowered is not None:
            groups.update(n.op_type for n in members)
        return lowered
    monkeypatch.setattr(fused, "group_of", recording)
    monkeypatch.setattr(kernels, "fused", counting)
    report = suite.planned_report(COVERED)
    assert not report["failed"], report["failed"]
    assert not report["stale"], report["stale"]
    assert len(report["passed"]) > 100 and len(report["graded"]) > 50, \
        {k: len(v) for k, v in report.items()}
    print(sorted(groups))
    for op in ("Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Tanh",
               "Erf", "Sigmoid", "Softplus", "Neg", "Abs", "Min", "Max", "Clip", "Where",
               "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        assert op in groups, (op, sorted(groups))


def test_scalars_0d_through_a_fused_group():
    b = GraphBuilder("scalars", 17)
    x = b.input("x", np.float32, (4,))
    s1 = b.node("ReduceSum", [x], keepdims=0)
    s2 = b.node("Sigmoid", [b.node("ReduceMean", [x], keepdims=0)], name="sigmoid")
    b.node("Sum", [s1, s2, b.node("Mul", [s1, s2], name="mul")], name="loss")
    b.output("loss", np.float32, ())
    graph = b.build()
    feeds = {"x": np.array([0.5, -1.0, 2.0, 0.25], np.float32)}
    ref = ReferenceExecutor(graph).inference_and_backprop(feeds, wrt=["x"])
    planned = PlannedExecutor(graph)
    values, grads = planned.inference_and_backprop(feeds, wrt=["x"])
    assert planned.placement()["mul"] == "fused into sigmoid", planned.placement()
    np.testing.assert_allclose(values["loss"], ref[0]["loss"], rtol=1e-6)
    np.testing.assert_allclose(grads["x"], ref[1]["x"], rtol=1e-6)
