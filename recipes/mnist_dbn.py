"""MNIST with a 784-500-500-10 deep belief network: greedy layer-wise CD-1 pre-training of two
RBMs (seed 000, Algorithms 1 and 2), then supervised fine-tuning by SGD (Algorithm 3).

Run:  meta run recipes/mnist_dbn.py

The DBN keys (pretrain_epochs, pretrain_lr, cd_k, pretrain_batch_size, persistent_cd) are in
``meta.recipe.Definitions``; ``hidden`` gives the RBM widths. The input stays in [0, 1] (binary
visible units), so the exported model.onnx expects unstandardized pixels. Under MPI with
``distributed: allreduce`` pre-training is data-parallel too (each rank a shard of every batch of
``pretrain_batch_size`` per rank, CD statistics averaged by allreduce); under other strategies
every rank pre-trains the same stack from the same seed. Fine-tuning follows the strategy:

    mpiexec -n 3 meta run recipes/mnist_dbn.py --set distributed=async_parameter_server
"""

from meta.recipe import AtLeast, AtMost

FIXED = {
    "dataset": "mnist",
    "model": "dbn",
    "hidden": [500, 500],
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
    "train_time_s": AtMost(180),
}
