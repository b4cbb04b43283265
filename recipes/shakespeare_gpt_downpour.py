"""The Shakespeare GPT (``shakespeare_gpt.py``'s model and data) trained with Downpour SGD
(DistBelief): one parameter server and two workers.

Run:  mpiexec -n 3 meta run recipes/shakespeare_gpt_downpour.py

The last rank holds the parameters and applies the workers' pushed gradients with the
recipe's AdamW (clipped); each worker trains on its half of the blocks, pushes its gradient
after every step and waits for the parameters that answer its fetch (``blocking_fetch``)
before the next, without waiting for the other worker; worker 0 first trains alone for
``warm_start_steps`` (DistBelief's warm start). Each worker runs the planned executor.

Why the blocking fetch (issue 39): nonblocking, a step's gradient is taken at the answer to
the fetch before last, a push of the other worker further behind; Adam on the server then
learned far more slowly than one process (2.564 nats/char after the full run's 490 server
updates, constant rate, against one process's 1.999). Blocking, the gradient lacks only the
other worker's push in flight (a staleness of 1 for 431 of 490 pushes): 2.330 with the cosine
schedule. The rest of the gap is that one update of staleness: one process whose AdamW is
fed each step the previous step's gradient reaches 2.778 after 160 steps, against 2.403 (Downpour
blocking: 2.609, nonblocking 2.815; all at a constant rate on 2,560 blocks).
DistBelief put Adagrad on the server against staleness; here it did no better (2.849 against
AdamW's 2.815 at 160 updates). The wait is a round trip a step, about 1 % of a step here.

The cosine schedule spans the server's updates: the server rank builds its optimizer over the
whole data's steps (both workers' pushes), each worker over its own half, so both schedules
are at the same fraction of the run at the same time.
"""

from meta.run.recipe import AtMost
from recipes.shakespeare_gpt import FIXED as SINGLE
from recipes.shakespeare_gpt import MUTABLE as SINGLE_MUTABLE

FIXED = dict(SINGLE)

MUTABLE = {
    **SINGLE_MUTABLE,
    # worker 0 trains alone for 20 steps first: from the initialisation, two asynchronous
    # workers stalled near the unigram entropy (3.0 nats after 160 updates in a short run)
    "distributed": {"name": "downpour", "servers": 1, "n_fetch": 1, "n_push": 1,
                    "warm_start_steps": 20, "blocking_fetch": True},
}

METRICS = {
    # nats per character; measured 2.330 (seed 0, full run, 490 server updates, 209 s on a
    # 2-core machine at load average 12): one process reaches 1.999 after as many (README)
    "test_loss": AtMost(2.5),
}
