"""MNIST MLP trained full-batch with Sandblaster L-BFGS (Level 3; seed 001, DistBelief).

Run:  mpiexec -n 3 meta run recipes/mnist_sandblaster.py      (coordinator + 2 workers)
      mpiexec -n 4 meta run recipes/mnist_sandblaster.py --set servers=2
Rank 0 coordinates L-BFGS and holds shard 0 of the parameters and of the (s, y) history; the
last ``servers - 1`` ranks hold the other shards; the rest are workers. The batch is the whole
training subset (``batch_size`` = ``train_samples``), so each epoch is one L-BFGS iteration
(line search included); every evaluation of it is cut into ``portions`` pieces handed out to
idle workers, with backup copies near the end. Portions per worker, backups and batch times
are printed and written to metrics.json. On one process it runs Level 2's L-BFGS.
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": {"name": "mnist", "train_samples": 10000},
    "model": {"name": "mlp", "hidden": [64]},
    "optimizer": "lbfgs",
    "batch_size": 10000,  # the full batch: one L-BFGS iteration per epoch
}

MUTABLE = {
    "distributed": {"name": "sandblaster", "servers": 1, "portions": 8},
    "epochs": 40,  # L-BFGS iterations
    "seed": 0,
}

METRICS = {
    "test_accuracy": AtLeast(0.90),
}
