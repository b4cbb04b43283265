"""Run a control-flow case (tests/lv0/cases_control.py) as a one-node model: the node's
inputs and the tensors its subgraphs read from outside are graph inputs. Forward is compared
with onnx.reference (or the case's own oracle), backward through the executor with central
differences in float64, w.r.t. the node's float inputs and the outer tensors alike."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from meta.lv1 import ReferenceExecutor, from_onnx


def value_info(name: str, x) -> object:
    """A graph input for ``x``: a tensor, or a sequence (list) of its first item's type."""
    if isinstance(x, list):
        elem = helper.np_dtype_to_tensor_dtype(x[0].dtype) if x else TensorProto.DOUBLE
        return helper.make_tensor_sequence_value_info(name, elem, None)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
        np.asarray(x).dtype), None)


def _n_outputs(op_type: str, attrs: dict) -> int:
    if op_type == "If":
        return len(attrs["then_branch"].output)
    if op_type == "Loop":
        return len(attrs["body"].output) - 1
    return len(attrs["body"].output)


def node_model(op_type, attrs, inputs, opset, loss_weights=None):
    """The model and its feeds; with ``loss_weights`` (one array or None per output) it also
    computes ``loss = sum_k sum(w_k * y_k)``."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    outs = [f"out{i}" for i in range(_n_outputs(op_type, attrs))]
    feeds = {n: x if isinstance(x, list) else np.asarray(x) for n, x in zip(names, inputs) if n}
    feeds.update(attrs.outer)
    nodes = [helper.make_node(op_type, names, outs, **dict(attrs))]
    graph_outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs]
    initializers = []
    if loss_weights is not None:
        terms = []
        for k, w in enumerate(loss_weights):
            if w is None:
                continue
            initializers.append(numpy_helper.from_array(w, f"w{k}"))
            nodes += [helper.make_node("Mul", [outs[k], f"w{k}"], [f"m{k}"]),
                      helper.make_node("ReduceSum", [f"m{k}"], [f"r{k}"], keepdims=0)]
            terms.append(f"r{k}")
        nodes.append(helper.make_node("Sum", terms, ["loss"]))
        graph_outputs = [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])]
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         if isinstance(v, np.ndarray) else value_info(n, v) for n, v in feeds.items()],
        graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model, feeds


def forward(op_type, attrs, inputs, opset):
    """(meta's outputs, the oracle's outputs)."""
    model, feeds = node_model(op_type, attrs, inputs, opset)
    outs = [o.name for o in model.graph.output]
    ours = ReferenceExecutor(from_onnx(model)).inference(feeds, outs)
    if attrs.oracle is not None:
        theirs = attrs.oracle(inputs, attrs.outer)
    else:
        theirs = ReferenceEvaluator(model).run(None, feeds)
    return [ours[o] for o in outs], theirs


def check_gradients(op_type, attrs, inputs, opset, eps=1e-6, rtol=1e-5, atol=1e-6):
    """Problems found (an empty list when the executor's gradients match)."""
    ours, _ = forward(op_type, attrs, inputs, opset)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(y.shape) if y.dtype.kind == "f" else None for y in ours]
    model, feeds = node_model(op_type, attrs, inputs, opset, weights)
    executor = ReferenceExecutor(from_onnx(model))
    wrt = [n for n, v in feeds.items() if v.dtype.kind == "f"]
    _, grads = executor.inference_and_backprop(feeds, "loss", wrt=wrt)
    problems = []
    for name in wrt:
        numeric = np.zeros_like(feeds[name])
        for index in np.ndindex(feeds[name].shape):
            values = []
            for sign in (1, -1):
                moved = {**feeds, name: feeds[name].copy()}
                moved[name][index] += sign * eps
                values.append(float(executor.inference(moved, ["loss"])["loss"]))
            numeric[index] = (values[0] - values[1]) / (2 * eps)
        if not np.allclose(grads[name], numeric, rtol=rtol, atol=atol):
            problems.append(f"{op_type} {dict(attrs)}: d loss / d {name}: "
                            f"{grads[name]} vs numeric {numeric}")
    return problems
