"""The onnxruntime executor: inference of a meta graph through an ``InferenceSession``.

``OnnxRuntimeExecutor(graph)`` (``executor: onnxruntime`` in a recipe) runs ``inference`` on
the graph's ONNX export: ``to_onnx(graph, outputs, training=False)`` after ``eval()`` (the
deployed network: BatchNormalization with its running statistics, no dropout), the nodes as
written before any mode is chosen. It is inference only: ``inference_and_backprop`` says so,
and so does ``inference`` in training mode when the graph has nodes whose training mode differs
(BatchNormalization, Dropout, an op with state). Evaluation in the trainer, ``meta compare``
and batch inference of an exported model are what it is for.

The graph's arrays stay the source of truth: a session embeds the weights (so onnxruntime can
fold and fuse them, as it would in deployment), and it is rebuilt when any initializer, or the
graph itself, changed since it was made. The check compares the arrays with a copy taken then
(~1 ms for the 2.7 MB MLP), so the evaluation after each training epoch sees the current
weights. onnxruntime is optional: imported when the executor is built, never by
``import meta``.

>>> from meta.lv1 import mlp
>>> ex = OnnxRuntimeExecutor(mlp(hidden=[8])).eval()                        # doctest: +SKIP
>>> ex.inference({"input": np.zeros((2, 1, 28, 28), np.float32)},
...              ["logits"])["logits"].shape                                   # doctest: +SKIP
(2, 10)

(Skipped as a doctest: onnxruntime is optional.)
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv1.executor import EXECUTORS, ExecutionError, Executor, Tensors
from meta.lv1.gradient_hook import GradientHook
from meta.lv1.graph import Graph, GraphError, canonical_domain, make_operator
from meta.lv1.onnx_io import to_onnx

INSTALL = "pip install 'meta[onnxruntime]'"
DOMAINS = ("", "com.microsoft")  # what onnxruntime's CPU kernels implement


def onnxruntime_missing() -> str | None:
    """Why this executor cannot be built here (None: onnxruntime is installed)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return f"onnxruntime is not installed ({INSTALL})"
    return None


