"""An LSTM reads each MNIST digit as a sequence of 28 rows of 28 pixels (ONNX's LSTM, trained by
backpropagation through time) and classifies its last hidden state.

Run:  meta run recipes/mnist_lstm.py
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "lstm", "hidden": 64},
    "optimizer": "adam",
}

MUTABLE = {
    "epochs": 3,
    "batch_size": 128,
    "lr": 0.01,
    "lr_schedule": "step",  # a tenth of the rate for the last epoch
    "lr_decay_epochs": [2],
    "seed": 0,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
