"""The PyTorch executor: a meta graph run by PyTorch eager, forward and through autograd.

``TorchExecutor(graph, device="cpu")`` (``executor: pytorch`` in a recipe, ``device: cuda`` on a
GPU) has the reference executor's interface: ``inference``, ``inference_and_backprop`` (with
``wrt`` and ``micro_batches``), ``train()``/``eval()``, ``placement()`` and profiling. PyTorch is
optional: it is imported when the executor is built, never by ``import meta``, and without it
the recipe fails before any data is loaded, saying how to install it.

How a node runs (``placement()`` tells): the hot operators map to torch functions
(``meta.lv1.torch_ops``: Conv, Gemm, MatMul, the activations, softmaxes and losses, the
elementwise arithmetic, BatchNormalization, the pools, Flatten, Reshape, Transpose, Concat,
Clip, Dropout, Gather, Shape, ...), placed ``"pytorch"``. Every other node — any other built-in
operator, a user's Python op, a run-time-compiled C++ op, If/Loop/Scan with their subgraphs —
runs meta's own operator on host numpy arrays inside autograd (a ``torch.autograd.Function``
calling its ``forward`` and ``backward``), placed ``"host"``: only that node's inputs and
outputs travel between device and host. An op meta does not know is named, with all the others,
when the executor is built.

The graph's arrays stay the source of truth, as for meta's executors: every call reads the
parameters and state from ``graph.initializers`` (on the CPU ``torch.from_numpy`` shares their
memory: no copy; on a GPU they are uploaded every call), the training mode writes the running
statistics back into the graph's state arrays (in place on the CPU, copied back from a GPU),
and gradients come back as numpy arrays (on the CPU views of torch's memory, no copy; from a
GPU one device-to-host copy each). So export, checkpoints, Level 2 optimizers and Level 3
strategies (which re-point the parameters into their flat buffer) work unchanged.
``transfers`` counts the bytes and seconds of those copies; with ``timeline`` set to a Level 3
strategy's timeline (``Trainer.use`` does) the step timeline shows the gradients' copy as its own
phase, ``to_host``, after ``compute``.

>>> from meta.lv1 import mlp
>>> ex = TorchExecutor(mlp(hidden=[8])).train()                     # doctest: +SKIP
>>> batch = {"input": np.zeros((2, 1, 28, 28), np.float32), "labels": np.zeros(2, np.int64)}
>>> values, grads = ex.inference_and_backprop(batch)                 # doctest: +SKIP
>>> sorted(grads)                                                    # doctest: +SKIP
['fc0.bias', 'fc0.weight', 'fc1.bias', 'fc1.weight']
"""

from __future__ import annotations

import importlib.util
import re
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv0 import Context, InferenceContext, Operator, check_backward
from meta.lv1.executor import (
    EXECUTORS,
    ExecutionError,
    ReferenceExecutor,
    SubgraphScope,
    Tensors,
    _describe,
)
from meta.lv1.graph import Graph, GraphError, Node, canonical_domain
from meta.lv1.onnx_io import operator_problems

INSTALL = "pip install 'meta[torch]'"
DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
# numpy dtypes torch.from_numpy takes; others (strings, objects) stay numpy, for host ops only
TORCH_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128))


def torch_missing() -> str | None:
    """Why the PyTorch executor cannot be built here (None: PyTorch is installed). Looks the
    package up without importing it."""
    if importlib.util.find_spec("torch") is None:
        return f"PyTorch is not installed ({INSTALL})"
    return None


def _import_torch() -> Any:
    reason = torch_missing()
    if reason is not None:
        raise ComponentError(f"executor 'pytorch': {reason}")
    import torch

    return torch


