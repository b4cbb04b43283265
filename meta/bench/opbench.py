"""Any of an operator's implementations against any other, forward and backward: its numpy
code, its C++ (native) twin, the planned executor running it as a one-node graph, and for a
user's operator the built-in one of the same type.

All run on the same inputs; each timed call of a registered class gets a fresh ``Context``
(and, for backward, a forward pass of its own run untimed in setup), so neither pass reuses
the other's buffers. The outputs and gradients are compared with the first implementation's
(the baseline's): a fast kernel that computes something else is not a speed-up.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from meta.bench.measure import Sample, Variant, measure_many
from meta.bench.stats import CONFIDENCE, RESAMPLES, Ratio, ratio_of_medians
from meta.lv0 import Context, Operator, entries, native
from meta.lv1.plan.precision import PRECISIONS

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
    whole = integer_inputs(op_type)
    top = max(1, min(shapes[0]))  # a valid index / label on the first input's every axis
    inputs = [rng.integers(0, top, s).astype(np.int64) if i in whole
              else rng.standard_normal(s).astype(dtype) for i, s in enumerate(shapes)]
    for i in POSITIVE_INPUTS.get(op_type, ()):
        if i < len(inputs):
            inputs[i] = (np.abs(inputs[i]) + 0.5).astype(dtype)
    return inputs


def integer_inputs(op_type: str) -> set[int]:
    """Positions of the inputs ONNX's schema of ``op_type`` allows only integer types for
    (labels, indices): random floats there are not a valid call (a loss's labels must be
    classes), so they are drawn as integers below every size of the first input."""
    try:
        schema = onnx.defs.get_schema(op_type)
    except onnx.defs.SchemaError:
        return set()
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    found = set()
    for i, formal in enumerate(schema.inputs):
        types = allowed.get(formal.type_str, {formal.type_str})
        if types and all(t.startswith("tensor(int") or t.startswith("tensor(uint")
                         for t in types):
            found.add(i)
    return found


class OpBenchError(ValueError):
    """The operator cannot be benchmarked as asked; the message says why and what would do."""


PLANNED = "planned"  # a one-node graph through the planned executor
BUILTIN = "builtin "  # prefix of a built-in implementation a user's op of that type replaces


@dataclass(frozen=True)
class Implementation:
    """One way to run an operator: a registered class called directly (``numpy``,
    ``native``, any other backend), or a one-node graph of it through the planned executor
    (``planned``: a compiled oneDNN / C++ step where a kernel covers the node, else the
    operator's code as one step). ``cls`` is the registered class (the plan's node is of its
    op type and domain); ``precision`` the planned executor's (``planned bf16``: its matrix
    products and convolutions read bf16)."""

    name: str
    cls: type[Operator]
    planned: bool = False
    precision: str = "f32"

    @property
    def entry(self) -> str:
        """The registry's name of the class: ``domain::OpType-since[backend]``."""
        domain = f"{self.cls.domain}::" if self.cls.domain else ""
        return f"{domain}{self.cls.op_type}-{self.cls.since}[{self.cls.backend}]"

    def describe(self, where: str = "") -> str:
        """What runs, in words: the class and its module, or the planned executor and
        ``where`` its node ran."""
        if self.planned:
            at = f" at precision={self.precision}" if self.precision != "f32" else ""
            return (f"{self.name} = the planned executor{at} on a one-node graph of "
                    f"{self.entry.rsplit('[', 1)[0]}" + (f" (node runs as {where})" if where
                                                         else ""))
        return f"{self.name} = {self.entry} ({self.cls.__module__}.{self.cls.__qualname__})"


def implementations(op_type: str, domain: str = "") -> dict[str, Implementation]:
    """Every implementation of ``op_type`` in ``domain`` bench-op can run, by name: each
    registered backend at the newest opset that has a numpy one, ``planned``, and for a
    custom domain's op whose type is also built in, the built-in's as ``builtin numpy``,
    ``builtin native``, ``builtin planned`` (a user's operator against the one it
    replaces)."""
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
    out = _of(found, "")
    if domain:
        builtin = [e for e in entries() if e.op_type == op_type and e.domain == ""]
        out.update(_of(builtin, BUILTIN) if builtin else {})
    return out


