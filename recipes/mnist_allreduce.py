"""MNIST MLP trained data-parallel by synchronous allreduce (Level 3), optionally compressed.

Run:  mpiexec -n 2 meta run recipes/mnist_allreduce.py
      mpiexec -n 4 meta run recipes/mnist_allreduce.py --set compression=topk --set timeline=true
Every rank averages its gradients with the others through one fused, chunked allreduce per step
(``compression``: none, fp16, topk, sign; topk and sign feed the error back locally), or, with
all ranks on one machine and no compression, through shared memory, each rank stepping 1/P of
one shared copy of the parameters (``--set shared_memory=false``: MPI's allreduce); all
replicas stay identical. Prints each step phase's share and the communication time per step,
measured and predicted by the alpha-beta model; ``timeline=true`` writes a Chrome trace.
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "mnist",
    "model": {"name": "mlp", "hidden": [256, 128]},
    "optimizer": "sgd",
}

MUTABLE = {
    "epochs": 4,
    "batch_size": 64,  # per rank
    "lr": 0.05,
    "momentum": 0.9,
    "seed": 0,
    "train_samples": 0,  # 0: all 60000; CI trains on fewer
    "distributed": {"name": "allreduce", "compression": "none", "topk_ratio": 0.01,
                    "chunk_bytes": 4194304},
    "timeline": False,
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
