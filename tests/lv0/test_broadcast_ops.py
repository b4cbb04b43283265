"""Focused tests of the tensor operators, beyond what the registry-driven tables check."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from meta.lv0 import Context, check_gradients, lookup
from meta.lv1 import GraphBuilder, ReferenceExecutor


def run(op_type: str, *inputs, opset: int = 21, **attrs):
    """Forward one op; returns (outputs, op, ctx) so a test can call backward."""
    op = lookup(op_type, opset)(**attrs)
    ctx = Context()
    return op.apply(ctx, *inputs), op, ctx


def test_add_broadcasting_both_inputs_gives_each_its_own_gradient_shape():
    a, b = np.ones((2, 1, 4)), np.ones((3, 1))
    (y,), op, ctx = run("Add", a, b)
    assert y.shape == (2, 3, 4)
    da, db = op.backward(ctx, np.ones(y.shape))
    assert da.shape == a.shape and db.shape == b.shape
    np.testing.assert_array_equal(da, np.full(a.shape, 3.0))  # stretched over 3 rows
    np.testing.assert_array_equal(db, np.full(b.shape, 8.0))  # over 2 batches x 4 columns


def test_div_gradient_near_but_not_at_zero():
    a, b = np.array([1.0, -2.0, 3.0]), np.array([1e-3, -2e-3, 5e-4])
    (y,), op, ctx = run("Div", a, b)
    dy = np.array([1.0, 0.5, -1.0])
    da, db = op.backward(ctx, dy)
    np.testing.assert_allclose(da, dy / b, rtol=1e-14)
    np.testing.assert_allclose(db, -dy * a / b**2, rtol=1e-14)
    # Finite differences still agree with a step far below |b|.
    assert check_gradients(lookup("Div", 21)(), [a, b], eps=1e-9, rtol=1e-5).passed


def test_integer_div_truncates_toward_zero():
    (y,), _, _ = run("Div", np.array([7, -7, 7, -7]), np.array([2, 2, -2, -2]))
    assert y.tolist() == [3, -3, -3, 3]


def test_gather_gradient_adds_up_repeated_indices():
    data = np.arange(8.0).reshape(4, 2)
    (y,), op, ctx = run("Gather", data, np.array([1, 1, -3, 3]))
    np.testing.assert_array_equal(y, data[[1, 1, 1, 3]])
    (dx, dindices) = op.backward(ctx, np.ones(y.shape))
    np.testing.assert_array_equal(dx, [[0, 0], [3, 3], [0, 0], [1, 1]])
    assert dindices is None


def test_gather_out_of_range_index_is_an_error_naming_the_op():
    with pytest.raises(IndexError, match=r"Gather: indices must lie in \[-4, 3\]"):
        run("Gather", np.zeros((4, 2)), np.array([4]))


def test_shape_and_constant_contribute_no_gradient_in_a_graph():
    # loss = sum(w * ConstantOfShape(Shape(w), 2.0)) + sum(Constant): dloss/dw = 2.
    b = GraphBuilder("consts")
    w = b.initializer("w", np.ones((2, 3)))
    twos = b.node("ConstantOfShape", [b.node("Shape", [w])], value=np.array([2.0]))
    c = b.node("Constant", [], value=np.array([5.0]))
    prod = b.node("ReduceSum", [b.node("Mul", [w, twos])], keepdims=0)
    b.node("Add", [prod, b.node("ReduceSum", [c], keepdims=0)], name="loss")
    b.output("loss", np.float64, ())
    values, grads = ReferenceExecutor(b.build()).inference_and_backprop({})
    assert values["loss"] == 17.0
    np.testing.assert_array_equal(grads["w"], np.full((2, 3), 2.0))
    assert lookup("Shape", 21)().backward(Context(), None) == (None,)
    assert lookup("Constant", 21)(value_float=1.0).backward(Context(), None) == ()


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
def test_softmax_before_opset_13_normalises_over_the_2d_coercion(op_type):
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    (old,), op, ctx = run(op_type, x, opset=12, axis=1)
    rows = x.reshape(2, 12)
    shifted = rows - rows.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = (logp if op_type == "LogSoftmax" else np.exp(logp)).reshape(x.shape)
    np.testing.assert_allclose(old, expected, rtol=1e-12)
    (new,), _, _ = run(op_type, x, opset=13, axis=1)  # one axis only
    assert not np.allclose(new, old)
    assert check_gradients(op, [x]).passed
    assert check_gradients(lookup(op_type, 12)(), [x]).passed  # default axis 1


def test_sigmoid_saturates_without_overflow_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,), _, _ = run("Sigmoid", np.array([-1000.0, 0.0, 1000.0]))
    assert y.tolist() == [0.0, 0.5, 1.0]


def test_pow_exponent_gradient_is_zero_at_a_zero_base():
    (y,), op, ctx = run("Pow", np.array([0.0, 2.0]), np.array([2.0, 3.0]))
    da, db = op.backward(ctx, np.ones(2))
    np.testing.assert_allclose(da, [0.0, 12.0])
    np.testing.assert_allclose(db, [0.0, 8.0 * np.log(2.0)])


def test_cast_between_float_types_returns_the_gradient_in_the_input_type():
    x = np.array([1.5, -2.25])
    (y,), op, ctx = run("Cast", x, to=1)  # FLOAT
    assert y.dtype == np.float32
    (dx,) = op.backward(ctx, np.ones(2, np.float32))
    assert dx.dtype == np.float64
    (y,), op, ctx = run("Cast", x, to=7)  # INT64
    assert y.tolist() == [1, -2] and op.no_grad_inputs == (0,)
    assert op.backward(ctx, None) == (None,)
    with pytest.raises(ValueError, match="Cast: unsupported target type to=16"):
        run("Cast", x, to=16)  # bfloat16


def test_pad_negative_pads_crop_and_the_gradient_flows_back():
    x = np.arange(12.0).reshape(3, 4)
    pads = np.array([-1, 1, 0, -2])  # crop row 0, add a column before, crop two columns after
    (y,), op, ctx = run("Pad", x, pads, np.array(9.0))
    np.testing.assert_array_equal(y, [[9, 4, 5], [9, 8, 9]])
    assert check_gradients(op, [x, pads, np.array(9.0)]).passed


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_gradient_of_copying_modes_sums_every_copy(mode):
    x = np.random.default_rng(1).standard_normal((2, 3))
    (y,), op, ctx = run("Pad", x, np.array([1, 2, 1, 2]), mode=mode)
    (dx, *_) = op.backward(ctx, np.ones(y.shape))
    assert dx.sum() == y.size  # each output element came from exactly one input element
    assert check_gradients(op, [x, np.array([1, 2, 1, 2])]).passed


def test_split_before_opset_18_splits_evenly_into_the_nodes_outputs():
    x = np.arange(6.0)
    op = lookup("Split", 13)()
    with pytest.raises(ValueError, match="number of outputs must be known"):
        op.apply(Context(), x)
    op.n_outputs = 3  # what graph loading sets from the node
    assert [p.tolist() for p in op.apply(Context(), x)] == [[0, 1], [2, 3], [4, 5]]
    op.n_outputs = 4
    with pytest.raises(ValueError, match="length 6 does not split evenly into 4"):
        op.apply(Context(), x)


def test_split_gradient_fills_unused_outputs_with_zeros():
    (a, b), op, ctx = run("Split", np.arange(5.0), np.array([2, 3]))
    (dx, _) = op.backward(ctx, None, np.ones(3))
    np.testing.assert_array_equal(dx, [0, 0, 1, 1, 1])


@pytest.mark.parametrize("op_type,inputs,attrs,message", [
    ("MatMul", [np.zeros((2, 3)), np.zeros((4, 5))], {}, r"inner dimensions differ: \(2, 3\) @"),
    ("MatMul", [np.zeros((2, 3, 4)), np.zeros((3, 4, 5))], {}, "cannot broadcast batch"),
    ("Add", [np.zeros((2, 3)), np.zeros((4,))], {}, r"Add: cannot broadcast .*\(2, 3\), \(4,\)"),
    ("Concat", [np.zeros((2, 3)), np.zeros((2, 4))], {"axis": 0}, r"\(2, 3\), \(2, 4\)"),
    ("Squeeze", [np.zeros((2, 1)), np.array([0])], {}, "a squeezed axis must have size 1"),
    ("ReduceSum", [np.zeros((2, 3)), np.array([0, -2])], {}, "repeated axis"),
    ("Transpose", [np.zeros((2, 3))], {"perm": [0, 0]}, "not a permutation"),
    ("Slice", [np.zeros(3), np.array([0]), np.array([2]), None, np.array([0])], {}, "step 0"),
    ("Pad", [np.zeros(3), np.array([1])], {}, "begin and an end"),
    ("Pad", [np.zeros(3), np.array([1, 1])], {"mode": "mirror"}, "unknown mode 'mirror'"),
    ("NegativeLogLikelihoodLoss", [np.zeros((2, 3)), np.array([0, 3])], {}, r"\[0, 2\]"),
])
def test_errors_name_the_op_and_shapes(op_type, inputs, attrs, message):
    with pytest.raises((ValueError, IndexError), match=message):
        run(op_type, *inputs, **attrs)


def test_mean_squared_error_refuses_mismatched_shapes_and_has_both_gradients():
    op = lookup("MeanSquaredError", 1, "ai.meta")()
    with pytest.raises(ValueError, match=r"\(3,\) and target of shape \(3, 1\)"):
        op.apply(Context(), np.zeros(3), np.zeros((3, 1)))
    ctx = Context()
    (loss,) = op.apply(ctx, np.array([1.0, 2.0]), np.array([0.0, 0.0]))
    assert loss == 2.5
    dp, dt = op.backward(ctx, np.array(1.0))
    np.testing.assert_array_equal(dp, [1.0, 2.0])
    np.testing.assert_array_equal(dt, [-1.0, -2.0])
