"""Executors: run a graph forward (inference) and backward (gradients of a loss)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Iterable, Mapping, Self, Sequence

import numpy as np

from meta.common.component import Option, Registry
from meta.lv0 import Context, InferenceContext, Operator, check_backward, native
from meta.lv1.gradient_hook import GradientHook
from meta.lv1.graph import Graph, GraphError, Node, TensorInfo

Tensors = dict[str, np.ndarray]


class ExecutionError(RuntimeError):
    """An operator failed while running; the message names the node and its inputs."""


def _describe(value: np.ndarray | None) -> str:
    return "absent" if value is None else f"{value.dtype}{list(np.shape(value))}"


@dataclass
class ProfileRow:
    op_type: str
    phase: str  # "forward" or "backward"
    calls: int
    total_ms: float
    share: float  # of all recorded time


@dataclass
class Profile:
    """Per-node wall times aggregated per (op type, phase); ``print(profile)`` shows a table."""

    rows: list[ProfileRow] = field(default_factory=list)
    total_ms: float = 0.0

    @classmethod
    def from_records(cls, records: Iterable[tuple[str, str, str, int]]) -> Profile:
        """Total time and calls per (op type, phase) from the executor's ``(node, op type, phase,
        ns)`` records, each row's share of the total."""
        calls: dict[tuple[str, str], int] = defaultdict(int)
        ns: dict[tuple[str, str], int] = defaultdict(int)
        for _node, op_type, phase, elapsed in records:
            calls[op_type, phase] += 1
            ns[op_type, phase] += elapsed
        total = sum(ns.values())
        rows = [ProfileRow(op, phase, calls[op, phase], t / 1e6, t / total if total else 0.0)
                for (op, phase), t in sorted(ns.items(), key=lambda kv: -kv[1])]
        return cls(rows, total / 1e6)

    def __str__(self) -> str:
        lines = [f"{'op':<26} {'phase':<8} {'calls':>7} {'total ms':>10} {'share':>7}"]
        for r in self.rows:
            lines.append(f"{r.op_type:<26} {r.phase:<8} {r.calls:>7} {r.total_ms:>10.3f} "
                         f"{r.share:>6.1%}")
        lines.append(f"{'total':<26} {'':<8} {sum(r.calls for r in self.rows):>7} "
                     f"{self.total_ms:>10.3f} {1.0 if self.rows else 0.0:>6.1%}")
        return "\n".join(lines)


class SubgraphScope:
    """What an operator holding subgraphs (If, Loop, Scan) finds as ``ctx.subgraphs``.

    Operators receive only their inputs; a branch or loop body also reads tensors of the
    enclosing graph (its free names). The executor hands such a node this scope, holding those
    values, and the op runs its graphs through it: ``run(graph, inputs)`` executes ``graph``
    with ``inputs`` bound to its graph inputs, in the executor's mode and with its backends,
    and returns the graph outputs and a record of the run. When the node is on the tape
    (``recording``), ``backward(record, grad_outputs)`` backpropagates through that run and
    returns the gradients of the graph inputs; those of the enclosing tensors it read are
    summed in ``outer_grads``, which the executor adds to their gradients.
    """

    def __init__(self, executor: ReferenceExecutor, outer: Tensors, wanted: set[str],
                 recording: bool) -> None:
        self.executor = executor
        self.outer = outer  # enclosing tensors the subgraphs read
        self.wanted = wanted  # those that need a gradient
        self.recording = recording
        self.outer_grads: Tensors = {}

    def run(self, graph: Graph, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], object]:
        """Run a subgraph (an If branch, a Loop body) on ``inputs`` with the enclosing graph's
        values in scope; returns its outputs and what its backward needs (``None`` when not
        recording)."""
        names = [t.name for t in graph.inputs]
        if len(inputs) != len(names):
            raise GraphError(f"subgraph {graph.name!r} takes {len(names)} inputs {names}, "
                             f"got {len(inputs)}")
        sub = self.executor.subexecutor(graph)
        free = sub.outer_names
        feeds = {n: v for n, v in self.outer.items() if n in free}
        feeds.update(zip(names, inputs))
        outputs = [t.name for t in graph.outputs]
        if not self.recording:
            values, _ = sub._forward(feeds, outputs, None)
            return [values[o] for o in outputs], None
        wanted = self.wanted & free
        values, tape = sub._forward(feeds, outputs, set(names) | wanted)
        return [values[o] for o in outputs], (graph, tape, wanted)

    def backward(self, record: object, grad_outputs: Sequence[np.ndarray | None]
                 ) -> list[np.ndarray | None]:
        """The gradients of the subgraph's inputs and of the outer values it read, from its outputs'
        gradients and the record ``run`` returned."""
        if record is None:
            raise GraphError("a subgraph run without recording (its node is not on the tape) "
                             "has no backward")
        graph, tape, wanted = record
        grads = {t.name: g for t, g in zip(graph.outputs, grad_outputs) if g is not None}
        names = {t.name for t in graph.inputs}
        grads = self.executor.subexecutor(graph)._run_tape(tape, grads, names | wanted)
        for name in wanted:
            if name in grads:
                g = grads[name]
                self.outer_grads[name] = self.outer_grads[name] + g \
                    if name in self.outer_grads else g
        return [grads.get(t.name) for t in graph.inputs]


