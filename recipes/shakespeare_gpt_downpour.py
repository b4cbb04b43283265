"""The Shakespeare GPT (``shakespeare_gpt.py``'s model and data) trained with Downpour SGD
(DistBelief): one parameter server and two workers.

Run:  mpiexec -n 3 meta run recipes/shakespeare_gpt_downpour.py

The last rank holds the parameters and applies the workers' pushed gradients with the
recipe's AdamW (clipped); each worker trains on its half of the blocks, fetches the
parameters every ``n_fetch`` steps and pushes its accrued gradients every ``n_push`` steps,
without waiting for the other; worker 0 first trains alone for ``warm_start_steps``
(DistBelief's warm start). The learning rate is constant: the server applies both workers'
pushes, twice as many updates as a worker's steps, so a cosine schedule laid over a worker's
steps would reach zero halfway through the server's. Each worker runs the planned executor.
"""

from meta.recipe import AtMost
from recipes.shakespeare_gpt import FIXED as SINGLE
from recipes.shakespeare_gpt import MUTABLE as SINGLE_MUTABLE

FIXED = dict(SINGLE)

MUTABLE = {
    **SINGLE_MUTABLE,
    "lr_schedule": "constant",
    # worker 0 trains alone for 20 steps first: from the initialisation, two asynchronous
    # workers stalled near the unigram entropy (3.0 nats after 160 updates in a short run)
    "distributed": {"name": "downpour", "servers": 1, "n_fetch": 1, "n_push": 1,
                    "warm_start_steps": 20},
}

METRICS = {
    # nats per character; measured 2.564 (seed 0, full run, 146 s on a busy 2-core machine):
    # behind the one-process recipe's 1.999 after as many updates (see README)
    "test_loss": AtMost(2.7),
}
