"""MNIST with a 784-512-512-10 MLP and SGD with momentum: the walking skeleton's main job.

Run:  meta run recipes/mnist_mlp.py            (one process)
      mpiexec -n 2 meta run recipes/mnist_mlp.py   (synchronous allreduce data parallelism)
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [512, 512]},
    "optimizer": "sgd",
}

MUTABLE = {
    "epochs": 5,
    "batch_size": 128,  # per rank
    "lr": 0.05,
    "momentum": 0.9,
    "seed": 0,
    "executor": "planned",  # the graph compiled into oneDNN steps; reference: numpy, the oracle
    "distributed": "allreduce",  # under mpiexec: --set distributed=zero2|zero3 shards the model
}

METRICS = {
    "test_accuracy": AtLeast(0.975),
}
