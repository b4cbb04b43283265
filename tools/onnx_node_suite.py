"""Count ONNX's node test cases that pass through the backend API, for meta and (when it
happens to be installed) onnxruntime, on the same onnx version.

ONNX's own runner, ``onnx.backend.test.BackendTest``, drives each backend over every node case
shipped in the onnx wheel (CPU device only, no exclusions): the counts are directly comparable.
onnxruntime is only a measuring stick here, never a code path of meta.

    .venv/bin/python tools/onnx_node_suite.py               # both counts
    .venv/bin/python tools/onnx_node_suite.py --failures    # meta's failures, grouped by cause
    .venv/bin/python tools/onnx_node_suite.py -k lstm       # only cases whose name matches
    .venv/bin/python tools/onnx_node_suite.py --planned     # planned executor vs the reference

``--planned`` (``planned_report()``, what tests/lv1/test_planned_node_suite.py runs) takes every
case the reference executor passes (tools/onnx_conformance.py decides that) through the planned
executor too: its outputs must match the expected ones, and where the reference executor can
differentiate the case (a loss summing each float output times fixed random weights, with
respect to the float inputs), the planned executor's gradients must match the reference's.
``NOT_PLANNED`` lists the cases that knowingly differ, each with its reason.
"""

from __future__ import annotations

import argparse
import re
import sys
import unittest
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def node_suite(backend, pattern: str | None = None) -> unittest.TestSuite:
    import onnx.backend.test

    runner = onnx.backend.test.BackendTest(backend, __name__)
    runner.include(r"_cpu$" if pattern is None else rf"{pattern}.*_cpu$")
    case = runner.test_cases["OnnxBackendNodeModelTest"]
    return unittest.defaultTestLoader.loadTestsFromTestCase(case)


def run(backend, pattern: str | None = None) -> unittest.TestResult:
    result = unittest.TestResult()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        node_suite(backend, pattern).run(result)
    return result


def passed(result: unittest.TestResult) -> int:
    return result.testsRun - len(result.failures) - len(result.errors) - len(result.skipped)


def summary(name: str, result: unittest.TestResult) -> str:
    ran = result.testsRun - len(result.skipped)
    return (f"{name:<12} passed {passed(result):>5} of {ran} node cases "
            f"({len(result.failures)} wrong, {len(result.errors)} errors)")


def _cause(text: str) -> str:
    last = [line for line in text.strip().splitlines() if line.strip()][-1]
    last = re.sub(r"'[^']*'", "'…'", last)
    return re.sub(r"\d+", "N", last)[:150]


# -- the planned executor against the reference executor -----------------------------------
# Cases the planned executor knowingly does not match: name -> why. Remove an entry once fixed
# (planned_report() says when a listed case passes).
NOT_PLANNED: dict[str, str] = {}

LOSS = "node_suite_loss"
GRAD_TOLERANCES = {np.dtype(np.float16): (1e-2, 1e-3), np.dtype(np.float32): (1e-3, 1e-5),
                   np.dtype(np.float64): (1e-7, 1e-9)}


def _conformance():
    """tools/onnx_conformance.py as a module (tools/ is not a package)."""
    import importlib.util

    name = "onnx_conformance"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _with_loss(model, outputs: list[str], expected: list) -> tuple[object, dict] | None:
    """The model plus a scalar ``LOSS``: the sum over its float outputs (of the first float
    output's dtype) of output * fixed random weights, fed as inputs (not parameters); returns
    it and those weights' feeds, or None when it has no such output."""
    import onnx
    from onnx import helper

    floats = [(o, e) for o, e in zip(outputs, expected)
              if isinstance(e, np.ndarray) and e.dtype.kind == "f" and e.size]
    if not floats:
        return None
    dtype = floats[0][1].dtype
    floats = [(o, e) for o, e in floats if e.dtype == dtype]
    rng = np.random.default_rng(0)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    terms, weights = [], {}
    for i, (o, e) in enumerate(floats):
        weights[f"{LOSS}_w{i}"] = rng.uniform(0.5, 1.5, e.shape).astype(dtype)
        graph.input.append(helper.make_tensor_value_info(
            f"{LOSS}_w{i}", helper.np_dtype_to_tensor_dtype(dtype), list(e.shape)))
        graph.node.append(helper.make_node("Mul", [o, f"{LOSS}_w{i}"], [f"{LOSS}_m{i}"]))
        graph.node.append(helper.make_node("ReduceSum", [f"{LOSS}_m{i}"], [f"{LOSS}_s{i}"],
                                           keepdims=0))
        terms.append(f"{LOSS}_s{i}")
    graph.node.append(helper.make_node("Sum", terms, [LOSS]))
    graph.output.append(helper.make_tensor_value_info(
        LOSS, helper.np_dtype_to_tensor_dtype(dtype), []))
    return model, weights


