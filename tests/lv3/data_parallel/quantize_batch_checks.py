"""MPI checks of issue 21's stochastic quantization and batch growth (mpi4py's test style).

pytest runs them in-process at size 1 and as a script under ``mpiexec -n 2``:

    mpiexec -n 2 python tests/lv3/data_parallel/quantize_batch_checks.py [check_name ...]
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from meta.lv1 import ReferenceExecutor, mlp
from meta.lv2 import Trainer, synthetic
from meta.lv2.batch_schedule import BatchGrowth
from meta.lv2.events import Event
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import Allreduce, Communicator, DistributedSampler, make_strategy
from tests import checks
from tests.lv3.mpi_checks import (
    _assert_replicas_identical,
    _init,
    _loss,
    _problem,
    _train_side_by_side,
)


def check_quantized_allreduce_keeps_replicas_identical(comm: Communicator) -> None:
    """Every rank decodes every payload in rank order: replicas stay bit-identical, the loss
    falls as uncompressed allreduce's does, and each step sends exactly one packed payload."""
    x, y = _problem()
    for options in ({"qsgd_bits": 2}, {"qsgd_bits": 4, "qsgd_error_feedback": True},
                    {"qsgd_bits": 8, "qsgd_norm": "l2"}, {}):
        compression = "qsgd" if options else "terngrad"
        opt = make_strategy("allreduce", Optimizer(sgd(0.05), _init(seed=100 + comm.rank)),
                            comm, compression=compression, **options,
                            **{f"{compression}_bucket_size": 4})
        start = _loss(opt.params, x, y)
        _train_side_by_side(comm, opt, Allreduce(Optimizer(sgd(0.1), _init(1)), comm), steps=60)
        assert _loss(opt.params, x, y) < 0.5 * start, (options, _loss(opt.params, x, y))
        assert opt.bytes_sent == 60 * opt.compressor.payload_bytes


def check_quantized_ranks_round_independently(comm: Communicator) -> None:
    """The same gradient on every rank is rounded differently on each (a stream per rank)."""
    opt = make_strategy("allreduce", Optimizer(sgd(0.1), _init(seed=0)), comm,
                        compression="qsgd", qsgd_bits=2)
    payload = opt.compressor.compress(np.linspace(-1, 1, opt.compressor.n))
    everyone = comm.allgather(payload)
    assert all(not np.array_equal(everyone[0], row) for row in everyone[1:])


class StepsPerEpoch(Event):
    """Records, on this rank, each epoch's batch size and the steps it took."""

    name = "steps_per_epoch"
    priority = -50
    seen: list[tuple[int, int]] = []

    def on_epoch_begin(self, trainer: Any, epoch: int) -> None:
        self.first_step = trainer.step

    def on_epoch_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        StepsPerEpoch.seen.append((trainer.sampler.batch_size, trainer.step - self.first_step))


def check_batch_growth_keeps_ranks_in_step(comm: Communicator) -> None:
    """Every rank's batch grows 4x after epochs 1 and 3, every rank takes the same steps per
    epoch (ceil(shard / batch)) in the synchronous allreduce, and the replicas end identical."""
    StepsPerEpoch.seen.clear()
    graph = mlp(input_shape=(8,), hidden=(16,), classes=10)
    strategy = Allreduce(Optimizer(sgd(0.05), graph.parameters), comm)
    sampler = DistributedSampler(600, 5, comm.rank, comm.size, seed=0)
    trainer = Trainer(ReferenceExecutor(graph), strategy.updater(), synthetic(600, (8,)),
                      sampler, synthetic(100, (8,), split=1),
                      [BatchGrowth(epochs=[1, 3], factor=4), StepsPerEpoch()],
                      eval_shard=(comm.rank, comm.size))
    history = trainer.fit(4)
    shard = -(-600 // comm.size)
    expected = [(b, -(-shard // b)) for b in (5, 20, 20, 80)]
    assert StepsPerEpoch.seen == expected, (comm.rank, StepsPerEpoch.seen, expected)
    everyone = comm.gather_obj(StepsPerEpoch.seen)
    assert comm.rank != 0 or everyone == [expected] * comm.size, everyone
    assert [m["batch_size"] for m in history] == [5, 20, 20, 80]
    assert history[-1]["steps"] == sum(steps for _, steps in expected)
    assert history[-1]["train_accuracy"] > 0.5  # it learned: the steps were real ones
    _assert_replicas_identical(comm, strategy.params)


CHECKS: dict[str, Callable[[Communicator], None]] = {
    name.removeprefix("check_"): fn for name, fn in globals().items()
    if name.startswith("check_") and callable(fn)}


def main(argv: list[str]) -> int:
    return checks.main(CHECKS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
