"""Count ONNX's node test cases that pass through the backend API, for meta and (when it
happens to be installed) onnxruntime, on the same onnx version.

ONNX's own runner, ``onnx.backend.test.BackendTest``, drives each backend over every node case
shipped in the onnx wheel (CPU device only, no exclusions): the counts are directly comparable.
onnxruntime is only a measuring stick here, never a code path of meta.

    .venv/bin/python tools/onnx_node_suite.py               # both counts
    .venv/bin/python tools/onnx_node_suite.py --failures    # meta's failures, grouped by cause
    .venv/bin/python tools/onnx_node_suite.py -k lstm       # only cases whose name matches
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="pattern", help="only cases whose name matches this regex")
    parser.add_argument("--failures", action="store_true", help="list meta's failing cases")
    args = parser.parse_args(argv)

    from meta.onnx_backend import MetaBackend

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
