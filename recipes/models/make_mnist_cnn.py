"""Writes mnist_cnn.onnx: a small MNIST CNN defined and initialised in PyTorch, exported by its
dynamo exporter, for ``recipes/onnx_model.py`` (a network the user brings, trained by meta).

Run from the repository root with PyTorch installed (``pip install torch==2.13.0 onnxscript``;
meta itself never needs PyTorch):

    python recipes/models/make_mnist_cnn.py

The network: conv3x3(1->8) + BatchNorm + ReLU + maxpool 2, conv3x3(8->16) + BatchNorm + ReLU +
maxpool 2, Linear(16*5*5 -> 10); untrained, seeded (``torch.manual_seed(0)``). The dynamo
exporter marks each initializer PARAMETER or BUFFER, and writes BatchNorm in inference form:
meta's ``executor.train()`` trains it with batch statistics and updates the running ones.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
from torch import nn

OUT = Path(__file__).with_name("mnist_cnn.onnx")


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 10))


def main() -> None:
    model = network().eval()
    example = torch.zeros(2, 1, 28, 28)
    batch = torch.export.Dim("N", min=1)
    program = torch.onnx.export(model, (example,), dynamo=True, input_names=["input"],
                                output_names=["logits"], dynamic_shapes=({0: batch},),
                                optimize=False)
    proto = program.model_proto
    for node in proto.graph.node:  # stack traces with local paths: not for a repository
        del node.metadata_props[:]
    onnx.checker.check_model(proto)
    onnx.save(proto, str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
