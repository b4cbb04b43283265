"""What one rank holds during a training step, in parts: parameters, gradients, optimizer
state, the activations a backward keeps, and a strategy's own buffers.

Rajbhandari et al.'s ZeRO paper counts a model of Ψ parameters trained in float32 with Adam
as 4Ψ bytes of parameters, 4Ψ of gradients and 8Ψ of optimizer state (two moments) on every
data-parallel rank: 16Ψ. Stage 1 shares out the state (8Ψ/P), stage 2 the state and the
gradients (4Ψ/P), stage 3 all three (16Ψ/P). ``zero_memory`` follows those formulas for each
part, and puts what meta's implementations hold beyond them in ``buffers``, so a prediction
is the paper's figure plus what this framework keeps, each named:

* allreduce: the flat buffer its gradients are packed into (or the overlapped buckets,
  written in place in one flat buffer): Ψ·4 bytes;
* ZeRO-2 (``meta/lv3/data_parallel/zero.py``): the backward writes the whole gradient into
  the flat gradient buffer, kept between steps, before each rank keeps its reduce-scattered
  shard (DeepSpeed holds a bucket at a time instead): 4Ψ;
* ZeRO-3 (``zero3.py``): at most two layer groups gathered at once (the running one and the
  prefetched one) and one group's gradients while they are reduce-scattered: 3 × 4Ψ/G for G
  groups (``zero3_groups``, the strategy's own default count).

Beyond the paper's parts, two things a step holds for a moment were measured to matter
(``benchmarks/memory_validation.py``: allreduce's predicted peak was 37 % low without them):

* the update's temporaries: an optimizer written as array expressions (Adam: the new moments
  are made beside the old ones, then the update, then the decayed and scaled updates) holds
  several parameter-sized arrays during its step. They are measured from the optimizer itself
  (``update_footprint`` runs its update on a flat array under ``tracemalloc``), not written
  down here: AdamW with clipping holds 5 arrays the size of what it steps, fused SGD-momentum 0.
  A strategy that steps a shard holds them for the shard only.
* the exchange's: MPI's nonblocking reductions (allreduce's buckets, ZeRO's reduce-scatters)
  hold temporaries the size of what is in flight: one gradient's worth for the allreduce, two
  for the reduce-scatters (``EXCHANGE_SLOTS``, ``SCATTER_SLOTS``: measured, not derived).

And one thing no array holds: the process's runtime (``runtime_bytes``), the resident set
its first compiled step leaves beyond every array (oneDNN's code and JIT kernels it touches, the
primitives, the plan's own objects), measured around the planner's first probe, not written
down. A ZeRO-3 rank of ``benchmarks/memory_validation.py`` (P = 2, recompute) held 134 MB
resident after its warm-up step against 92 MB of arrays (``tracemalloc``, less the strategy's
never-written zero buffers): 41 MB of runtime, on every row alike.

Activations are what the executor keeps for the backward and the workspace of the backward
itself: the planned executor's arrays (its arena and the values it allocates apart), asked from
a compiled plan, or, on the reference path (ZeRO-3's layer groups run it), the traced peak of a
step (``step_activations``); both at two small batches, extended linearly to the batch asked.

The same model serves ``meta plan`` (its ranking, ``--memory``) and the run's
``memory_limit_gb`` check (``meta.run.memory_budget``), so a plan and a refusal agree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import tracemalloc
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

MB = 1 << 20
# MPI's temporaries for a nonblocking reduction, in copies of the bytes in flight: measured
# (benchmarks/memory_validation.py, MPICH 5), the overlapped allreduce's peak held about one
# gradient's worth above what the strategy allocates, ZeRO-2's about one more (a reduce-scatter
# with a receive and a result buffer of the whole count would hold that)
EXCHANGE_SLOTS = 1.0  # iallreduce
SCATTER_SLOTS = 2.0  # ireduce_scatter
ZERO3_GROUP_PARAMS = 2_000_000  # Zero3's default: a layer group per 2 M parameters


@dataclass(frozen=True)
class Memory:
    """Bytes one rank holds at a step's peak, by part."""

    parameters: float
    gradients: float
    state: float
    activations: float = 0.0
    buffers: float = 0.0
    temporaries: float = 0.0  # the update's and the exchange's, during the step only
    runtime: float = 0.0  # the process's own beyond its arrays (``runtime_bytes``)

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.state + self.activations + self.buffers
                + self.temporaries + self.runtime)

    @property
    def model_state(self) -> float:
        """Everything but the activations and the step's temporaries: what stays between
        steps (the buffers at most)."""
        return self.total - self.activations - self.temporaries

    def parts_mb(self) -> str:
        """``params+grads+state+activations+buffers+temporaries+runtime`` in MB (2^20 bytes),
        for a table."""
        return "+".join(mb(v).replace(",", "") for v in (
            self.parameters, self.gradients, self.state, self.activations, self.buffers,
            self.temporaries, self.runtime))

    def larger(self, other: Memory) -> Memory:
        """The one of two ranks' memories with the larger total (the busiest rank)."""
        return other if other.total > self.total else self


