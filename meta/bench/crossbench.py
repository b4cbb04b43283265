"""One operator's forward across meta's backends and the frameworks installed (``meta
bench-op``'s second table), as Deep500's Level 0 benchmarks compare operators.

The same inputs go to each implementation:

* ``reference``: meta's numpy operator (``meta.ops``), called directly;
* ``native``: its C++ twin, where it has one;
* ``planned``: a one-node graph through the planned executor (a compiled oneDNN / C++ step
  where a kernel covers the node, else the operator's code as one step: the row says which);
* ``pytorch``: PyTorch's function for the op (the PyTorch executor's table,
  ``meta.lv1.torch_ops``), called on tensors sharing the inputs' memory, without autograd;
* ``onnxruntime``: an ``InferenceSession`` of the one-node model (``meta.lv1.to_onnx``).

Each is timed with meta's statistics (``meta.bench.measure``: implementations take turns,
medians with bootstrap intervals) and its first output compared with the reference's (the
largest absolute difference): a fast implementation that computes something else is no
speed-up. A framework that is not installed, or an op it has no function for, is one row
saying so, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from meta.bench.measure import Sample, Variant, measure_many

IMPLEMENTATIONS = ("reference", "native", "planned", "pytorch", "onnxruntime")


@dataclass
class Row:
    """One implementation: its timings and output difference, or why it did not run."""

    name: str
    sample: Sample | None = None
    max_abs_diff: float | None = None
    note: str = ""  # where it ran ("onednn", "python"), or why not ("not installed")

    def to_dict(self) -> dict[str, Any]:
        """The row as report.json holds it (its timings, summary and difference only when it
        ran)."""
        out: dict[str, Any] = {"name": self.name, "note": self.note}
        if self.sample is not None:
            out["time_s"] = self.sample.summary().to_dict()
            out["times_s"] = self.sample.seconds.tolist()
            out["max_abs_diff"] = self.max_abs_diff
        return out


@dataclass
class CrossResult:
    op_type: str
    shapes: list[tuple[int, ...]]
    attrs: dict[str, Any]
    rows: list[Row] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The comparison as report.json's ``across`` key holds it."""
        return {"op": self.op_type, "shapes": [list(s) for s in self.shapes],
                "attrs": self.attrs, "rows": [r.to_dict() for r in self.rows]}


def _graph(op_type: str, inputs: list[np.ndarray], attrs: dict[str, Any], domain: str,
           opset: int, output: np.ndarray) -> Any:
    from meta.lv1 import GraphBuilder

    b = GraphBuilder(f"bench_{op_type}", opset=opset)
    names = [b.input(f"x{i}", x.dtype, x.shape) for i, x in enumerate(inputs)]
    out = b.node(op_type, names, name="op", outputs=["y"], domain=domain, **attrs)
    b.output(out, output.dtype, output.shape)  # onnxruntime wants the output's type whole
    return b.build()


def _reference_and_native(classes: dict[str, type], inputs: list[np.ndarray],
                          attrs: dict[str, Any]) -> dict[str, tuple[Callable, str]]:
    from meta.lv0 import InferenceContext

    made = {}
    for backend, name in (("numpy", "reference"), ("native", "native")):
        if backend in classes:
            op = classes[backend](**attrs)
            made[name] = (lambda op=op: op.forward(InferenceContext(), *inputs),
                          "numpy (meta.ops)" if backend == "numpy" else "C++ twin")
    return made


def _planned(graph: Any, feeds: dict[str, np.ndarray]) -> tuple[Callable, str]:
    from meta.lv1 import PlannedExecutor

    ex = PlannedExecutor(graph)
    ex.eval()
    ex.inference(feeds, ["y"])  # compiles the plan: not timed
    where = ex.placement().get("op", "?")
    return (lambda: ex.inference(feeds, ["y"])["y"]), f"plan step: {where}"


def _pytorch(classes: dict[str, type], graph: Any, inputs: list[np.ndarray],
             attrs: dict[str, Any], domain: str) -> tuple[Callable | None, str]:
    try:
        import torch
    except ImportError:
        return None, "not installed"
    from meta.lv1 import torch_ops
    from meta.lv1.torch_executor import Call

    entry = torch_ops.KERNELS.get(graph.nodes[0].op_type)
    op = classes["numpy"](**attrs)
    node = graph.nodes[0]
    if entry is None or domain or op.since < entry.since or \
            (entry.takes is not None and not entry.takes(op, node)):
        return None, "no PyTorch function for this op in meta's table (meta.lv1.torch_ops)"
    call = Call(op, node, False, (), torch.device("cpu"))
    tensors = [torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]

    def run() -> Any:
        with torch.inference_mode():
            return entry.fn(call, *tensors)

    if run() is NotImplemented:  # the executor then runs meta's own operator instead
        return None, "PyTorch's function leaves these inputs to meta"
    return run, f"torch {entry.fn.__name__}"


