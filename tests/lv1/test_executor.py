from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import (
    ExecutionError,
    GraphBuilder,
    GraphError,
    ReferenceExecutor,
    mlp,
)


def tiny_mlp(dtype=np.float64):
    return mlp(input_shape=(2, 3), hidden=(5, 4), classes=3, seed=1, dtype=dtype)


def feeds(n=6, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal((n, 2, 3)).astype(dtype),
            "labels": rng.integers(0, 3, n)}


def test_inference_shapes_and_pruning():
    ex = ReferenceExecutor(mlp(hidden=[16]))
    x = np.zeros((3, 1, 28, 28), np.float32)
    out = ex.inference({"input": x}, ["logits"])  # labels not needed for logits
    assert out["logits"].shape == (3, 10) and out["logits"].dtype == np.float32
    with pytest.raises(GraphError, match="'labels' is needed but was not fed"):
        ex.inference({"input": x})


def test_backprop_matches_finite_differences_through_the_whole_graph():
    graph = tiny_mlp()
    ex = ReferenceExecutor(graph)
    f = feeds()
    _, grads = ex.inference_and_backprop(f)
    eps = 1e-6
    for name, param in graph.parameters.items():
        numeric = np.zeros_like(param)
        for i in np.ndindex(param.shape):
            saved = param[i]
            param[i] = saved + eps
            plus = float(ex.inference(f, ["loss"])["loss"])
            param[i] = saved - eps
            minus = float(ex.inference(f, ["loss"])["loss"])
            param[i] = saved
            numeric[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, atol=1e-7, rtol=1e-5, err_msg=name)


def test_native_backend_gives_the_same_gradients():
    graph = tiny_mlp(np.float32)
    f = feeds(dtype=np.float32)
    ref = ReferenceExecutor(graph).inference_and_backprop(f)[1]
    nat = ReferenceExecutor(graph, backends=("native",))
    assert type(nat.ops["relu0"]).__name__ == "NativeRelu"
    for name, g in nat.inference_and_backprop(f)[1].items():
        np.testing.assert_allclose(g, ref[name], rtol=1e-5, atol=1e-6)


def test_a_tensor_used_twice_accumulates_its_gradients():
    b = GraphBuilder("shared")
    x = b.input("x", np.float64, (2, 3))
    labels = b.input("labels", np.int64, (2,))
    w = b.initializer("w", np.random.default_rng(0).standard_normal((4, 3)))
    h = b.node("Gemm", [x, w], transB=1)
    y = b.node("Gemm", [x, w, h], transB=1)  # w feeds two nodes: y = 2 x w^T
    loss = b.node("SoftmaxCrossEntropyLoss", [y, labels], name="loss")
    b.output(loss, np.float64)
    graph = b.build()
    ex = ReferenceExecutor(graph)
    f = {"x": np.random.default_rng(1).standard_normal((2, 3)), "labels": np.array([1, 3])}
    grad = ex.inference_and_backprop(f)[1]["w"]
    wv, eps, numeric = graph.initializers["w"], 1e-6, np.zeros((4, 3))
    for i in np.ndindex(wv.shape):
        saved = wv[i]
        wv[i] = saved + eps
        plus = float(ex.inference(f, ["loss"])["loss"])
        wv[i] = saved - eps
        numeric[i] = (plus - float(ex.inference(f, ["loss"])["loss"])) / (2 * eps)
        wv[i] = saved
    np.testing.assert_allclose(grad, numeric, atol=1e-7, rtol=1e-5)


def test_unknown_op_fails_when_the_executor_is_built():
    b = GraphBuilder("bad")
    x = b.input("x", np.float32, (2,))
    b.output(b.node("Frobnicate", [x], name="frob"), np.float32)
    with pytest.raises(GraphError, match=r"node 'frob' \(Frobnicate\).*'Frobnicate'.*opset 17"):
        ReferenceExecutor(b.build())


def test_bad_attribute_names_the_node():
    b = GraphBuilder("bad")
    x = b.input("x", np.float32, (2, 2))
    b.output(b.node("Flatten", [x], name="flat", axes=1), np.float32)
    with pytest.raises(GraphError, match=r"node 'flat' \(Flatten\).*unknown attribute"):
        ReferenceExecutor(b.build())


def test_dangling_input_names_the_node():
    b = GraphBuilder("bad")
    b.input("x", np.float32, (2,))
    b.node("Relu", ["nowhere"], name="r")
    with pytest.raises(GraphError, match=r"node 'r' \(Relu\): input 'nowhere'"):
        b.build()


def test_feed_checks_name_the_input():
    ex = ReferenceExecutor(tiny_mlp())
    f = feeds()
    with pytest.raises(GraphError, match="'input': expected float64, got float32"):
        ex.inference({**f, "input": f["input"].astype(np.float32)})
    with pytest.raises(GraphError, match=r"'input': expected shape \['N', 2, 3\], got \[6, 3, 2\]"):
        ex.inference({**f, "input": f["input"].reshape(6, 3, 2)})
    with pytest.raises(GraphError, match="feeds \\['inptu'\\] are not inputs"):
        ex.inference({**f, "inptu": f["input"]})


def test_runtime_failure_names_node_and_shapes():
    ex = ReferenceExecutor(tiny_mlp())
    f = feeds()
    f["labels"] = np.zeros(5, np.int64)  # one label short
    with pytest.raises(ExecutionError, match=r"node 'loss' \(SoftmaxCrossEntropyLoss\) failed "
                                             r"on inputs \(logits: float64\[6, 3\]"):
        ex.inference(f, ["loss"])
