"""The ``>>>`` examples in meta's docstrings run and print what they say.

Restricted to modules whose examples are quick and need nothing optional (no onnxruntime, no
MPI launch, no datasets); ``python -m doctest`` can run any other by hand.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "meta.bench",
    "meta.bench.environment",
    "meta.bench.measure",
    "meta.bench.report",
    "meta.bench.stats",
    "meta.common.component",
    "meta.run.errors",
    "meta.common.files",
    "meta.lv0.broadcast",
    "meta.lv0.cpp_ops",
    "meta.lv0.gradcheck",
    "meta.lv0.native",
    "meta.lv0.operator",
    "meta.lv0.validate",
    "meta.lv1.builder",
    "meta.lv1.executor",
    "meta.lv1.graph",
    "meta.lv1.onnx_io",
    "meta.lv1.ort_executor",
    "meta.lv1.torch_executor",
    "meta.lv2.batch_schedule",
    "meta.lv2.dbn",
    "meta.lv2.idx",
    "meta.lv2.optimizers",
    "meta.lv2.rbm",
    "meta.lv2.sampler",
    "meta.lv2.torch_optimizers",
    "meta.lv2.transforms",
    "meta.lv2.updater",
    "meta.lv3.flat",
    "meta.lv3.sampler",
    "meta.lv3.timeline",
    "meta.lv1.onnx_backend",
    "meta.run.recipe",
    "meta.run.run_dir",
    "meta.ops._window",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             report=True)
    assert result.attempted, f"{name} has no >>> examples left: drop it from the list"
    assert result.failed == 0, f"{result.failed} example(s) of {name} failed (printed above)"