# optimizer -> slots of state per parameter (momentum: 1, Adam: 2); unknown: 2, erring high
STATE_SLOTS = {"sgd": 1, "nesterov": 1, "adagrad": 1, "rmsprop": 1, "adam": 2, "adamw": 2,
               "adadelta": 2, "lbfgs": 2}


def state_slots(optimizer: str, values: dict) -> int:
    """Arrays of optimizer state the size of the parameters that ``optimizer`` (a recipe's
    optimizer name, with its option ``values``) keeps: plain SGD none, momentum one, Adam
    two (amsgrad three)."""
    slots = STATE_SLOTS.get(optimizer, 2)
    if optimizer == "sgd" and not values.get("momentum", 0.0):
        slots = 0
    if optimizer in ("adam", "adamw") and values.get("amsgrad"):
        slots = 3  # the running maximum of v, as PyTorch's amsgrad keeps it
    return slots



@dataclass(frozen=True)
class StepFacts:
    """What a recipe's step holds beyond its parameters, asked from its own parts once per
    plan (``step_facts``): the optimizer's state and temporaries, and the executor's
    activations as ``fixed + per_sample * batch`` (the planned path's and the reference
    path's, which ZeRO-3's layer groups run)."""

    state_slots: float  # arrays of state the size of the parameters
    update_whole: float  # the update's temporaries that grow with all it steps, in slots
    update_tensor: float  # ... and with its largest tensor (freed tensor by tensor)
    elementwise: bool  # a slice of the parameters can be stepped alone (ZeRO-1 shares it)
    planned: tuple[float, float] | None  # (fixed, per sample) bytes; None: not planned
    reference: tuple[float, float]  # (the planned path's where no row needs it)
    largest_param_bytes: float
    recompute: tuple[float, float] | None = None  # the planned path with recompute="blocks"
    zero3: tuple[float, float] | None = None  # ZeRO-3's planned layer groups (else reference)
    zero3_slots: float | None = None  # ZeRO-3's gathered groups and their gradients, bytes
    zero3_recompute: tuple[float, float] | None = None  # ZeRO-3's groups with its recompute
    runtime: float = 0.0  # the process's resident bytes beyond its arrays (``runtime_bytes``)

    def activations(self, batch: int, planned: bool = True, recompute: bool = False) -> float:
        """Bytes of activations at ``batch`` on the planned path (where the recipe's executor
        plans; ``recompute``: with ``RECOMPUTE``) or the reference path."""
        if recompute and self.recompute is not None:
            fixed, per = self.recompute
        else:
            fixed, per = self.planned if planned and self.planned is not None else \
                self.reference
        return max(0.0, fixed + per * batch)

    def recomputed(self, batch: int, param_bytes: float, hooked: bool) -> float:
        """Activations of a step with ``RECOMPUTE`` at ``batch``: the segmented step's arrays
        and, where a strategy's gradient hook takes the gradients (``hooked``), the
        parameters' gradients the segments' plans compute in arrays of their own before
        they are added into the hook's (``meta.lv1.plan.recompute``: measured 12 MB, one
        gradient of the 3.2 M-parameter GPT, above the segments' arrays without it)."""
        return self.activations(batch, recompute=True) + (param_bytes if hooked else 0.0)

    def update_slots(self, param_bytes: float, flat: bool) -> float:
        """The update's temporaries in slots of ``param_bytes``: over one flat shard all of
        them grow with it; over the network's tensors the per-tensor ones only with the
        largest."""
        if flat or not param_bytes:
            return self.update_whole + self.update_tensor
        return self.update_whole + self.update_tensor * self.largest_param_bytes / param_bytes


