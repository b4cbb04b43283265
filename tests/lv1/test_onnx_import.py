"""ONNX import of real-world files: dtypes, external data, shadowed initializers, opsets,
subgraphs, and one clear error for each kind of malformed model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from meta.lv0 import Operator, register
from meta.lv0.registry import _REGISTRY
from meta.lv1 import (
    GraphError,
    ONNXLoadError,
    ReferenceExecutor,
    from_onnx,
    mlp,
    save_onnx,
    shape_inference,
)


def model(nodes, inputs, outputs, initializers=(), opset=17, domain="", value_info=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers),
                              value_info=list(value_info))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    m.ir_version = 8
    return m


def vi(name, elem=TensorProto.FLOAT, shape=(2, 3)):
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def gemm_model(weight: onnx.TensorProto, **kw):
    node = helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)
    return model([node], [vi("x", shape=(2, 3))], [vi("y", shape=(2, 4))], [weight], **kw)


@pytest.fixture
def double13():
    """A default-domain op registered from opset 13 only for these tests (then removed), so
    opset checks do not depend on which versions of real ops are registered today."""

    @register("MetaTestDouble", since=13)
    class Double(Operator):
        def forward(self, ctx, x):
            return 2 * x

    yield "MetaTestDouble"
    _REGISTRY.pop(("", "MetaTestDouble"))


# -- what must load -----------------------------------------------------------------------
@pytest.mark.parametrize("elem,expected", [
    (TensorProto.FLOAT16, np.float32), (TensorProto.BFLOAT16, np.float32),
    (TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64),
    (TensorProto.INT8, np.int8), (TensorProto.UINT8, np.uint8), (TensorProto.INT16, np.int16),
    (TensorProto.INT32, np.int32), (TensorProto.INT64, np.int64), (TensorProto.BOOL, np.bool_),
    (TensorProto.UINT16, np.uint16), (TensorProto.UINT32, np.uint32),
    (TensorProto.UINT64, np.uint64), (TensorProto.INT4, np.int8),
    (TensorProto.FLOAT8E4M3FN, np.float32),
])
def test_every_numeric_initializer_dtype_loads(elem, expected):
    values = [1, 0, 1, 1, 0, 1]
    t = helper.make_tensor("c", elem, [2, 3], values)
    m = model([helper.make_node("Identity", ["x"], ["y"])], [vi("x")], [vi("y")], [t])
    g = from_onnx(m, check_operators=False)
    assert g.initializers["c"].dtype == expected
    np.testing.assert_array_equal(g.initializers["c"].astype(np.float64).ravel(), values)


def test_half_precision_parameters_compute_in_float32():
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float16)
    g = from_onnx(gemm_model(numpy_helper.from_array(w, "w")))
    assert g.parameters["w"].dtype == np.float32
    x = np.ones((2, 3), np.float32)
    y = ReferenceExecutor(g).inference({"x": x})["y"]
    np.testing.assert_allclose(y, x @ w.astype(np.float32).T, rtol=1e-6)


def test_external_data_is_loaded(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    m = gemm_model(numpy_helper.from_array(w, "w"))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").is_file()
    np.testing.assert_array_equal(from_onnx(path).initializers["w"], w)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (tmp_path / "weights.bin").rename(moved / "weights.bin")
    np.testing.assert_array_equal(from_onnx(path, base_dir=moved).initializers["w"], w)


def test_a_graph_input_shadowing_an_initializer_is_an_optional_feed():
    w = np.ones((4, 3), np.float32)
    node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    m = model([node], [vi("x"), vi("w", shape=(4, 3))], [vi("y", shape=(2, 4))],
              [numpy_helper.from_array(w, "w")])
    g = from_onnx(m)
    ex = ReferenceExecutor(g)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(ex.inference({"x": x})["y"], np.full((2, 4), 3.0))
    np.testing.assert_array_equal(ex.inference({"x": x, "w": 2 * w})["y"], np.full((2, 4), 6.0))
    with pytest.raises(GraphError, match="'w': expected shape"):
        ex.inference({"x": x, "w": np.ones((3, 3), np.float32)})


@pytest.mark.parametrize("opset", [7, 11, 12, 13, 17, 21])
@pytest.mark.parametrize("domain", ["", "ai.onnx"])
def test_opsets_and_both_spellings_of_the_default_domain(double13, opset, domain):
    m = model([helper.make_node(double13, ["x"], ["y"], domain=domain)], [vi("x")], [vi("y")],
              opset=opset, domain=domain)
    if opset < 13:
        with pytest.raises(ONNXLoadError, match=rf"'{double13}'.*opset {opset}.*from opset 13"):
            from_onnx(m)
        return
    g = from_onnx(m)
    assert g.opset == {"": opset} and g.nodes[0].domain == ""
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(ReferenceExecutor(g).inference({"x": x})["y"], 2 * x)


def test_constant_nodes_subgraphs_and_value_info_are_kept():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t")])
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        np.array(True)))
    branch = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then)
    m = model([const, branch], [vi("x")], [vi("y")], value_info=[vi("c", TensorProto.BOOL, ())])
    g = from_onnx(m, check_operators=False)
    assert g.nodes[0].attrs["value"].dtype == np.bool_
    sub = g.nodes[1].attrs["then_branch"]
    assert sub.nodes[0].op_type == "Relu" and sub.free_names() == {"x"}
    assert g.value_info["c"].dtype == np.bool_ and g.value_info["c"].shape == ()
    assert shape_inference(g)["c"] == (np.dtype(np.bool_), ())


def test_round_trip_through_a_file(tmp_path):
    g = from_onnx(save_onnx(mlp(hidden=[4]), tmp_path / "m.onnx"))
    assert [n.op_type for n in g.nodes] == ["Flatten", "Gemm", "Relu", "Gemm",
                                            "SoftmaxCrossEntropyLoss"]


# -- fifteen malformed models, one clear message each --------------------------------------
def test_01_truncated_file(tmp_path):
    good = save_onnx(mlp(hidden=[4]), tmp_path / "good.onnx").read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(good[: len(good) // 3])
    with pytest.raises(ONNXLoadError, match="truncated.onnx: not a readable ONNX model, "
                                            "truncated or not protobuf"):
        from_onnx(path)


def test_02_empty_file(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(ONNXLoadError, match="empty.onnx: empty file, not an ONNX model"):
        from_onnx(tmp_path / "empty.onnx")


def test_03_not_protobuf(tmp_path):
    (tmp_path / "text.onnx").write_text("this is a text file, not a model\n")
    with pytest.raises(ONNXLoadError, match="text.onnx: not (a readable ONNX model|an ONNX "
                                            "model)"):
        from_onnx(tmp_path / "text.onnx")


def test_04_unknown_op_fails_at_load_naming_op_domain_opset_and_node():
    m = model([helper.make_node("Frobnicate", ["x"], ["y"], name="frob")], [vi("x")], [vi("y")])
    with pytest.raises(ONNXLoadError, match=r"node 'frob' \(Frobnicate\): op 'Frobnicate' "
                                            r"\(domain 'ai.onnx', opset 17\): no such operator"):
        from_onnx(m)


def test_05_unsupported_opset_for_an_op_and_for_the_model(double13):
    m = model([helper.make_node(double13, ["x"], ["y"], name="d")], [vi("x")], [vi("y")],
              opset=12)
    with pytest.raises(ONNXLoadError, match=rf"node 'd' \({double13}\).*opset 12.*only from "
                                            r"opset 13"):
        from_onnx(m)
    old = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi("y")], opset=5)
    with pytest.raises(ONNXLoadError, match="default-domain opset 5 is not supported"):
        from_onnx(old)


def test_06_dangling_input():
    m = model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [vi("x")], [vi("y")])
    with pytest.raises(ONNXLoadError, match=r"node 'r' \(Relu\): input 'nowhere' is not a graph "
                                            r"input"):
        from_onnx(m)


def test_07_duplicate_output_names():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="a"),
             helper.make_node("Relu", ["x"], ["y"], name="b")]
    with pytest.raises(ONNXLoadError, match=r"tensor 'y' is produced by both node 'a' \(Relu\) "
                                            r"and node 'b' \(Relu\)"):
        from_onnx(model(nodes, [vi("x")], [vi("y")]))
    one = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(ONNXLoadError, match="output 'y' is listed twice"):
        from_onnx(model(one, [vi("x")], [vi("y"), vi("y")]))


def test_08_cycle():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="n1"),
             helper.make_node("Relu", ["a"], ["b"], name="n2")]
    with pytest.raises(ONNXLoadError, match=r"has a cycle through node 'n1' \(Relu\), node 'n2'"):
        from_onnx(model(nodes, [vi("x")], [vi("b")]))


def test_09_wrong_input_rank_fed():
    ex = ReferenceExecutor(from_onnx(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x")],
                                           [vi("y")])))
    with pytest.raises(GraphError, match=r"input 'x': expected shape \[2, 3\], got \[6\]"):
        ex.inference({"x": np.ones(6, np.float32)})


def test_10_dtype_mismatch_fed():
    ex = ReferenceExecutor(from_onnx(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x")],
                                           [vi("y")])))
    with pytest.raises(GraphError, match="input 'x': expected float32, got int64"):
        ex.inference({"x": np.ones((2, 3), np.int64)})


def test_11_initializer_with_bad_or_missing_data():
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 3])
    with pytest.raises(ONNXLoadError, match=r"initializer 'w' \(type FLOAT, dims \[4, 3\]\): "
                                            r"its data cannot be read"):
        from_onnx(gemm_model(t))
    t.raw_data = b"\x00" * 10  # 10 bytes for 12 floats
    with pytest.raises(ONNXLoadError, match="initializer 'w'.*cannot be read"):
        from_onnx(gemm_model(t))


def test_12_missing_external_data_file(tmp_path):
    m = gemm_model(numpy_helper.from_array(np.ones((4, 3), np.float32), "w"))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ONNXLoadError, match=r"m.onnx: initializer 'w' keeps its data in external "
                                            r"file .*weights.bin, which does not exist"):
        from_onnx(path)


def test_13_node_with_unknown_attribute():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r", alpha=0.1)], [vi("x")],
              [vi("y")])
    with pytest.raises(ONNXLoadError, match=r"node 'r' \(Relu\): Relu: unknown attribute\(s\) "
                                            r"alpha"):
        from_onnx(m)


def test_14_graph_output_never_produced():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi("y"), vi("z")])
    with pytest.raises(ONNXLoadError, match="output 'z' is not produced by any node"):
        from_onnx(m)


def test_15_empty_graph_or_no_outputs():
    with pytest.raises(ONNXLoadError, match="graph 'g' has no outputs"):
        from_onnx(model([], [vi("x")], []))
    with pytest.raises(ONNXLoadError, match="not an ONNX model \\(it has no graph\\)"):
        from_onnx(onnx.ModelProto(ir_version=8))


def test_16_missing_file_and_no_opset(tmp_path):
    with pytest.raises(ONNXLoadError, match="nothere.onnx: no such ONNX file"):
        from_onnx(tmp_path / "nothere.onnx")
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi("y")])
    del m.opset_import[:]
    with pytest.raises(ONNXLoadError, match="imports no opset"):
        from_onnx(m)
