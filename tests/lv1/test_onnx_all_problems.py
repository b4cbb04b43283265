"""Loading a model that meta cannot run names every problem at once, not the first one."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from meta.lv1 import ONNXLoadError, from_onnx


def _vi(name: str):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3])


def _model(nodes, opsets):
    graph = helper.make_graph(nodes, "g", [_vi("x")], [_vi(nodes[-1].output[0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def test_every_unknown_op_opset_and_attribute_is_listed_in_one_error():
    nodes = [helper.make_node("Frobnicate", ["x"], ["a"], name="frob"),
             helper.make_node("Relu", ["a"], ["b"], name="fine"),
             helper.make_node("Twiddle", ["b"], ["c"], name="tw", domain="com.example"),
             helper.make_node("Relu", ["c"], ["d"], name="bad_attr", alpha=0.5),
             helper.make_node("Frobnicate", ["d"], ["e"], name="frob2")]
    with pytest.raises(ONNXLoadError) as info:
        from_onnx(_model(nodes, [("", 17), ("com.example", 3)]))
    err = info.value
    assert len(err.problems) == 4, str(err)
    text = str(err)
    assert "4 nodes cannot be run" in text
    for expected in (r"node 'frob' (Frobnicate): op 'Frobnicate' (domain 'ai.onnx', opset 17)",
                     r"node 'tw' (Twiddle): op 'Twiddle' (domain 'com.example', opset 3)",
                     r"node 'bad_attr' (Relu): Relu: unknown attribute(s) alpha",
                     r"node 'frob2' (Frobnicate)"):
        assert expected in text, text
    assert "'fine'" not in text


def test_problems_inside_subgraphs_are_listed_with_their_parent():
    then = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["t"], name="inner")],
                             "then", [], [_vi("t")])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["f"], name="ok")],
                              "else", [], [_vi("f")])
    cond = helper.make_node("Constant", [], ["c"], name="cond",
                            value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    branch = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then,
                              else_branch=other)
    graph = helper.make_graph([cond, branch, helper.make_node("Nope", ["y"], ["z"], name="n")],
                              "g", [_vi("x")], [_vi("z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ONNXLoadError) as info:
        from_onnx(model)
    text = str(info.value)
    assert "subgraph 'then': node 'inner' (Frobnicate)" in text, text
    assert "node 'n' (Nope)" in text, text


def test_a_single_problem_keeps_the_one_line_message():
    nodes = [helper.make_node("Frobnicate", ["x"], ["a"], name="frob")]
    with pytest.raises(ONNXLoadError, match=r"^model 'g': node 'frob' \(Frobnicate\): op "
                                            r"'Frobnicate' \(domain 'ai.onnx', opset 17\): no "
                                            r"such operator is registered$"):
        from_onnx(_model(nodes, [("", 17)]))