class OnnxRuntimeExecutor(Executor):
    """Inference through onnxruntime (see the module docstring); ``threads`` intra-op
    threads (0: ``OMP_NUM_THREADS`` if set, as meta sets it per MPI rank, else onnxruntime's
    default), ``providers`` in order of preference."""

    options: ClassVar[dict[str, Option]] = {
        "threads": Option(0, "intra-op threads (0: OMP_NUM_THREADS, else onnxruntime's "
                             "default)", low=0),
        "providers": Option(("CPUExecutionProvider",), "execution providers, preferred first",
                            type=tuple[str, ...]),
    }

    def __init__(self, graph: Graph, threads: int = 0,
                 providers: Sequence[str] = ("CPUExecutionProvider",)) -> None:
        reason = onnxruntime_missing()
        if reason is not None:
            raise ComponentError(f"executor 'onnxruntime': {reason}")
        import onnxruntime

        self.ort = onnxruntime
        self.graph = graph
        available = onnxruntime.get_available_providers()
        unknown = [p for p in providers if p not in available]
        if unknown or not providers:
            raise ComponentError(f"executor 'onnxruntime': providers {list(unknown)} are not "
                                 f"available here (available: {', '.join(available)})")
        self.providers = list(providers)
        self.threads = threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
        foreign = [f"{n.describe()} in domain {n.domain!r}" for n in _all_nodes(graph)
                   if canonical_domain(n.domain) not in DOMAINS]
        if foreign:
            raise GraphError(f"executor 'onnxruntime' cannot run {len(foreign)} node(s) of "
                             f"graph {graph.name!r}, which are meta custom operators (run them "
                             f"with the reference, native or pytorch executor):\n  - "
                             + "\n  - ".join(foreign))
        self.training: bool | None = None  # no meta operators run here: ``ops`` is empty
        self.sessions_built = 0
        self._sessions: dict[tuple[Any, ...], Any] = {}
        self._snapshot: dict[str, np.ndarray] = {}
        self._structure: tuple[Any, ...] = ()

    def placement(self) -> dict[str, str]:
        return {node.name: "onnxruntime" for node in self.graph.nodes}

    def _mode_dependent(self) -> list[str]:
        names = []
        for node in self.graph.nodes:
            try:
                op = make_operator(node, self.graph.opset)
            except GraphError:
                continue  # an ONNX op meta lacks: onnxruntime's own semantics
            if op.state_inputs or node.op_type == "Dropout":
                names.append(node.describe())
        return names

    def _fresh(self) -> None:
        """Drop the sessions if the graph or any initializer changed since they were made."""
        graph = self.graph
        structure = (tuple(id(n) for n in graph.nodes), tuple(t.name for t in graph.outputs),
                     tuple((k, v.shape, v.dtype) for k, v in graph.initializers.items()))
        changed = structure != self._structure or any(
            not np.array_equal(graph.initializers[k], v, equal_nan=v.dtype.kind == "f")
            for k, v in self._snapshot.items())
        if changed:
            self._sessions.clear()
            self._structure = structure
            self._snapshot = {k: np.array(v, copy=True) for k, v in graph.initializers.items()}

    def _session(self, outputs: tuple[str, ...]) -> Any:
        self._fresh()
        key = (self.training, outputs)
        session = self._sessions.get(key)
        if session is None:
            model = to_onnx(self.graph, outputs, training=self.training is None)
            options = self.ort.SessionOptions()
            options.log_severity_level = 3
            if self.threads:
                options.intra_op_num_threads = self.threads
                options.inter_op_num_threads = 1
            try:
                session = self.ort.InferenceSession(model.SerializeToString(), options,
                                                    providers=self.providers)
            except Exception as err:
                raise ExecutionError(f"onnxruntime cannot load graph {self.graph.name!r}: "
                                     f"{err}") from err
            self._sessions[key] = session
            self.sessions_built += 1
        return session

    def inference(self, feeds: Tensors, outputs: Iterable[str] | None = None) -> Tensors:
        """Compute graph ``outputs`` (default: all) from ``feeds``; feeds the session does
        not need (labels when only logits are asked for) are left out."""
        declared = [t.name for t in self.graph.outputs]
        names = tuple(outputs) if outputs is not None else tuple(declared)
        other = [n for n in names if n not in declared]
        if other:
            raise GraphError(f"executor 'onnxruntime' fetches graph outputs only ({declared}); "
                             f"{other} are not (the reference executor fetches any tensor)")
        if self.training:
            dependent = self._mode_dependent()
            if dependent:
                raise ExecutionError(f"executor 'onnxruntime' runs inference only: call eval() "
                                     f"(training mode changes {', '.join(dependent[:3])}"
                                     f"{' ...' if len(dependent) > 3 else ''})")
        session = self._session(names)
        wanted = {i.name for i in session.get_inputs()}
        missing = sorted(wanted - set(feeds))
        if missing:
            raise GraphError(f"graph inputs {missing} are needed but were not fed")
        given = {k: np.asarray(v) for k, v in feeds.items() if k in wanted}
        try:
            results = session.run(list(names), given)
        except Exception as err:
            shapes = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in given.items())
            raise ExecutionError(f"onnxruntime failed on graph {self.graph.name!r} with inputs "
                                 f"({shapes}): {err}") from err
        return dict(zip(names, results))

    def inference_and_backprop(self, feeds: Tensors, loss: str = "loss",
                               outputs: Iterable[str] | None = None, micro_batches: int = 1,
                               wrt: Sequence[str] = (), hook: GradientHook | None = None,
                               ) -> tuple[Tensors, Tensors]:
        raise ExecutionError("executor 'onnxruntime' runs inference only (InferenceSession): "
                             "train with the reference, native or pytorch executor and "
                             "evaluate or serve with this one")


def _all_nodes(graph: Graph) -> list[Any]:
    nodes = []
    for node in graph.nodes:
        nodes.append(node)
        for sub in node.subgraphs():
            nodes.extend(_all_nodes(sub))
    return nodes


def _problems(values: dict[str, Any]) -> list[str]:
    reason = onnxruntime_missing()
    return [] if reason is None else [reason]


EXECUTORS.add("onnxruntime", OnnxRuntimeExecutor, validate=_problems,
              doc="onnxruntime InferenceSession, inference only (needs onnxruntime: "
                  "pip install 'meta[onnxruntime]')")
