"""MNIST MLP trained by Hogwild on one node: lock-free updates in shared memory (seed 003).

Run:  mpiexec -n 2 meta run recipes/mnist_hogwild.py
The parameters live once, in an MPI shared-memory window of the node (``Win.Allocate_shared``);
every rank's forward pass reads them and its optimizer writes its update into them directly,
without a lock or a message. Every rank trains (no server rank, unlike ``async_rma``). The
ranks' steps interleave freely, which acts as extra momentum ("asynchrony begets momentum"),
so the explicit momentum is lower than synchronous SGD's. Refuses to start when the ranks are
not all on one node.
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 128]},
    "optimizer": "sgd",
}

MUTABLE = {
    "distributed": "hogwild",
    "epochs": 3,
    "batch_size": 64,  # per rank
    "lr": 0.05,
    "momentum": 0.5,
    "seed": 0,
    "train_samples": 0,  # 0: all 60000
    "timeline": False,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
