"""MNIST MLP trained with asynchronous SGD through MPI one-sided windows (Level 3; seed 000).

Run:  mpiexec -n 3 meta run recipes/mnist_async_rma.py      (1 window owner + 2 workers)
The last rank allocates the parameters in an ``MPI.Win.Allocate`` window and trains nothing;
each worker steps its local copy with the recipe's optimizer, ``Accumulate``s the change into
the window and ``Get``s the sum back, never waiting for the other worker (no staleness bound,
and none is measured).
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 128]},
    "optimizer": "sgd",
}

MUTABLE = {
    "distributed": "async_rma",
    "epochs": 4,
    "batch_size": 64,  # per worker
    "lr": 0.05,
    "momentum": 0.5,  # per-worker momentum on top of the others' stale updates
    "seed": 0,
    "train_samples": 0,  # 0: all 60000
    "timeline": False,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