class SavedForward:
    """What ``forward_saving`` kept for ``backward_seeded``: a handle, used once.

    ``outputs`` are the names computed, ``shapes`` their (shape, dtype), ``wrt`` the tensors
    whose gradients the backward returns besides the parameters'. What it holds is the
    executor's business: the reference executor's tape, or a plan whose arena holds the
    saved activations (valid until the next forward run in that arena: ``generation``).
    """

    def __init__(self, executor: Executor, outputs: list[str], shapes: dict[str, tuple],
                 wrt: list[str], zeros: dict[str, tuple], state: Any, generation: int = 0
                 ) -> None:
        self.executor = executor
        self.outputs = outputs
        self.shapes = shapes  # output -> (shape, dtype)
        self.wrt = wrt
        self.zeros = zeros  # wrt name -> (shape, dtype): its gradient when nothing reaches it
        self.state = state  # a tape, or a plan
        self.generation = generation
        self.used = False

    def seeds(self, seeds: Mapping[str, Any]) -> Tensors:
        """``seeds`` checked against the outputs (names, shapes) and cast to their dtypes; a
        second backward of one forward is refused (its saved values are consumed)."""
        if self.used:
            raise ValueError("backward_seeded: this forward_saving's backward already ran "
                             "(its saved values are consumed); run forward_saving again")
        unknown = [n for n in seeds if n not in self.shapes]
        if unknown:
            raise ValueError(f"backward_seeded: seeds {unknown} are not outputs of the "
                             f"forward ({self.outputs})")
        checked: Tensors = {}
        for name, seed in seeds.items():
            shape, dtype = self.shapes[name]
            seed = np.asarray(seed)
            if seed.shape != shape:
                raise ValueError(f"backward_seeded: seed of {name!r} has shape "
                                 f"{list(seed.shape)}, the output {list(shape)}")
            checked[name] = seed.astype(dtype, copy=False)
        self.used = True
        return checked