# tracemalloc counts Python's objects too, which vary by a few hundred bytes from one call to
# the next: the reference path's peak is rounded up to this, so two plans of one recipe agree
TRACE_GRAIN = 1 << 16
RECOMPUTE = "blocks"  # the planned executor's recomputation the planner ranks
# the batches a step is probed at: the smallest two (a trace and a compile cost about their
# batch); every figure asked is fixed + per sample * batch, so two points give it exactly
PROBE_BATCHES = (1, 2)
FOOTPRINT_VALUES = 1 << 16  # float32 values the optimizer is stepped on to measure it


def _traced_step(make: Callable[[dict], Any], sizes: list[int]) -> tuple[Any, float]:
    """The optimizer ``make`` builds over float32 arrays of ``sizes``, after one step, and the
    peak bytes its second step allocates (``tracemalloc``: numpy reports its arrays to it)."""
    params = {f"w{i}": np.full(k, 0.5, np.float32) for i, k in enumerate(sizes)}
    grads = {k: np.full(v.shape, 10.0, np.float32) for k, v in params.items()}  # clips
    opt = make(params)
    opt.step(grads)  # the state exists and is written
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    opt.step(grads)
    peak = tracemalloc.get_traced_memory()[1] - base
    if not was:
        tracemalloc.stop()
    return opt, float(peak)


def _state_bytes(tree: Any, size: int) -> float:
    if isinstance(tree, np.ndarray):
        return float(tree.nbytes) if tree.size >= size // 2 else 0.0
    if isinstance(tree, dict):
        return sum(_state_bytes(v, size) for v in tree.values())
    if isinstance(tree, (tuple, list)):
        return sum(_state_bytes(v, size) for v in tree)
    return 0.0


