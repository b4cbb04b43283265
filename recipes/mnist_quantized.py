"""MNIST MLP trained by allreduce with stochastically quantized gradients (QSGD, TernGrad).

Run:  mpiexec -n 2 meta run recipes/mnist_quantized.py
      mpiexec -n 2 meta run recipes/mnist_quantized.py --set qsgd_bits=2 \
          --set qsgd_error_feedback=true
      mpiexec -n 2 meta run recipes/mnist_quantized.py --set compression=terngrad
Each rank rounds its gradient, bucket by bucket, to a sign and one of 2**(bits-1) - 1 levels of
the bucket's largest magnitude (``qsgd``), or to -1, 0, +1 times it (``terngrad``), up or down
at random so that the expectation is the gradient; the levels travel packed (4 bits: 8x fewer
bytes than float32, ternary: 1.6 bits) in one allgather. Prints the bytes sent per step.
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
    "distributed": {"name": "allreduce", "compression": "qsgd", "qsgd_bits": 4,
                    "qsgd_bucket_size": 512, "qsgd_error_feedback": False},
    "timeline": False,
}

METRICS = {"test_accuracy": AtLeast(0.97)}
