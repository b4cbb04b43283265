"""A recorded asynchronous run's workers on one process: each one's batches, its Dropout draws
and its gradient at the parameters it holds (``Workers``), and the asynchronous parameter
server's updates applied in a given order (``apply_in_order``).

Both ``meta replay`` (``meta.run.replay``, which recomputes a run from its ``replay.json``) and the
virtual-time simulator (``meta.planner.virtual_time``, which orders the updates by simulated
clocks, and which ``meta replay`` uses for Downpour's schedule) need exactly this; holding it
here, below both, keeps one piece of code for "worker w's next gradient" without an import
circle between them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from meta.run.replay_record import ReplayError


def _batches(run: Any, index: int, replicas: int) -> Iterator[dict[str, np.ndarray]]:
    """A worker's feeds in the order its trainer took them (the runner's own sampler)."""
    from meta.run.runner import make_sampler

    d, trainer, n = run.recipe.definitions, run.trainer, run.trainer.names
    train = trainer.train_data
    sampler = make_sampler(len(train), d, index, replicas)
    for epoch in range(d.epochs):
        sampler.set_epoch(epoch)
        for i, indices in enumerate(sampler):
            x, y = train.batch(indices)
            if trainer.transform is not None:
                x = trainer.transform(x, sampler.batch_rng(i))
            yield {n["input"]: x, n["labels"]: y}


class Workers:
    """A run's workers on one process: each one's batches (its rank's sampler), its own
    Dropout draws, and its gradient at the parameters it holds. What ``replay`` and the
    virtual-time simulator (``meta.planner.virtual_time``) share: one piece of code computes
    "worker w's next gradient", whichever order the updates are applied in.

    ``replica(w)`` is worker ``w``'s (index, replicas) of the data, as its rank took them.
    """

    def __init__(self, run: Any, workers: list[int],
                 replica: Callable[[int], tuple[int, int]]) -> None:
        from meta.lv3.flat import FlatBuffer

        self.run, self.workers = run, list(workers)
        executor, optimizer = run.trainer.executor, run.trainer.optimizer
        self.executor, self.names = executor, run.trainer.names
        # The server's optimizer: built as the server rank built it (its sampler is the whole
        # data's, as RecipeRun's at size 1), over its own copy of the initial parameters.
        self.initial = {k: v.copy() for k, v in optimizer.params.items()}
        self.transform = optimizer.transform
        self.local = FlatBuffer.adopt(optimizer.params)  # the executor computes with this copy
        self.grads = FlatBuffer(self.local.shapes, self.local.dtype)
        self.streams = {w: _batches(run, *replica(w)) for w in self.workers}
        self.random_ops = {k: op for k, op in executor.ops.items() if hasattr(op, "rng")}
        start_rng = {k: op.rng.bit_generator.state for k, op in self.random_ops.items()}
        self.rngs = {w: dict(start_rng) for w in self.workers}  # each rank draws its own
        executor.train(True)

    def server(self) -> tuple[Any, Any]:
        """A fresh server optimizer over a copy of the initial parameters, and its flat
        buffer."""
        from meta.lv2.optimizers import Optimizer
        from meta.lv3.flat import FlatBuffer

        server = Optimizer(self.transform, {k: v.copy() for k, v in self.initial.items()})
        return server, FlatBuffer.adopt(server.params)

    def gradient(self, w: int, params: np.ndarray) -> np.ndarray | None:
        """Worker ``w``'s gradient on its next batch at the flat ``params``, packed into
        ``self.grads`` (returned; overwritten by the next call), or None when ``w`` has no
        batch left."""
        feeds = next(self.streams[w], None)
        if feeds is None:
            return None
        np.copyto(self.local.buffer, params)
        for k, op in self.random_ops.items():
            op.rng.bit_generator.state = self.rngs[w][k]
        _, grads = self.executor.inference_and_backprop(feeds, loss=self.names["loss"],
                                                        outputs=[self.names["logits"]])
        self.rngs[w] = {k: op.rng.bit_generator.state for k, op in self.random_ops.items()}
        return self.grads.pack(grads)

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """The test metrics (loss, accuracy) at the flat ``params``."""
        np.copyto(self.local.buffer, params)
        try:
            return self.run.trainer.evaluate(self.run.trainer.test_data, "test_")
        finally:
            self.executor.train(True)


def apply_in_order(order: list[int], workers: Workers,
                   on_update: Callable[[int, int, dict], None] | None = None,
                   where: Any = "the order") -> dict[str, np.ndarray]:
    """The asynchronous parameter server on one process: each update in ``order`` is that
    worker's gradient at the parameters it last received, applied by the server's optimizer,
    which answers with its new parameters. Returns the server's final parameters."""
    server, server_flat = workers.server()
    held = {w: server_flat.buffer.copy() for w in workers.workers}  # what each last received
    for i, w in enumerate(order):
        if workers.gradient(w, held[w]) is None:
            raise ReplayError(f"{where}: update {i} is worker {w}'s, which has no batch left")
        server.step(workers.grads.views)
        np.copyto(held[w], server_flat.buffer)
        if on_update is not None:
            on_update(i, w, server.params)
    return {k: np.array(v) for k, v in server.params.items()}