def update_footprint(make: Callable[[dict], Any]) -> tuple[float, float, float, bool] | None:
    """(state slots, whole-size temporaries, per-tensor temporaries, elementwise) of the
    optimizer ``make`` builds over a parameter dict: its step run on one array and on two
    halves of it, the difference being what it frees tensor by tensor. None for an
    optimizer that is not meta's ``Optimizer`` (another framework's, a line search)."""
    from meta.lv2.optimizers import Optimizer

    n = FOOTPRINT_VALUES
    try:
        one, peak1 = _traced_step(make, [n])
        _, peak2 = _traced_step(make, [n // 2, n // 2])
    except Exception:  # noqa: BLE001  (a user's optimizer the probe cannot step: not known)
        return None
    if not isinstance(one, Optimizer):
        return None
    nbytes = 4.0 * n
    tensor = max(0.0, 2 * (peak1 - peak2) / nbytes)
    whole = max(0.0, peak1 / nbytes - tensor)
    return (round(_state_bytes(one.state, n) / nbytes, 2), round(whole, 2), round(tensor, 2),
            bool(one.transform.elementwise))


def resident_bytes() -> float | None:
    """This process's resident set in bytes after glibc has given back its free pages
    (``malloc_trim``), so that what is counted is what is held; None where ``/proc`` or
    glibc is not there to ask."""
    import ctypes
    import os

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, AttributeError, ValueError, IndexError):
        return None


# the process's runtime bytes, measured once, at its first compiled step (``runtime_bytes``)
_RUNTIME: list[float] = []


def runtime_bytes() -> float:
    """What a training process holds beyond every array once its first plan is compiled and
    stepped: the libraries' code and data it touches (oneDNN's, its JIT kernels, the
    primitives' caches) and the plan's own objects. Measured, not written down: the resident
    set (``resident_bytes``) around the planner's first probe (``step_activations``), less
    the arrays the plan holds and the gradients it hands out. It is the first use that costs:
    the GPT of ``benchmarks/memory_validation.py`` left 39 MB in a fresh process, a second
    compile in it 2-3 MB more; in ``meta plan``, whose preparations (``node_shapes``'s
    reference forward, the model built) have touched part of it first, the probe finds 17 MB,
    what a training rank holds beyond its arrays being about 41 MB: the term is a lower
    bound, low by what the process paid before the probe. Kept for the process: a later
    probe finds it resident already. 0 where the resident set cannot be read."""
    return _RUNTIME[0] if _RUNTIME else 0.0


def _linear(low: float, high: float) -> tuple[float, float]:
    """(fixed, per sample) from a figure at each of ``PROBE_BATCHES``."""
    b1, b2 = PROBE_BATCHES
    per = max(0.0, (high - low) / (b2 - b1))
    return low - b1 * per, per


@contextlib.contextmanager
def quiet():
    """The planner's probes without their messages: what a strategy or the executor says
    once on stderr (``say_once``, an operator leaving oneDNN, a warning) is about the user's
    run, not the planner's internal steps, so it is dropped here and left unsaid, to be
    said by the run that does it."""
    from meta.lv1.plan import custom, precision

    said, announced = set(precision._said), set(custom._announced)
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        precision._said.clear()
        precision._said.update(said)
        custom._announced.clear()
        custom._announced.update(announced)


def zero3_activations(graph: Any, feeds_at: Callable[[int], dict],
                      make_executor: Callable[[Any], Any], recompute: str | None = None
                      ) -> tuple[tuple[float, float], float] | None:
    """((fixed, per sample) bytes of ZeRO-3's layer groups' activations, its slots' bytes):
    the strategy itself (``Zero3``, on a copy of the graph, one rank) takes a step at each of
    ``PROBE_BATCHES`` with the recipe's executor; each group's executor is asked what its compiled
    plans hold (every group's forward keeps its arrays until its backward), the strategy
    what its slots take (``ShardedExecutor.slot_bytes``: the gathered groups and their
    gradients). ``recompute``: ZeRO-3's own (each group's forward run again for its backward,
    the groups' plans in one shared arena). None where its groups do not plan or it cannot
    take the step here."""
    import copy

    from meta.lv2.optimizers import Optimizer, sgd
    from meta.lv3.comm.communicator import SingleProcessCommunicator
    from meta.lv3.data_parallel.zero3 import Zero3

    out, slots = [], 0.0
    for batch in PROBE_BATCHES:
        g = copy.deepcopy(graph)
        options = {"recompute": recompute} if recompute else {}
        zero3 = Zero3(Optimizer(sgd(1e-12), g.parameters), SingleProcessCommunicator(), g,
                      make_executor, **options)
        ex = zero3.executor
        ex.train()
        groups = getattr(ex, "executors", [])
        if not groups or not all(hasattr(e, "_plans") for e in groups):
            return None  # not planned: the reference path's traced figure serves
        zero3.step_with(ex, feeds_at(batch))
        seen: dict[int, float] = {}  # the groups' plans may share one arena: counted once
        held = [_plan_bytes(e, every_plan=True, seen=seen) for e in groups]
        if not hasattr(ex, "slot_bytes") or not all(held):  # groups run unplanned
            return None
        out.append(sum(seen.values()))
        slots = float(ex.slot_bytes())
    return _linear(*out), slots


def _plan_bytes(executor: Any, every_plan: bool = False,
                seen: dict[int, float] | None = None) -> float:
    """The arrays the planned executor's last step allocated (its arena, the values it keeps
    apart; with ``recompute``, the segments' shared arena, their plans' own arrays and the
    kept segment inputs), less the parameters' gradients it hands out (a strategy's own
    buffers under its hook)."""
    extra = 0.0
    segments = getattr(executor, "_segments", None)
    if getattr(executor, "_segmented", False) and segments:
        plans = [p for ex in segments.executors for p in ex._plans.values()
                 if hasattr(p, "values")]
        extra = float(getattr(segments, "kept_bytes", 0))
    elif every_plan:  # a stage's: its forward's and its backward's plans, both kept
        plans = [p for p in getattr(executor, "_plans", {}).values() if hasattr(p, "values")]
    else:
        plans = [executor._last] if getattr(executor, "_last", None) is not None else []
    params = set(executor.graph.parameters)
    skip = {id(_root(a)) for a in executor.graph.initializers.values()
            if isinstance(a, np.ndarray)}
    skip |= {id(_root(a)) for p in plans for name, a in p.gradients.items()
             if name in params and isinstance(a, np.ndarray)}
    seen = {} if seen is None else seen  # root array id -> bytes, shared with other calls
    found = 0.0
    for plan in plans:
        for v in plan.values.values():
            a = getattr(v, "array", None)
            if isinstance(a, np.ndarray) and id(_root(a)) not in skip:
                seen[id(_root(a))] = float(_root(a).nbytes)
                found += float(_root(a).nbytes)
    return (found and sum(seen.values())) + extra


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def step_activations(make_executor: Callable[[], Any], feeds_at: Callable[[int], dict],
                     planned: bool) -> tuple[float, float]:
    """(fixed, per sample) bytes of a training step's activations: on the planned path the
    compiled plan's arrays (``_plan_bytes``), on the reference path the traced peak of a
    step less the gradients it returns; each at ``PROBE_BATCHES``, extended linearly."""
    out = []
    if not planned:  # once untraced: what a first call imports or caches is not the step's
        ex = make_executor()
        ex.train()
        ex.inference_and_backprop(feeds_at(PROBE_BATCHES[0]), loss="loss")
    for batch in PROBE_BATCHES:
        before = resident_bytes() if planned and not _RUNTIME else None
        ex = make_executor()
        ex.train()
        if planned:
            ex.inference_and_backprop(feeds_at(batch), loss="loss")
            out.append(_plan_bytes(ex))
            after = resident_bytes() if before is not None else None
            if after is not None:  # the process's first compiled step: what it left
                grads = {id(_root(a)): float(_root(a).nbytes) for a in
                         getattr(getattr(ex, "_last", None), "gradients", {}).values()
                         if isinstance(a, np.ndarray)}
                _RUNTIME.append(max(0.0, after - before - out[-1] - sum(grads.values())))
            continue
        was = tracemalloc.is_tracing()
        if not was:
            tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        _, grads = ex.inference_and_backprop(feeds_at(batch), loss="loss")
        peak = tracemalloc.get_traced_memory()[1] - base
        if not was:
            tracemalloc.stop()
        arrays = peak - sum(float(np.asarray(g).nbytes) for g in grads.values())
        out.append(max(0.0, math.ceil(arrays / TRACE_GRAIN) * TRACE_GRAIN))
    return _linear(*out)


def step_facts(graph: Any, feeds_at: Callable[[int], dict], make_optimizer: Callable[[dict],
               Any], make_executor: Callable[..., Any], slots: float) -> StepFacts:
    """``StepFacts`` of a recipe: its optimizer (``make_optimizer(params)``) stepped by
    ``update_footprint`` (``slots``, the name table's, where it cannot be), its executor
    (``make_executor(graph, **options)``; again with ``recompute=RECOMPUTE`` where it takes
    that option) and the reference executor run on ``feeds_at(batch)``. The probes are the
    planner's own steps: they say nothing (``quiet``)."""
    with quiet():
        return _step_facts(graph, feeds_at, make_optimizer, make_executor, slots)


def _step_facts(graph: Any, feeds_at: Callable[[int], dict], make_optimizer: Callable[[dict],
                Any], make_executor: Callable[..., Any], slots: float) -> StepFacts:
    from meta.lv1.executor import ReferenceExecutor

    found = update_footprint(make_optimizer)
    state, whole, tensor, elementwise = found if found is not None else (slots, slots, 0.0, True)
    executor = make_executor(graph)
    planned = None
    if getattr(executor, "supports_gradient_hook", False):  # the planned executor
        planned = step_activations(lambda: make_executor(graph), feeds_at, True)
    recompute = None
    if planned is not None and "recompute" in getattr(executor, "options", {}) \
            and make_executor(graph, recompute=RECOMPUTE).segments() is not None:
        # (a graph recompute cannot segment steps as without it: no probe, the same figure)
        recompute = step_activations(lambda: make_executor(graph, recompute=RECOMPUTE),
                                     feeds_at, True)
    zero3 = None
    if planned is not None:
        try:
            zero3 = zero3_activations(graph, feeds_at, make_executor)
        except Exception:  # noqa: BLE001  (a graph ZeRO-3 refuses: it is ranked on the
            zero3 = None  # reference path's figure and the formula's buffers)
    zero3_recompute = None
    if zero3 is not None and recompute is not None:
        try:
            again = zero3_activations(graph, feeds_at, make_executor, RECOMPUTE)
        except Exception:  # noqa: BLE001  (ZeRO-3 refuses recompute here: not ranked)
            again = None
        zero3_recompute = again[0] if again else None
    # the reference path serves where the executor or ZeRO-3's groups do not plan: traced
    # only then (each figure costs steps at two batches)
    reference = planned if planned is not None and zero3 is not None else \
        step_activations(lambda: ReferenceExecutor(graph), feeds_at, False)
    largest = max((float(np.asarray(p).nbytes) for p in graph.parameters.values()), default=0.0)
    return StepFacts(state, whole, tensor, elementwise, planned, reference, largest, recompute,
                     zero3[0] if zero3 else None, zero3[1] if zero3 else None,
                     zero3_recompute, runtime_bytes() if planned is not None else 0.0)


def zero3_groups(param_count: int, nodes: int) -> int:
    """The layer groups ``Zero3`` cuts a graph into when its ``groups`` option is 0."""
    count = max(2, min(nodes, param_count // ZERO3_GROUP_PARAMS + 1))
    return min(count, nodes)


def zero_memory(param_bytes: float, state_slots: float, activations: float, ranks: int,
                stage: int, groups: int = 2, shared_buffer: bool = True,
                update_slots: float = 0.0, elementwise: bool = True,
                overlapped: bool = False, slots: float | None = None) -> Memory:
    """A data-parallel rank's memory under ZeRO ``stage`` (0: plain allreduce over MPI, 1:
    allreduce in shared memory, ``NodeExchange``) at ``ranks`` ranks: ``param_bytes`` of
    parameters (4Ψ in float32), ``state_slots`` arrays of state the size of the parameters
    (Adam: 2), ``activations`` the bytes the executor holds for this rank's batch,
    ``update_slots`` the update's temporaries in arrays the size of what it steps
    (``update_footprint``). ``shared_buffer``: stage 0 packs its gradients into a flat buffer
    besides the executor's (not ``overlapped``: there the backward writes into the buckets,
    whose allreduces in flight hold one gradient's worth in MPI). ``elementwise``: whether
    stage 1 can step a slice (``ShardedOptimizer.takes``; else every rank steps the whole
    mean, which the ranks share, with the whole state). ``slots``: stage 3's gathered groups
    and their gradients as the strategy reports them (``ShardedExecutor.slot_bytes``), else
    two groups and one group's gradients."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage}: must be 0, 1, 2 or 3")
    p = max(1, ranks)
    n = float(param_bytes)
    sharded = stage >= 2 or (stage == 1 and elementwise)  # the update steps 1/P
    params = n / p if stage >= 3 else n
    grads = n / p if stage >= 2 else n
    state = n * state_slots / p if sharded else n * state_slots
    temporaries = n * update_slots / p if sharded else n * update_slots
    if stage == 0:
        buffers = n if shared_buffer and not overlapped else 0.0
        if overlapped and p > 1:
            temporaries += EXCHANGE_SLOTS * n
    elif stage == 1:  # the other ranks' slices read and this rank's sum: n; the mean shared
        buffers = (n if elementwise else 2 * n) if p > 1 else 0.0
    elif stage == 2:  # the flat gradient the backward writes; its reduce-scatters in flight
        buffers = n if p > 1 else 0.0
        temporaries += SCATTER_SLOTS * n if p > 1 else 0.0
    else:  # two groups gathered and one group's gradients; its reduce-scatter in flight
        g = max(1, groups)
        buffers = (3 * n / g if slots is None else slots) if p > 1 else 0.0
        temporaries += SCATTER_SLOTS * n / g if p > 1 else 0.0
    return Memory(params, grads, state, float(activations), buffers, temporaries)


def rank_memory(facts: StepFacts | None, param_bytes: float, batch: int, ranks: int,
                stage: int, groups: int = 2, shared_buffer: bool = True,
                overlapped: bool = False, state_slots: float = 2,
                activation_bytes: float = 0.0, recompute: bool = False) -> Memory:
    """``zero_memory`` for a recipe's step from its ``facts``: activations of the planned path
    (ZeRO-3's groups run the reference path), the update's temporaries over the tensors
    (stage 0, and stage 1 with an optimizer it cannot slice) or over a flat shard. Without
    facts, the name table's ``state_slots`` and ``activation_bytes`` per sample."""
    if facts is None:
        return zero_memory(param_bytes, state_slots, activation_bytes * batch, ranks, stage,
                           groups, shared_buffer, overlapped=overlapped)
    flat = stage >= 2 or (stage == 1 and facts.elementwise)
    act = facts.activations(batch, True, recompute)
    if stage == 3:  # its layer groups run as stages: their own plans, or the reference path
        fixed, per = facts.zero3 if facts.zero3 is not None else facts.reference
        if recompute and facts.zero3_recompute is not None:
            fixed, per = facts.zero3_recompute
        act = max(0.0, fixed + per * batch)
    memory = zero_memory(param_bytes, facts.state_slots, act, ranks, stage, groups,
                         shared_buffer, facts.update_slots(param_bytes, flat),
                         facts.elementwise, overlapped, facts.zero3_slots)
    return dataclasses.replace(memory, runtime=facts.runtime)


def mb(nbytes: float) -> str:
    """Bytes in MB (2^20 bytes): one decimal below 10 MB, whole MB above."""
    return f"{nbytes / MB:,.{1 if nbytes < 10 * MB else 0}f}"


def describe(memory: Memory) -> str:
    """One line: the total and each part in MB (activations where counted), for messages."""
    act = f", activations {mb(memory.activations)}" if memory.activations else ""
    return (f"{mb(memory.total)} MB (parameters {mb(memory.parameters)}, gradients "
            f"{mb(memory.gradients)}, optimizer state {mb(memory.state)}{act}, buffers "
            f"{mb(memory.buffers)})")