def _device(torch: Any, name: str) -> Any:
    if not DEVICE.match(name):
        raise ComponentError(f"executor 'pytorch': device must be cpu, cuda or cuda:N, got "
                             f"{name!r}")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ComponentError(f"executor 'pytorch': device {name!r} needs a CUDA GPU, and "
                                 f"PyTorch {torch.__version__} sees none "
                                 f"(torch.cuda.is_available() is False)")
        count = torch.cuda.device_count()
        if (device.index or 0) >= count:
            raise ComponentError(f"executor 'pytorch': device {name!r} does not exist; "
                                 f"PyTorch sees {count} CUDA device(s)")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


@dataclass
class Call:
    """What a torch kernel knows of its node (``meta.lv1.torch_ops``)."""

    op: Operator
    node: Node
    training: bool | None  # the executor's mode (None: each node as written)
    writes_state: tuple[int, ...]  # input indices whose state this node updates
    device: Any

    def mode(self, as_written: bool) -> bool:
        """Whether the node runs in training mode: the executor's mode, else the node's own."""
        return as_written if self.training is None else self.training


class TorchExecutor(ReferenceExecutor):
    """Runs a graph with PyTorch on ``device`` (``cpu``, ``cuda``, ``cuda:N``); see the module
    docstring. ``transfers`` holds the cumulative bytes and seconds copied to the device
    (``to_device_*``) and to the host (``to_host_*``: gradients, outputs, host nodes' inputs
    and outputs, state written back); on the CPU nothing is copied."""

    options: ClassVar[dict[str, Option]] = {
        **ReferenceExecutor.options,
        "device": Option("cpu", "where PyTorch runs: cpu, cuda or cuda:N"),
    }

    def __init__(self, graph: Graph, device: str = "cpu", profile: bool = False,
                 free_intermediates: bool = True) -> None:
        torch = _import_torch()
        from meta.lv1 import torch_ops  # imports torch

        self.torch = torch
        self.device = _device(torch, device)
        problems = operator_problems(graph)
        if problems:
            raise GraphError(f"executor 'pytorch' cannot run {len(problems)} node(s) of graph "
                             f"{graph.name!r} (register their operators with meta.register or "
                             f"meta.register_cpp_op):\n  - " + "\n  - ".join(problems))
        super().__init__(graph, ("numpy",), profile, free_intermediates)
        self.kernels: dict[str, Any] = {}
        for node in graph.nodes:
            op = self.ops[node.name]
            entry = torch_ops.KERNELS.get(node.op_type)
            if (entry is not None and canonical_domain(node.domain) == ""
                    and op.since >= entry.since and not any(True for _ in node.subgraphs())
                    and (entry.takes is None or entry.takes(op, node))):
                self.kernels[node.name] = entry.fn
        self.transfers = {"to_device_bytes": 0, "to_device_s": 0.0, "to_host_bytes": 0,
                          "to_host_s": 0.0}
        # self.timeline (Executor's; a Level 3 Timeline): the gradients' copy timed "to_host"
        self._host_function = _host_function(torch)
        self._on_cpu = self.device.type == "cpu"

    def placement(self) -> dict[str, str]:
        """Node name -> "pytorch" (a torch function) or "host" (meta's own operator, Python
        or C++, on host arrays inside autograd)."""
        return {n.name: "pytorch" if n.name in self.kernels else "host" for n in self.graph.nodes}

    def subexecutor(self, graph: Graph) -> ReferenceExecutor:
        """Subgraphs (If branches, Loop bodies) run on the host through meta's reference
        executor, inside their node's autograd function."""
        sub = self._subexecutors.get(id(graph))
        if sub is None:
            sub = ReferenceExecutor(graph, self.backends, self.profile, self.free_intermediates)
            sub.records = self.records
            sub.outer_names = graph.free_names()
            self._subexecutors[id(graph)] = sub
        sub.training = self.training
        return sub

    # -- moving arrays -------------------------------------------------------------------
    def to_device(self, value: Any) -> Any:
        """A numpy value as a tensor on the device (sharing its memory on the CPU); a value
        torch cannot hold (strings) stays a numpy array."""
        torch = self.torch
        if isinstance(value, (torch.Tensor, list, tuple)) or value is None:
            return value  # a sequence or an empty optional stays as it is (host ops only)
        array = np.asarray(value)
        if array.dtype not in TORCH_DTYPES:
            return array
        if (not array.flags.writeable or not array.dtype.isnative
                or any(s < 0 for s in array.strides)):
            array = np.array(array, dtype=array.dtype.newbyteorder("="))
        tensor = torch.from_numpy(array)
        if self._on_cpu:
            return tensor
        start = time.perf_counter()
        tensor = tensor.to(self.device)
        self.transfers["to_device_s"] += time.perf_counter() - start
        self.transfers["to_device_bytes"] += array.nbytes
        return tensor

    def to_host(self, value: Any) -> Any:
        """A tensor as a numpy array (a view of its memory on the CPU, a copy from a GPU)."""
        if not isinstance(value, self.torch.Tensor):
            return value
        value = value.detach()
        if value.device.type != "cpu":
            start = time.perf_counter()
            value = value.cpu()
            self.transfers["to_host_s"] += time.perf_counter() - start
            self.transfers["to_host_bytes"] += value.numel() * value.element_size()
        return value.resolve_conj().resolve_neg().numpy()

    # -- forward -------------------------------------------------------------------------
    def _run(self, feeds: Tensors, outputs: list[str], grad: set[str]) -> dict[str, Any]:
        """Tensors of ``outputs`` (and of the names in ``grad``, made to require gradients:
        parameters, fed inputs or intermediates) after a forward in the executor's mode."""
        torch, graph = self.torch, self.graph
        nodes = graph.nodes_for(outputs, given=feeds)
        feeds = self._check_feeds(feeds, nodes)
        needed = {x for n in nodes for x in n.dependencies()} | set(outputs) | grad
        values: dict[str, Any] = {}
        for name in needed:
            source = feeds if name in feeds else graph.initializers
            if name in source:
                values[name] = self.to_device(source[name])
                if name in grad:
                    self._require_grad(values, name)
        remaining: dict[str, int] = {}
        for node in nodes:
            for name in set(node.dependencies()):
                remaining[name] = remaining.get(name, 0) + 1
        keep = set(outputs) | set(values) | grad
        state = set(graph.state) - set(feeds) if self.training else set()
        written: dict[str, Any] = {}  # state tensors a torch kernel updated
        timed = self.profile
        for node in nodes:
            args = [values[x] if x else None for x in node.inputs]
            op = self.ops[node.name]
            writes = tuple(i for i, x in enumerate(node.inputs) if x in state
                           and i in op.state_inputs)
            start = time.perf_counter_ns() if timed else 0
            try:
                results, on_torch = self._node(node, op, args, values, writes)
                if timed and not self._on_cpu:
                    torch.cuda.synchronize(self.device)
            except Exception as err:
                shapes = ", ".join(f"{x or '-'}: {_describe_any(a)}"
                                   for x, a in zip(node.inputs, args))
                raise ExecutionError(f"{node.describe()} failed on inputs ({shapes}): {err}") \
                    from err
            if timed:
                self.records.append((node.name, node.op_type, "forward",
                                     time.perf_counter_ns() - start))
            if writes and on_torch:
                written.update((node.inputs[i], args[i]) for i in writes)
            for name, value in zip(node.outputs, results):
                if name and name not in feeds:
                    values[name] = value
                    if name in grad:
                        self._require_grad(values, name)
            del args
            if self.free_intermediates:
                for name in set(node.dependencies()):
                    remaining[name] -= 1
                    if remaining[name] == 0 and name not in keep:
                        values.pop(name, None)
                for name in node.outputs:
                    if name and not remaining.get(name) and name not in keep:
                        values.pop(name, None)
        self._write_back(written)
        missing = [o for o in outputs if o not in values]
        if missing:
            raise GraphError(f"outputs {missing} are not produced by graph {graph.name!r}")
        return values

    def _require_grad(self, values: dict[str, Any], name: str) -> None:
        tensor = values[name]
        if isinstance(tensor, self.torch.Tensor) and tensor.is_floating_point() \
                and not tensor.requires_grad:
            # a tensor of its own (sharing memory): an Identity's output may be its input
            values[name] = tensor.detach().requires_grad_(True)

    def _node(self, node: Node, op: Operator, args: list[Any], values: dict[str, Any],
              writes: tuple[int, ...]) -> tuple[tuple[Any, ...], bool]:
        """The node's outputs, and whether a torch kernel computed them (a kernel returns
        NotImplemented for a case it leaves to meta's operator, such as integer division)."""
        fn = self.kernels.get(node.name)
        if fn is not None and all(a is None or isinstance(a, self.torch.Tensor) for a in args):
            results = fn(Call(op, node, self.training, writes, self.device), *args)
            if results is not NotImplemented:
                return (results if isinstance(results, tuple) else (results,)), True
        return self._host(node, op, args, values, writes), False

    def _write_back(self, written: dict[str, Any]) -> None:
        """State a torch kernel updated, into the graph's arrays (on the CPU the tensors are
        those arrays: nothing to do)."""
        for name, tensor in written.items():
            target = self.graph.initializers[name]
            if self._on_cpu and tensor.data_ptr() == target.ctypes.data:
                continue
            target[...] = self.to_host(tensor)

    def _host(self, node: Node, op: Operator, args: list[Any], values: dict[str, Any],
              writes: tuple[int, ...]) -> tuple[Any, ...]:
        """Run meta's own operator on host arrays, inside autograd when a gradient flows."""
        torch = self.torch
        free = sorted({x for sub in node.subgraphs() for x in self.subexecutor(sub).outer_names})
        outer = [values.get(x) for x in free]
        call = HostCall(self, node, op, writes, free)
        inputs = [*args, *outer]
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in inputs):
            tensors = self._host_function.apply(call, *inputs)
            tensors = tensors if isinstance(tensors, tuple) else (tensors,)
        else:
            tensors = call.to_tensors(call.forward(inputs, [False] * len(inputs)))
        return tuple(call.side.get(i, t) for i, t in enumerate(tensors))

    def inference(self, feeds: Tensors, outputs: Iterable[str] | None = None) -> Tensors:
        """Compute ``outputs`` (default: the graph outputs; any tensor name works) from
        ``feeds``, without autograd; returns numpy arrays."""
        names = list(outputs) if outputs is not None else [t.name for t in self.graph.outputs]
        with self.torch.no_grad():
            values = self._run(feeds, names, set())
            return {n: self.to_host(values[n]) for n in names}

    # -- backward ------------------------------------------------------------------------
    def _backprop(self, feeds: Tensors, loss: str, outputs: Iterable[str] | None,
                  seed: float = 1.0, wrt: Sequence[str] = ()) -> tuple[Tensors, Tensors]:
        torch = self.torch
        params = self.graph.parameters
        names = list(dict.fromkeys([loss, *(outputs or [])]))
        wrt = self._wrt(feeds, wrt)
        trainable = [p for p in params if p not in feeds]
        grad = set(trainable) | set(wrt)
        with torch.enable_grad():
            values = self._run(feeds, names, grad)
            loss_t = values[loss]
            if loss_t.numel() != 1:
                raise GraphError(f"loss {loss!r} must be a scalar, got shape "
                                 f"{tuple(loss_t.shape)}")
            wanted = [n for n in dict.fromkeys([*trainable, *wrt])
                      if isinstance(values.get(n), torch.Tensor) and values[n].requires_grad]
            found: list[Any] = [None] * len(wanted)
            if wanted and loss_t.requires_grad:
                start = time.perf_counter_ns() if self.profile else 0
                found = list(torch.autograd.grad(loss_t, [values[n] for n in wanted],
                                                 torch.full_like(loss_t, seed),
                                                 allow_unused=True))
                if self.profile:
                    if not self._on_cpu:
                        torch.cuda.synchronize(self.device)
                    self.records.append(("backward", "(autograd)", "backward",
                                         time.perf_counter_ns() - start))
        if self.timeline is not None:
            self.timeline.lap("compute")
        grads = self._gradients_to_host(dict(zip(wanted, found)))
        out = {n: self.to_host(values[n]) for n in names}
        if self.timeline is not None:
            self.timeline.lap("to_host")
        param_grads = {p: grads[p] if grads.get(p) is not None else np.zeros_like(v)
                       for p, v in params.items()}
        for name in wrt:
            found_grad = grads.get(name)
            param_grads[name] = found_grad if found_grad is not None else \
                np.zeros_like(self.to_host(values.get(name, feeds.get(name))))
        return out, param_grads

    def _gradients_to_host(self, found: dict[str, Any]) -> dict[str, np.ndarray | None]:
        """Gradients as numpy arrays of their own: contiguous (autograd may hand out
        broadcast views) and never sharing memory with one another (callers add into them)."""
        seen: set[int] = set()
        grads: dict[str, np.ndarray | None] = {}
        for name, g in found.items():
            if g is None:
                grads[name] = None
                continue
            if not g.is_contiguous() or g.data_ptr() in seen:
                g = g.contiguous() if not g.is_contiguous() else g.clone()
            seen.add(g.data_ptr())
            grads[name] = self.to_host(g)
        return grads


