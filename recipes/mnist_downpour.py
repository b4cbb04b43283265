"""MNIST MLP trained with Downpour SGD (Level 3; seed 001, DistBelief).

Run:  mpiexec -n 3 meta run recipes/mnist_downpour.py      (1 shard server + 2 workers)
      mpiexec -n 4 meta run recipes/mnist_downpour.py --set servers=2
The last ``servers`` ranks each hold a contiguous shard of the parameters and apply pushed
gradients with Adagrad (DistBelief's choice; the recipe's ``optimizer``); workers fetch every
``n_fetch`` steps and push accrued gradients every ``n_push`` steps, without waiting for each
other. Worker 0 trains alone for ``warm_start_steps`` first. The staleness histogram of the
applied pushes is printed and written to metrics.json (``staleness_count_<k>``).
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 128]},
    "optimizer": "adagrad",
}

MUTABLE = {
    "distributed": {"name": "downpour", "servers": 1, "n_fetch": 1, "n_push": 1,
                    "warm_start_steps": 50},
    "epochs": 6,
    "batch_size": 64,  # per worker
    "lr": 0.01,  # Adagrad: its first step moves every weight by lr
    "seed": 0,
    "train_samples": 0,  # 0: all 60000
    "timeline": False,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
