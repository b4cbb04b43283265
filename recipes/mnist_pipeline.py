"""MNIST MLP trained with pipeline parallelism: the network cut into one stage per rank.

Run:  mpiexec -n 2 meta run recipes/mnist_pipeline.py
      mpiexec -n 4 meta run recipes/mnist_pipeline.py --set schedule=gpipe
Each batch is split into ``micro_batches`` that flow through the stages forward and back
(``schedule``: 1f1b or gpipe); the cuts balance the nodes' measured times (``balance``), or
come from ``cuts`` (the last node of each stage but the last: ``--set cuts=fc0,relu1``).
Every step's gradients are the whole batch's, as on one process. Prints per stage its times,
idle share (the bubble, against (p-1)/(m+p-1)), parameters and stored activations, and the
step time the schedule model predicts beside the measured one.
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 512, 256, 512]},  # splits evenly in 2 or 4
    "optimizer": "sgd",
}

MUTABLE = {
    "epochs": 2,
    "batch_size": 128,  # the whole pipeline's: split into micro_batches
    "lr": 0.05,
    "momentum": 0.9,
    "lr_schedule": "cosine",
    "seed": 0,
    "distributed": {"name": "pipeline", "stages": 0, "micro_batches": 4, "schedule": "1f1b",
                    "cuts": [], "balance": "measured"},
    "timeline": False,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