def _describe_any(value: Any) -> str:
    if value is None or isinstance(value, np.ndarray):
        return _describe(value)
    return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"


class HostCall:
    """One node run by meta's own operator on host arrays: forward keeps meta's Context for
    backward; ``side`` holds outputs torch cannot represent (strings), by output index."""

    def __init__(self, executor: TorchExecutor, node: Node, op: Operator,
                 writes: tuple[int, ...], free: list[str]) -> None:
        self.executor, self.node, self.op = executor, node, op
        self.writes, self.free = writes, free
        self.side: dict[int, np.ndarray] = {}
        self.ctx: Context | None = None
        self.needs: list[bool] = []

    def forward(self, inputs: Sequence[Any], needs: Sequence[bool]) -> tuple[Any, ...]:
        """Run meta's own operator for the node on host copies of ``inputs`` inside PyTorch's
        autograd; ``needs`` says which inputs want a gradient."""
        ex, node, n = self.executor, self.node, len(self.node.inputs)
        host = [ex.to_host(a) for a in inputs]
        self.needs = [bool(w) for w in needs]
        recording = any(self.needs)
        if recording or self.writes:
            ctx: Context = Context([bool(x) and self.needs[i] for i, x in enumerate(node.inputs)],
                                   ex.training)
        else:
            ctx = InferenceContext(training=ex.training)
        if self.free:
            outer = {x: v for x, v in zip(self.free, host[n:]) if v is not None}
            wanted = {x for x, w in zip(self.free, self.needs[n:]) if w}
            ctx.subgraphs = SubgraphScope(ex, outer, wanted, recording)
        results = self.op.apply(ctx, *host[:n])
        if self.writes:
            self._update_state(ctx, inputs, host)
        self.ctx = ctx
        return results

    def _update_state(self, ctx: Context, inputs: Sequence[Any], host: list[Any]) -> None:
        """``op.update_state``'s values into the graph's arrays (and the device copies)."""
        ex, node = self.executor, self.node
        new = self.op.update_state(ctx, *(host[i] for i in self.writes))
        if new is None:
            return
        for i, value in zip(self.writes, new):
            name = node.inputs[i]
            target = ex.graph.initializers[name]
            if np.shape(value) != target.shape:
                raise ExecutionError(f"{node.describe()}: update_state returned shape "
                                     f"{np.shape(value)} for state {name!r} {target.shape}")
            target[...] = value
            tensor = inputs[i]
            if isinstance(tensor, ex.torch.Tensor) and not (
                    ex._on_cpu and tensor.data_ptr() == target.ctypes.data):
                with ex.torch.no_grad():
                    tensor.copy_(ex.torch.from_numpy(np.ascontiguousarray(target)))

    def to_tensors(self, results: Sequence[Any]) -> tuple[Any, ...]:
        """The host results as tensors on the executor's device (values torch cannot hold are handed
        on as numpy)."""
        tensors = []
        for i, value in enumerate(results):
            tensor = self.executor.to_device(value)
            if not isinstance(tensor, self.executor.torch.Tensor):
                self.side[i] = tensor  # strings and the like: handed on as numpy
                tensor = self.executor.torch.empty(0)
            tensors.append(tensor)
        return tuple(tensors)

    def backward(self, grads: Sequence[Any]) -> list[Any]:
        """The operator's backward for autograd: gradients of the node's inputs (and of the outer
        values a subgraph read), as tensors."""
        ex, node, n = self.executor, self.node, len(self.node.inputs)
        count = n + len(self.free)
        if self.ctx is None or all(g is None for g in grads):
            return [None] * count
        start = time.perf_counter_ns() if ex.profile else 0
        grad_outputs = [ex.to_host(g) for g in grads]
        try:
            grad_inputs = list(ex.ops[node.name].backward(self.ctx, *grad_outputs))
        except Exception as err:
            shapes = ", ".join(f"{o or '-'}: {_describe(g)}"
                               for o, g in zip(node.outputs, grad_outputs))
            raise ExecutionError(f"{node.describe()} backward failed on output gradients "
                                 f"({shapes}): {err}") from err
        grad_inputs = list(check_backward(grad_inputs, self.ctx, node))  # a user op's mistakes
        if ex.profile:
            ex.records.append((node.name, node.op_type, "backward",
                               time.perf_counter_ns() - start))
        result: list[Any] = []
        for i in range(n):
            g = grad_inputs[i] if i < len(grad_inputs) else None
            result.append(ex.to_device(np.asarray(g)) if g is not None and self.needs[i]
                          else None)
        scope = getattr(self.ctx, "subgraphs", None)
        outer = scope.outer_grads if scope is not None else {}
        for k, name in enumerate(self.free):
            g = outer.get(name)
            result.append(ex.to_device(np.asarray(g)) if g is not None and self.needs[n + k]
                          else None)
        self.ctx = None  # what forward saved goes once used
        return result


