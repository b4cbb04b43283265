"""MNIST with a 784-500-500-10 deep belief network: greedy layer-wise CD-1 pre-training of two
RBMs (seed 000, Algorithms 1 and 2), then supervised fine-tuning by SGD (Algorithm 3).

Run:  meta run recipes/mnist_dbn.py

The DBN's options (hidden: the RBM widths, pretrain_epochs, pretrain_lr, cd_k,
pretrain_batch_size, persistent_cd) are declared by the ``dbn`` model (``meta components
model``). The input stays in [0, 1] (binary visible units), so the exported model.onnx expects
unstandardized pixels. Under MPI,
pre-training is distributed as the strategy says, and fine-tuning follows the strategy:

- ``distributed: allreduce``: synchronous data parallelism (each rank a shard of every batch of
  ``pretrain_batch_size`` per rank, CD statistics averaged by one allreduce per update);
- ``async_rma``, ``async_parameter_server``, ``downpour``: asynchronous, the seed's Algorithm 4
  (the last rank(s) serve the parameters; each other rank trains on its own shard of the data,
  pushes every CD step to the server and reads the parameters back: one-sided
  ``MPI_Accumulate`` / ``MPI_Get`` on a window under ``async_rma``);
- the others: every rank pre-trains the same stack from the same seed.

    mpiexec -n 3 meta run recipes/mnist_dbn.py --set distributed=async_rma   # 97.5 %
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": {"name": "mnist", "normalize": False},  # binary visible units: pixels in [0, 1]
    "model": {"name": "dbn", "hidden": [500, 500]},
    "optimizer": "sgd",
}

MUTABLE = {
    "pretrain_epochs": 1,
    "pretrain_lr": 0.1,
    "cd_k": 1,
    "pretrain_batch_size": 100,
    "persistent_cd": False,
    "epochs": 4,  # of fine-tuning
    "batch_size": 128,
    "lr": 0.3,  # sigmoid hidden units take a larger step than mnist_mlp's ReLUs
    "momentum": 0.9,
    "seed": 0,
    "distributed": "allreduce",
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