def _onnxruntime(graph: Any, feeds: dict[str, np.ndarray], threads: int | None, opset: int
                 ) -> tuple[Callable | None, str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "not installed"
    from meta.lv1 import to_onnx

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(to_onnx(graph).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001  (onnxruntime's own errors: a row, not a crash)
        return None, f"cannot run it: {str(err).splitlines()[0][:120]}"
    return (lambda: session.run(["y"], feeds)[0]), f"one-node session, opset {opset}"


def _as_numpy(value: Any) -> np.ndarray:
    value = value[0] if isinstance(value, (tuple, list)) else value
    if hasattr(value, "detach"):
        value = value.detach().numpy()
    return np.asarray(value)


def compare(op_type: str, classes: dict[str, type], inputs: list[np.ndarray],
            attrs: dict[str, Any] | None = None, domain: str = "", repeat: int = 30,
            warmup: int = 3, threads: int | None = None,
            implementations: tuple[str, ...] = IMPLEMENTATIONS) -> CrossResult:
    """Time ``op_type``'s forward on ``inputs`` in each of ``implementations`` (those
    available), taking turns; ``classes`` are its registered classes by backend ("numpy",
    "native"). ``threads`` also sets onnxruntime's (and PyTorch's) intra-op threads."""
    attrs = dict(attrs or {})
    opset = max(13, classes["numpy"].since)
    runs: dict[str, tuple[Callable | None, str]] = _reference_and_native(classes, inputs,
                                                                         attrs)
    reference = _as_numpy(runs["reference"][0]())
    graph = _graph(op_type, inputs, attrs, domain, opset, reference)
    feeds = {f"x{i}": x for i, x in enumerate(inputs)}
    if "native" not in runs:
        runs["native"] = (None, "no C++ twin")
    if "planned" in implementations:
        try:
            runs["planned"] = _planned(graph, feeds)
        except Exception as err:  # noqa: BLE001  (one row says why; the others still run)
            runs["planned"] = (None, f"cannot run it: {str(err).splitlines()[0][:120]}")
    if "pytorch" in implementations:
        runs["pytorch"] = _pytorch(classes, graph, inputs, attrs, domain)
        if threads is not None and runs["pytorch"][0] is not None:
            import torch
            torch.set_num_threads(threads)
    if "onnxruntime" in implementations:
        runs["onnxruntime"] = _onnxruntime(graph, feeds, threads, opset)
    runs = {name: runs[name] for name in implementations if name in runs}
    ready = {name: fn for name, (fn, _) in runs.items() if fn is not None}
    expected = reference.astype(np.float64)
    diffs = {}
    for name, fn in ready.items():
        got = _as_numpy(fn())
        diffs[name] = float(np.max(np.abs(got.astype(np.float64) - expected))) \
            if got.shape == expected.shape and got.size else \
            (0.0 if got.shape == expected.shape else float("inf"))
    samples = measure_many({name: Variant(fn) for name, fn in ready.items()}, repeat, warmup)
    result = CrossResult(op_type, [tuple(x.shape) for x in inputs], attrs)
    for name, (fn, note) in runs.items():
        result.rows.append(Row(name, samples.get(name), diffs.get(name), note))
    return result


def table(result: CrossResult) -> str:
    """Medians with 95 % intervals, each against the reference, and the output differences;
    one line for each implementation that did not run, saying why."""
    from meta.bench.report import format_table

    shapes = ", ".join("x".join(map(str, s)) for s in result.shapes)
    attrs = " ".join(f"{k}={v}" for k, v in result.attrs.items())
    lines = [f"{result.op_type} forward ({shapes}{'; ' + attrs if attrs else ''}) across "
             "meta's backends and the frameworks installed, taking turns:"]
    ran = [r for r in result.rows if r.sample is not None]
    ref = next((r.sample.summary().median for r in ran if r.name == "reference"), None)
    rows = [["implementation", "median us", "95% CI", "vs reference", "max |diff|", "runs as"]]
    for r in ran:
        s = r.sample.summary().scaled(1e6)
        speed = f"{ref / r.sample.summary().median:.3g}x" if ref else "-"
        rows.append([r.name, f"{s.median:.1f}", f"[{s.ci_low:.1f}, {s.ci_high:.1f}]", speed,
                     f"{r.max_abs_diff:.3g}", r.note or "-"])
    lines.append(format_table(rows))
    lines += [f"{r.name}: {r.note}" for r in result.rows if r.sample is None]
    return "\n".join(lines)
