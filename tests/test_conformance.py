"""ONNX's own node conformance cases, run through meta's loader and executor.

Every case of a registered op type must pass or be listed in ``tools/onnx_conformance.py``'s
``EXCLUDE`` with a reason; at least 95 % of them must pass.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "onnx_conformance.py"


@pytest.fixture(scope="module")
def conformance():
    spec = importlib.util.spec_from_file_location("onnx_conformance", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(conformance):
    return conformance.run_conformance()


def test_registered_ops_pass_onnx_conformance(report):
    assert report.in_scope, "no conformance case matched a registered op type"
    failures = "\n".join(f"{r.name} ({r.op_type}): {r.message}" for r in report.failures())
    assert not failures, (f"conformance failures neither fixed nor in EXCLUDE of {TOOL.name}:\n"
                          f"{failures}")
    assert report.pass_rate >= 0.95, report.table()


def test_every_exclusion_has_a_reason(conformance):
    for name, reason in conformance.EXCLUDE.items():
        assert name.startswith("test_") and len(reason) > 20, (name, reason)


def test_a_case_is_classified(conformance):
    relu = conformance.run_conformance({"Relu"})
    assert [r.status for r in relu.results] == ["passed"], str(relu)
