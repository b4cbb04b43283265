"""A recurrent model builder: ``lstm`` reads each example as a sequence of rows (an MNIST
digit as 28 steps of 28 pixels) with ONNX's LSTM and classifies its last hidden state.

Graph: input (N, C, H, W) -> Reshape (N, C*H, W) -> Transpose to (steps, N, features) ->
LSTM(hidden) -> Y_h (1, N, hidden) -> Reshape (N, hidden) -> Gemm -> logits, loss. Weights
are uniform in +-1/sqrt(hidden) (PyTorch's nn.LSTM initialisation), the forget gate's bias 1.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from meta.common.component import Option
from meta.lv1.builder import GraphBuilder
from meta.lv1.graph import Graph
from meta.lv1.models import MODELS


def lstm(input_shape: Sequence[int] = (1, 28, 28), classes: int = 10, seed: int = 0,
         dtype: Any = np.float32, hidden: int = 64) -> Graph:
    """An LSTM over the rows of each example, then a linear classifier."""
    if len(input_shape) < 2:
        raise ValueError(f"lstm: input shape {list(input_shape)} has no rows to read in turn")
    steps, features = math.prod(input_shape[:-1]), input_shape[-1]
    rng = np.random.default_rng(seed)
    bound = 1 / math.sqrt(hidden)
    b = GraphBuilder("lstm")
    x = b.input("input", dtype, ("N", *input_shape))
    labels = b.input("labels", np.int64, ("N",))
    seq = b.node("Reshape", [x, b.initializer("rows.shape", np.array([0, steps, features]))],
                 name="rows")
    seq = b.node("Transpose", [seq], name="time_major", perm=[1, 0, 2])

    def uniform(name: str, shape: tuple[int, ...]) -> str:
        return b.initializer(name, rng.uniform(-bound, bound, shape).astype(dtype))

    bias = rng.uniform(-bound, bound, (1, 8 * hidden)).astype(dtype)
    bias[0, 2 * hidden:3 * hidden] += 1.0  # ONNX gate order i, o, f, c: the forget gate's W bias
    outputs = b.node("LSTM", [seq, uniform("lstm.W", (1, 4 * hidden, features)),
                              uniform("lstm.R", (1, 4 * hidden, hidden)),
                              b.initializer("lstm.B", bias)],
                     name="lstm", outputs=["lstm.Y", "lstm.Y_h", "lstm.Y_c"], hidden_size=hidden)
    last = b.node("Reshape", [outputs[1], b.initializer("last.shape", np.array([-1, hidden]))],
                  name="last")
    w = uniform("fc.weight", (classes, hidden))
    logits = b.node("Gemm", [last, w, b.initializer("fc.bias", np.zeros(classes, dtype))],
                    name="logits", transB=1)
    loss = b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss", reduction="mean")
    b.output(logits, dtype, ("N", classes))
    b.output(loss, dtype, ())
    return b.build()


MODELS.add("lstm", lstm, {"hidden": Option(64, "LSTM hidden units", low=1)})
