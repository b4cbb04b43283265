"""MNIST MLP trained with Downpour SGD over pipelined replicas (DistBelief's arrangement).

Run:  mpiexec -n 5 meta run recipes/mnist_hybrid_downpour.py   (2 replicas x 2 stages + 1 server)
      mpiexec -n 7 meta run recipes/mnist_hybrid_downpour.py --set servers=3
Ranks 0-1 and 2-3 are two replicas, each a 2-stage pipeline (``micro_batches`` per batch,
``schedule`` 1f1b); the last ``servers`` ranks hold the parameters in shards and apply pushed
gradients with the recipe's optimizer. Each stage fetches its own parameters every
``n_fetch`` steps and pushes its accrued gradients every ``n_push`` steps, to and from the
shards that hold them, without waiting for the other replica. Prints, and keeps in
metrics.json, per stage the bytes of activations, pushes and fetches per step, the pipeline's
bubble and memory, and the staleness histogram of the applied pushes.

The servers apply SGD with momentum 0.5 and a cosine schedule: a server rank's schedule counts
the pushes a piece receives (its sampler is the whole epoch, every replica's steps), so the
rate decays over the run as planned. Momentum 0.9 diverged here (two replicas' stale pushes
each carried by it); Adagrad at 0.02 reached 96.0 % in two epochs, at 0.05 it was unstable.
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 128]},
    "optimizer": "sgd",
}

MUTABLE = {
    "distributed": {"name": "hybrid_downpour", "stages": 2, "servers": 1, "n_fetch": 1,
                    "n_push": 1, "micro_batches": 2, "schedule": "1f1b", "cuts": [],
                    "balance": "measured"},
    "epochs": 3,
    "batch_size": 64,  # per replica: split into micro_batches along its pipeline
    "lr": 0.1,
    "momentum": 0.5,
    "lr_schedule": "cosine",
    "seed": 0,
    "train_samples": 0,  # 0: all 60000
    "timeline": False,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
