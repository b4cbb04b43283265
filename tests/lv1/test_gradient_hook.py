"""The gradient hook is one declared seam (issue 40): ``meta.lv1.gradient_hook.GradientHook``,
named by every executor's ``inference_and_backprop`` and implemented by Level 3's two hooks."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import meta.lv1.ort_executor  # noqa: F401 - registers its executor class
import meta.lv1.plan.executor  # noqa: F401
import meta.lv3.pipeline.stage  # noqa: F401
import meta.lv3.tensor_parallel.strategy  # noqa: F401
from meta.lv1.executor import Executor, ReferenceExecutor
from meta.lv1.gradient_hook import GradientHook
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3.data_parallel.allreduce import Allreduce, Buckets
from meta.lv3.data_parallel.node_exchange import NodeExchange

META = Path(__file__).parents[2] / "meta"


def _executors() -> list[type]:
    found, todo = [], [Executor]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_executor_names_the_protocol_for_its_hook():
    """Each executor that defines ``inference_and_backprop`` types ``hook`` as the protocol
    (the reference, native, planned, onnxruntime executors, a pipeline stage, a partition)."""
    defining = [c for c in _executors() if "inference_and_backprop" in vars(c)]
    names = {c.__name__ for c in defining}
    assert {"Executor", "ReferenceExecutor", "PlannedExecutor"} <= names, names
    for cls in defining:
        hook = inspect.signature(cls.inference_and_backprop).parameters["hook"]
        assert hook.annotation in ("GradientHook | None", GradientHook | None), cls
        assert hook.default is None, cls


def test_the_protocol_is_declared_once():
    """No second declaration of the hook's shape anywhere in meta."""
    where = [p for p in META.rglob("*.py")
             if re.search(r"^class GradientHook\b", p.read_text(), re.M)]
    assert where == [META / "lv1" / "gradient_hook.py"], where


def test_both_level3_hooks_implement_it():
    """The overlapped allreduce's buckets and the shared-memory exchange are GradientHooks;
    a half-made hook is not."""
    strategy = Allreduce(Optimizer(sgd(0.1), {"w": np.zeros(4)}))
    assert isinstance(strategy.buckets, GradientHook)
    assert GradientHook in NodeExchange.__mro__  # built only on MPI ranks sharing a node
    for member in ("layout", "use", "ready", "bucket_bytes"):
        assert hasattr(NodeExchange, member), member
    assert "seed" in NodeExchange.__annotations__

    class HalfHook:
        bucket_bytes, seed = 1024, 1.0

        def layout(self, names):
            return {}

    assert not isinstance(HalfHook(), GradientHook)
    assert isinstance(Buckets(strategy, 1024), GradientHook)


def test_an_executor_without_the_hook_refuses_it_in_one_line():
    reference = ReferenceExecutor.__new__(ReferenceExecutor)  # the check reads no graph
    strategy = Allreduce(Optimizer(sgd(0.1), {"w": np.zeros(4)}))
    with pytest.raises(ValueError, match="ReferenceExecutor takes no gradient hook"):
        reference.inference_and_backprop({}, hook=strategy.buckets)
