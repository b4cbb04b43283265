from __future__ import annotations

import numpy as np
import pytest

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import AllreduceOptimizer, SingleProcessCommunicator, allreduce_mean


def params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}


def grad_sequence(steps: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)} for _ in range(steps)]


class TwinCommunicator(SingleProcessCommunicator):
    """Pretends to be two identical ranks: a sum doubles, so the mean must undo it."""

    size = 2

    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        super().allreduce(buf, op)
        if op == "sum":
            buf *= 2
        return buf


@pytest.mark.parametrize("transform", [sgd(0.1), sgd(0.05, momentum=0.9, nesterov=True)])
@pytest.mark.parametrize("comm", [SingleProcessCommunicator(), TwinCommunicator()])
def test_equals_bare_optimizer_exactly(transform, comm) -> None:
    bare = Optimizer(transform, params())
    wrapped_params = params()
    arrays = dict(wrapped_params)
    wrapped = AllreduceOptimizer(Optimizer(transform, wrapped_params), comm)
    for grads in grad_sequence(10):
        bare.step(grads)
        wrapped.step(grads)
    assert wrapped.params is wrapped_params and list(wrapped_params) == list(arrays)
    for name in bare.params:
        assert wrapped.params[name] is wrapped.flat_params.views[name]  # rebound to the buffer
        np.testing.assert_array_equal(wrapped.params[name], bare.params[name])
    assert wrapped.state is wrapped.optimizer.state
    assert wrapped.comm is comm


def test_default_communicator_and_errors() -> None:
    opt = AllreduceOptimizer(Optimizer(sgd(0.1), params()))
    assert opt.comm.size == 1
    with pytest.raises(KeyError, match=r"missing \['b'\]"):
        opt.step({"w": np.zeros((3, 2))})
    mixed = {"w": np.zeros(2), "h": np.zeros(2, dtype=np.float32)}
    with pytest.raises(TypeError, match="w: float64, h: float32"):
        AllreduceOptimizer(Optimizer(sgd(0.1), mixed))


def test_allreduce_mean() -> None:
    values = np.array([1, 2], dtype=np.int32)
    out = allreduce_mean(TwinCommunicator(), values)
    assert out.dtype == np.float64 and out.tolist() == [1.0, 2.0]
    assert values.tolist() == [1, 2]
    assert float(allreduce_mean(SingleProcessCommunicator(), 0.5)) == 0.5
