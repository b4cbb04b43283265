"""Convolutional model builders: LeNet-5, ResNet-20, a small VGG and a wide CNN for benchmarks.

Same conventions as ``mlp``: inputs ``input`` (N, *input_shape) and ``labels`` (N,) int64,
outputs ``logits`` (N, classes) and the mean softmax cross-entropy ``loss``; weights He-uniform
(suited to ReLU) from ``seed``, biases zero. Every graph exports to ONNX as is.

>>> from meta.lv1 import ReferenceExecutor
>>> ex = ReferenceExecutor(lenet5())
>>> ex.inference({"input": np.zeros((2, 1, 28, 28), np.float32)}, ["logits"])["logits"].shape
(2, 10)
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from meta.component import Component, ComponentError, Option, Registry
from meta.lv1.builder import GraphBuilder, mlp
from meta.lv1.graph import Graph


class _Net:
    """A GraphBuilder that tracks the activation shape (C, *spatial) and draws the weights."""

    def __init__(self, name: str, input_shape: Sequence[int], seed: int, dtype: Any) -> None:
        self.b = GraphBuilder(name)
        self.rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)
        self.x = self.b.input("input", dtype, ("N", *input_shape))
        self.labels = self.b.input("labels", np.int64, ("N",))
        self.shape = tuple(input_shape)

    def he(self, name: str, shape: tuple[int, ...], fan_in: int) -> str:
        bound = math.sqrt(6.0 / fan_in)
        return self.b.initializer(name, self.rng.uniform(-bound, bound, shape).astype(self.dtype))

    def const(self, name: str, value: float, size: int) -> str:
        return self.b.initializer(name, np.full(size, value, self.dtype))

    def conv(self, h: str, name: str, out: int, k: int, stride: int = 1, pad: int = 0,
             bias: bool = True) -> str:
        c, spatial = self.shape[0], self.shape[1:]
        w = self.he(f"{name}.weight", (out, c, *(k,) * len(spatial)), c * k ** len(spatial))
        inputs = [h, w] + ([self.const(f"{name}.bias", 0.0, out)] if bias else [])
        self.shape = (out, *((s + 2 * pad - k) // stride + 1 for s in spatial))
        return self.b.node("Conv", inputs, name=name, kernel_shape=[k] * len(spatial),
                           strides=[stride] * len(spatial), pads=[pad] * (2 * len(spatial)))

    def batch_norm(self, h: str, name: str) -> str:
        """BatchNormalization written for inference, as PyTorch exports an eval-mode model:
        the executor's mode decides (``executor.train()`` uses batch statistics and updates
        ``running_mean``/``running_var``, the graph's state)."""
        c = self.shape[0]
        stats = [self.const(f"{name}.{p}", v, c) for p, v in
                 (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0))]
        return self.b.node("BatchNormalization", [h, *stats], name=name, momentum=0.9,
                           epsilon=1e-5)

    def relu(self, h: str, name: str) -> str:
        return self.b.node("Relu", [h], name=name)

    def max_pool(self, h: str, name: str, k: int = 2) -> str:
        c, spatial = self.shape[0], self.shape[1:]
        self.shape = (c, *(s // k for s in spatial))
        return self.b.node("MaxPool", [h], name=name, kernel_shape=[k] * len(spatial),
                           strides=[k] * len(spatial))

    def flatten(self, h: str) -> str:
        self.shape = (math.prod(self.shape),)
        return self.b.node("Flatten", [h], name="flatten", axis=1)

    def fc(self, h: str, name: str, out: int) -> str:
        width = self.shape[0]
        w = self.he(f"{name}.weight", (out, width), width)
        self.shape = (out,)
        return self.b.node("Gemm", [h, w, self.const(f"{name}.bias", 0.0, out)], name=name,
                           transB=1)

    def finish(self, logits_input: str, classes: int) -> Graph:
        logits = self.fc(logits_input, "logits", classes)
        loss = self.b.node("SoftmaxCrossEntropyLoss", [logits, self.labels], name="loss",
                           reduction="mean")
        self.b.output(logits, self.dtype, ("N", classes))
        self.b.output(loss, self.dtype, ())
        return self.b.build()


def _check_spatial(name: str, net: _Net, input_shape: Sequence[int]) -> None:
    if min(net.shape[1:], default=1) < 1:
        raise ValueError(f"{name}: input shape {list(input_shape)} is too small for its "
                         f"convolutions and pools")


def lenet5(input_shape: Sequence[int] = (1, 28, 28), classes: int = 10, seed: int = 0,
           dtype: Any = np.float32) -> Graph:
    """LeNet-5 with ReLU: conv5x5(6, pad 2), pool2, conv5x5(16), pool2, fc120, fc84, fc."""
    net = _Net("lenet5", input_shape, seed, dtype)
    h = net.relu(net.conv(net.x, "conv1", 6, 5, pad=2), "relu1")
    h = net.max_pool(h, "pool1")
    h = net.relu(net.conv(h, "conv2", 16, 5), "relu2")
    h = net.max_pool(h, "pool2")
    _check_spatial("lenet5", net, input_shape)
    h = net.flatten(h)
    h = net.relu(net.fc(h, "fc1", 120), "relu3")
    h = net.relu(net.fc(h, "fc2", 84), "relu4")
    return net.finish(h, classes)


def resnet20(input_shape: Sequence[int] = (3, 32, 32), classes: int = 10, width: int = 16,
             seed: int = 0, dtype: Any = np.float32) -> Graph:
    """ResNet-20 (He et al. 2016, CIFAR variant): conv3x3 + 3 stages of 3 basic blocks at widths
    ``width``, 2x and 4x (stride 2 entering stages 2 and 3, 1x1 projection shortcuts there),
    global average pool, fc. Its 21 BatchNormalizations hold 42 state tensors (running
    statistics), which the executor's training mode updates; they are not parameters."""
    net = _Net("resnet20", input_shape, seed, dtype)
    h = net.conv(net.x, "conv0", width, 3, pad=1, bias=False)
    h = net.relu(net.batch_norm(h, "bn0"), "relu0")
    for stage in range(3):
        for block in range(3):
            name = f"s{stage + 1}b{block + 1}"
            stride = 2 if stage > 0 and block == 0 else 1
            out = width * 2 ** stage
            entry, entry_shape = h, net.shape
            y = net.conv(h, f"{name}.conv1", out, 3, stride, pad=1, bias=False)
            y = net.relu(net.batch_norm(y, f"{name}.bn1"), f"{name}.relu1")
            y = net.conv(y, f"{name}.conv2", out, 3, 1, pad=1, bias=False)
            y = net.batch_norm(y, f"{name}.bn2")
            if stride != 1 or entry_shape[0] != out:
                block_shape, net.shape = net.shape, entry_shape
                entry = net.conv(entry, f"{name}.proj", out, 1, stride, bias=False)
                entry = net.batch_norm(entry, f"{name}.proj_bn")
                assert net.shape == block_shape, (net.shape, block_shape)
            h = net.relu(net.b.node("Add", [y, entry], name=f"{name}.add"), f"{name}.relu2")
    _check_spatial("resnet20", net, input_shape)
    h = net.b.node("GlobalAveragePool", [h], name="pool")
    net.shape = (net.shape[0], *(1,) * (len(net.shape) - 1))
    return net.finish(net.flatten(h), classes)


def vgg_small(input_shape: Sequence[int] = (3, 32, 32), classes: int = 10, seed: int = 0,
              dtype: Any = np.float32) -> Graph:
    """A small VGG: three stages of two conv3x3 (32, 64, 128 channels, pad 1) + ReLU and a
    2x2 max pool, then fc256 and fc."""
    net = _Net("vgg_small", input_shape, seed, dtype)
    h = net.x
    for stage, out in enumerate((32, 64, 128), start=1):
        for i in (1, 2):
            h = net.relu(net.conv(h, f"conv{stage}_{i}", out, 3, pad=1), f"relu{stage}_{i}")
        h = net.max_pool(h, f"pool{stage}")
    _check_spatial("vgg_small", net, input_shape)
    h = net.relu(net.fc(net.flatten(h), "fc1", 256), "relu_fc1")
    return net.finish(h, classes)


def wide_cnn(input_shape: Sequence[int] = (1, 28, 28), classes: int = 10, seed: int = 0,
             dtype: Any = np.float32) -> Graph:
    """The classic Keras MNIST CNN, a benchmark with wide convolutions: conv3x3(32),
    conv3x3(64), max pool 2, fc128, fc."""
    net = _Net("wide_cnn", input_shape, seed, dtype)
    h = net.relu(net.conv(net.x, "conv1", 32, 3), "relu1")
    h = net.relu(net.conv(h, "conv2", 64, 3), "relu2")
    h = net.max_pool(h, "pool")
    _check_spatial("wide_cnn", net, input_shape)
    h = net.relu(net.fc(net.flatten(h), "fc1", 128), "relu3")
    return net.finish(h, classes)


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
