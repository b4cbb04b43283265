"""If, Loop and Scan through the executors: subgraphs read the enclosing graph's tensors
(nested too), run in the executor's mode, and pass gradients back to the parameters they read."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from meta.lv0 import native
from meta.lv1 import NativeExecutor, ReferenceExecutor, from_onnx

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _v(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def loop_model(trips=3):
    """h <- tanh(h W + x_i) over the rows of x (Gather by iteration number); an If in the body
    adds the bias b (an initializer two scopes out) on even iterations; loss = sum(h^2)."""
    add_b = helper.make_graph([helper.make_node("Add", ["z", "b"], ["zb"])], "then", [],
                              [_v("zb")])
    keep = helper.make_graph([helper.make_node("Identity", ["z"], ["zi"])], "else", [],
                             [_v("zi")])
    body = helper.make_graph([
        helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
        helper.make_node("Gather", ["x", "i"], ["x_i"], axis=0),
        helper.make_node("Add", ["hw", "x_i"], ["z"]),
        helper.make_node("Mod", ["i", "two"], ["odd"]),
        helper.make_node("Equal", ["odd", "zero"], ["even"]),
        helper.make_node("If", ["even"], ["zz"], then_branch=add_b, else_branch=keep),
        helper.make_node("Tanh", ["zz"], ["h_out"]),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
    ], "body", [_v("i", I64, []), _v("c_in", B, []), _v("h_in", F, [1, 3])],
        [_v("c_out", B, []), _v("h_out", F, [1, 3]), _v("h_out_scan", F, [1, 3])])
    body.node.append(helper.make_node("Identity", ["h_out"], ["h_out_scan"]))
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("W", rng.standard_normal((3, 3)).astype(np.float32) * 0.5),
        ("b", rng.standard_normal(3).astype(np.float32)),
        ("h0", np.zeros((1, 3), np.float32)), ("M", np.array(trips, np.int64)),
        ("two", np.array(2, np.int64)), ("zero", np.array(0, np.int64)),
        ("yes", np.array(True)))]
    graph = helper.make_graph([
        helper.make_node("Loop", ["M", "yes", "h0"], ["h", "hs"], body=body),
        helper.make_node("Mul", ["h", "h"], ["h2"]),
        helper.make_node("ReduceSum", ["h2"], ["loss"], keepdims=0),
    ], "rnn", [_v("x", F, [trips, 1, 3])], [_v("loss", F, []), _v("hs")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def numpy_loss(W, b, x):
    h = np.zeros((1, 3))
    for i in range(len(x)):
        z = h @ W + x[i] + (b if i % 2 == 0 else 0)
        h = np.tanh(z)
    return float((h * h).sum())


def test_loop_with_nested_if_forward_and_parameter_gradients():
    graph = from_onnx(loop_model())
    assert set(graph.parameters) == {"W", "b", "h0"}  # W, b read only inside subgraphs
    x = np.random.default_rng(1).standard_normal((3, 1, 3)).astype(np.float32)
    ex = ReferenceExecutor(graph)
    values, grads = ex.inference_and_backprop({"x": x}, "loss", outputs=["hs"], wrt=["x"])
    W, b = graph.initializers["W"].astype(np.float64), graph.initializers["b"].astype(np.float64)
    assert values["loss"] == pytest.approx(numpy_loss(W, b, x.astype(np.float64)), rel=1e-5)
    assert values["hs"].shape == (3, 1, 3)
    eps = 1e-6
    for name, value in (("W", W), ("b", b), ("x", x.astype(np.float64))):
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            args = {"W": W, "b": b, "x": x.astype(np.float64)}
            up, down = value.copy(), value.copy()
            up[index] += eps
            down[index] -= eps
            numeric[index] = (numpy_loss(**{**args, name: up})
                              - numpy_loss(**{**args, name: down})) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-3, atol=1e-5, err_msg=name)
    # inference keeps no tape and gives the same loss; profiling sees the body's nodes
    ex = ReferenceExecutor(graph, profile=True)
    assert ex.inference({"x": x})["loss"] == pytest.approx(values["loss"])
    ops = {r.op_type for r in ex.profile_table().rows}
    assert {"Loop", "MatMul", "If", "Tanh"} <= ops


def test_subgraphs_run_in_the_executors_mode():
    """Dropout inside an If branch drops after train() and not after eval()."""
    branch = helper.make_graph([helper.make_node("Dropout", ["x", "ratio"], ["d"], seed=0)],
                               "then", [], [_v("d")])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)], "g",
        [_v("x", F, [100]), _v("c", B, [])], [_v("y")],
        [numpy_helper.from_array(np.array(0.5, np.float32), "ratio")])
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x, c = np.ones(100, np.float32), np.array(True)
    ex = ReferenceExecutor(model)
    assert (ex.eval().inference({"x": x, "c": c})["y"] == 1).all()
    assert (ex.train().inference({"x": x, "c": c})["y"] == 0).any()


def test_scan_gradients_reach_the_initial_state_and_the_sequence():
    body = helper.make_graph([helper.make_node("Mul", ["s_in", "x_t"], ["p"]),
                              helper.make_node("Add", ["p", "u"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])], "body",
                             [_v("s_in", F, [2]), _v("x_t", F, [2])],
                             [_v("s_out", F, [2]), _v("y_t", F, [2])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1),
         helper.make_node("ReduceSum", ["ys"], ["loss"], keepdims=0)], "g",
        [_v("s0", F, [2]), _v("xs", F, [3, 2])], [_v("loss", F, [])],
        [numpy_helper.from_array(np.array([0.5, -1.0], np.float32), "u")])
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    s0 = np.array([1.0, 2.0], np.float32)
    xs = np.array([[2.0, 1.0], [0.5, 3.0], [1.0, -1.0]], np.float32)
    _, grads = ReferenceExecutor(model).inference_and_backprop({"s0": s0, "xs": xs}, "loss",
                                                               wrt=["s0", "xs"])
    # s1 = s0 x0 + u, s2 = s1 x1 + u, s3 = s2 x2 + u; loss = sum(s1 + s2 + s3)
    x0, x1, x2 = xs
    np.testing.assert_allclose(grads["s0"], x0 * (1 + x1 * (1 + x2)), rtol=1e-6)
    np.testing.assert_allclose(grads["u"], 1 + (1 + x2) + x1 * (1 + x2) + 1, rtol=1e-6)


@pytest.mark.skipif(not native.available(), reason="the native extension is not built")
def test_native_executor_runs_subgraphs_on_its_kernels():
    graph = from_onnx(loop_model())
    x = np.random.default_rng(2).standard_normal((3, 1, 3)).astype(np.float32)
    ours = NativeExecutor(graph).inference_and_backprop({"x": x}, "loss")
    ref = ReferenceExecutor(graph).inference_and_backprop({"x": x}, "loss")
    assert ours[0]["loss"] == pytest.approx(ref[0]["loss"], rel=1e-5)
    for name in ("W", "b"):
        np.testing.assert_allclose(ours[1][name], ref[1][name], rtol=1e-4, atol=1e-6)