def _host_function(torch: Any) -> Any:
    """The autograd function that runs a HostCall (defined once torch is imported)."""

    class HostOp(torch.autograd.Function):
        @staticmethod
        def forward(fctx, call: HostCall, *inputs: Any) -> tuple[Any, ...]:
            fctx.set_materialize_grads(False)  # unused outputs get None, not zeros
            fctx.call = call
            tensors = call.to_tensors(call.forward(inputs, fctx.needs_input_grad[1:]))
            fixed = [t for t in tensors if not (t.is_floating_point() or t.is_complex())]
            fixed += [tensors[i] for i in call.side]
            if fixed:
                fctx.mark_non_differentiable(*fixed)
            return tensors

        @staticmethod
        def backward(fctx, *grads: Any) -> tuple[Any, ...]:
            return (None, *fctx.call.backward(grads))

    return HostOp


def _problems(values: dict[str, Any]) -> list[str]:
    """What a recipe naming the executor can be told before anything runs."""
    problems = []
    reason = torch_missing()
    if reason is not None:
        problems.append(reason)
    device = values.get("device")
    if isinstance(device, str) and not DEVICE.match(device):
        problems.append(f"option 'device' must be cpu, cuda or cuda:N, got {device!r}")
    return problems


EXECUTORS.add("pytorch", TorchExecutor, validate=_problems,
              doc="PyTorch eager on cpu or cuda (needs PyTorch: pip install 'meta[torch]')")
