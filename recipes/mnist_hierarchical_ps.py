"""MNIST MLP through a two-level parameter server (Level 3; seed 004, Gupta et al.).

Run:  mpiexec -n 5 meta run recipes/mnist_hierarchical_ps.py      (1 server + 4 workers)
      mpiexec -n 5 meta run recipes/mnist_hierarchical_ps.py --set fan_in=1   (one level)
The last rank is the global server (``servers`` shards: the last ranks); the workers form
groups of ``fan_in``, whose first rank aggregates: it averages its group's gradients, pushes
one message to the server and passes the new parameters back. The server receives ``fan_in``
times fewer bytes per step than from every worker (printed: ``global server ... received``);
groups run asynchronously to each other, so momentum is kept low as for the other servers.
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 128]},
    "optimizer": "sgd",
}

MUTABLE = {
    "distributed": {"name": "hierarchical_ps", "servers": 1, "fan_in": 2},
    "epochs": 4,
    "batch_size": 64,  # per worker: a group of fan_in steps on fan_in * 64 examples
    "lr": 0.05,
    "momentum": 0.5,
    "seed": 0,
    "train_samples": 0,  # 0: all 60000
    "timeline": False,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
