"""Float64 central-difference gradient checking of operators."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from meta.lv0.operator import Array, Context, Operator


@dataclass
class InputCheck:
    """How one input's analytic gradient compares with central differences."""

    index: int
    checked: bool
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    passed: bool = True
    problem: str = ""


@dataclass
class GradCheckReport:
    op: str
    inputs: list[InputCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether every input's gradient matched its finite differences."""
        return all(i.passed for i in self.inputs)

    def __str__(self) -> str:
        lines = [f"gradient check of {self.op}: {'PASS' if self.passed else 'FAIL'}"]
        for i in self.inputs:
            if not i.checked:
                lines.append(f"  input {i.index}: {i.problem or 'no gradient (as declared)'}")
                continue
            verdict = "ok" if i.passed else "MISMATCH"
            lines.append(
                f"  input {i.index}: max abs err {i.max_abs_error:.2e}, "
                f"max rel err {i.max_rel_error:.2e} {verdict} {i.problem}".rstrip()
            )
        return "\n".join(lines)


def _is_float(x: Array | None) -> bool:
    return x is not None and np.issubdtype(np.asarray(x).dtype, np.floating)


def _as_float64(x: Array | None) -> Array | None:
    return np.array(x, dtype=np.float64) if _is_float(x) else x


def check_gradients(
    op: Operator,
    inputs: Sequence[Array | None],
    eps: float = 1e-6,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    seed: int = 0,
) -> GradCheckReport:
    """Compare ``op.backward`` with central differences of ``op.forward`` in float64.

    The scalar checked is ``sum_k <w_k, y_k>`` over the float outputs with random weights
    ``w_k``, so every output and every element is exercised. Float inputs must get a gradient
    of their own shape unless listed in ``op.no_grad_inputs``; others must get ``None``.

    >>> from meta.ops.relu import Relu
    >>> check_gradients(Relu(), [np.array([-1.0, 2.0])]).passed
    True
    """
    rng = np.random.default_rng(seed)
    xs = [_as_float64(x) for x in inputs]
    ctx = Context()
    outputs = op.apply(ctx, *xs)
    weights = [rng.standard_normal(np.shape(y)) if _is_float(y) else None for y in outputs]
    grads = list(op.backward(ctx, *weights))
    report = GradCheckReport(op=repr(op))
    # Trailing entries may stand for optional inputs that were not given; they must be None.
    if len(grads) < len(xs) or any(g is not None for g in grads[len(xs):]):
        report.inputs.append(
            InputCheck(-1, False, passed=False,
                       problem=f"backward returned {len(grads)} gradients for {len(xs)} inputs")
        )
        return report

    def objective(values: list[Array | None]) -> float:
        ys = op.apply(Context(), *values)
        return float(sum(np.sum(w * y) for w, y in zip(weights, ys) if w is not None))

    no_grad = set(getattr(op, "no_grad_inputs", ()))
    for index, (x, g) in enumerate(zip(xs, grads)):
        if not _is_float(x) or index in no_grad:
            ok = g is None
            problem = "" if ok else "backward returned a gradient for a non-differentiable input"
            report.inputs.append(InputCheck(index, False, passed=ok, problem=problem))
            continue
        if g is None or np.shape(g) != np.shape(x):
            got = "None" if g is None else f"shape {np.shape(g)}"
            report.inputs.append(
                InputCheck(index, False, passed=False,
                           problem=f"expected a gradient of shape {np.shape(x)}, got {got}")
            )
            continue
        numeric = np.zeros_like(x)
        flat = x.reshape(-1)  # a view: perturbing it perturbs x
        for j in range(flat.size):
            saved = flat[j]
            flat[j] = saved + eps
            plus = objective(xs)
            flat[j] = saved - eps
            minus = objective(xs)
            flat[j] = saved
            numeric.reshape(-1)[j] = (plus - minus) / (2 * eps)
        error = np.abs(np.asarray(g, dtype=np.float64) - numeric)
        rel = error / np.maximum(np.abs(numeric), 1e-12)
        ok = bool(np.all(error <= atol + rtol * np.abs(numeric)))
        report.inputs.append(
            InputCheck(index, True, float(error.max(initial=0.0)), float(rel.max(initial=0.0)), ok)
        )
    return report
