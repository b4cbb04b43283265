"""Convolutional model builders: LeNet-5, ResNet-20, a small VGG and a wide CNN for benchmarks.

Each is a few lines of the layer API (``meta.lv1.layers``), with the model-component contract
of ``mlp``: inputs ``input`` (N, *input_shape) and ``labels`` (N,) int64, outputs ``logits``
(N, classes) and the mean softmax cross-entropy ``loss``; weights He-uniform (``init="he"``,
suited to ReLU) from ``seed``, biases zero. Every graph exports to ONNX as is.

>>> from meta.lv1 import ReferenceExecutor
>>> ex = ReferenceExecutor(lenet5())
>>> ex.inference({"input": np.zeros((2, 1, 28, 28), np.float32)}, ["logits"])["logits"].shape
(2, 10)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from meta.common.component import Component, ComponentError, Option, Registry
from meta.lv1.graph import Graph
from meta.lv1.layers import (
    BatchNorm,
    Conv,
    Flatten,
    GlobalAvgPool,
    Layer,
    Linear,
    MaxPool,
    Relu,
    Residual,
    Sequential,
)


def mlp(
    input_shape: Sequence[int] = (1, 28, 28),
    hidden: Sequence[int] = (512, 512),
    classes: int = 10,
    seed: int = 0,
    dtype: Any = np.float32,
) -> Graph:
    """A multilayer perceptron: Flatten, then Gemm+Relu per hidden layer, then Gemm to logits.

    Inputs ``input`` (N, *input_shape) and ``labels`` (N,) int64; outputs ``logits`` and the
    mean softmax cross-entropy ``loss``. Weights are He-uniform (suited to ReLU), biases zero,
    all drawn from ``seed``; the layers' parameters are ``fc0`` ... ``fc<len(hidden)>``.
    """
    layers = [Flatten()]
    for i, width in enumerate(hidden):
        layers += [Linear(width, name=f"fc{i}"), Relu(name=f"relu{i}")]
    return Sequential(*layers, Linear(classes, name=f"fc{len(hidden)}")).graph(
        input_shape, classes, seed, dtype, init="he", name="mlp")



def lenet5(input_shape: Sequence[int] = (1, 28, 28), classes: int = 10, seed: int = 0,
           dtype: Any = np.float32) -> Graph:
    """LeNet-5 with ReLU: conv5x5(6, pad 2), pool2, conv5x5(16), pool2, fc120, fc84, fc."""
    return Sequential(
        Conv(6, 5, padding=2), Relu(), MaxPool(2), Conv(16, 5), Relu(), MaxPool(2), Flatten(),
        Linear(120), Relu(), Linear(84), Relu(), Linear(classes, name="logits"),
    ).graph(input_shape, classes, seed, dtype, init="he", name="lenet5")


def _basic_block(name: str, out: int, stride: int, projection: bool) -> list[Layer]:
    """ResNet's basic block: conv3x3-BN-ReLU-conv3x3-BN plus the shortcut (a 1x1 projection
    with BN where the shape changes), then ReLU."""
    shortcut = [Conv(out, 1, stride, bias=False, name="proj"), BatchNorm(name="proj_bn")]
    return [Residual(Conv(out, 3, stride, padding=1, bias=False), BatchNorm(), Relu(),
                     Conv(out, 3, padding=1, bias=False), BatchNorm(),
                     shortcut=shortcut if projection else None, name=name),
            Relu(name=f"{name}.relu2")]


def resnet20(input_shape: Sequence[int] = (3, 32, 32), classes: int = 10, width: int = 16,
             seed: int = 0, dtype: Any = np.float32) -> Graph:
    """ResNet-20 (He et al. 2016, CIFAR variant): conv3x3 + 3 stages of 3 basic blocks at widths
    ``width``, 2x and 4x (stride 2 entering stages 2 and 3, 1x1 projection shortcuts there),
    global average pool, fc. Its 21 BatchNormalizations hold 42 state tensors (running
    statistics), which the executor's training mode updates; they are not parameters."""
    blocks = [layer for stage in range(3) for block in range(3)
              for layer in _basic_block(f"s{stage + 1}b{block + 1}", width * 2 ** stage,
                                        2 if stage > 0 and block == 0 else 1,
                                        stage > 0 and block == 0)]
    return Sequential(
        Conv(width, 3, padding=1, bias=False, name="conv0"), BatchNorm(name="bn0"),
        Relu(name="relu0"), *blocks, GlobalAvgPool(name="pool"), Flatten(),
        Linear(classes, name="logits"),
    ).graph(input_shape, classes, seed, dtype, init="he", name="resnet20")


