"""MNIST MLP trained by decentralised averaging over an MPI topology (Level 3; seed 004).

Run:  mpiexec -n 4 meta run recipes/mnist_neighbours.py                  (a ring: a 1-D grid)
      mpiexec -n 4 meta run recipes/mnist_neighbours.py --set cart_dims=2     (a 2x2 torus)
      mpiexec -n 4 meta run recipes/mnist_neighbours.py --set topology=graph  (exponential graph)
Each rank steps on its own shard, then averages its parameters with its neighbours through one
``Neighbor_allgather`` on the topology (every ``average_every`` steps); no rank waits for all
the others. The end of training takes the exact mean once and reports how far the replicas
were from it (``replica_spread``).
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 128]},
    "optimizer": "sgd",
}

MUTABLE = {
    "distributed": {"name": "neighbours", "topology": "cart", "cart_dims": 1,
                    "average_every": 1},
    "epochs": 4,
    "batch_size": 64,  # per rank
    "lr": 0.05,
    "momentum": 0.9,
    "seed": 0,
    "train_samples": 0,  # 0: all 60000
    "timeline": False,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
