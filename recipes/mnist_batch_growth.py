"""MNIST MLP, data-parallel: grow the batch where a step schedule would decay the learning rate.

Run:  mpiexec -n 2 meta run recipes/mnist_batch_growth.py
      mpiexec -n 2 meta run recipes/mnist_batch_growth.py --set events.batch_growth.factor=1 \
          --set lr_schedule=step          # the step-decay schedule it replaces, for comparison
Smith et al. (2018), "Don't decay the learning rate, increase the batch size": after epochs 2
and 3 every rank's batch (64 at first, so 128 globally at -n 2) grows 5x, at the same learning
rate, instead of the learning rate dropping 5x. Each later epoch takes 5x fewer steps and
exchanges; ``steps`` and ``batch_size`` are reported with every epoch's metrics.
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 128]},
    "optimizer": "sgd",
}

MUTABLE = {
    "epochs": 4,
    "batch_size": 64,  # per rank, before growing
    "lr": 0.05,
    "momentum": 0.9,
    "lr_schedule": "constant",  # "step" with factor 1 below: the step-decay baseline
    "lr_decay_epochs": [2, 3],
    "lr_decay_factor": 0.2,
    "seed": 0,
    "train_samples": 0,  # 0: all 60000; CI trains on fewer
    "distributed": {"name": "allreduce", "compression": "none"},
    "events": [{"name": "batch_growth", "epochs": [2, 3], "factor": 5.0}],
    "timeline": False,
}

METRICS = {"test_accuracy": AtLeast(0.97)}
