"""Fashion-MNIST with LeNet-5: clothing images are harder than digits, so the bar is 89 %.

Run:  meta run recipes/fashion_lenet.py
      mpiexec -n 2 meta run recipes/fashion_lenet.py   (synchronous allreduce data parallelism)
"""

from meta.recipe import AtLeast

FIXED = {
    "dataset": "fashion-mnist",
    "model": "lenet",
    "optimizer": "adam",
}

MUTABLE = {
    "epochs": 6,
    "batch_size": 64,  # per rank
    "lr": 0.002,
    "lr_schedule": "step",
    "lr_decay_epochs": [4],
    "lr_decay_factor": 0.1,
    "augmentation": ["flip"],  # clothes look the same mirrored; digits would not
    "seed": 0,
    "executor": "planned",
}

METRICS = {
    "test_accuracy": AtLeast(0.89),
}
