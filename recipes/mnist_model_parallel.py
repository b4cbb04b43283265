"""MNIST with one wide network partitioned over the ranks by neurons (DistBelief's model
parallelism): a model over one rank's parameter budget, trained when partitioned.

Run:  mpiexec -n 2 meta run recipes/mnist_model_parallel.py
      meta run recipes/mnist_model_parallel.py       (one rank: refused, over the budget)
      mpiexec -n 2 meta run recipes/mnist_model_parallel.py --set groups=1 \\
          --set distributed.param_budget_mb=0          (fully connected: compare bytes/step)

The network (``grouped_mlp``, defined here) is 784 -> 1024 fully connected, two layers of
1024 neurons each connected to 1/``groups`` of the layer below (grouped 1x1 convolutions:
local connectivity), then 10 logits. Partitioned, the first layer is split by output neurons
(column-parallel), the grouped layers run on each rank's own neurons with no communication
and the logits layer sums the ranks' parts (one allreduce of 128 x 10 values per step); with
``groups: 1`` the middle layers are fully connected and each step also allreduces two
activations of 128 x 1024. The run prints the bytes sent per step, each rank's parameters
and the step time predicted from one process's node times and an α-β link beside the
measured one.
"""

import math

import numpy as np

from meta.common.component import Option
from meta.lv1 import models
from meta.lv1.builder import GraphBuilder
from meta.recipe import AtLeast


def grouped_mlp(input_shape, classes, seed, dtype, hidden=1024, layers=2, groups=8):
    """Input -> ``hidden`` (fully connected) -> ``layers`` x ``hidden`` (each neuron reads
    hidden / ``groups`` neurons of the layer below: a 1x1 convolution with ``groups``) ->
    ``classes``. He-uniform weights, zero biases, drawn from ``seed``."""
    if hidden % groups:
        raise ValueError(f"grouped_mlp: hidden {hidden} is not divisible by groups {groups}")
    rng = np.random.default_rng(seed)
    b = GraphBuilder("grouped_mlp")
    x = b.input("input", dtype, ("N", *input_shape))
    labels = b.input("labels", np.int64, ("N",))
    fan_in = math.prod(input_shape)
    bound = math.sqrt(6.0 / fan_in)
    w = rng.uniform(-bound, bound, (hidden, fan_in)).astype(dtype)
    h = b.node("Gemm", [b.node("Flatten", [x], name="pixels", axis=1),
                        b.initializer("fc0.weight", w),
                        b.initializer("fc0.bias", np.zeros(hidden, dtype))], name="fc0", transB=1)
    h = b.node("Relu", [h], name="relu_fc0")
    # (N, hidden, 1, 1): a 1x1 convolution with groups is a layer of locally connected neurons
    h = b.node("Reshape", [h, b.initializer("neurons", np.array([0, -1, 1, 1]))],
               name="as_channels")

    def layer(h, name, fan_in, out, group):
        bound = math.sqrt(6.0 / (fan_in // group))
        w = rng.uniform(-bound, bound, (out, fan_in // group, 1, 1)).astype(dtype)
        h = b.node("Conv", [h, b.initializer(f"{name}.weight", w),
                            b.initializer(f"{name}.bias", np.zeros(out, dtype))],
                   name=name, kernel_shape=[1, 1], group=group)
        return b.node("Relu", [h], name=f"relu_{name}")

    for i in range(1, layers + 1):
        h = layer(h, f"fc{i}", hidden, hidden, groups)
    bound = math.sqrt(6.0 / hidden)
    w = b.initializer("logits.weight", rng.uniform(-bound, bound, (classes, hidden)).astype(dtype))
    logits = b.node("Gemm", [b.node("Flatten", [h], name="flatten", axis=1), w,
                             b.initializer("logits.bias", np.zeros(classes, dtype))],
                    name="logits", transB=1)
    loss = b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss", reduction="mean")
    b.output(logits, dtype, ("N", classes))
    b.output(loss, dtype, ())
    return b.build()


models.MODELS.add("grouped_mlp", grouped_mlp, {
    "hidden": Option(1024, "neurons per hidden layer", low=1),
    "layers": Option(2, "grouped hidden layers after the first, fully connected one", low=0),
    "groups": Option(8, "groups of the grouped layers (1: fully connected)", low=1),
})

FIXED = {
    "dataset": "mnist",
    "model": "grouped_mlp",
    "optimizer": "sgd",
}

MUTABLE = {
    "epochs": 2,
    "train_samples": 0,  # all 60,000
    "batch_size": 128,  # every rank takes the whole batch: the ranks split the neurons
    "lr": 0.05,
    "momentum": 0.9,
    "lr_schedule": "cosine",
    "seed": 0,
    "hidden": 1024,
    "layers": 2,
    "groups": 8,
    "executor": "native",
    # 4.3 MB of parameters: refused on one rank, 2.2 MB per rank at -n 2
    "distributed": {"name": "partitioned", "param_budget_mb": 3.0},
}

METRICS = {
    "test_accuracy": AtLeast(0.97),
}
