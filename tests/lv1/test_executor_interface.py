"""Every executor implements the one declared interface (``meta.lv1.executor.Executor``)."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, mlp
from meta.lv1.executor import Executor, NativeExecutor
from meta.lv1.ort_executor import OnnxRuntimeExecutor
from meta.lv1.plan.executor import PlannedExecutor
from meta.lv1.torch_executor import TorchExecutor
from meta.lv3.pipeline.stage import PipelineExecutor
from meta.lv3.tensor_parallel.strategy import PartitionedExecutor

EXECUTORS = [ReferenceExecutor, NativeExecutor, PlannedExecutor, TorchExecutor,
             OnnxRuntimeExecutor, PipelineExecutor, PartitionedExecutor]


@pytest.mark.parametrize("cls", EXECUTORS, ids=lambda c: c.__name__)
def test_every_executor_is_an_executor(cls):
    assert issubclass(cls, Executor)
    for name in ("inference", "inference_and_backprop"):
        assert getattr(cls, name) is not getattr(Executor, name), f"{cls.__name__}.{name}"
    assert isinstance(cls.supports_gradient_hook, bool)


@pytest.mark.parametrize("cls", [c for c in EXECUTORS if c is not PlannedExecutor],
                         ids=lambda c: c.__name__)
def test_train_and_eval_are_written_once(cls):
    """The mode switch is Executor's; an executor says what it redoes in ``_mode_changed``
    (the planned executor, under lv1/plan/, still overrides both to refresh its plans)."""
    assert cls.train is Executor.train and cls.eval is Executor.eval


def test_the_interface_as_callers_use_it():
    ex = ReferenceExecutor(mlp(input_shape=(4,), hidden=(3,), classes=2, seed=0))
    assert ex.training is None and ex.timeline is None and not ex.supports_gradient_hook
    assert ex.train() is ex and ex.training is True and ex.eval().training is False
    assert set(ex.placement().values()) == {"numpy"} and set(ex.placement()) == set(ex.ops)
    feeds = {"input": np.zeros((2, 4), np.float32), "labels": np.array([0, 1])}
    values, grads = ex.inference_and_backprop(feeds, outputs=["logits"])
    assert values["logits"].shape == (2, 2) and set(grads) == set(ex.graph.parameters)
    with pytest.raises(ValueError, match="ReferenceExecutor takes no gradient hook"):
        ex.inference_and_backprop(feeds, hook=object())
    assert PlannedExecutor.supports_gradient_hook
    assert dict(Executor.ops) == {} and Executor.timeline is None