def _of(found: list, prefix: str) -> dict[str, Implementation]:
    """The implementations of one op's registry entries, named with ``prefix``."""
    by_since: dict[int, dict[str, type[Operator]]] = {}
    for e in found:
        by_since.setdefault(e.since, {})[e.backend] = e.cls
    with_numpy = [since for since, impls in by_since.items() if "numpy" in impls]
    impls = by_since[max(with_numpy or by_since)]
    out = {prefix + b: Implementation(prefix + b, cls) for b, cls in sorted(
        impls.items(), key=lambda kv: (kv[0] != "numpy", kv[0]))}
    first = next(iter(out.values())).cls
    out[prefix + PLANNED] = Implementation(prefix + PLANNED, first, planned=True)
    bf16 = planned_name(prefix + PLANNED, "bf16")
    out[bf16] = Implementation(bf16, first, planned=True, precision="bf16")
    return out


def planned_name(planned: str, precision: str) -> str:
    """The name of a planned implementation at ``precision``: ``planned``, ``planned bf16``."""
    return planned if precision == "f32" else f"{planned} {precision}"


def default_backends(available: dict[str, Implementation], domain: str = "") -> list[str]:
    """What bench-op compares without --backend: a built-in's numpy code against its C++
    twin, or against the planned executor where it has none; a user's op against the
    built-in of its type where there is one (else timed alone)."""
    if domain:
        return ["numpy", BUILTIN + "numpy"] if BUILTIN + "numpy" in available else ["numpy"]
    return ["numpy", "native" if "native" in available else PLANNED]


def choose(op_type: str, domain: str = "", backends: list[str] | None = None,
           precisions: tuple[str, ...] = ("f32",)) -> list[Implementation]:
    """The implementations asked for by name (the first is the baseline), or the defaults;
    an unknown name is an OpBenchError listing those there are. ``precisions`` other than
    float32 alone (``--precision bf16``, ``f32,bf16``): each planned implementation named runs
    at each of them (``planned``, ``planned bf16``), and where none is named (the defaults
    numpy and native), the planned executor is added at each: bf16 is the planned executor's,
    numpy and the C++ twins compute float32."""
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        raise OpBenchError(f"--precision {','.join(precisions)}: expected one or more of "
                           f"{', '.join(PRECISIONS)}")
    available = implementations(op_type, domain)
    names = backends or default_backends(available, domain)
    if tuple(precisions) != ("f32",):
        if not any(available[n].planned for n in names if n in available):
            names = [*names, PLANNED]
        names = [m for n in names for m in ([planned_name(n, p) for p in precisions]
                                            if n in available and available[n].planned
                                            and available[n].precision == "f32" else [n])]
    unknown = [n for n in names if n not in available]
    if unknown:
        raise OpBenchError(f"--backend {unknown[0]}: {op_type} has no implementation "
                           f"{unknown[0]!r}; it has {', '.join(available)}")
    if len(set(names)) < len(names):
        raise OpBenchError(f"--backend: {', '.join(names)} names one twice")
    return [available[n] for n in names]


def twins(op_type: str, domain: str = "") -> dict[str, type[Operator]]:
    """The registered numpy class of ``op_type`` (and its C++ twin where it has one) at the
    newest opset with a numpy one: the reference and native rows of the forward across
    backends (``meta.bench.crossbench``)."""
    return {i.name: i.cls for i in implementations(op_type, domain).values()
            if not i.planned and i.name in ("numpy", "native")}


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


