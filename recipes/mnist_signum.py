"""A recipe that brings its own optimizer: Signum (signSGD with momentum, Bernstein et al. 2018).

The update rule is written here in a few lines as optax-style transformations and registered by
name; the recipe then chooses it like a built-in one. Under ``mpiexec`` the same rule runs inside
the synchronous allreduce strategy, which averages the gradients before the rule sees them.

Run:  meta run recipes/mnist_signum.py
      mpiexec -n 2 meta run recipes/mnist_signum.py
"""

import numpy as np

from meta.lv2.optimizers import (
    GradientTransformation,
    chain,
    register_optimizer,
    scale_by_learning_rate,
    trace,
)
from meta.recipe import AtLeast


def scale_by_sign() -> GradientTransformation:
    """updates = sign(updates): every parameter moves by the same step size."""
    return GradientTransformation(
        init=lambda params: (),
        update=lambda grads, state, params: ({k: np.sign(g) for k, g in grads.items()}, state))


@register_optimizer("signum")
def signum(lr, momentum=0.9):
    return chain(trace(momentum), scale_by_sign(), scale_by_learning_rate(lr))


FIXED = {"dataset": "mnist", "hidden": [256], "optimizer": "signum"}
MUTABLE = {"epochs": 2, "batch_size": 128, "lr": 0.0005, "momentum": 0.9, "seed": 0,
           "train_samples": 0}
METRICS = {"test_accuracy": AtLeast(0.96)}
