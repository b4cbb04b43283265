"""The ``onnx`` model component: train the network in the user's own ``.onnx`` file.

The file's graph keeps its names, roles (parameters, state, constants: ``meta.lv1.roles``) and
BatchNorm statistics; the component adds what training needs, a ``labels`` input and the mean
softmax cross-entropy ``loss`` on the chosen logits, and checks that the data fits the input.
Logits (N, C) take one label per example; logits (N, C, T, ...) one per position (a language
model's next tokens), the class axis second as PyTorch's ``cross_entropy`` reads it, with
``IGNORE_INDEX`` (-100) skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from meta.common.component import Option
from meta.lv1.graph import Graph, GraphError, Node, TensorInfo
from meta.lv1.language_models import IGNORE_INDEX
from meta.lv1.models import MODELS
from meta.lv1.onnx_io import from_onnx


def onnx_model(input_shape: Sequence[int], classes: int, seed: int, dtype: Any, path: str,
               logits: str = "", untie: bool = False, as_exported: bool = False) -> Graph:
    """A network from an ONNX file, with a cross-entropy loss on its logits; ``untie`` and
    ``as_exported`` are ``from_onnx``'s (a recipe reaches the loader's choices here)."""
    graph = from_onnx(Path(path).expanduser(), untie=untie, as_exported=as_exported)
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
    info = next(t for t in graph.outputs if t.name == logits)
    graph.inputs.append(TensorInfo("labels", np.int64, _labels_shape(info)))
    # ignore_index: per-position labels mark padding with -100, as PyTorch's cross_entropy
    # skips it (class labels are checked >= 0, so for them it changes nothing)
    graph.insert(Node("SoftmaxCrossEntropyLoss", [logits, "labels"], ["loss"], "loss",
                      attrs={"reduction": "mean", "ignore_index": IGNORE_INDEX}))
    graph.outputs = [info, TensorInfo("loss", info.dtype, ())]
    return graph


def _labels_shape(logits: TensorInfo) -> tuple[Any, ...] | None:
    """The labels the loss reads for these logits: (N,) for (N, C); (N, T, ...) for
    per-position logits (N, C, T, ...), the class axis second as in ONNX's
    SoftmaxCrossEntropyLoss and PyTorch's cross_entropy; unknown when the rank is."""
    if logits.shape is None:
        return None
    return ("N", *logits.shape[2:])


MODELS.add("onnx", onnx_model, {
    "path": Option(doc="the .onnx file", type=str, path=True),
    "logits": Option("", "the output holding the logits (default: the first output)"),
    "untie": Option(False, "train apart the initializers an exporter wrote twice from one tied "
                           "parameter (a GPT's embedding and head), as from_onnx(untie=True)"),
    "as_exported": Option(False, "train a file that cannot train as its source did (BatchNorm "
                                 "folded by torch.onnx.export's optimizer) as it is, folded "
                                 "weights and all, instead of refusing it"),
})