class _Planned:
    """An operator as a one-node graph on the planned executor: ``forward`` runs the node;
    ``backward`` runs the graph's forward and backward of ``sum(y_i * dy_i)`` (a plan's
    backward runs after the forward it differentiates, so it is timed with it) and returns
    the inputs' gradients."""

    def __init__(self, cls: type[Operator], inputs: list[np.ndarray], attrs: dict[str, Any],
                 outputs: tuple[np.ndarray, ...], precision: str = "f32") -> None:
        from meta.lv1 import GraphBuilder, PlannedExecutor

        b = GraphBuilder(f"bench_{cls.op_type}", opset=max(13, cls.since))
        xs = [b.input(f"x{i}", x.dtype, x.shape) for i, x in enumerate(inputs)]
        ys = [f"y{i}" for i in range(len(outputs))]
        b.node(cls.op_type, xs, n_outputs=len(ys), name="op", outputs=ys,
               domain=cls.domain, **attrs)
        total = None
        for i, y in enumerate(outputs):
            b.input(f"dy{i}", y.dtype, y.shape)
            b.output(ys[i], y.dtype, y.shape)
            part = b.node("ReduceSum", [b.node("Mul", [ys[i], f"dy{i}"])], keepdims=0)
            total = part if total is None else b.node("Add", [total, part])
        b.node("Identity", [total], outputs=["loss"])
        b.output("loss", outputs[0].dtype, ())
        self.graph = b.build()
        self.names, self.ys = xs, ys
        self.inputs = dict(zip(xs, inputs))
        self.ex = PlannedExecutor(self.graph, precision=precision)
        self.ex.train(True)

    def forward(self) -> tuple[np.ndarray, ...]:
        values = self.ex.inference(self.inputs, self.ys)
        return tuple(values[y] for y in self.ys)

    def backward(self, dys: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        feeds = {**self.inputs, **{f"dy{i}": d for i, d in enumerate(dys)}}
        _values, grads = self.ex.inference_and_backprop(feeds, "loss", wrt=self.names)
        return tuple(grads[x] for x in self.names)

    def where(self) -> str:
        return self.ex.placement().get("op", "?")


@dataclass
class OpBenchResult:
    op_type: str
    shape: tuple[int, ...]
    dtype: str
    samples: dict[str, dict[str, Sample]]  # pass -> implementation -> timings
    # pass -> candidate -> median(candidate) / median(baseline), the baseline the first
    ratios: dict[str, dict[str, Ratio]]
    max_abs_diff: dict[str, dict[str, float]]  # pass -> candidate -> largest |baseline - it|
    shapes: list[tuple[int, ...]] = field(default_factory=list)  # one per input
    inputs: list[np.ndarray] = field(default_factory=list, repr=False)  # what was timed
    implementations: list[str] = field(default_factory=list)  # describe() of each, in order
    baseline: str = "numpy"
    notes: list[str] = field(default_factory=list)  # what a reader must know of a row

    def to_variants(self) -> list[dict[str, Any]]:
        """One report entry per implementation and pass (``numpy forward``, ``native
        backward``, ...) with its timings and summary."""
        return [{"name": f"{backend} {p}", "backend": backend, "pass": p,
                 "time_s": s.summary().to_dict(), "times_s": s.seconds.tolist()}
                for p, by_backend in self.samples.items() for backend, s in by_backend.items()]


def _max_diff(a: tuple, b: tuple) -> float:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return max((float(np.max(np.abs(np.asarray(x, np.float64) - y))) if np.size(x) else 0.0
                for x, y in pairs), default=0.0)


def bench_op(op_type: str, shape: tuple[int, ...] | list[tuple[int, ...]],
             dtype: str = "float32", repeat: int = 30, warmup: int = 3, seed: int = 0,
             resamples: int = RESAMPLES, domain: str = "",
             attrs: dict[str, Any] | None = None,
             backends: list[str] | None = None,
             precisions: tuple[str, ...] = ("f32",)) -> OpBenchResult:
    """Time forward and backward of each implementation in ``backends`` (``choose``: the
    first is the baseline; default ``default_backends``; ``precisions``: the planned
    executor's, see ``choose``) on random inputs of ``shape`` (one shape for every input) or
    of each of a list of shapes (one per input), with the node attributes ``attrs``; each
    one's outputs and gradients compared with the baseline's."""
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
    chosen = choose(op_type, domain, backends, precisions)
    if any(i.cls.backend == "native" and not i.planned for i in chosen) and \
            np_dtype not in native.NATIVE_DTYPES:  # handed to numpy
        raise OpBenchError(f"dtype {np_dtype} is not supported by the native kernels "
                           f"({', '.join(np.dtype(d).name for d in native.NATIVE_DTYPES)})")
    try:
        ops = {i.name: i.cls(**(attrs or {})) for i in chosen if not i.planned}
    except TypeError as err:
        raise OpBenchError(f"--attr: {err}") from err
    count = len(shapes) if len(shapes) > 1 else input_count(chosen[0].cls)
    rng = np.random.default_rng(seed)
    inputs = make_inputs(op_type, shapes, count, np_dtype, rng)
    try:
        results = {b: _outputs(op, inputs) for b, op in ops.items()}
        reference = next(iter(results.values()))[1] if results else \
            _outputs(chosen[0].cls(**(attrs or {})), inputs)[1]
        planned = {i.name: _Planned(i.cls, inputs, attrs or {}, reference, i.precision)
                   for i in chosen if i.planned}
        forward_out = {i.name: (results[i.name][1] if i.name in results else
                                planned[i.name].forward()) for i in chosen}
    except (TypeError, ValueError, IndexError) as err:
        raise OpBenchError(f"{op_type} on inputs of shape {shape} and dtype {dtype} failed: "
                           f"{err}") from err
    dys = tuple(rng.standard_normal(y.shape).astype(y.dtype) for y in reference)
    grads = {i.name: (tuple(ops[i.name].backward(results[i.name][0], *dys)) if not i.planned
                      else planned[i.name].backward(dys)) for i in chosen}
    base = chosen[0].name
    diffs = {p: {i.name: _max_diff(got[base], got[i.name]) for i in chosen[1:]}
             for p, got in (("forward", forward_out), ("backward", grads))} \
        if len(chosen) > 1 else {}

    def forward(i: Implementation) -> Variant:
        if i.planned:
            return Variant(planned[i.name].forward)
        op = ops[i.name]
        return Variant(lambda ctx, *xs: op.forward(ctx, *xs), lambda: (Context(), *inputs))

    def backward(i: Implementation) -> Variant:
        if i.planned:
            return Variant(lambda: planned[i.name].backward(dys))
        op = ops[i.name]

        def setup() -> tuple:
            ctx, _ = _outputs(op, inputs)
            return (ctx, *dys)
        return Variant(op.backward, setup)

    samples: dict[str, dict[str, Sample]] = {}
    ratios: dict[str, dict[str, Ratio]] = {}
    for name, make in (("forward", forward), ("backward", backward)):
        samples[name] = measure_many({i.name: make(i) for i in chosen}, repeat, warmup)
        ratios[name] = {
            i.name: ratio_of_medians(samples[name][base].seconds,
                                     samples[name][i.name].seconds, resamples, seed=seed)
            for i in chosen[1:] if not (name == "backward" and (i.planned or chosen[0].planned))}
    notes = [f"{i.name} backward: timed with its forward (a plan's backward runs after the "
             f"forward it differentiates), so not compared with {base}'s backward alone"
             for i in chosen if i.planned]
    notes += [precision_note(i.name, op_type, planned[i.name].where())
              for i in chosen if i.planned and i.precision != "f32"]
    described = [i.describe(planned[i.name].where() if i.planned else "") for i in chosen]
    return OpBenchResult(op_type, tuple(shape), np_dtype.name, samples, ratios, diffs,
                         [tuple(x.shape) for x in inputs], inputs, described, base, notes)


def precision_note(name: str, op_type: str, where: str) -> str:
    """What a planned implementation asked for bf16 ran as (its node's placement), and so
    what its difference from a float32 baseline means."""
    from meta.lv1.plan.precision import native_bf16, of_placement

    if of_placement(where) == "bf16":
        return (f"{name}: {op_type} ran as {where}: its products read bf16 (8 significant "
                f"bits), accumulated in float32; its difference from float32 is bf16's "
                f"rounding")
    native, why = native_bf16()
    because = f"bf16 is not native here ({why})" if not native else \
        "only matrix products and convolutions compute in bf16"
    return f"{name}: {op_type} ran as {where}, in float32: {because}"


def op_table(result: OpBenchResult, repeat: int, warmup: int) -> str:
    """What ran, then medians with their intervals per pass and implementation, then each
    implementation against the first (the baseline) per pass, and their differences."""
    from meta.bench.report import coverage_notes, format_ratio, format_table

    shape = ", ".join("x".join(map(str, s)) for s in result.shapes or [result.shape])
    head = (f"{result.op_type} {result.dtype} {shape}: {repeat} timed calls per "
            f"implementation and pass after {warmup} warm-up calls, implementations taking "
            f"turns")
    rows = [["pass", "implementation", "median us", "95% CI", "min us", "cv", "outliers"]]
    for p, by_backend in result.samples.items():
        for backend, sample in by_backend.items():
            s = sample.summary().scaled(1e6)
            rows.append([p, backend, f"{s.median:.1f}", f"[{s.ci_low:.1f}, {s.ci_high:.1f}]",
                         f"{s.min:.1f}", f"{s.cv:.2f}", str(len(s.outliers))])
    lines = [head, *result.implementations, format_table(rows)]
    for p, by_candidate in result.ratios.items():
        for candidate, ratio in by_candidate.items():
            c = {"baseline": result.baseline, "candidate": candidate, **ratio.to_dict()}
            lines.append(format_ratio(c, f"{p} time"))
    lines += coverage_notes([s.summary().to_dict() for by in result.samples.values()
                             for s in by.values()][:1], CONFIDENCE)
    candidates = [c for c in next(iter(result.max_abs_diff.values()), {})]
    for c in candidates:
        lines.append(f"max |{result.baseline} - {c}|: " + ", ".join(
            f"{p} {d[c]:.3g}" for p, d in result.max_abs_diff.items()))
    lines += result.notes
    if not result.max_abs_diff:
        lines.append(f"{result.op_type}: one implementation ({result.baseline}): timed, not "
                     f"compared (--backend names others)")
    return "\n".join(lines)
