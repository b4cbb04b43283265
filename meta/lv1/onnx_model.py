"""The ``onnx`` model component: train the network in the user's own ``.onnx`` file.

The file's graph keeps its names, roles (parameters, state, constants: ``meta.lv1.roles``) and
BatchNorm statistics; the component adds what training needs, a ``labels`` input and the mean
softmax cross-entropy ``loss`` on the chosen logits, and checks that the data fits the input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from meta.component import Option
from meta.lv1.graph import Graph, GraphError, Node, TensorInfo
from meta.lv1.models import MODELS
from meta.lv1.onnx_io import from_onnx


def onnx_model(input_shape: Sequence[int], classes: int, seed: int, dtype: Any, path: str,
               logits: str = "") -> Graph:
    """A network from an ONNX file, with a cross-entropy loss on its logits."""
    graph = from_onnx(Path(path).expanduser())
    feeds = [t for t in graph.inputs if t.name not in graph.initializers]
    if len(feeds) != 1:
        raise GraphError(f"{path}: model 'onnx' needs one data input, the file has "
                         f"{[t.name for t in feeds]}")
    fed = feeds[0]
    if fed.shape is not None and len(fed.shape) == len(input_shape) + 1 and any(
            isinstance(d, int) and d != s for d, s in zip(fed.shape[1:], input_shape)):
        raise GraphError(f"{path}: input {fed.name!r} takes {list(fed.shape)}, the dataset's "
                         f"examples are {list(input_shape)}")
    names = [t.name for t in graph.outputs]
    logits = logits or names[0]
    if logits not in names:
        raise GraphError(f"{path}: logits {logits!r} is not an output of the model "
                         f"(outputs: {names})")
    taken = sorted({"labels", "loss"} & graph.tensor_names())
    if taken:
        raise GraphError(f"{path}: the model already has tensor(s) {taken}; meta adds "
                         f"'labels' and 'loss'")
    graph.inputs.append(TensorInfo("labels", np.int64, ("N",)))
    graph.insert(Node("SoftmaxCrossEntropyLoss", [logits, "labels"], ["loss"], "loss",
                      attrs={"reduction": "mean"}))
    info = next(t for t in graph.outputs if t.name == logits)
    graph.outputs = [info, TensorInfo("loss", info.dtype, ())]
    return graph


MODELS.add("onnx", onnx_model, {
    "path": Option(doc="the .onnx file", type=str),
    "logits": Option("", "the output holding the logits (default: the first output)"),
})