class Executor:
    """What every executor is and every caller may use: the interface, declared once.

    ``graph`` is the network it runs (parameters read from it on every call, so optimizer
    updates take effect at once); ``training`` its mode (None: each node as written, see
    ``ReferenceExecutor``), set by ``train``/``eval``; ``inference`` computes tensors,
    ``inference_and_backprop`` also the gradients of a loss, and takes a gradient ``hook``
    where ``supports_gradient_hook`` (a strategy then communicates during the backward:
    ``PlannedExecutor``); ``placement`` says where each node runs; ``ops`` holds the meta
    operators it runs (empty where it runs none: their random state goes into checkpoints);
    ``timeline``, when a Level 3 strategy sets it, is where the executor records its own
    phases (host copies). The reference, native, planned, PyTorch and onnxruntime executors
    implement it, and so do Level 3's pipeline stage and partitioned graph.
    """

    graph: Graph
    training: bool | None = None
    timeline: Any = None
    supports_gradient_hook: ClassVar[bool] = False
    ops: Mapping[str, Any] = MappingProxyType({})

    def train(self, mode: bool = True) -> Self:
        """Run every node in training mode from now on (``train(False)`` is ``eval()``)."""
        self.training = bool(mode)
        self._mode_changed()
        return self

    def eval(self) -> Self:
        """Run every node in inference mode from now on."""
        return self.train(False)

    def _mode_changed(self) -> None:
        """After ``train``/``eval``: what an executor must redo for the new mode (nothing)."""

    def placement(self) -> dict[str, str]:
        """Node name -> the backend of the implementation it runs ("numpy", "native", ...)."""
        return {name: op.backend for name, op in self.ops.items()}

    def inference(self, feeds: Tensors, outputs: Iterable[str] | None = None) -> Tensors:
        """The tensors ``outputs`` (default: the graph's outputs) computed from ``feeds``."""
        raise NotImplementedError(f"{type(self).__name__}.inference")

    def inference_and_backprop(
        self, feeds: Tensors, loss: str = "loss", outputs: Iterable[str] | None = None,
        micro_batches: int = 1, wrt: Sequence[str] = (), hook: GradientHook | None = None,
    ) -> tuple[Tensors, Tensors]:
        """(values of ``loss`` and ``outputs``, gradients of the loss with respect to the
        trainable parameters and to ``wrt``)."""
        raise NotImplementedError(f"{type(self).__name__}.inference_and_backprop")

    def forward_saving(self, feeds: Tensors, outputs: Iterable[str], wrt: Sequence[str] = ()
                       ) -> tuple[Tensors, SavedForward]:
        """A stage's forward: the values of ``outputs`` (any tensors, non-scalar too) and a
        handle keeping what their backward needs (``backward_seeded``). The building block of
        layer groups (ZeRO-3), activation recomputation and pipeline stages."""
        raise NotImplementedError(f"{type(self).__name__}.forward_saving")

    def backward_seeded(self, saved: SavedForward, seeds: Mapping[str, np.ndarray]) -> Tensors:
        """The backward of ``forward_saving``'s forward from ``seeds`` (output -> the gradient
        of something with respect to it, of its shape; outputs not seeded count as zero;
        several add): a vector-Jacobian product. Returns the gradients of every trainable
        parameter (zeros where nothing seeded reaches it) and of the forward's ``wrt``."""
        raise NotImplementedError(f"{type(self).__name__}.backward_seeded")

    def _refuse_hook(self, hook: GradientHook | None) -> None:
        if hook is not None:
            raise ValueError(f"{type(self).__name__} takes no gradient hook "
                             "(supports_gradient_hook is False)")


