"""MNIST with LeNet-5 (ReLU, max pooling) and Adam: the convolutional main job.

Run:  meta run recipes/mnist_lenet.py
      mpiexec -n 2 meta run recipes/mnist_lenet.py   (synchronous allreduce data parallelism)
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": "lenet",
    "optimizer": "adam",
}

MUTABLE = {
    "epochs": 6,
    "batch_size": 64,  # per rank
    "lr": 0.002,
    "lr_schedule": "step",  # a tenth of the rate for the last two epochs
    "lr_decay_epochs": [4],
    "lr_decay_factor": 0.1,
    "seed": 0,
    "executor": "planned",  # compiled into oneDNN steps (2x native here); reference: numpy
}

METRICS = {
    "test_accuracy": AtLeast(0.988),
}
