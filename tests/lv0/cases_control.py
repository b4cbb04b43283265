"""Test cases for the control-flow operators (If, Loop, Scan): attributes holding ONNX
subgraphs that also read tensors of the enclosing graph (``Scoped.outer``), and the node's
inputs. tests/lv0/control_harness.py runs them as one-node models through the executor: the
op alone cannot run, since the executor hands it the enclosing values."""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto, helper

D, I64, B = TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL


class Scoped(dict):
    """Operator attributes, plus the enclosing graph's tensors its subgraphs read, and (where
    onnx.reference is wrong or lacks the case) a numpy oracle of (inputs, outer) -> outputs."""

    def __init__(self, attrs: dict, outer: dict, oracle: Callable | None = None) -> None:
        super().__init__(attrs)
        self.outer = outer
        self.oracle = oracle


def _v(name, elem=D, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _graph(nodes, name, inputs, outputs):
    return helper.make_graph(nodes, name, inputs, outputs)


def if_(rng):
    x, y = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    then = _graph([helper.make_node("Add", ["x", "y"], ["t0"]),
                   helper.make_node("Mul", ["t0", "x"], ["t1"])], "then", [],
                  [_v("t0"), _v("t1")])
    other = _graph([helper.make_node("Sub", ["x", "y"], ["e0"]),
                    helper.make_node("Tanh", ["y"], ["e1"])], "else", [], [_v("e0"), _v("e1")])
    attrs = {"then_branch": then, "else_branch": other}
    return [(Scoped(attrs, {"x": x, "y": y}), [np.array(True)]),
            (Scoped(attrs, {"x": x, "y": y}), [np.array([False])])]


def _loop_body(cond_from_iteration: bool):
    nodes = [helper.make_node("Mul", ["v_in", "w"], ["a"]),
             helper.make_node("Cast", ["i"], ["i_f"], to=D),
             helper.make_node("Add", ["a", "i_f"], ["v_out"]),
             helper.make_node("Mul", ["v_out", "v_out"], ["sq"])]
    if cond_from_iteration:
        nodes += [helper.make_node("Constant", [], ["two"], value=helper.make_tensor(
                      "two", I64, [], [2])),
                  helper.make_node("Less", ["i", "two"], ["c_out"])]
    else:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    return _graph(nodes, "body", [_v("i", I64, []), _v("c_in", B, []), _v("v_in", D, [2])],
                  [_v("c_out", B, []), _v("v_out", D, [2]), _v("sq", D, [2])])


def loop(rng):
    w, v = rng.uniform(0.5, 1.5, 2), rng.standard_normal(2)
    return [
        (Scoped({"body": _loop_body(False)}, {"w": w}),
         [np.array(3, np.int64), np.array(True), v]),
        # no trip count: the body's condition (iteration < 2) stops it after three iterations
        (Scoped({"body": _loop_body(True)}, {"w": w}), [None, np.array(True), v]),
        # no condition input: a for loop (onnx.reference runs no iteration then)
        (Scoped({"body": _loop_body(False)}, {"w": w}, _loop_oracle),
         [np.array(2, np.int64), None, v]),
    ]


def _loop_oracle(inputs, outer):
    trips, _, v = inputs
    squares = []
    for i in range(int(trips)):
        v = v * outer["w"] + i
        squares.append(v * v)
    return [v, np.stack(squares)]


def _scan_body():
    return _graph([helper.make_node("Mul", ["x_t", "w"], ["xw"]),
                   helper.make_node("Add", ["s_in", "xw"], ["s_out"]),
                   helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])], "body",
                  [_v("s_in", D, [2]), _v("x_t", D, [2])], [_v("s_out", D, [2]), _v("y_t", D, [2])])


def _scan_oracle(steps, reverse_in, reverse_out, in_axis, out_axis):
    def oracle(inputs, outer):
        s, xs = inputs
        xs = np.moveaxis(xs, in_axis, 0)
        ys = []
        for t in range(steps):
            x_t = xs[steps - 1 - t if reverse_in else t]
            s = s + x_t * outer["w"]
            ys.append(s * x_t)
        return [s, np.stack(ys[::-1] if reverse_out else ys, axis=out_axis)]
    return oracle


def scan(rng):
    w, s = rng.uniform(0.5, 1.5, 2), rng.standard_normal(2)
    xs = rng.standard_normal((4, 2))
    body = _scan_body()
    moved = {"scan_input_axes": [1], "scan_input_directions": [1], "scan_output_axes": [-1],
             "scan_output_directions": [1]}
    return [(Scoped({"body": body, "num_scan_inputs": 1}, {"w": w}), [s, xs], range(9, 100)),
            (Scoped({"body": body, "num_scan_inputs": 1, **moved}, {"w": w},
                    _scan_oracle(4, True, True, 1, 1)), [s, xs.T.copy()], range(9, 100)),
            # opset 8: batch axis first, optional sequence_lens (onnx.reference has only 9)
            (Scoped({"body": body, "num_scan_inputs": 1}, {"w": w}, _scan8_oracle(False)),
             [None, np.stack([s, -s]), np.stack([xs, xs[::-1]])], range(8, 9)),
            (Scoped({"body": body, "num_scan_inputs": 1, "directions": [1]}, {"w": w},
                    _scan8_oracle(True)),
             [np.array([4, 2], np.int32), np.stack([s, -s]), np.stack([xs, xs * 2])],
             range(8, 9))]


def _scan8_oracle(reverse):
    def oracle(inputs, outer):
        lens, states, xs = inputs
        finals, outs = [], []
        for b in range(len(states)):
            length = xs.shape[1] if lens is None else int(lens[b])
            s, y = _scan_oracle(length, reverse, False, 0, 0)([states[b], xs[b, :length]], outer)
            finals.append(s)
            outs.append(np.pad(y, [(0, xs.shape[1] - length), (0, 0)]))
        return [np.stack(finals), np.stack(outs)]
    return oracle


CASES: dict[str, Callable[[np.random.Generator], list]] = {"If": if_, "Loop": loop, "Scan": scan}
