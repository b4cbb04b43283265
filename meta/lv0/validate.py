"""Validating one operator: forward against an oracle, backward against central differences.

``validate_operator`` is what an operator author runs before trusting a new op (and what
``meta check-op`` runs): the forward pass is compared with ONNX's reference evaluator on a
one-node model (or with any ``oracle`` callable, which a custom-domain op must bring), within
tolerances that depend on the dtype, and the backward pass with float64 central differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from meta.lv0.gradcheck import GradCheckReport, check_gradients
from meta.lv0.operator import Array, Context, Operator
from meta.lv0.registry import entries, lookup

NEWEST_OPSET = 21  # the newest default-domain opset meta claims to serve

# (rtol, atol) for the forward comparison, by the dtype of the output compared.
TOLERANCES: dict[np.dtype, tuple[float, float]] = {
    np.dtype(np.float16): (1e-2, 1e-3),
    np.dtype(np.float32): (1e-4, 1e-6),
    np.dtype(np.float64): (1e-7, 1e-10),
}

Oracle = Callable[[list[Array | None], dict[str, Any]], Sequence[Array]]


@dataclass
class OutputCheck:
    index: int
    shape: tuple[int, ...]
    dtype: str
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    passed: bool = True
    problem: str = ""


@dataclass
class ValidationReport:
    """Forward and backward verdicts of one operator on one set of inputs; ``str()`` reads well."""

    op: str
    opset: int | None
    inputs: list[str]
    rtol: float
    atol: float
    outputs: list[OutputCheck]
    forward_checked: bool = True
    forward_problem: str = ""
    gradients: GradCheckReport | None = None
    backward_note: str = ""

    @property
    def forward_passed(self) -> bool:
        """Whether every output matched the oracle within tolerance (true when the forward was not
        checked: ``forward_checked`` says so)."""
        if not self.forward_checked:
            return True
        return not self.forward_problem and all(o.passed for o in self.outputs)

    @property
    def backward_passed(self) -> bool:
        """Whether the gradients matched finite differences (true when there were none to check)."""
        return self.gradients is None or self.gradients.passed

    @property
    def passed(self) -> bool:
        """Both checks passed."""
        return self.forward_passed and self.backward_passed

    @property
    def max_abs_error(self) -> float:
        """The largest absolute difference from the oracle over the outputs."""
        return max((o.max_abs_error for o in self.outputs), default=0.0)

    @property
    def max_rel_error(self) -> float:
        """The largest relative difference from the oracle over the outputs."""
        return max((o.max_rel_error for o in self.outputs), default=0.0)

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        where = f" at opset {self.opset}" if self.opset is not None else ""
        lines = [f"{self.op}{where} on {', '.join(self.inputs) or 'no inputs'}: {verdict}"]
        if not self.forward_checked:
            lines.append(f"  forward: not checked ({self.forward_problem or 'no oracle'})")
        elif self.forward_problem:
            lines.append(f"  forward: FAIL {self.forward_problem}")
        else:
            lines.append(f"  forward (rtol {self.rtol:g}, atol {self.atol:g}):")
            for o in self.outputs:
                status = "ok" if o.passed else "MISMATCH"
                lines.append(f"    output {o.index} {o.dtype}{list(o.shape)}: max abs err "
                             f"{o.max_abs_error:.2e}, max rel err {o.max_rel_error:.2e} {status}"
                             f" {o.problem}".rstrip())
        if self.gradients is not None:
            lines.append("  backward: " + str(self.gradients).replace("\n", "\n  "))
        else:
            lines.append(f"  backward: not checked ({self.backward_note})")
        return "\n".join(lines)


def _describe(x: Array | None) -> str:
    return "absent" if x is None else f"{np.asarray(x).dtype}{list(np.shape(x))}"


def _onnx_oracle(op_type: str, opset: int) -> Oracle:
    """Run one node through onnx.reference; ``None`` inputs become omitted optional inputs."""

    def run(inputs: list[Array | None], attrs: dict[str, Any], n_outputs: int = 1):
        from onnx import TensorProto, helper, numpy_helper
        from onnx.reference import ReferenceEvaluator

        names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
        outs = [f"y{i}" for i in range(n_outputs)]
        node = helper.make_node(
            op_type, names, outs,
            **{k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
               for k, v in attrs.items() if v is not None})
        given = [(n, np.asarray(x)) for n, x in zip(names, inputs) if x is not None]
        graph = helper.make_graph(
            [node], "oracle",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), None)
             for n, x in given],
            [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return ReferenceEvaluator(model).run(None, dict(given))

    return run


def _serving_opset(cls: type[Operator]) -> int:
    """The newest opset this implementation serves (the next registration's ``since`` - 1)."""
    later = [e.since for e in entries()
             if (e.domain, e.op_type) == (cls.domain, cls.op_type) and e.since > cls.since]
    return min(later) - 1 if later else max(NEWEST_OPSET, cls.since)


def _compare(index: int, ours: Array, theirs: Array) -> OutputCheck:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    check = OutputCheck(index, ours.shape, str(ours.dtype))
    if ours.shape != theirs.shape:
        check.passed = False
        check.problem = f"shape {list(ours.shape)}, oracle gives {list(theirs.shape)}"
        return check
    if ours.dtype != theirs.dtype:
        check.passed = False
        check.problem = f"dtype {ours.dtype}, oracle gives {theirs.dtype}"
    if ours.dtype.kind not in "fc":
        if not np.array_equal(ours, theirs):
            check.passed, check.max_abs_error = False, float("inf")
            check.problem = "values differ"
        return check
    rtol, atol = TOLERANCES.get(ours.dtype, TOLERANCES[np.dtype(np.float64)])
    a, b = ours.astype(np.float64), theirs.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    error = np.where(both_nan, 0.0, np.abs(a - b))
    error = np.where(np.isnan(error), np.inf, error)
    rel = error / np.maximum(np.abs(b), np.finfo(np.float64).tiny)
    check.max_abs_error = float(error.max(initial=0.0))
    check.max_rel_error = float(np.where(error == 0, 0.0, rel).max(initial=0.0))
    if not np.all(error <= atol + rtol * np.abs(b)):
        check.passed = False
    return check


def validate_operator(
    op: str | type[Operator],
    inputs: Sequence[Array | None],
    attrs: dict[str, Any] | None = None,
    opset: int | None = None,
    oracle: Oracle | None = None,
    check_backward: bool = True,
    domain: str = "",
    check_forward: bool = True,
) -> ValidationReport:
    """Check an operator's forward against an oracle and its backward against float64
    central differences.

    ``op`` is an op type (looked up in the registry for ``domain`` and ``opset``) or an
    Operator class. The default oracle is ``onnx.reference`` at ``opset`` (default: the newest
    opset the implementation serves); a custom-domain op needs ``oracle(inputs, attrs) ->
    outputs``, or ``check_forward=False``. Tolerances depend on the output dtype
    (``TOLERANCES``: float16 1e-2, float32 1e-4, float64 1e-7 relative).

    >>> x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    >>> validate_operator("Relu", [x]).passed
    True
    """
    attrs = dict(attrs or {})
    if isinstance(op, str):
        cls = lookup(op, opset if opset is not None else NEWEST_OPSET, domain)
    elif isinstance(op, type) and issubclass(op, Operator):
        cls = op
    else:
        raise TypeError(f"validate_operator: expected an op type or an Operator class, "
                        f"got {op!r}")
    custom = bool(cls.domain)
    if opset is None and not custom:
        opset = _serving_opset(cls)
    name = f"{cls.domain + '::' if custom else ''}{cls.op_type or cls.__name__}"
    instance = cls(**attrs)  # unknown attributes fail here, naming them
    described = [_describe(x) for x in inputs]
    first = next((np.asarray(x) for x in inputs if x is not None), np.zeros(0))
    rtol, atol = TOLERANCES.get(first.dtype, TOLERANCES[np.dtype(np.float64)])
    report = ValidationReport(f"{name}({', '.join(f'{k}={v!r}' for k, v in attrs.items())})",
                              opset, described, rtol, atol, [])
    # Operators may write into their inputs' buffers by mistake; give each run its own copy.
    copies = lambda: [None if x is None else np.array(x) for x in inputs]  # noqa: E731
    try:
        ours = instance.apply(Context(), *copies())
    except Exception as err:
        report.forward_problem = f"forward raised {type(err).__name__}: {err}"
        ours = None
    if ours is not None and check_forward:
        if oracle is None and custom:
            raise ValueError(f"validate_operator: {name} is in custom domain {cls.domain!r}; "
                             f"pass oracle=callable(inputs, attrs) -> outputs, or "
                             f"check_forward=False")
        try:
            if oracle is None:
                theirs = list(_onnx_oracle(cls.op_type, opset)(copies(), attrs, len(ours)))
            else:
                theirs = list(oracle(copies(), attrs))
        except Exception as err:
            report.forward_problem = f"the oracle raised {type(err).__name__}: {err}"
        else:
            if len(theirs) < len(ours):
                report.forward_problem = (f"{len(ours)} outputs, the oracle gives "
                                          f"{len(theirs)}")
            report.outputs = [_compare(i, a, b) for i, (a, b) in enumerate(zip(ours, theirs))]
    elif ours is not None:
        report.forward_checked = False
        report.forward_problem = "check_forward=False"
    if not check_backward:
        report.backward_note = "check_backward=False"
    elif cls.backward is Operator.backward:
        report.backward_note = "the operator is not differentiable (no backward)"
    elif ours is None:
        report.backward_note = "forward failed"
    elif not any(x is not None and np.asarray(x).dtype.kind == "f" for x in inputs):
        report.backward_note = "no float inputs"
    else:
        report.gradients = check_gradients(cls(**attrs), copies())
    return report
