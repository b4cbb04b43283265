"""The planned executor: the graph compiled once per input shapes and mode into a plan of C++
steps (``meta.lv1.plan.compiler``), then run in one call per forward and one per backward.

It has the reference executor's interface and semantics (train/eval modes with BatchNorm
statistics written back, any tensor fetched or fed, gradients with respect to graph inputs,
micro-batches), and the reference executor is its oracle: the tests compare the two on every
shipped model and the PyTorch fixtures.

Where a plan cannot be made (shapes that depend on the data, sequences) or meta was built
without oneDNN, it runs the reference path on meta's native kernels instead, and says so in
``placement()`` and ``unplanned``.

Two things to know:

* The gradients it returns are the executor's own arrays, overwritten by the next backward
  (as PyTorch's ``.grad``): copy one to keep it. (Micro-batching copies for you.)
* An inference-only plan reorders the weights into its kernels' layouts once, as
  onnxruntime's session does, and repeats that when they change: on ``train()`` /
  ``eval()``, after a backward on this executor, when the graph's arrays are replaced, and
  when the graph's version stamp (``graph.version``) moved, which optimizers, strategies,
  checkpoint loading and the graph's own API (``graph.parameters[name] = ...``, ``freeze``,
  ``unfreeze``) move on. A raw in-place write into a weight array
  (``graph.initializers[name][...] = ...``) moves nothing: call ``graph.touch()`` (or this
  executor's ``refresh()``) after it.
"""

from __future__ import annotations

import ctypes
import sys
import warnings
from typing import ClassVar, Iterable, Sequence

import numpy as np

from meta.common.component import Option
from meta.lv0 import native
from meta.lv1.executor import EXECUTORS, ReferenceExecutor, SavedForward, Tensors
from meta.lv1.gradient_hook import GradientHook
from meta.lv1.graph import Graph
from meta.lv1.plan import custom, profile_share
from meta.lv1.plan.compiler import NotPlannable, Plan, compile_plan
from meta.lv1.plan.precision import PRECISIONS, say_once
from meta.lv1.plan.precision import check as check_precision
from meta.lv1.plan.precision import effective as effective_precision
from meta.lv1.plan.recompute import NotSegmentable, Segments
from meta.lv1.plan.recompute import parse as parse_recompute
from meta.lv1.plan.runtime import PlanUnavailableError, module


def _give_back_heap() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim``). A compile
    traces a forward on numpy; glibc keeps the freed buffers of that one-time pass in the
    heap, where they stayed resident beside the plan's arena (60 MiB for the GPT benchmark at
    sequence 256, most of what the process held over PyTorch's)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # another C library (musl): nothing to trim
        pass


def _signature(value) -> tuple:
    """What a plan's key holds of a fed value: shape and dtype; a sequence's (a list, whose
    tensors may differ in shape) item by item, so it reaches the fallback instead of numpy."""
    if isinstance(value, list):
        return ("sequence", *(_signature(v) for v in value))
    if value is None:
        return ("none",)
    return (np.shape(value), getattr(value, "dtype", None))