class ReferenceExecutor(Executor):
    """Runs a graph with numpy operators (or the first of ``backends`` that implements each op).

    Operators are resolved when the executor is built, so an unknown op fails here, naming the
    node. Parameters are read from ``graph.initializers`` on every call, so in-place optimizer
    updates take effect at once. Any tensor can be fetched (``outputs``) and any tensor fed: a
    fed intermediate replaces what its producer would compute, and producers needed for nothing
    else are skipped. An intermediate is dropped as soon as no remaining node or requested
    output needs it (``free_intermediates=False`` keeps them all); ``peak_intermediate_bytes``
    says how many bytes of intermediates were alive at most during the last forward.
    With ``profile=True`` every node's forward and backward wall time is recorded;
    ``profile_table()`` aggregates them per op type.

    Mode, as PyTorch's ``module.train()``/``eval()``: after ``train()`` every node runs in
    training mode (BatchNormalization normalises with batch statistics and the executor writes
    the updated running statistics into the graph's state, Dropout drops), after ``eval()`` in
    inference mode (stored statistics, no dropout), whatever the node's own ``training_mode``
    says; before either (``training is None``) each node runs as written, which is ONNX's
    functional meaning (state is never written then).

    >>> from meta.lv1 import mlp
    >>> ex = ReferenceExecutor(mlp(hidden=[8]))
    >>> x = np.zeros((2, 1, 28, 28), np.float32)
    >>> ex.inference({"input": x}, ["logits"])["logits"].shape
    (2, 10)
    """

    backends: tuple[str, ...] = ("numpy",)
    options: ClassVar[dict[str, Option]] = {
        "profile": Option(False, "record every node's forward and backward time"),
        "free_intermediates": Option(True, "drop each activation once nothing needs it"),
    }

    def __init__(self, graph: Graph, backends: Sequence[str] | None = None,
                 profile: bool = False, free_intermediates: bool = True) -> None:
        self.graph = graph
        self.backends = tuple(backends or self.backends)
        self.ops: dict[str, Operator] = graph.check_operators(self.backends)
        self.profile = profile
        self.free_intermediates = free_intermediates
        self.peak_intermediate_bytes = 0
        self.records: list[tuple[str, str, str, int]] = []  # (node, op type, phase, ns)
        self.training: bool | None = None
        self._subexecutors: dict[int, ReferenceExecutor] = {}

    def subexecutor(self, graph: Graph) -> ReferenceExecutor:
        """The executor of a subgraph (an If branch, a Loop body): same class, backends and
        mode, its profile records kept with ours; built once per graph."""
        sub = self._subexecutors.get(id(graph))
        if sub is None:
            sub = type(self).__new__(type(self))
            ReferenceExecutor.__init__(sub, graph, self.backends, self.profile,
                                       self.free_intermediates)
            sub.records = self.records
            sub.outer_names = graph.free_names()  # what it reads from enclosing graphs
            self._subexecutors[id(graph)] = sub
        sub.training = self.training
        return sub

    # -- profiling -----------------------------------------------------------------------
    def profile_table(self) -> Profile:
        """The recorded node times per op type and phase (all calls since the last reset)."""
        return Profile.from_records(self.records)

    def reset_profile(self) -> None:
        """Forget the per-node timings recorded so far (``profile=True``)."""
        self.records.clear()

    # -- feeds ---------------------------------------------------------------------------
    def _check_value(self, name: str, value: np.ndarray, info: TensorInfo, kind: str) -> None:
        if not isinstance(value, np.ndarray):
            return  # a sequence or an optional: not a tensor to check
        if info.dtype is not None and value.dtype != info.dtype:
            raise GraphError(f"{kind} {name!r}: expected {info.dtype}, got {value.dtype}")
        if info.shape is not None:
            fixed = [d if isinstance(d, int) else None for d in info.shape]
            if len(fixed) != value.ndim or any(
                    d is not None and d != s for d, s in zip(fixed, value.shape)):
                raise GraphError(f"{kind} {name!r}: expected shape {list(info.shape)}, "
                                 f"got {list(value.shape)}")

    def _check_feeds(self, feeds: Tensors, nodes: list[Node]) -> Tensors:
        graph = self.graph
        declared = {t.name: t for t in graph.inputs}
        produced = graph.producers()
        unknown = sorted(set(feeds) - set(declared) - set(graph.initializers) - set(produced)
                         - graph.outer_scope)
        if unknown:
            raise GraphError(f"feeds {unknown} are not inputs, initializers or tensors of graph "
                             f"{graph.name!r} (inputs: {sorted(declared)})")
        # sequences (lists) and empty optionals (None) stay as they are
        feeds = {k: v if isinstance(v, (np.ndarray, list)) or v is None else np.asarray(v)
                 for k, v in feeds.items()}
        needed = {x for n in nodes for x in n.dependencies()}
        for name, info in declared.items():
            if name in feeds:
                self._check_value(name, feeds[name], info, "input")
            elif name in needed and name not in graph.initializers:
                raise GraphError(f"graph input {name!r} is needed but was not fed")
        for name in feeds.keys() & produced.keys():
            if name in graph.value_info:
                self._check_value(name, feeds[name], graph.value_info[name], "fed tensor")
        return feeds

    # -- forward -------------------------------------------------------------------------
    def _forward(self, feeds: Tensors, outputs: Iterable[str], requires_grad: set[str] | None):
        outputs = list(outputs)
        nodes = self.graph.nodes_for(outputs, given=feeds)
        feeds = self._check_feeds(feeds, nodes)
        values: dict[str, np.ndarray] = {**self.graph.initializers, **feeds}
        # Reference counts: how many remaining nodes read each tensor; requested outputs and
        # what the caller passed in are never dropped.
        remaining: dict[str, int] = defaultdict(int)
        for node in nodes:
            for name in set(node.dependencies()):
                remaining[name] += 1
        keep = set(outputs) | set(values)
        live = peak = 0
        tape: list[tuple[Node, Context]] = []
        training = self.training
        inference = InferenceContext(training=training)
        timed = self.profile
        state = set(self.graph.state) - set(feeds) if training else set()
        for node in nodes:
            args = [values[x] if x else None for x in node.inputs]
            op = self.ops[node.name]
            updates = [(i, x) for i, x in enumerate(node.inputs) if x in state
                       and i in op.state_inputs]
            if requires_grad is not None:
                ctx = Context([bool(x) and x in requires_grad for x in node.inputs], training)
            elif updates:
                ctx = Context([False] * len(node.inputs), training)  # keeps the batch statistics
            else:
                ctx = inference
            scope = self._scope(node, values, requires_grad)
            if scope is not None:
                ctx = ctx if ctx is not inference else InferenceContext(training=training)
                ctx.subgraphs = scope
            try:
                start = time.perf_counter_ns() if timed else 0
                results = op.apply(ctx, *args)
                if timed:
                    self.records.append((node.name, node.op_type, "forward",
                                         time.perf_counter_ns() - start))
            except Exception as err:
                shapes = ", ".join(f"{x or '-'}: {_describe(a)}" for x, a in zip(node.inputs, args))
                raise ExecutionError(f"{node.describe()} failed on inputs ({shapes}): {err}") \
                    from err
            if updates:
                self._update_state(node, op, ctx, [x for _, x in updates], values)
            del args
            for name, value in zip(node.outputs, results):
                if name and name not in feeds:  # a fed tensor wins over its producer
                    values[name] = value
                    live += getattr(value, "nbytes", 0)
            peak = max(peak, live)
            if requires_grad is not None and (any(ctx.needs_input_grad)
                                              or (scope is not None and scope.recording)):
                requires_grad.update(o for o in node.outputs if o)
                tape.append((node, ctx))
            if self.free_intermediates:
                dead = [o for o in node.outputs if o and not remaining.get(o) and o not in keep]
                for name in set(node.dependencies()):
                    remaining[name] -= 1
                    if remaining[name] == 0 and name not in keep:
                        dead.append(name)
                for name in dead:
                    if name in values:
                        live -= getattr(values.pop(name), "nbytes", 0)
        self.peak_intermediate_bytes = peak
        missing = [o for o in outputs if o not in values]
        if missing:
            raise GraphError(f"outputs {missing} are not produced by graph {self.graph.name!r}")
        return values, tape

    def _scope(self, node: Node, values: Tensors, requires_grad: set[str] | None
               ) -> SubgraphScope | None:
        """The SubgraphScope of a node with subgraphs (None for other nodes)."""
        subgraphs = list(node.subgraphs())
        if not subgraphs:
            return None
        free: set[str] = set()
        for sub in subgraphs:
            free |= self.subexecutor(sub).outer_names
        outer = {n: values[n] for n in free if n in values}
        wanted = free & requires_grad if requires_grad is not None else set()
        recording = requires_grad is not None and (
            bool(wanted) or any(x in requires_grad for x in node.inputs if x))
        return SubgraphScope(self, outer, wanted, recording)

    def _update_state(self, node: Node, op: Operator, ctx: Context, names: list[str],
                      values: Tensors) -> None:
        """Write ``op.update_state``'s new values into the graph's state arrays, in place (a
        checkpoint or a strategy holding them sees them change)."""
        new = op.update_state(ctx, *(values[x] for x in names))
        if new is None:
            return
        for name, value in zip(names, new):
            target = self.graph.initializers[name]
            if np.shape(value) != target.shape:
                raise ExecutionError(f"{node.describe()}: update_state returned shape "
                                     f"{np.shape(value)} for state {name!r} {target.shape}")
            target[...] = value

    def inference(self, feeds: Tensors, outputs: Iterable[str] | None = None) -> Tensors:
        """Compute ``outputs`` (default: the graph outputs; any tensor name works) from
        ``feeds`` (graph inputs, or any tensor to override); keeps no tape."""
        names = list(outputs) if outputs is not None else [t.name for t in self.graph.outputs]
        values, _ = self._forward(feeds, names, None)
        return {n: values[n] for n in names}

    # -- backward ------------------------------------------------------------------------
    def _wrt(self, feeds: Tensors, wrt: Sequence[str]) -> list[str]:
        """The tensors to differentiate with respect to besides the parameters, once each;
        a name the graph does not know is a GraphError naming it."""
        wrt = list(dict.fromkeys(wrt))
        unknown = [w for w in wrt if w not in feeds and w not in self.graph.tensor_names()]
        if unknown:
            raise GraphError(f"wrt: {unknown} are not inputs or tensors of graph "
                             f"{self.graph.name!r}")
        return wrt

    def _backprop(self, feeds: Tensors, loss: str, outputs: Iterable[str] | None,
                  seed: float = 1.0, wrt: Sequence[str] = ()):
        params = self.graph.parameters
        names = list(dict.fromkeys([loss, *(outputs or [])]))
        wrt = self._wrt(feeds, wrt)
        values, tape = self._forward(feeds, names, (set(params) - set(feeds)) | set(wrt))
        if np.size(values[loss]) != 1:
            raise GraphError(f"loss {loss!r} must be a scalar, got shape {np.shape(values[loss])}")
        # d loss / d loss; a micro-batch seeds its weight here, so its gradients come out scaled
        grads: dict[str, np.ndarray] = {loss: np.full_like(values[loss], seed)}
        grads = self._run_tape(tape, grads, set(params) | set(wrt))
        param_grads = {p: grads[p] if p in grads else np.zeros_like(v) for p, v in params.items()}
        for name in wrt:
            value = values.get(name, feeds.get(name))
            param_grads[name] = grads[name] if name in grads else np.zeros_like(value)
        return {n: values[n] for n in names}, param_grads

    # -- a stage: forward keeping the tape, backward from seeds -----------------------------
    def forward_saving(self, feeds: Tensors, outputs: Iterable[str], wrt: Sequence[str] = ()
                       ) -> tuple[Tensors, SavedForward]:
        """See ``Executor.forward_saving``: the forward recording its tape."""
        names = list(dict.fromkeys(outputs))
        wrt = self._wrt(feeds, wrt)
        params = self.graph.parameters
        values, tape = self._forward(feeds, names, (set(params) - set(feeds)) | set(wrt))
        out = {n: values[n] for n in names}
        zeros = {w: (np.shape(v), np.asarray(v).dtype) for w in wrt
                 for v in [values.get(w, feeds.get(w))]}
        shapes = {n: (np.shape(v), np.asarray(v).dtype) for n, v in out.items()}
        return out, SavedForward(self, names, shapes, wrt, zeros, tape)

    def backward_seeded(self, saved: SavedForward, seeds: Mapping[str, np.ndarray]) -> Tensors:
        """See ``Executor.backward_seeded``: the tape run from the seeds."""
        if saved.executor is not self:
            raise ValueError("backward_seeded: the handle comes from another executor")
        grads = self._run_tape(saved.state, saved.seeds(seeds),
                               set(self.graph.parameters) | set(saved.wrt))
        saved.state = None
        out = {p: grads[p] if p in grads else np.zeros_like(v)
               for p, v in self.graph.parameters.items()}
        for name in saved.wrt:
            shape, dtype = saved.zeros[name]
            out[name] = grads[name] if name in grads else np.zeros(shape, dtype)
        return out

    def _run_tape(self, tape: list[tuple[Node, Context]], grads: Tensors, keep: set[str]
                  ) -> Tensors:
        """Backpropagate ``grads`` (tensor name -> gradient) through ``tape``, consuming it;
        returns the gradients of the tensors in ``keep`` (others are dropped once used)."""
        timed = self.profile
        while tape:
            node, ctx = tape.pop()  # popping lets the saved context go once it is used
            grad_outputs = [grads.get(o) if o else None for o in node.outputs]
            if all(g is None for g in grad_outputs):
                continue
            start = time.perf_counter_ns() if timed else 0
            try:
                grad_inputs = self.ops[node.name].backward(ctx, *grad_outputs)
            except Exception as err:
                shapes = ", ".join(f"{o or '-'}: {_describe(g)}"
                                   for o, g in zip(node.outputs, grad_outputs))
                raise ExecutionError(f"{node.describe()} backward failed on output gradients "
                                     f"({shapes}): {err}") from err
            grad_inputs = check_backward(grad_inputs, ctx, node)  # a user op's mistakes
            if timed:
                self.records.append((node.name, node.op_type, "backward",
                                     time.perf_counter_ns() - start))
            wanted = ctx.needs_input_grad
            scope = getattr(ctx, "subgraphs", None)
            outer = scope.outer_grads if scope is not None else {}
            del ctx, grad_outputs
            for name in node.outputs:  # every reader of these ran earlier in the tape
                if name not in keep:
                    grads.pop(name, None)
            for name, g, want in zip(node.inputs, grad_inputs, wanted):
                if want and g is not None:
                    grads[name] = grads[name] + g if name in grads else g
            for name, g in outer.items():  # what a subgraph read from this graph
                grads[name] = grads[name] + g if name in grads else g
        return grads

    def _split(self, feeds: Tensors, k: int) -> list[Tensors]:
        """``feeds`` cut into ``k`` parts along axis 0 (batched graph inputs only)."""
        declared = {t.name for t in self.graph.inputs} - set(self.graph.initializers)
        batched = {n: np.asarray(v) for n, v in feeds.items() if n in declared and np.ndim(v) >= 1}
        if not batched:
            raise GraphError("micro_batches: no fed graph input has a batch axis to split")
        sizes = {n: v.shape[0] for n, v in batched.items()}
        if len(set(sizes.values())) != 1:
            raise GraphError(f"micro_batches: fed inputs disagree on the batch size (axis 0): "
                             f"{sizes}")
        total = next(iter(sizes.values()))
        if not 1 <= k <= total:
            raise GraphError(f"micro_batches={k} must be between 1 and the batch size {total}")
        bounds = np.linspace(0, total, k + 1).round().astype(int)
        return [{**feeds, **{n: v[a:b] for n, v in batched.items()}}
                for a, b in zip(bounds[:-1], bounds[1:])]

    def inference_and_backprop(
        self, feeds: Tensors, loss: str = "loss", outputs: Iterable[str] | None = None,
        micro_batches: int = 1, wrt: Sequence[str] = (), hook: GradientHook | None = None,
    ) -> tuple[Tensors, Tensors]:
        """Forward to ``loss`` (plus ``outputs``), then backward; returns (values, gradients).

        Gradients are those of the scalar ``loss`` with respect to every trainable parameter
        (``graph.parameters``; a fed parameter is a constant and gets zeros) and to each tensor
        named in ``wrt`` (graph inputs such as the image, for saliency maps, adversarial
        examples or a gradient check of the whole network). ``micro_batches=k`` runs the
        batch in ``k`` slices along axis 0, one at a time, so activations of only one slice are
        alive at once. It assumes the loss is a mean over the batch axis: each slice's loss and
        gradients are weighted by its size / batch size, which gives the full-batch values
        exactly (a loss that is a sum, or a weighted mean like ignore_index, is not matched,
        and neither is an op that mixes samples, such as BatchNormalization in training).
        The loss is combined the same way, other outputs are concatenated along axis 0
        (scalars are weighted like the loss). No gradient ``hook``: see ``Executor``.
        """
        self._refuse_hook(hook)
        if micro_batches == 1:
            return self._backprop(feeds, loss, outputs, wrt=wrt)
        parts = self._split(feeds, micro_batches)
        batched = next(n for n in parts[0] if parts[0][n] is not feeds[n])
        total = np.shape(feeds[batched])[0]
        gathered: dict[str, list[tuple[float, np.ndarray]]] = defaultdict(list)
        gathered_grads: dict[str, list[np.ndarray]] = defaultdict(list)
        grads: Tensors = {}
        for part in parts:
            weight = np.shape(part[batched])[0] / total
            values, part_grads = self._backprop(part, loss, outputs, seed=weight, wrt=wrt)
            for name, g in part_grads.items():
                if name in wrt and name in part and part[name] is not feeds[name]:  # sliced
                    gathered_grads[name].append(g)
                elif name in grads:
                    grads[name] += g
                elif any(np.shares_memory(g, other) for other in grads.values()):
                    grads[name] = g.copy()  # accumulated in place below: never share buffers
                else:
                    grads[name] = g
            del part_grads
            for name, v in values.items():
                gathered[name].append((weight, v))
        combined: Tensors = {}
        for name, pieces in gathered.items():
            first = pieces[0][1]
            if name == loss or np.ndim(first) == 0:
                combined[name] = np.asarray(sum(w * v for w, v in pieces), dtype=first.dtype)
            else:
                combined[name] = np.concatenate([v for _, v in pieces], axis=0)
        grads.update({name: np.concatenate(g, axis=0) for name, g in gathered_grads.items()})
        return combined, grads


class NativeExecutor(ReferenceExecutor):
    """Runs each node on its C++/OpenMP kernel where the operator has one (Conv, Gemm, MatMul,
    pools, BatchNormalization, activations, elementwise ops, softmax cross-entropy) and on
    numpy otherwise; a kernel that does not take a node's case (an N-D window, an integer
    tensor) runs that node's numpy code. Results match the reference executor to rounding
    (the kernels may sum in another order); ``placement()`` says where each node runs.

    >>> from meta.lv1 import mlp
    >>> NativeExecutor(mlp(hidden=[8])).placement()["fc0"]
    'native'
    """

    backends = ("native", "numpy")

    def __init__(self, graph: Graph, backends: Sequence[str] | None = None,
                 profile: bool = False, free_intermediates: bool = True) -> None:
        native.module()  # fails here, with how to build it, if the extension is missing
        super().__init__(graph, backends, profile, free_intermediates)


# Executors as recipes name them (``executor: native``): ``build(graph, **options)``.
EXECUTORS = Registry("executor", context=("graph",))
EXECUTORS.add("reference", ReferenceExecutor)
EXECUTORS.add("native", NativeExecutor)