def _compare_grads(ours: dict, theirs: dict) -> str:
    for name, want in theirs.items():
        got = ours.get(name)
        if got is None or np.shape(got) != np.shape(want):
            return f"gradient {name!r}: shape {np.shape(got)}, reference {np.shape(want)}"
        # the looser of the two dtypes' (the planned gradient has its input's dtype, where an
        # operator may hand the reference a wider one)
        rtol, atol = np.max([GRAD_TOLERANCES.get(np.asarray(v).dtype, (1e-3, 1e-5))
                             for v in (got, want)], axis=0)
        a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            return (f"gradient {name!r}: max abs difference {np.nanmax(np.abs(a - b)):.3g} "
                    f"from the reference's (rtol {rtol:g}, atol {atol:g})")
    return ""


def planned_case(case) -> tuple[str, bool]:
    """Run one case (that the reference executor passes) through the planned executor:
    ("" or the first difference, whether gradients were compared)."""
    from meta.lv1 import ReferenceExecutor, from_onnx
    from meta.lv1.plan.executor import PlannedExecutor

    conformance = _conformance()
    inputs = [v.name for v in case.model.graph.input]
    outputs = [v.name for v in case.model.graph.output]
    try:
        planned = PlannedExecutor(from_onnx(case.model))
    except Exception as err:
        return f"load: {type(err).__name__}: {err}", False
    graded = False
    for inputs_, expected in case.data_sets:
        feeds = dict(zip(inputs, inputs_))
        try:
            got = planned.inference(feeds, outputs)
        except Exception as err:
            return f"inference: {type(err).__name__}: {str(err)[:300]}", graded
        for name, want in zip(outputs, expected):
            problem = conformance._compare(name, got[name], want, case)
            if problem:
                return problem, graded
        made = _with_loss(case.model, outputs, expected)
        if made is None:
            continue
        model, weights = made
        wrt = [k for k, v in feeds.items()
               if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
        feeds = {**feeds, **weights}
        try:
            reference = ReferenceExecutor(from_onnx(model))
            _, theirs = reference.inference_and_backprop(feeds, LOSS, wrt=wrt)
        except Exception:
            continue  # the reference executor has no gradient here: nothing to compare
        graded = True
        try:
            _, ours = PlannedExecutor(from_onnx(model)).inference_and_backprop(feeds, LOSS,
                                                                               wrt=wrt)
        except Exception as err:
            return f"gradients: {type(err).__name__}: {str(err)[:300]}", graded
        problem = _compare_grads(ours, theirs)
        if problem:
            return problem, graded
    return "", graded


def planned_report(pattern: str | None = None) -> dict[str, list]:
    """Every case the reference executor passes, through the planned executor: {"passed",
    "failed", "not_planned", "stale"} -> [(name, message)], and "graded": how many cases had
    their gradients compared."""
    conformance = _conformance()
    from meta.lv0 import entries

    registered = {(e.domain, e.op_type) for e in entries()}
    report: dict[str, list] = {"passed": [], "failed": [], "not_planned": [], "stale": [],
                               "graded": []}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for case in conformance.collect_cases():
            if pattern is not None and not re.search(pattern, case.name):
                continue
            ops = {(n.domain if n.domain != "ai.onnx" else "", n.op_type)
                   for n in conformance._nodes(case.model.graph)}
            if not ops <= registered or conformance._narrow_types(case.model.graph) \
                    or case.name in conformance.EXCLUDE or conformance.run_case(case):
                continue  # the reference executor does not pass it: nothing to compare with
            problem, graded = planned_case(case)
            if graded:
                report["graded"].append((case.name, ""))
            if case.name in NOT_PLANNED:
                report["not_planned" if problem else "stale"].append(
                    (case.name, problem or NOT_PLANNED[case.name]))
            else:
                report["failed" if problem else "passed"].append((case.name, problem))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="pattern", help="only cases whose name matches this regex")
    parser.add_argument("--failures", action="store_true", help="list meta's failing cases")
    parser.add_argument("--planned", action="store_true",
                        help="the planned executor against the reference executor")
    args = parser.parse_args(argv)
    if args.planned:
        report = planned_report(args.pattern)
        for status in ("failed", "stale"):
            for name, message in report[status]:
                print(f"{status.upper()} {name}: {message}")
        print(f"planned: {len(report['passed'])} passed, {len(report['failed'])} failed, "
              f"{len(report['not_planned'])} listed as not planned, {len(report['stale'])} "
              f"listed but passing; gradients compared in {len(report['graded'])} cases")
        return 1 if report["failed"] or report["stale"] else 0

    from meta.lv1.onnx_backend import MetaBackend

    ours = run(MetaBackend, args.pattern)
    lines = [summary("meta", ours)]
    try:
        import onnxruntime
        import onnxruntime.backend as ort_backend
    except ImportError:
        lines.append("onnxruntime  not installed: no count to compare with")
    else:
        onnxruntime.set_default_logger_severity(4)  # its log would bury the counts
        lines.append(summary("onnxruntime", run(ort_backend, args.pattern)))
    if args.failures:
        causes: Counter = Counter()
        for test, text in ours.failures + ours.errors:
            name = test.id().rsplit(".", 1)[-1]
            print(f"FAIL {name}: {_cause(text)}")
            causes[_cause(text)] += 1
        for cause, n in causes.most_common(30):
            print(f"{n:>5}  {cause}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