class PlannedExecutor(ReferenceExecutor):
    """Runs a graph as a compiled plan of oneDNN kernels (see the module's docstring).

    >>> from meta.lv1 import mlp
    >>> ex = PlannedExecutor(mlp(hidden=[8]))
    >>> x = np.zeros((2, 1, 28, 28), np.float32)
    >>> ex.inference({"input": x}, ["logits"])["logits"].shape
    (2, 10)
    """

    options: ClassVar[dict[str, Option]] = {
        "profile": Option(False, "record every step's time (profile_table())"),
        "precision": Option("f32", "bf16: matrix products and convolutions read bf16, "
                            "accumulate float32 (float32 masters; float32 where the CPU has "
                            "no native bf16)", choices=PRECISIONS),
        "recompute": Option("", "activation recomputation: blocks (each repeated block of "
                            "the graph a segment) or comma-separated node-name patterns "
                            "ending segments; a step keeps only the segments' inputs and "
                            "recomputes each segment in the backward (less activation "
                            "memory, about a third more time); empty: off", type=str),
    }

    def __init__(self, graph: Graph, backends: Sequence[str] | None = None,
                 profile: bool = False, free_intermediates: bool = True,
                 precision: str = "f32", recompute: str | Sequence[str] | None = None
                 ) -> None:
        try:
            native.module()
            default = ("native", "numpy")
        except ImportError:
            default = ("numpy",)
        super().__init__(graph, backends or default, profile, free_intermediates)
        self._plans: dict[tuple, Plan | str] = {}
        self._last: Plan | None = None
        self.unplanned: str | None = None  # why the last call ran unplanned, if it did
        # times the first training steps, says when Python steps take over 5 % of one
        self.python_watch = profile_share.Watch()
        self.precision = check_precision(precision)  # as asked
        # as plans run it: float32 where bf16 is not native here (said once, on stderr)
        self.plan_precision = effective_precision(precision)
        # "blocks", node-name patterns or None (meta.lv1.plan.recompute)
        self.recompute = parse_recompute(recompute)
        self._segments: Segments | None | bool = None  # built at the first step; False: not
        self._segmented = False  # whether the last step ran segmented
        try:
            self.rt = module()
        except PlanUnavailableError as err:
            self.rt = None
            self.unavailable = str(err)
            warnings.warn(f"meta: the planned executor runs unplanned: {err}", RuntimeWarning,
                          stacklevel=2)

    # -- modes -------------------------------------------------------------------------------
    def _mode_changed(self) -> None:
        """A plan is made for one mode: the next call reorders the weights for the new one."""
        super()._mode_changed()
        self.refresh()

    def refresh(self) -> None:
        """Reorder the weights again before the next call (after writing into them yourself;
        ``graph.touch()`` does the same for every executor of the graph)."""
        for plan in self._plans.values():
            if isinstance(plan, Plan):
                plan.prepared = False
        if self._segments:
            for ex in self._segments.executors:
                ex.refresh()

    # -- activation recomputation --------------------------------------------------------------
    def segments(self) -> Segments | None:
        """The segments a step runs with ``recompute`` (built once; None when off or when the
        graph cannot be cut, which is said once on stderr)."""
        if self.recompute is None or self.rt is None:
            return None
        if self._segments is None:
            try:
                self._segments = Segments(self.graph, self.recompute, self._segment_executor)
            except NotSegmentable as err:
                self._segments = False
                say_once(f"meta: recompute={self.recompute!r} on graph {self.graph.name!r}: "
                         f"{err}; training steps run without recomputation")
        return self._segments or None

    def _segment_executor(self, graph: Graph) -> PlannedExecutor:
        ex = PlannedExecutor(graph, self.backends, self.profile, self.free_intermediates,
                             self.precision)
        ex.records = self.records
        ex.training = self.training
        return ex

    def _backprop_segmented(self, feeds: Tensors, loss: str, names: list[str], seed: float,
                            wrt: Sequence[str], hook: GradientHook | None):
        """One step through the segments (``recompute``), or None where it does not apply
        (said once)."""
        segments = self.segments()
        if segments is None:
            return None
        why = segments.takes(names, wrt)
        if why is not None:
            say_once(f"meta: recompute: a step asking for {why} runs without recomputation")
            return None
        self._check_feeds(feeds, self.graph.nodes_for(names, given=feeds))
        segments.sync(self.training)
        values, grads = segments.backprop(feeds, names, loss, seed, hook)
        self._segmented = True
        reasons = [ex.unplanned for ex in segments.executors if ex.unplanned]
        self.unplanned = reasons[0] if reasons else None
        self.peak_intermediate_bytes = segments.arena.nbytes + segments.kept_bytes
        return values, grads

    # -- plans -------------------------------------------------------------------------------
    def _key(self, feeds: Tensors, outputs: Iterable[str], loss: str | None,
             wrt: Sequence[str]) -> tuple:
        signature = tuple((k, _signature(v)) for k, v in feeds.items())
        return (self.training, loss, tuple(outputs), tuple(dict.fromkeys(wrt)), signature,
                tuple(self.graph.parameters), self.rt.max_threads())

    arena = None
    """The ``memory.Arena`` this executor's plans share (None: each plan has its own). Set
    before the first call; activation recomputation gives its segments' executors one."""
    inputs_outside = False
    """Whether its plans keep their fed inputs in arrays of their own, outside the arena,
    where they stay until the next call (recomputation keeps a segment's input there)."""

    def _plan(self, feeds: Tensors, outputs: list[str], loss: str | None,
              wrt: Sequence[str], hook=None, seeded: bool = False
              ) -> tuple[Plan | None, Tensors, list[str]]:
        """The plan for this request (compiled on first sight), the feeds and wrt checked;
        a known request skips the checks: they depend only on what the key holds."""
        if self.rt is None:
            self.unplanned = self.unavailable
            if self.plan_precision == "bf16":
                say_once("meta: precision bf16 asked for, but the planned executor runs "
                         f"unplanned ({self.unavailable}): float32")
            return None, self._check_feeds(feeds, self.graph.nodes_for(outputs, given=feeds)), \
                self._wrt(feeds, wrt) if loss or seeded else []
        key = (*self._key(feeds, outputs, loss, wrt), id(hook) if hook is not None else None,
               seeded)
        plan = self._plans.get(key)
        if isinstance(plan, Plan) and not plan.stale(self.graph):
            self._last, self.unplanned = plan, None
            self.peak_intermediate_bytes = plan.arena_bytes
            return plan, feeds, list(dict.fromkeys(wrt))
        feeds = self._check_feeds(feeds, self.graph.nodes_for(outputs, given=feeds))
        wrt = self._wrt(feeds, wrt) if loss or seeded else []
        if isinstance(plan, str):
            self.unplanned = plan
            return None, feeds, wrt
        try:
            plan = compile_plan(self.graph, feeds, outputs, loss, list(wrt), self.training,
                                self.backends, self.rt, hook, self.plan_precision, seeded,
                                self.arena, self.inputs_outside)
        except NotPlannable as err:
            self._plans[key] = str(err)
            self.unplanned = str(err)
            if self.plan_precision == "bf16":
                say_once(f"meta: precision bf16 asked for, but this request runs unplanned "
                         f"({err}): float32, as the reference path computes")
            return None, feeds, wrt
        _give_back_heap()
        for program in plan.programs.values():
            program.profile = self.profile
        self._plans[key] = plan
        custom.announce(self.graph.nodes, plan.placement)  # once per op leaving oneDNN
        self._last, self.unplanned = plan, None
        self.peak_intermediate_bytes = plan.arena_bytes
        return plan, feeds, wrt

    def _run(self, plan: Plan, phase: str, hook=None) -> None:
        if phase == "backward" and hook is not None and plan.segments:
            hook.use(plan.hook_names)  # this plan's arrays (another batch size: another plan)
            for program, names, owners in plan.segments:  # buckets handed over as they finish
                self._run_program(program, owners, phase)
                if names:
                    hook.ready(names)
            return
        self._run_program(plan.programs[phase], plan.records[phase], phase)

    def _run_program(self, program, owners, phase: str) -> None:
        if not len(program):
            return
        if not self.profile:
            program.run()
            return
        program.profile = True
        before = list(program.step_ns) or [0] * len(program)
        program.run()
        for owner, ns, old in zip(owners, program.step_ns, before):
            self.records.append((owner.node, owner.op_type or owner.name, phase, ns - old))

    def _forward_plan(self, plan: Plan, feeds: Tensors, backward: bool) -> None:
        for name, array in plan.inputs.items():
            value = feeds[name]
            if np.shape(value) != array.shape:
                raise ValueError(f"input {name!r}: shape {np.shape(value)}, the plan's "
                                 f"{array.shape}")
            np.copyto(array, value, casting="same_kind")
        plan.arena.generation += 1  # what an earlier forward in this arena saved is gone
        version = self.graph.version
        if backward or not plan.prepared or plan.version != version:
            self._run(plan, "prepare")
            plan.prepared = not backward
            plan.version = version
        if backward:  # weights move: every other plan reorders them again
            for other in self._plans.values():
                if isinstance(other, Plan) and other is not plan:
                    other.prepared = False
        self._run(plan, "forward")

    # -- the executor's interface ---------------------------------------------------------------
    def inference(self, feeds: Tensors, outputs: Iterable[str] | None = None) -> Tensors:
        names = list(outputs) if outputs is not None else [t.name for t in self.graph.outputs]
        fast = self._repeat(feeds, names)
        if fast is not None:
            return fast
        plan, feeds, _ = self._plan(feeds, names, None, ())
        if plan is None:
            self._last_inference = None
            return super().inference(feeds, names)
        self._forward_plan(plan, feeds, backward=False)
        self._remember(plan, feeds, names)
        return {n: plan.array(plan.fetch[n]).copy() for n in names}

    _last_inference: tuple | None = None

    def _graph_stamp(self) -> tuple:
        """What moves when the graph's arrays or roles may have changed: its version, the
        number of its arrays, its role overrides (the object and its size)."""
        g = self.graph
        return (g.version, len(g.initializers), id(g.role_overrides), len(g.role_overrides),
                self.training, self.rt.max_threads())

    def _remember(self, plan: Plan, feeds: Tensors, names: list[str]) -> None:
        """The inference just run, for ``_repeat``: its plan (prepared), its feeds' names,
        shapes and dtypes, its outputs and the graph's stamp (not with ``profile``, whose
        records the full path keeps)."""
        if not plan.prepared or self.profile or any(type(v) is not np.ndarray
                                                    for v in feeds.values()):
            self._last_inference = None
            return
        inputs = tuple((k, v.shape, v.dtype) for k, v in feeds.items() if k in plan.inputs)
        if len(inputs) != len(feeds):
            self._last_inference = None
            return
        fetched = tuple((n, plan.fetch[n]) for n in names)
        # the graph's arrays by identity (``Plan.stale``'s test, in one pass): the plan holds
        # those it points into, so none of their ids can be reused while it lives
        ids = tuple(map(id, self.graph.initializers.values()))
        self._last_inference = (plan, inputs, tuple(names), fetched, self._graph_stamp(), ids)

    def _repeat(self, feeds: Tensors, names: list[str]) -> Tensors | None:
        """The same request as the last inference (same feeds' names, shapes and dtypes,
        same outputs, the graph's arrays and roles unchanged): run its plan without the key,
        the checks and the lookups ``_plan`` makes, which cost 10-25 us of a batch-1 call
        (MobileNetV3's is 0.25 ms). None when anything differs: the full path then."""
        last = self._last_inference
        if last is None or self.profile:
            return None
        plan, inputs, outputs, fetched, stamp, ids = last
        if len(feeds) != len(inputs) or tuple(names) != outputs \
                or self._graph_stamp() != stamp \
                or tuple(map(id, self.graph.initializers.values())) != ids:
            return None
        for name, shape, dtype in inputs:
            value = feeds.get(name)
            if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                return None
        # the plan's arrays looked up each call: a shared arena that grows rebinds them
        arrays = plan.inputs
        for name, _, _ in inputs:
            np.copyto(arrays[name], feeds[name], casting="same_kind")
        plan.arena.generation += 1  # what an earlier forward in this arena saved is gone
        if not plan.prepared:  # another plan's backward moved the weights
            self._run(plan, "prepare")
            plan.prepared = True
        self._last, self.unplanned = plan, None
        self.peak_intermediate_bytes = plan.arena_bytes
        plan.programs["forward"].run()
        values = plan.values
        return {n: values[v].array.copy() for n, v in fetched}

    def _backprop(self, feeds: Tensors, loss: str, outputs: Iterable[str] | None,
                  seed: float = 1.0, wrt: Sequence[str] = (), hook: GradientHook | None = None):
        names = list(dict.fromkeys([loss, *(outputs or [])]))
        if self.recompute is not None:
            done = self._backprop_segmented(feeds, loss, names, seed, wrt, hook)
            if done is not None:
                return done
        self._segmented = False
        plan, feeds, wrt = self._plan(feeds, [n for n in names if n != loss] + [loss], loss,
                                      wrt, hook)
        if plan is None:
            return super()._backprop(feeds, loss, outputs, seed, wrt)
        self.python_watch.before(plan)
        self._forward_plan(plan, feeds, backward=True)
        if np.size(plan.array(loss)) != 1:
            raise ValueError(f"loss {loss!r} must be a scalar, got shape "
                             f"{np.shape(plan.array(loss))}")
        plan.seed[...] = seed * (hook.seed if hook is not None else 1.0)
        self._run(plan, "backward", hook)
        self.python_watch.after(plan, self.profile)
        values = {n: plan.array(plan.fetch[n]).copy() for n in names}
        grads: Tensors = {}
        for name in plan.parameters:
            g = plan.gradients.get(name)
            grads[name] = g if g is not None else np.zeros_like(self.graph.initializers[name])
        for name in wrt:  # no gradient: the loss does not depend on it (compile_plan checks)
            g = plan.gradients.get(name)
            if g is None:  # zeros of its shape: fed, in the plan, or a graph array not read
                g = feeds[name] if name in feeds else plan.array(name) \
                    if name in plan.values else self.graph.initializers.get(name, 0.0)
                g = np.zeros_like(g)
            grads[name] = g.copy()
        return values, grads

    # -- a stage ----------------------------------------------------------------------------
    def forward_saving(self, feeds: Tensors, outputs: Iterable[str], wrt: Sequence[str] = (),
                       hook: GradientHook | None = None) -> tuple[Tensors, SavedForward]:
        """See ``Executor.forward_saving``. The plan (compiled once per shapes, outputs,
        ``wrt`` and ``hook``, its backward starting from a seed per output) runs its forward;
        with a ``hook`` its backward writes the parameters' gradients into the hook's arrays
        (``layout``, asked once per plan; its ``seed`` is not applied: the seeds are the
        caller's), so the plan owns none (ZeRO-3's layer groups write into a shared slot). The
        arena keeps what the backward reads. A later forward in the same arena (this plan
        again, or another sharing it) overwrites that: ``backward_seeded`` then refuses the handle,
        so run each stage's backward before its next forward. The plan points into the
        graph's arrays as they were when it was compiled: replacing one (``graph.initializers
        [name] = new``) makes the next call compile again; writing into it in place does not
        (do not change weights between the forward and its backward)."""
        names = list(dict.fromkeys(outputs))
        plan, feeds, wrt = self._plan(feeds, names, None, wrt, hook, seeded=True)
        if plan is None:  # the reference path: its gradients are arrays of its own
            return super().forward_saving(feeds, names, wrt)
        self._forward_plan(plan, feeds, backward=True)
        out = {n: plan.array(plan.fetch[n]).copy() for n in names}
        shapes = {n: (v.shape, v.dtype) for n, v in out.items()}
        zeros = {}
        for w in wrt:
            v = feeds[w] if w in feeds else plan.array(w) if w in plan.values else \
                self.graph.initializers.get(w, np.zeros(()))
            zeros[w] = (np.shape(v), np.asarray(v).dtype)
        saved = SavedForward(self, names, shapes, wrt, zeros, plan, plan.arena.generation)
        saved.hook = hook
        return out, saved

    def backward_seeded(self, saved: SavedForward, seeds: Tensors) -> Tensors:
        """See ``Executor.backward_seeded``. The parameters' gradients are the plan's own
        arrays, overwritten by its next backward (copy one to keep it); ``wrt``'s are copies."""
        plan = saved.state
        if not isinstance(plan, Plan):  # the forward ran unplanned: the reference path
            return super().backward_seeded(saved, seeds)
        if saved.executor is not self:
            raise ValueError("backward_seeded: the handle comes from another executor")
        seeds = saved.seeds(seeds)  # checked (and the handle used) first
        if plan.arena.generation != saved.generation:
            raise ValueError("backward_seeded: another forward ran in this plan's arena since "
                             "this forward_saving (its saved activations are overwritten); "
                             "run each backward before the next forward")
        for name, array in plan.seeds.items():
            if name in seeds:
                np.copyto(array, seeds[name])
            else:
                array[...] = 0
        self._run(plan, "backward", getattr(saved, "hook", None))
        plan.arena.generation += 1  # the backward reused the saved values' bytes
        grads: Tensors = {}
        for name in plan.parameters:
            g = plan.gradients.get(name)
            grads[name] = g if g is not None else np.zeros_like(self.graph.initializers[name])
        for name in saved.wrt:
            g = plan.gradients.get(name)
            grads[name] = g.copy() if g is not None else np.zeros(*saved.zeros[name])
        return grads

    def inference_and_backprop(self, feeds: Tensors, loss: str = "loss",
                               outputs: Iterable[str] | None = None, micro_batches: int = 1,
                               wrt: Sequence[str] = (), hook: GradientHook | None = None,
                               ) -> tuple[Tensors, Tensors]:
        """As the reference executor's, plus ``hook``: a strategy that communicates during the
        backward (``Allreduce`` with ``overlap``). The plan asks ``hook.layout(names)`` once
        for the arrays to write the parameters' gradients into, given in the order the
        backward finishes them, writes them there, calls ``hook.ready(names)`` each time a
        bucket of at least ``hook.bucket_bytes`` is final, and scales the loss's gradient by
        ``hook.seed`` (1/P: the buckets then sum to the mean)."""
        if hook is not None and (micro_batches != 1 or self.rt is None):
            raise ValueError("a gradient hook needs a plan and one micro-batch")
        if micro_batches == 1:
            return self._backprop(feeds, loss, outputs, wrt=wrt, hook=hook)
        copying = _Copying(self)
        return ReferenceExecutor.inference_and_backprop(copying, feeds, loss, outputs,
                                                        micro_batches, wrt)

    supports_gradient_hook = True

    def placement(self) -> dict[str, str]:
        """Node -> where it ran in the last plan: "onednn", "native" (meta's loop),
        "onednn bf16" (its products read bf16: ``precision="bf16"``),
        "compiled" (a C++ custom operator's kernel on the plan's buffers), "python" (the
        operator's code; "python (LSTM: clip)" where a kernel says why not), "view",
        "folded", "fused into <node>"; before any call, or when unplanned, the reference
        path's backends."""
        if self._segmented:
            return {k: v for ex in self._segments.executors for k, v in ex.placement().items()}
        if self._last is None or self.unplanned:
            return super().placement()
        return dict(self._last.placement)

    def profile_table(self) -> profile_share.PlannedProfile:
        """The recorded times per op type (``profile=True``), and the share in Python steps."""
        executors = [self, *(self._segments.executors if self._segments else [])]
        placement = {n: w for ex in executors for plan in ex._plans.values()
                     if isinstance(plan, Plan) for n, w in plan.placement.items()}
        return profile_share.PlannedProfile.from_plan_records(self.records, placement)

    def plan_summary(self) -> str:
        """The last plan: how many steps of each kind, the arena and what placement says."""
        plan = self._last
        if self._segmented:
            seg = self._segments
            memory = seg.memory()
            return (f"recompute: {seg.how}; shared arena {memory['arena'] / 2**20:.2f} MiB, "
                    f"kept segment inputs {memory['kept'] / 2**20:.2f} MiB, owned "
                    f"{memory['owned'] / 2**20:.2f} MiB")
        if plan is None:
            return "no plan yet"
        counts: dict[str, int] = {}
        for where in plan.placement.values():
            key = "fused" if where.startswith("fused") else where
            counts[key] = counts.get(key, 0) + 1
        steps = {phase: len(p) for phase, p in plan.programs.items()}
        return (f"nodes: {counts}; steps: {steps}; arena {plan.arena_bytes / 2**20:.2f} MiB, "
                f"gradients and constants {plan.owned_bytes / 2**20:.2f} MiB, kernels' own "
                f"{plan.internal_bytes / 2**20:.2f} MiB")


class _Copying:
    """The executor seen by the micro-batch loop: each part's gradients copied, since the
    next part's backward reuses the arrays."""

    def __init__(self, inner: PlannedExecutor) -> None:
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _backprop(self, *args, **kwargs):
        values, grads = self._inner._backprop(*args, **kwargs)
        return values, {k: g.copy() for k, g in grads.items()}


EXECUTORS.add("planned", PlannedExecutor)
