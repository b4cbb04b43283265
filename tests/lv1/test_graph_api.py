"""Graph editing, parameters, shape inference, and feeding/fetching any tensor."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphError, Node, ReferenceExecutor, mlp, shape_inference


def tiny():
    return mlp(input_shape=(2, 3), hidden=(5,), classes=3, seed=1, dtype=np.float64)


def feeds(n=4):
    rng = np.random.default_rng(0)
    return {"input": rng.standard_normal((n, 2, 3)), "labels": rng.integers(0, 3, n)}


def test_list_nodes_and_parameters():
    g = tiny()
    assert [n.name for n in g.nodes] == ["flatten", "fc0", "relu0", "logits", "loss"]
    assert g.node("fc0").op_type == "Gemm"
    assert set(g.parameters) == {"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"}
    assert g.parameters["fc0.weight"] is g.initializers["fc0.weight"]  # updates in place
    assert [n.name for n in g.consumers()["fc0"]] == ["relu0"]
    with pytest.raises(GraphError, match="has no node 'nope'"):
        g.node("nope")


def test_insert_replace_remove_keep_the_graph_runnable():
    g = tiny()
    f = feeds()
    before = ReferenceExecutor(g).inference(f, ["logits"])["logits"]
    # Insert a second Relu after relu0 (idempotent), rewire logits to read it.
    g.insert(Node("Relu", ["relu0"], ["relu0b"], "relu0b"), after="relu0")
    g.node("logits").inputs[0] = "relu0b"
    assert [n.name for n in g.sorted_nodes()][:4] == ["flatten", "fc0", "relu0", "relu0b"]
    np.testing.assert_array_equal(ReferenceExecutor(g).inference(f, ["logits"])["logits"], before)
    # Replace it by a LeakyRelu(alpha=0) chain that produces the same tensor name.
    g.replace("relu0b", Node("LeakyRelu", ["relu0"], ["relu0b"], "leaky", attrs={"alpha": 0.0}))
    assert g.node("leaky").op_type == "LeakyRelu"
    np.testing.assert_array_equal(ReferenceExecutor(g).inference(f, ["logits"])["logits"], before)
    # An insertion placed too early is re-sorted after its producer.
    g.insert(Node("Relu", ["logits"], ["late"], "late"), before="flatten")
    assert [n.name for n in g.nodes].index("late") > [n.name for n in g.nodes].index("logits")


def test_edits_that_break_the_graph_are_refused_and_leave_it_unchanged():
    g = tiny()
    names = [n.name for n in g.nodes]
    with pytest.raises(GraphError, match=r"node 'logits' \(Gemm\): input 'relu0' is not"):
        g.remove("relu0")
    with pytest.raises(GraphError, match="tensor 'fc0' is produced by both"):
        g.insert(Node("Relu", ["flatten"], ["fc0"], "dup"))
    with pytest.raises(GraphError, match="cycle"):
        g.replace("relu0", Node("Relu", ["logits"], ["relu0"], "relu0"))
    with pytest.raises(GraphError, match="used twice"):
        g.insert(Node("Relu", ["fc0"], ["x2"], "fc0"))
    with pytest.raises(GraphError, match="output 'loss' is not produced by any node"):
        g.remove("loss")
    assert [n.name for n in g.nodes] == names
    g.outputs = [t for t in g.outputs if t.name != "loss"]  # outputs are the caller's to edit
    g.remove("loss")
    assert [n.name for n in g.nodes] == names[:-1]


def test_shape_inference_names_every_tensor():
    shapes = shape_inference(tiny())
    assert shapes["fc0"] == (np.dtype(np.float64), ("N", 5))
    assert shapes["logits"] == (np.dtype(np.float64), ("N", 3))
    assert shapes["fc0.weight"] == (np.dtype(np.float64), (5, 6))
    assert shapes["labels"][0] == np.dtype(np.int64)


def test_fetch_and_feed_any_intermediate():
    g = tiny()
    ex = ReferenceExecutor(g)
    f = feeds()
    got = ex.inference(f, ["fc0", "relu0", "logits"])
    np.testing.assert_array_equal(got["relu0"], np.maximum(got["fc0"], 0))
    # Feeding relu0 cuts off flatten, fc0 and relu0: input is not needed any more.
    fed = np.ones_like(got["relu0"])
    out = ex.inference({"relu0": fed}, ["logits"])["logits"]
    w, b = g.initializers["fc1.weight"], g.initializers["fc1.bias"]
    np.testing.assert_allclose(out, fed @ w.T + b)
    # A fed intermediate also wins when its producer still runs for another output.
    both = ex.inference({**f, "relu0": fed}, ["fc0", "logits"])
    np.testing.assert_array_equal(both["fc0"], got["fc0"])
    np.testing.assert_allclose(both["logits"], out)
    with pytest.raises(GraphError, match=r"feeds \['nothing'\] are not inputs"):
        ex.inference({"nothing": fed}, ["logits"])


def test_backprop_stops_at_a_fed_intermediate():
    g = tiny()
    ex = ReferenceExecutor(g)
    f = feeds()
    relu = ex.inference(f, ["relu0"])["relu0"]
    _, grads = ex.inference_and_backprop({"relu0": relu, "labels": f["labels"]})
    _, full = ex.inference_and_backprop(f)
    assert not grads["fc0.weight"].any()  # cut off by the feed
    np.testing.assert_allclose(grads["fc1.weight"], full["fc1.weight"])