def vgg_small(input_shape: Sequence[int] = (3, 32, 32), classes: int = 10, seed: int = 0,
              dtype: Any = np.float32) -> Graph:
    """A small VGG: three stages of two conv3x3 (32, 64, 128 channels, pad 1) + ReLU and a
    2x2 max pool, then fc256 and fc."""
    layers: list[Layer] = []
    for stage, out in enumerate((32, 64, 128), start=1):
        for i in (1, 2):
            layers += [Conv(out, 3, padding=1, name=f"conv{stage}_{i}"),
                       Relu(name=f"relu{stage}_{i}")]
        layers.append(MaxPool(2, name=f"pool{stage}"))
    return Sequential(
        *layers, Flatten(), Linear(256), Relu(name="relu_fc1"), Linear(classes, name="logits"),
    ).graph(input_shape, classes, seed, dtype, init="he", name="vgg_small")


def wide_cnn(input_shape: Sequence[int] = (1, 28, 28), classes: int = 10, seed: int = 0,
             dtype: Any = np.float32) -> Graph:
    """The classic Keras MNIST CNN, a benchmark with wide convolutions: conv3x3(32),
    conv3x3(64), max pool 2, fc128, fc."""
    return Sequential(
        Conv(32, 3), Relu(), Conv(64, 3), Relu(), MaxPool(2, name="pool"), Flatten(),
        Linear(128), Relu(), Linear(classes, name="logits"),
    ).graph(input_shape, classes, seed, dtype, init="he", name="wide_cnn")


# Model builders as recipes name them: ``build(input_shape, classes, seed, dtype, **options)``
# returns a Graph with inputs ``input``/``labels`` and outputs ``logits``/``loss`` (or, for a
# model needing more than building, an object with ``graph`` and ``prepare(run)``).
MODELS = Registry("model", context=("input_shape", "classes", "seed", "dtype"), common={
    "trainable": Option((), "train only the parameters matching these patterns (conv1.*)",
                        type=tuple[str, ...]),
    "frozen": Option((), "do not train the parameters matching these patterns",
                     type=tuple[str, ...]),
})


def build_model(component: Component, options: dict[str, Any], input_shape: Sequence[int],
                classes: int, seed: int, dtype: Any) -> Any:
    """The model a recipe names, its ``trainable``/``frozen`` selection applied (a pattern
    that matches nothing is an error naming it)."""
    values = component.resolve(options)
    trainable, frozen = values.pop("trainable"), values.pop("frozen")
    built = component.factory(input_shape=tuple(input_shape), classes=classes, seed=seed,
                              dtype=dtype, **values)
    graph = getattr(built, "graph", built)
    try:
        graph.select(trainable, frozen)
    except KeyError as err:
        raise ComponentError(f"model {component.name!r}: {err.args[0]}") from err
    return built
MODELS.add("mlp", mlp, {"hidden": Option((512, 512), "hidden layer widths", type=tuple[int, ...],
                                         low=1)})
MODELS.add("lenet", lenet5)
MODELS.add("resnet20", resnet20, {"width": Option(16, "channels of the first stage", low=1)})
MODELS.add("vgg_small", vgg_small)
MODELS.add("wide_cnn", wide_cnn)
