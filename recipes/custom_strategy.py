"""A distributed strategy written in the recipe file: gradients summed locally for ``every``
steps, then averaged across the ranks in one allreduce and applied (k times fewer messages; a
k times larger effective batch). Every rank applies the same update: replicas stay identical.

Run:  mpiexec -n 2 meta run recipes/custom_strategy.py
"""

from meta.common.component import Option
from meta.lv3 import Strategy, register_strategy
from meta.recipe import AtLeast


@register_strategy("allreduce_every")
class AllreduceEvery(Strategy):
    """Accumulate gradients for ``every`` steps, then one allreduce and one update."""

    name = "allreduce_every"
    options = {**Strategy.options, "every": Option(4, "steps between allreduces", low=1)}

    def __init__(self, optimizer, comm=None, every=4, **options):
        super().__init__(optimizer, comm, **options)
        self.every, self.count = every, 0
        self.flat_grads.buffer[...] = 0

    def step(self, grads):
        self.timeline.begin()
        for name, g in grads.items():
            self.flat_grads.views[name] += g
        self.count += 1
        if self.count == self.every:
            self.average(self.grad_chunks, self.flat_grads.buffer)  # the mean over ranks
            self.flat_grads.buffer *= 1.0 / self.every  # and over the steps
            self.optimizer.step(self.flat_grads.views)
            self.flat_grads.buffer[...] = 0
            self.count = 0
        self.timeline.lap("update")

    def predict_comm_s(self, link):
        from meta.lv3.comm.costmodel import ring_allreduce

        return ring_allreduce(link, self.comm.size, self.flat_grads.nbytes) / self.every


FIXED = {
    "dataset": {"name": "mnist", "train_samples": 20000},
    "model": {"name": "mlp", "hidden": [128]},
    "distributed": {"name": "allreduce_every", "every": 2},
}

MUTABLE = {
    "epochs": 4,
    "batch_size": 32,
    "lr": 0.1,
    "momentum": 0.9,
    "seed": 0,
}

METRICS = {
    "test_accuracy": AtLeast(0.95),
}
