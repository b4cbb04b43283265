"""MPI checks of the bf16 gradient exchange (``meta.lv3.comm.bf16``, ``grad_dtype=bf16``),
written once: pytest runs them in-process at size 1; under MPI every rank runs them:

    mpiexec -n 2 python tests/lv3/comm/bf16_checks.py [check_name ...]
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import Communicator, make_strategy
from meta.lv3.comm.bf16 import Bf16Queue, round_bf16
from tests import checks

SIZES = (0, 1, 2, 5, 1000, 4099)  # fewer values than ranks: some ranks sum nothing
STEPS = 12


def _values(comm: Communicator, n: int, seed: int) -> np.ndarray:
    """This rank's float32 values: a wide range of magnitudes and signs, so sums cancel and
    round; the same on every run."""
    rng = np.random.default_rng([seed, comm.rank])
    scale = np.float32(2.0) ** rng.integers(-20, 20, n)
    return (rng.standard_normal(n).astype(np.float32) * scale).astype(np.float32)


def _expected(comm: Communicator, values: np.ndarray) -> np.ndarray:
    """The float32 sum, in rank order, of every rank's values rounded to bf16, rounded to bf16
    once (the allgather carries bf16): what every rank must hold, bit for bit."""
    everyone = comm.allgather(values)
    total = np.zeros(values.size, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # inf - inf, 3e38 * P: as IEEE says
        for row in everyone:
            total += round_bf16(row)
    return round_bf16(total)


def check_sum_is_the_float32_sum_of_the_bf16_values(comm: Communicator) -> None:
    """Several sums under way at once (progressed, then finished), each bit-identical on every
    rank to the float32 sum of the same bf16 values, rounded once; NaN and inf carried; 2
    bytes of send buffers per value."""
    queue = Bf16Queue(comm, comm.split(0))
    buffers = [_values(comm, n, seed) for seed, n in enumerate(SIZES)]
    specials = np.array([np.inf, 1.0, -np.inf if comm.rank == 0 else np.inf, np.nan, 3e38],
                        np.float32)
    buffers.append(specials)
    expected = [_expected(comm, b) for b in buffers]
    for b in buffers:
        queue.start(b)
        queue.progress()
    assert queue.take_bytes() == 2 * sum(b.size for b in buffers)
    queue.finish()
    assert not queue.pending
    for got, want in zip(buffers, expected):
        np.testing.assert_array_equal(got, want)  # NaN equals NaN here
    if comm.size > 1:  # inf + -inf is NaN; 3e38 * P overflows to inf
        assert np.isposinf(specials[0]) and np.isnan(specials[2]) and np.isnan(specials[3])
        assert np.isposinf(specials[4])


def _train(comm: Communicator, grad_dtype: str, planned: bool) -> tuple[list[float], object]:
    """STEPS steps of a small MLP under allreduce (MPI, not shared memory) with ``grad_dtype``:
    the losses (mean over ranks) and the strategy. Planned: the backward hands buckets of
    about 1 KB (several a step, overlapped)."""
    from meta.lv1 import PlannedExecutor, ReferenceExecutor, mlp

    graph = mlp((1, 4, 4), hidden=(13, 7), classes=3, seed=1)
    strategy = make_strategy("allreduce", Optimizer(sgd(0.05, momentum=0.9), graph.parameters),
                             comm, shared_memory=False, grad_dtype=grad_dtype,
                             bucket_bytes=1024)
    executor = (PlannedExecutor if planned else ReferenceExecutor)(graph).train()
    rng = np.random.default_rng(100 + comm.rank)
    losses = []
    for _ in range(STEPS):
        feeds = {"input": rng.standard_normal((6, 1, 4, 4)).astype(np.float32),
                 "labels": rng.integers(0, 3, 6)}
        loss = np.array([float(strategy.step_with(executor, feeds)["loss"])])
        comm.allreduce(loss)
        losses.append(float(loss[0]) / comm.size)
        for v in graph.parameters.values():  # replicas stay bit-identical
            gathered = comm.allgather(np.ascontiguousarray(v))
            assert all(np.array_equal(g, gathered[0]) for g in gathered)
    return losses, strategy


def check_bf16_training_sends_half_the_bytes(comm: Communicator) -> None:
    """The same steps with grad_dtype bf16 send exactly half the bytes of float32 (counted by
    the strategy), overlapped with the planned executor's backward and after the reference
    executor's; the losses follow float32's closely."""
    from meta.lv1.plan import runtime

    for planned in ((False, True) if runtime.available() else (False,)):
        f32_losses, f32 = _train(comm, "f32", planned)
        losses, bf16 = _train(comm, "bf16", planned)
        assert 2 * bf16.bytes_sent == f32.bytes_sent, (bf16.bytes_sent, f32.bytes_sent)
        if comm.size > 1:
            assert bf16.bytes_sent > 0 and bf16.grad_dtype == "bf16" and bf16.node is None
            n = bf16.flat_grads.buffer.size
            assert bf16.report()["bytes_sent_per_step"] == 2 * n
        if planned and comm.size > 1:
            assert bf16.buckets.used
            calls = [e for e in bf16.timeline.background_events
                     if e[0] == "allreduce (overlapped)"]
            assert len(calls) >= 2 * STEPS, len(calls)
        np.testing.assert_allclose(losses, f32_losses, rtol=0, atol=2e-2)


def check_strategy_sum_is_the_bf16_exchange(comm: Communicator) -> None:
    """One step of plain SGD (lr 1) through the strategy moves every parameter by exactly the
    bf16 exchange's result divided by P: the strategy adds nothing of its own."""
    shapes = {"w": (33, 5), "b": (5,)}
    start = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    strategy = make_strategy("allreduce", Optimizer(sgd(1.0), start), comm,
                             shared_memory=False, grad_dtype="bf16", chunk_bytes=64)
    grads = {k: _values(comm, int(np.prod(s)), 7 + i).reshape(s)
             for i, (k, s) in enumerate(shapes.items())}
    strategy.step(grads)
    for k, g in grads.items():
        want = _expected(comm, g.ravel()) if comm.size > 1 else g.ravel()
        want = want * np.float32(1.0 / comm.size)
        np.testing.assert_array_equal(strategy.params[k].ravel(), -want, err_msg=k)


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__.removeprefix("check_"): f for f in (
        check_sum_is_the_float32_sum_of_the_bf16_values,
        check_bf16_training_sends_half_the_bytes,
        check_strategy_sum_is_the_bf16_exchange,
    )
}

if __name__ == "__main__":
    sys.exit(checks.main(CHECKS, sys.argv[1:]))
