"""An operator's numpy implementation against its C++ (native) twin, forward and backward.

Both run on the same inputs; each timed call gets a fresh ``Context`` (and, for backward, a
forward pass of its own run untimed in setup), so neither pass reuses the other's buffers.
The outputs and gradients are compared too: a fast kernel that computes something else is not
a speed-up.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meta.bench.measure import Sample, Variant, measure_many
from meta.bench.stats import CONFIDENCE, RESAMPLES, Ratio, ratio_of_medians
from meta.lv0 import Context, Operator, entries, native

BACKENDS = ("numpy", "native")
PASSES = ("forward", "backward")

# What ``meta bench-op OP`` runs without --shape: one shape per input (a CNN's layer sizes) and
# the attributes that make the case typical. ``meta bench-op --help`` prints this table.
DEFAULT_INPUTS: dict[str, tuple[list[tuple[int, ...]], dict[str, Any]]] = {
    "Conv": ([(8, 16, 32, 32), (32, 16, 3, 3), (32,)], {"pads": [1, 1, 1, 1]}),
    "Gemm": ([(64, 512), (512, 256), (256,)], {}),
    "MatMul": ([(64, 512), (512, 256)], {}),
    "Relu": ([(64, 4096)], {}),
    "Sigmoid": ([(64, 4096)], {}),
    "Tanh": ([(64, 4096)], {}),
    "Softmax": ([(64, 1000)], {}),
    "MaxPool": ([(8, 32, 32, 32)], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "AveragePool": ([(8, 32, 32, 32)], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "BatchNormalization": ([(8, 32, 32, 32), (32,), (32,), (32,), (32,)], {}),
    "Add": ([(64, 4096), (64, 4096)], {}),
    "Mul": ([(64, 4096), (64, 4096)], {}),
}
# Inputs that must be positive (a variance): drawn as |N(0, 1)| + 0.5.
POSITIVE_INPUTS = {"BatchNormalization": (4,)}


def default_inputs_help() -> str:
    """The DEFAULT_INPUTS table as one line per op, for ``--help``."""
    def shapes(s: list[tuple[int, ...]]) -> str:
        return " ".join(",".join(map(str, x)) for x in s)
    return "; ".join(f"{op} {shapes(s)}{' ' + str(a) if a else ''}"
                     for op, (s, a) in DEFAULT_INPUTS.items())


def make_inputs(op_type: str, shapes: list[tuple[int, ...]], count: int, dtype: np.dtype,
                rng: np.random.Generator) -> list[np.ndarray]:
    """Standard-normal inputs, one per shape; one shape for an op of ``count`` inputs gives
    every input that shape."""
    if len(shapes) == 1 and count > 1:
        shapes = shapes * count
    inputs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    for i in POSITIVE_INPUTS.get(op_type, ()):
        if i < len(inputs):
            inputs[i] = (np.abs(inputs[i]) + 0.5).astype(dtype)
    return inputs


class OpBenchError(ValueError):
    """The operator cannot be benchmarked as asked; the message says why and what would do."""


def twins(op_type: str, domain: str = "") -> dict[str, type[Operator]]:
    """The numpy and native classes of ``op_type`` at the newest opset that has both; for an
    operator of a custom domain (a user's, ``--module``) without a native twin, its numpy
    class alone, timed without a comparison."""
    domain = "" if domain == "ai.onnx" else domain
    found = [e for e in entries() if e.op_type == op_type and e.domain == domain]
    if not found:
        known = sorted({e.op_type for e in entries() if e.domain == domain})
        close = difflib.get_close_matches(op_type, known, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise OpBenchError(f"no operator {op_type!r} is registered (domain "
                           f"{domain or 'ai.onnx'!r}){hint}; `meta ops` lists them; for "
                           f"yours, --module FILE imports the file that registers it and "
                           f"--domain names its domain")
    by_since: dict[int, dict[str, type[Operator]]] = {}
    for e in found:
        by_since.setdefault(e.since, {})[e.backend] = e.cls
    both = [since for since, impls in by_since.items() if set(BACKENDS) <= set(impls)]
    alone = [since for since, impls in by_since.items() if "numpy" in impls]
    if not both and domain and alone:
        return {"numpy": by_since[max(alone)]["numpy"]}
    if not both:
        with_native = sorted({e.op_type for e in entries() if e.backend == "native"})
        raise OpBenchError(f"operator {op_type!r} has no native (C++) implementation, only "
                           f"{', '.join(sorted({e.backend for e in found}))}; bench-op compares "
                           f"the two. Ops with both: {', '.join(with_native) or 'none'}")
    impls = by_since[max(both)]
    return {b: impls[b] for b in BACKENDS}


def input_count(cls: type[Operator]) -> int:
    """How many array inputs ``forward`` takes (all are given the same shape)."""
    params = list(inspect.signature(cls.forward).parameters.values())[2:]  # self, ctx
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        raise OpBenchError(f"{cls.op_type}.forward takes a variable number of inputs; "
                           "bench-op needs a fixed one")
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _outputs(op: Operator, inputs: list[np.ndarray]) -> tuple[Context, tuple[np.ndarray, ...]]:
    ctx = Context()
    return ctx, op.apply(ctx, *inputs)


@dataclass
class OpBenchResult:
    op_type: str
    shape: tuple[int, ...]
    dtype: str
    samples: dict[str, dict[str, Sample]]  # pass -> backend -> timings
    ratios: dict[str, Ratio]  # pass -> median(native) / median(numpy)
    max_abs_diff: dict[str, float]  # pass -> largest |numpy - native| over outputs
    shapes: list[tuple[int, ...]] = field(default_factory=list)  # one per input
    inputs: list[np.ndarray] = field(default_factory=list, repr=False)  # what was timed

    def to_variants(self) -> list[dict[str, Any]]:
        """One report entry per backend and pass (``numpy forward``, ``native backward``, ...) with
        its timings and summary."""
        return [{"name": f"{backend} {p}", "backend": backend, "pass": p,
                 "time_s": s.summary().to_dict(), "times_s": s.seconds.tolist()}
                for p, by_backend in self.samples.items() for backend, s in by_backend.items()]


def _max_diff(a: tuple, b: tuple) -> float:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return max((float(np.max(np.abs(x.astype(np.float64) - y))) if x.size else 0.0
                for x, y in pairs), default=0.0)


def bench_op(op_type: str, shape: tuple[int, ...] | list[tuple[int, ...]],
             dtype: str = "float32", repeat: int = 30, warmup: int = 3, seed: int = 0,
             resamples: int = RESAMPLES, domain: str = "",
             attrs: dict[str, Any] | None = None) -> OpBenchResult:
    """Time forward and backward of both backends on random inputs of ``shape`` (one shape for
    every input) or of each of a list of shapes (one per input), with the node attributes
    ``attrs`` (a custom domain's numpy-only operator alone)."""
    shapes = [tuple(s) for s in shape] if shape and isinstance(shape[0], (tuple, list)) \
        else [tuple(shape)]  # type: ignore[arg-type]
    for s in shapes:
        if not s or min(s) <= 0:
            raise OpBenchError(f"--shape must list positive sizes, got {s}")
    shape = shapes[0]
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as err:
        raise OpBenchError(f"--dtype: {dtype!r} is not a numpy dtype") from err
    classes = twins(op_type, domain)
    numpy_cls = classes["numpy"]
    if "native" in classes and np_dtype not in native.NATIVE_DTYPES:  # handed to numpy
        raise OpBenchError(f"dtype {np_dtype} is not supported by the native kernels "
                           f"({', '.join(np.dtype(d).name for d in native.NATIVE_DTYPES)})")
    try:
        ops = {b: cls(**(attrs or {})) for b, cls in classes.items()}
    except TypeError as err:
        raise OpBenchError(f"--attr: {err}") from err
    count = len(shapes) if len(shapes) > 1 else input_count(numpy_cls)
    rng = np.random.default_rng(seed)
    inputs = make_inputs(op_type, shapes, count, np_dtype, rng)
    try:
        results = {b: _outputs(op, inputs) for b, op in ops.items()}
    except (TypeError, ValueError) as err:
        raise OpBenchError(f"{op_type} on inputs of shape {shape} and dtype {dtype} failed: "
                           f"{err}") from err
    dys = tuple(rng.standard_normal(y.shape).astype(y.dtype) for y in results["numpy"][1])
    grads = {b: tuple(ops[b].backward(results[b][0], *dys)) for b in ops}
    diffs = {"forward": _max_diff(results["numpy"][1], results["native"][1]),
             "backward": _max_diff(grads["numpy"], grads["native"])} if "native" in ops else {}

    def forward(op: Operator) -> Variant:
        return Variant(lambda ctx, *xs: op.forward(ctx, *xs), lambda: (Context(), *inputs))

    def backward(op: Operator) -> Variant:
        def setup() -> tuple:
            ctx, _ = _outputs(op, inputs)
            return (ctx, *dys)
        return Variant(op.backward, setup)

    samples, ratios = {}, {}
    for name, make in (("forward", forward), ("backward", backward)):
        samples[name] = measure_many({b: make(op) for b, op in ops.items()}, repeat, warmup)
        if "native" in ops:
            ratios[name] = ratio_of_medians(samples[name]["numpy"].seconds,
                                            samples[name]["native"].seconds, resamples, seed=seed)
    return OpBenchResult(op_type, tuple(shape), np_dtype.name, samples, ratios, diffs,
                         [tuple(x.shape) for x in inputs], inputs)


def op_table(result: OpBenchResult, repeat: int, warmup: int) -> str:
    """Medians with their intervals per pass and backend, then native/numpy per pass."""
    from meta.bench.report import coverage_notes, format_ratio, format_table

    shape = ", ".join("x".join(map(str, s)) for s in result.shapes or [result.shape])
    head = (f"{result.op_type} {result.dtype} {shape}: {repeat} timed calls per backend and "
            f"pass after {warmup} warm-up calls, backends taking turns")
    rows = [["pass", "backend", "median us", "95% CI", "min us", "cv", "outliers"]]
    for p, by_backend in result.samples.items():
        for backend, sample in by_backend.items():
            s = sample.summary().scaled(1e6)
            rows.append([p, backend, f"{s.median:.1f}", f"[{s.ci_low:.1f}, {s.ci_high:.1f}]",
                         f"{s.min:.1f}", f"{s.cv:.2f}", str(len(s.outliers))])
    lines = [head, format_table(rows)]
    for p, ratio in result.ratios.items():
        c = {"baseline": "numpy", "candidate": "native", **ratio.to_dict()}
        lines.append(format_ratio(c, f"{p} time"))
    lines += coverage_notes([s.summary().to_dict() for by in result.samples.values()
                             for s in by.values()][:1], CONFIDENCE)
    if result.max_abs_diff:
        lines.append("max |numpy - native|: " + ", ".join(
            f"{p} {d:.3g}" for p, d in result.max_abs_diff.items()))
    else:
        lines.append(f"{result.op_type} has one implementation (numpy): timed, not compared")
    return "\n".join(lines)
