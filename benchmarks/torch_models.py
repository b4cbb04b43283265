"""Networks written in PyTorch for the benchmarks, each also as meta runs it: the module is
exported with PyTorch's TorchScript exporter and loaded with ``meta.lv1.from_onnx``, so meta
and PyTorch train the same network from the same weights.

- ``mobilenet_v2``: MobileNetV2 for 32x32 images (width 0.5: inverted residual blocks of
  1x1 expand, 3x3 depthwise, 1x1 project, BatchNorm, ReLU6 as Clip), 10 classes;
- ``resnet18``: ResNet-18 for 32x32 images (basic blocks [2, 2, 2, 2], widths 32-256);
- ``transformer``: two ``nn.TransformerEncoderLayer`` (d_model 128, 4 heads, feed-forward
  256, GELU, no dropout) over 32 steps of 64 features, mean-pooled, a linear classifier;
- ``lstm``, ``bilstm``, ``gru``: one recurrent layer (hidden 128; bidirectional for bilstm)
  over 32 steps of 64 features, its outputs mean-pooled over time, a linear classifier.

Needs torch; imported only by the benchmark scripts.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from torch import nn

from meta.lv1 import Graph, Node, TensorInfo, from_onnx


def _bn_relu6(channels: int) -> list[nn.Module]:
    return [nn.BatchNorm2d(channels), nn.ReLU6()]


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), *_bn_relu6(hidden)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   *_bn_relu6(hidden), nn.Conv2d(hidden, cout, 1, bias=False),
                   nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    # (expansion, output channels, blocks, first stride) at width 1.0, CIFAR strides
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, width: float = 0.5, classes: int = 10) -> None:
        super().__init__()
        c = int(32 * width)
        layers: list[nn.Module] = [nn.Conv2d(3, c, 3, 1, 1, bias=False), *_bn_relu6(c)]
        for t, out, n, s in self.SETTINGS:
            out = max(8, int(out * width))
            for i in range(n):
                layers.append(InvertedResidual(c, out, s if i == 0 else 1, t))
                c = out
        last = 640
        layers += [nn.Conv2d(c, last, 1, bias=False), *_bn_relu6(last)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        blocks, c = [], width
        for i, out in enumerate((width, 2 * width, 4 * width, 8 * width)):
            for j in range(2):
                blocks.append(BasicBlock(c, out, 2 if i and not j else 1))
                c = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
        return self.fc(torch.flatten(y, 1))


class TransformerClassifier(nn.Module):
    def __init__(self, features: int = 64, d: int = 128, heads: int = 4, ff: int = 256,
                 layers: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(features, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                       batch_first=True) for _ in range(layers))
        self.fc = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.fc(h.mean(dim=1))


class RecurrentClassifier(nn.Module):
    def __init__(self, cell: str, bidirectional: bool = False, features: int = 64,
                 hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](
            features, hidden, batch_first=True, bidirectional=bidirectional)
        self.fc = nn.Linear(hidden * (2 if bidirectional else 1), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0].mean(dim=1))


# name -> (module factory, input shape of one example, batch)
TORCH_MODELS = {
    "mobilenet_v2": (lambda: MobileNetV2(), (3, 32, 32), 32),
    "resnet18": (lambda: ResNet18(), (3, 32, 32), 32),
    "transformer": (lambda: TransformerClassifier(), (32, 64), 32),
    "lstm": (lambda: RecurrentClassifier("lstm"), (32, 64), 32),
    "bilstm": (lambda: RecurrentClassifier("lstm", bidirectional=True), (32, 64), 32),
    "gru": (lambda: RecurrentClassifier("gru"), (32, 64), 32),
}


def exported(model: nn.Module, example: np.ndarray) -> Graph:
    """``model`` as meta loads its TorchScript export (training form: BatchNorm updates its
    statistics), with a mean cross-entropy loss on the logits."""
    return with_loss(export_bytes(model, example))


def export_bytes(model: nn.Module, example: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    model.train()
    with warnings.catch_warnings():  # the exporter's notes on num_batches_tracked
        warnings.simplefilter("ignore")
        _export(model, example, buffer)
    return buffer.getvalue()


def with_loss(model: bytes | str) -> Graph:
    """An exported model (bytes or a file) with a mean cross-entropy loss on its logits."""
    graph = from_onnx(model)
    graph.inputs.append(TensorInfo("labels", np.int64, ("N",)))
    graph.insert(Node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], "loss",
                      attrs={"reduction": "mean"}))
    graph.outputs.append(TensorInfo("loss", np.float32, ()))
    return graph


def _export(model: nn.Module, example: np.ndarray, buffer: io.BytesIO) -> None:
    torch.onnx.export(model, (torch.from_numpy(example),), buffer, dynamo=False,
                      opset_version=17, input_names=["input"], output_names=["logits"],
                      training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False,
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})


def module(name: str, seed: int = 0) -> nn.Module:
    """The PyTorch module, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return TORCH_MODELS[name][0]()


def build(name: str, seed: int = 0) -> tuple[nn.Module, Graph]:
    """The PyTorch module and meta's graph of it, with the same (seeded) weights."""
    _, shape, batch = TORCH_MODELS[name]
    net = module(name, seed)
    return net, exported(net, np.zeros((batch, *shape), np.float32))
