"""A network you bring: a CNN written in PyTorch and exported to ONNX
(``models/mnist_cnn.onnx``, made by ``models/make_mnist_cnn.py``), trained by meta on MNIST.

Run:  meta run recipes/onnx_model.py
      meta inspect recipes/models/mnist_cnn.onnx     (its parameters, state and constants)

The file's BatchNorm layers train with batch statistics and keep running ones (the graph's
state); the exporter's PARAMETER marks decide what the optimizer sees. ``frozen`` (patterns)
would keep layers fixed, as ``"frozen": ["0.*", "1.*"]`` for the first convolution and its
BatchNorm.
"""

from pathlib import Path

from meta.recipe import AtLeast

FIXED = {
    "dataset": {"name": "mnist", "train_samples": 12000},
    "model": {"name": "onnx", "path": str(Path(__file__).parent / "models" / "mnist_cnn.onnx")},
    "optimizer": "adam",
}

MUTABLE = {
    "epochs": 2,
    "batch_size": 64,
    "lr": 0.003,
    "seed": 0,
    "executor": "native",
}

METRICS = {
    "test_accuracy": AtLeast(0.96),
}
