"""Compiling a graph into a plan, once per input shapes, mode and request.

1. **Trace**: one forward on the reference path with the actual feeds gives every tensor's
   shape and dtype (the plan's shapes are then fixed; a later call with other shapes gets its
   own plan).
2. **Fold**: nodes computed from constants only (and Shape/Size of a tensor whose shape is now
   fixed) are evaluated once; their outputs become the plan's constants, so an exporter's
   shape arithmetic (Shape, Gather, Concat, Reshape) costs nothing at run time.
3. **Lower**: after the rewrites (``patterns``), each remaining node becomes steps of C++
   kernels (``kernels.KERNELS``, by family in ``lowering/``: oneDNN convolutions, matrix
   products, pooling, normalizations, activations, ...), fused with the activation or
   eval-mode BatchNormalization after it where that is legal, or else one Python step running
   the operator's own forward and backward (``kernels.python_node``).
4. **Backward**: in training the nodes' backward steps follow in reverse order; a gradient's
   first contribution writes it, later ones add to it. The backward starts from the scalar
   loss's seed (d loss / d loss), or, for a stage (``seeded``: ``forward_saving`` /
   ``backward_seeded``), from a seed array of each seeded output's shape (a vector-Jacobian
   product of several non-scalar outputs). A collective split into a start and a wait
   (``overlap``) gets the steps that do not need it moved in between.
5. **Memory**: every computed value gets its place in one arena from its lifetime across the
   forward and the backward (``memory.assign_offsets``); parameter gradients get arrays of
   their own, handed to the caller.
6. **Bind**: the C++ steps are created against those arrays and grouped into three programs,
   each run in one call: ``prepare`` (weights into the kernels' layouts), ``forward``,
   ``backward``.

``compile_plan`` runs them in this order, one function each (``trace_phase``, ``fold_phase``,
``lower_phase``, ``backward_phase``, ``memory_phase``, ``bind_phase``).

Rules every phase keeps:

* **An operator is its (domain, type).** The kernels, fusions and rewrites are ONNX's
  operators; a node of another domain (a user's ``HardSwish`` registered in ``my.ops``) is
  seen by them as ``my.ops::HardSwish`` (``planned_type``), which none of them matches, so it
  runs its registered operator (a Python step, or a C++ operator's compiled step).
* **A tensor asked for in ``wrt`` is never a constant.** An initializer the graph classes as a
  constant (Div's operands, Clip's bounds, a 0-d tensor) is folded into its readers; named in
  ``wrt`` it stays a variable of the plan, so its readers differentiate it (issue 39: these
  gradients came back as zeros), and no fusion absorbs it. A plan whose kernels would still
  leave a gradient asked for without a value, though the loss depends on it, is not made
  (``NotPlannable``: the executor runs the reference path and says why in ``unplanned``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from meta.lv1.gradient_hook import GradientHook
from meta.lv1.graph import Graph, GraphError, Node, canonical_domain, make_operator
from meta.lv1.plan import hoist, overlap
from meta.lv1.plan.builder import PlanBuilder, PlannedStep
from meta.lv1.plan.context import Traced
from meta.lv1.plan.memory import (
    Arena,
    Value,
    aligned_empty,
    assign_offsets,
    lifetimes,
    root,
    view_of,
)
from meta.lv1.plan.precision import check_unwritten

# Ops whose outputs are never folded: random, or reading a mode the plan does not fix.
NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})
# Ops whose output shapes depend on input values: a plan (fixed shapes) cannot hold them
# unless they fold.
DATA_DEPENDENT = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "Loop", "If",
                            "Scan", "StringSplit", "RegexFullMatch", "SequenceConstruct",
                            "SplitToSequence", "SequenceInsert", "SequenceErase",
                            "ConcatFromSequence", "SequenceAt", "SequenceEmpty",
                            "SequenceLength", "SequenceMap", "Optional", "OptionalGetElement",
                            "OptionalHasElement", "TfIdfVectorizer"})


def planned_type(node: Node) -> str:
    """The op type the planner keys kernels, fusions and rewrites on: ONNX's own for the
    default domain ("" or "ai.onnx"), ``domain::OpType`` for any other, so a user's operator
    whose type clashes with an ONNX one never gets ONNX's kernel."""
    return node.op_type if canonical_domain(node.domain) == "" else \
        f"{node.domain}::{node.op_type}"


def as_planned(node: Node) -> Node:
    """``node`` as the kernels see it: itself, or (another domain) a copy whose op type is
    ``planned_type``; the operator itself is always made from the original node."""
    kind = planned_type(node)
    return node if kind == node.op_type else replace(node, op_type=kind)


class NotPlannable(GraphError):
    """A graph the planner cannot fix the shapes of (data-dependent shapes, sequences)."""


@dataclass
class Plan:
    """A compiled graph: bound programs and where each value lives."""

    values: dict[str, Value]
    programs: dict[str, object]  # phase -> meta._plan.Program
    records: dict[str, list[PlannedStep]]  # phase -> the planned step of each bound step
    inputs: dict[str, np.ndarray]  # fed name -> its array in the arena
    fetch: dict[str, str]  # requested name -> the (plain) value holding it
    gradients: dict[str, np.ndarray]  # parameter / wrt name -> gradient array (or zeros)
    seed: np.ndarray | None  # d loss / d loss, set per call
    bound: dict[str, np.ndarray]  # graph arrays the steps point into
    placement: dict[str, str]  # node -> "onednn", "python", "folded", "view"
    arena_bytes: int
    owned_bytes: int
    internal_bytes: int
    objects: dict = field(default_factory=dict)
    parameters: tuple[str, ...] = ()  # the graph's trainable parameters (fed ones excluded)
    prepared: bool = False
    version: int = -1  # the graph's version stamp when the prepare program last ran
    segments: list = field(default_factory=list)  # (program, parameters it finishes, owners)
    hook_names: list = field(default_factory=list)  # the order the backward finishes them
    # The gradient hook whose arrays the gradients are, held so that its id, part of the
    # plan's key, cannot be reused by another hook while this plan exists.
    hook: GradientHook | None = None
    # A stage plan's (``seeded``): output -> the arena array its seed is copied into before
    # the backward (an output that takes no gradient has none).
    seeds: dict[str, np.ndarray] = field(default_factory=dict)
    arena: Arena | None = None  # the bytes its arena values live in (shared between plans)
    offsets: dict[str, int] = field(default_factory=dict)  # arena value -> its offset
    order: list = field(default_factory=list)  # its steps in program order (for rebind)
    cuts: dict = field(default_factory=dict)  # the gradient hook's cuts (for rebind)
    seed_names: dict[str, str] = field(default_factory=dict)  # output -> its seed value
    gradient_values: dict[str, str] = field(default_factory=dict)  # name -> its gradient value

    def array(self, name: str) -> np.ndarray:
        return self.values[name].array

    def stale(self, graph: Graph) -> bool:
        """Whether a graph array a step points into was replaced (a strategy re-pointed it)."""
        arrays = graph.initializers
        return any(arrays.get(name) is not array for name, array in self.bound.items())




def foldable(node: Node, static: set[str]) -> bool:
    """Whether ``node`` computes the same outputs on every call of a plan: from constants only
    (Shape, Size and CastLike read only their input's shape or dtype, fixed in a plan)."""
    inputs = [x for x in node.inputs if x]
    kind = planned_type(node)
    return kind not in NOT_FOLDED and (
        all(x in static for x in inputs) or kind in ("Shape", "Size")
        or kind == "CastLike" and inputs[0] in static)


def trace(graph: Graph, feeds: dict, nodes: list[Node], static: set[str], backends,
          variable: frozenset[str] = frozenset()
          ) -> tuple[dict[str, np.ndarray | Traced], set[str]]:
    """One forward as written (no state written): every tensor's shape and dtype, and the
    values of those computed from constants (``static`` grows by them; their nodes are
    returned), the rest dropped as soon as no node needs them, so the trace's memory is an
    inference's, not a training step's. A name in ``variable`` (asked for in ``wrt``) keeps
    its value if its node folds but is not a constant to its readers."""
    from meta.lv0 import InferenceContext

    values: dict = {**graph.initializers, **feeds}
    left = Counter(x for n in nodes for x in n.dependencies())
    info: dict[str, np.ndarray | Traced] = {}
    folded: set[str] = set()
    kept: set[str] = set()  # the folded nodes' outputs: their values stay
    for node in nodes:
        op = make_operator(node, graph.opset, backends)
        args = [values[x] if x else None for x in node.inputs]
        try:
            results = op.apply(InferenceContext(), *args)
        except Exception as err:
            raise GraphError(f"{node.describe()} failed while tracing the plan: {err}") from err
        del args
        fold = foldable(node, static) and not any(o in feeds for o in node.outputs if o)
        if fold:
            folded.add(node.name)
        for name, value in zip(node.outputs, results):
            if not name or name in feeds:
                continue
            if isinstance(value, np.generic):  # a numpy scalar (Gather of one index)
                value = np.asarray(value)
            values[name] = value
            if fold:
                kept.add(name)
                if name not in variable:
                    static.add(name)
        for name in [*node.dependencies(), *(o for o in node.outputs if o)]:
            if name in node.dependencies():
                left[name] -= 1
            if left[name] <= 0 and name in values and name not in graph.initializers \
                    and name not in feeds:
                value = values[name]
                info[name] = value if name in kept or not isinstance(value, np.ndarray) \
                    else Traced(value.shape, value.dtype)
                if left[name] <= 0 and name not in kept:
                    del values[name]
    for name, value in values.items():
        if name not in info:  # a fed array is kept as its shape and dtype: a plan holding
            info[name] = Traced(value.shape, value.dtype) \
                if name in feeds and isinstance(value, np.ndarray) else value  # it held a copy
    return info, folded


def compile_plan(graph: Graph, feeds: dict[str, np.ndarray], outputs: list[str],
                 loss: str | None, wrt: list[str], training: bool | None, backends,
                 rt, hook: GradientHook | None = None, precision: str = "f32",
                 seeded: bool = False, arena: Arena | None = None,
                 inputs_outside: bool = False) -> Plan:
    """The plan computing ``outputs`` (and, with ``loss``, the gradients of the parameters and
    of ``wrt``) from ``feeds``: the module docstring's phases, one function each, in order.

    ``seeded`` (no ``loss``): a stage's plan, whose backward starts from a seed array of each
    output's shape (``Plan.seeds``, written by the caller before the backward). ``arena``: the
    bytes to lay the arena in, shared with other plans (grown, and they rebound, when this one
    needs more); default: an arena of its own. ``inputs_outside``: the fed inputs in arrays
    of the plan's own (``Plan.inputs``), which hold them until the next call (a shared arena
    does not)."""
    if seeded and loss is not None:
        raise ValueError("a plan starts its backward from a loss or from seeds, not both")
    wanted = list(dict.fromkeys([*outputs, *([loss] if loss else [])]))
    nodes, needed, static, traced, folded = trace_phase(graph, feeds, wanted, backends, wrt)
    values, live, placement = fold_phase(graph, feeds, nodes, needed, traced, folded)
    pb, context, fetch = lower_phase(graph, feeds, outputs, wanted, loss, wrt, training,
                                     backends, rt, live, values, needed, traced, static,
                                     placement, precision, seeded)
    seed, gradients = backward_phase(graph, loss, wrt, rt, pb, values,
                                     fetch if seeded else None)
    check_unwritten(context)  # a bf16-only value read as float32 would be garbage
    seed_names = seed if isinstance(seed, dict) else {}
    pb.steps = overlap.schedule(pb.steps, values)  # compute between collectives' start, wait
    # an inference plan computes what depends only on the graph's arrays once (plan/hoist.py)
    hoist.hoist(pb, values, set(fetch.values()), loss is not None or seeded, placement)
    arena = arena if arena is not None else Arena()
    order, cuts, hook_names, arena_bytes, owned_bytes, offsets = memory_phase(
        graph, feeds, pb, values, gradients, fetch, hook, list(seed_names.values()), arena,
        inputs_outside)
    programs, records, segments = bind_phase(rt, order, values, cuts)
    external = {n: v.array for n, v in values.items() if v.storage == "external"}
    grads = {name: values[g].array for name, g in gradients.items()}
    internal = sum(getattr(k, "internal_bytes", 0) for k in context.kernels)
    plan = Plan(values, programs, records, {n: values[n].array for n in feeds if n in values},
                {n: fetch[n] for n in outputs}, grads, None if seed_names else seed, external,
                placement, arena_bytes, owned_bytes, internal, context.objects)
    plan.parameters = tuple(p for p in graph.parameters)
    plan.segments = segments
    plan.hook_names, plan.hook = hook_names, hook
    plan.seed_names, plan.gradient_values = seed_names, dict(gradients)
    plan.seeds = {n: values[s].array for n, s in seed_names.items()}
    plan.arena, plan.offsets, plan.order, plan.cuts = arena, offsets, order, cuts
    arena.bind(plan, rebind)
    return plan


def rebind(plan: Plan) -> None:
    """Point ``plan``'s arena values into its arena's current bytes (the arena grew for
    another plan sharing it) and bind its programs again; its layout is unchanged."""
    values, buffer = plan.values, plan.arena.buffer
    for name, offset in plan.offsets.items():
        values[name].array = view_of(buffer[offset:], values[name])
    for name, v in values.items():  # views after their bases (made before them)
        if v.storage == "view" and root(values, name) in plan.offsets:
            v.array = _view_array(values, name)
    from meta.lv1.plan.runtime import module

    profile = {phase: p.profile for phase, p in plan.programs.items()}
    rt = module()
    plan.programs, plan.records, plan.segments = bind_phase(rt, plan.order, values, plan.cuts)
    for phase, program in plan.programs.items():
        program.profile = profile.get(phase, False)
    plan.inputs = {n: values[n].array for n in plan.inputs}
    plan.seeds = {n: values[s].array for n, s in plan.seed_names.items()}
    plan.gradients = {n: values[g].array for n, g in plan.gradient_values.items()}


def _view_array(values: dict[str, Value], name: str) -> np.ndarray:
    """A view value's array: its base's bytes (plain: from its offset, in its shape)."""
    v = values[name]
    b = values[v.base]
    count = int(np.prod(v.shape))
    array = b.array if v.layout != "plain" else \
        b.array.reshape(-1)[v.offset:v.offset + count].reshape(v.shape)
    assert count == 0 or np.shares_memory(array, b.array), name  # empty: no bytes
    return array


def trace_phase(graph: Graph, feeds: dict[str, np.ndarray], wanted: list[str], backends,
                wrt: list[str] = ()) -> tuple[list[Node], set[str], set[str], dict, set[str]]:
    """1. Trace (and find what folds): the nodes the request needs, the names they read, the
    constants (never a name in ``wrt``), every tensor's shape and dtype, the nodes computed
    from constants only."""
    nodes = graph.nodes_for(wanted, given=feeds)
    for node in nodes:
        if planned_type(node) in DATA_DEPENDENT or any(True for _ in node.subgraphs()):
            raise NotPlannable(f"{node.describe()}: output shapes depend on the data")
    needed = {x for n in nodes for x in n.dependencies()} | set(wanted)
    roles = graph.roles
    variable = frozenset(wrt)
    static = {n for n in graph.initializers
              if roles.get(n) == "constant" and n not in feeds and n not in variable}
    traced, folded = trace(graph, feeds, nodes, static, backends, variable)
    for name in needed:
        value = traced.get(name)
        if not isinstance(value, (np.ndarray, Traced)):
            raise NotPlannable(f"tensor {name!r} is not a tensor (a sequence or optional)")
        if value.dtype.kind in "OSUV":  # no fixed size per element: no place in an arena
            raise NotPlannable(f"tensor {name!r} holds {value.dtype} (strings or objects)")
    return nodes, needed, static, traced, folded


def fold_phase(graph: Graph, feeds: dict[str, np.ndarray], nodes: list[Node], needed: set[str],
               traced: dict, folded: set[str]
               ) -> tuple[dict[str, Value], list[Node], dict[str, str]]:
    """2. Fold: the plan's first values (feeds in the arena, graph arrays where they are,
    folded nodes' outputs as constants of its own) and the nodes left to run."""
    values: dict[str, Value] = {}
    for name in needed:
        a = traced[name]
        if name in feeds:
            values[name] = Value(name, a.shape, a.dtype)
        elif name in graph.initializers:
            values[name] = Value(name, a.shape, a.dtype, storage="external")
    placement: dict[str, str] = {}
    live: list[Node] = []
    for node in nodes:
        if node.name not in folded:
            live.append(node)
            continue
        for out in node.outputs:
            if out and out in traced:
                a = np.array(traced[out], order="C")  # 0-d stays 0-d
                values[out] = Value(out, a.shape, a.dtype, storage="owned", array=a)
        placement[node.name] = "folded"
    return values, live, placement


def lower_phase(graph: Graph, feeds: dict[str, np.ndarray], outputs: list[str],
                wanted: list[str], loss: str | None, wrt: list[str], training: bool | None,
                backends, rt, live: list[Node], values: dict[str, Value], needed: set[str],
                traced: dict, static: set[str], placement: dict[str, str],
                precision: str = "f32", seeded: bool = False):
    """3. Lower: rewrites (patterns), what needs a gradient, then each live node into steps
    (``kernels.lower``); returns the builder, the lowering context and the fetched values."""
    from meta.lv1.plan import kernels, patterns
    from meta.lv1.plan.lowering import gemv

    backends = tuple(backends)
    originals = {n.name: n for n in live}
    live = [as_planned(n) for n in live]
    live, made, merged = patterns.gelu(live, {n: traced[n] for n in static if n in traced},
                                       set(wanted) | set(feeds) | set(wrt), backends)
    live, decomposed, parts = patterns.decompose(live, traced, static, values, backends)
    made.update(decomposed)
    ops = {n.name: made.get(n.name) or make_operator(originals.get(n.name, n), graph.opset,
                                                     backends) for n in live}
    placement.update((old, f"fused into {new}") for old, new in merged.items())
    pb = PlanBuilder(values, training, rt)
    backprop = loss is not None or seeded
    if backprop:
        params = [p for p in graph.parameters if p not in feeds]
        pb.requires.update(p for p in params if p in needed)
        pb.requires.update(w for w in wrt if w in values)
        for node in live:
            op = ops[node.name]
            if any(x in pb.requires for i, x in enumerate(node.inputs)
                   if x and i not in op.no_grad_inputs):
                pb.requires.update(o for o in node.outputs if o)
    reads = Counter(x for n in live for x in n.inputs if x)
    pb.consumers = dict(reads)

    keep = set(wanted)
    absorbed: set[str] = set()
    consumers: dict[str, list[Node]] = {}
    for n in live:
        for x in n.inputs:
            if x:
                consumers.setdefault(x, []).append(n)
    # fetched, fed and wrt names exist as themselves: no fusion absorbs them (a gradient
    # asked for of a tensor fused away would have nowhere to be)
    context = kernels.Context(pb, ops, consumers, keep | set(feeds) | set(wrt), absorbed,
                              training, backprop, traced)
    context.static = static
    context.precision = precision
    context.order = {n.name: i for i, n in enumerate(live)}
    if training:  # the state a training forward updates (not when fed)
        context.state = set(graph.state) - set(feeds)
    for node in live:
        if node.name in absorbed:
            placement[node.name] = placement.get(node.name, "fused")
            continue
        pb.current = node
        # a batch-1 Linear (Gemm) taking no gradient: one pass over its weight (lowering.gemv)
        lowered = gemv.lower(context, node) or kernels.lower(context, node)
        pb.lowered.append(lowered)
        for name in context.fused_into.pop(node.name, []):
            placement[name] = f"fused into {node.name}"
        placement[node.name] = lowered.kind
    patterns.place(placement, parts)
    fetch = {}
    pb.current = None
    for name in outputs:
        fetch[name] = pb.require_layout(name, "plain")
    roots = {loss} if loss is not None else set(outputs) if seeded else set()
    pb.reaches_loss = _reaching(live, ops, roots) if roots else set()
    return pb, context, fetch


def _reaching(live: list[Node], ops: dict, roots: set[str]) -> set[str]:
    """The tensors the loss (or the seeded outputs) depend on through inputs that take a
    gradient: those whose gradient can be nonzero (the plan must have one for each asked
    for)."""
    reach = set(roots)
    for node in reversed(live):
        if any(o in reach for o in node.outputs if o):
            op = ops[node.name]
            reach.update(x for i, x in enumerate(node.inputs)
                         if x and i not in op.no_grad_inputs)
    return reach


def backward_phase(graph: Graph, loss: str | None, wrt: list[str], rt, pb: PlanBuilder,
                   values: dict[str, Value], seeded: dict[str, str] | None = None
                   ) -> tuple[np.ndarray | dict[str, str] | None, dict[str, str]]:
    """4. Backward: the seed d(loss)/d(loss), then each lowered node's backward in reverse
    order; returns the seed and the value holding each parameter's (and ``wrt``'s) gradient.

    ``seeded`` (a stage: output -> the plain value fetched for it): instead of the loss's
    seed, one seed value per output that takes a gradient (float, reached from a parameter
    or ``wrt``), copied into that output's gradient as the loss's seed is; returned as
    output -> seed value. The seeds live in the arena, alive from the backward's first step to
    their copy (they are activation-sized: a plan of its own for each would hold them all)."""
    from meta.lv1.plan.context import py_step

    gradients: dict[str, str] = {}
    if seeded is not None:
        seeds = _seed_outputs(rt, pb, values, seeded)
        _backward_steps(graph, wrt, pb, values, gradients, "the seeded outputs depend")
        return seeds, gradients
    if loss is None:
        return None, gradients
    seed = np.ones((), values[loss].dtype)
    seed_name = "loss@seed"
    values[seed_name] = Value(seed_name, (), seed.dtype, storage="owned", array=seed)
    target = pb.grad_target(loss) if loss in pb.requires else None
    if target is not None:
        dest = target[0]
        if seed.dtype == np.float32:
            pb.step("loss gradient", [seed_name], [dest],
                    lambda a: [rt.copy(a(seed_name), a(dest), 1)], "backward")
        else:
            pb.step("loss gradient", [seed_name], [dest],
                    lambda a: [py_step(lambda: np.copyto(a(dest), a(seed_name)),
                                       "loss gradient")], "backward")
    _backward_steps(graph, wrt, pb, values, gradients, f"{loss!r} depends")
    return seed, gradients


def _seed_outputs(rt, pb: PlanBuilder, values: dict[str, Value], fetch: dict[str, str]
                  ) -> dict[str, str]:
    """A stage's seeds: for each output that takes a gradient, a seed value of its shape
    copied into its gradient by the backward's first steps; output -> seed value."""
    from meta.lv1.plan.context import py_step

    seeds: dict[str, str] = {}
    for out, f in fetch.items():
        v = values[f]
        if f not in pb.requires or v.dtype.kind != "f":
            continue
        seed_name = f"{out}@seed"
        values[seed_name] = Value(seed_name, v.shape, v.dtype)
        dest = pb.grad_target(f)[0]
        if v.dtype == np.float32:
            n = int(np.prod(v.shape))
            pb.step("output gradient", [seed_name], [dest],
                    lambda a, s=seed_name, d=dest, n=n: [rt.copy(a(s), a(d), n)], "backward")
        else:
            pb.step("output gradient", [seed_name], [dest],
                    lambda a, s=seed_name, d=dest: [py_step(lambda: np.copyto(a(d), a(s)),
                                                            "output gradient")], "backward")
        seeds[out] = seed_name
    pb.flush()  # two outputs fetched as one value: their seeds add
    return seeds


def _backward_steps(graph: Graph, wrt: list[str], pb: PlanBuilder, values: dict[str, Value],
                    gradients: dict[str, str], what: str) -> None:
    """Each lowered node's backward in reverse order; ``gradients`` gets the value holding
    each parameter's (and ``wrt``'s) gradient."""
    for lowered in reversed(pb.lowered):
        if lowered.backward is not None:
            pb.current = lowered.node
            lowered.backward(pb)
            pb.flush()
    for name in [*graph.parameters, *wrt]:
        if name in values and pb.grad(name) is not None and name not in gradients:
            gradients[name] = pb.grad(name)
    # Never zeros for a gradient asked for that the loss depends on: a plan without it is
    # not made (the executor runs the reference path instead, and says why in ``unplanned``).
    missing = [w for w in wrt if w not in gradients and w in pb.reaches_loss]
    if missing:
        raise NotPlannable(f"wrt {missing[0]!r}: the plan's kernels give it no gradient "
                           f"though {what} on it")


def memory_phase(graph: Graph, feeds: dict[str, np.ndarray], pb: PlanBuilder,
                 values: dict[str, Value], gradients: dict[str, str], fetch: dict[str, str],
                 hook: GradientHook | None, seeds: Sequence[str] = (),
                 arena: Arena | None = None, inputs_outside: bool = False
                 ) -> tuple[list[PlannedStep], dict[int, list[str]], list[str], int, int,
                            dict[str, int]]:
    """5. Memory: the steps in program order, every value's array (arena offsets from the
    lifetimes, owned arrays, graph arrays, views of their bases), the gradient hook's cuts;
    returns (order, cuts, hook names, arena bytes, owned bytes, arena offsets). ``seeds``
    (a stage's) are written before the backward's first step: alive from there; a stage's
    outputs, copied out before it, need not live through the backward. ``inputs_outside``:
    the fed inputs are arrays of the plan's own, not in the arena."""
    order = [s for phase in ("prepare", "forward", "backward") for s in pb.steps
             if s.phase == phase]
    if inputs_outside:  # the plan keeps its fed inputs in arrays of its own
        for name in feeds:
            if name in values and values[name].storage == "arena":
                values[name].storage = "owned"
    params = set(graph.parameters)
    # A stage's gradients of wrt tensors (its inputs: activation-sized) are copied out by
    # backward_seeded as soon as the backward ends: in the arena, alive to its end.
    staged = {root(values, g) for n, g in gradients.items() if seeds and n not in params}
    for name, g in gradients.items():  # handed out: arrays of their own, kept across calls
        base = root(values, g)  # a view's (a gradient aliased through a view): its base's
        if values[base].storage == "arena" and (name in params or not seeds):
            values[base].storage = "owned"
            staged.discard(base)
    cuts, hook_names = bucket_cuts(order, values, gradients, params, hook)
    first_backward = next((i for i, s in enumerate(order) if s.phase == "backward"),
                          len(order))
    if seeds:  # a stage's outputs are copied out between its forward and its backward
        spans = lifetimes(order, values, set())
        for name in fetch.values():
            r = root(values, name)
            if r in spans:
                spans[r] = (spans[r][0], max(spans[r][1], first_backward - 1))
    else:
        spans = lifetimes(order, values, set(fetch.values()))
    for name in feeds:  # copied in before the first step
        if name in spans:
            spans[name] = (0, spans[name][1])
    for name in staged:
        if name in spans and values[name].storage == "arena":
            spans[name] = (spans[name][0], len(order))
    for name in seeds:  # copied in before the backward's first step
        if name in spans:
            spans[name] = (min(first_backward, spans[name][0]), spans[name][1])
    arena_values = {n: v.nbytes for n, v in values.items() if v.storage == "arena" and n in spans}
    offsets, arena_bytes = assign_offsets(arena_values, spans)
    arena = (arena if arena is not None else Arena()).reserve(max(arena_bytes, 64))
    owned_bytes = 0
    for name, v in values.items():
        if v.storage == "arena" and name in offsets:
            v.array = view_of(arena[offsets[name]:], v)
        elif v.storage == "external":
            v.array = graph.initializers[name]
        elif v.storage == "owned" and v.array is None:
            v.array = view_of(aligned_empty(max(v.nbytes, 64)), v)
            owned_bytes += v.nbytes
    for name, v in values.items():  # views after their bases (made before them)
        if v.storage == "view":
            b = values[v.base]
            if b.array is None:  # the view of a value no step touches (an unread gradient)
                b.array = view_of(aligned_empty(max(b.nbytes, 64)), b)
            v.array = _view_array(values, name)
    # Declared, never touched by a step (the Transposes fused attention absorbs): no step
    # reads or writes them, so they share one buffer, as large as the largest (each its own
    # array held 16 MiB of the GPT's step at sequence 256 for nothing).
    untouched = [v for v in values.values() if v.array is None and v.storage == "arena"]
    if untouched:
        scratch = aligned_empty(max(64, *(v.nbytes for v in untouched)))
        for v in untouched:
            v.array = view_of(scratch, v)
    return order, cuts, hook_names, arena_bytes, owned_bytes, offsets


def bind_phase(rt, order: list[PlannedStep], values: dict[str, Value],
               cuts: dict[int, list[str]]
               ) -> tuple[dict[str, object], dict[str, list[PlannedStep]], list]:
    """6. Bind: the C++ steps created against the values' arrays and grouped into the
    ``prepare``, ``forward`` and ``backward`` programs (and, with a hook, the backward's
    segments: one per bucket of finished gradients)."""
    def lookup(name: str) -> np.ndarray:
        return values[name].array

    programs, records = {}, {}
    cut_at: list[tuple[int, list[str]]] = []  # (backward steps so far, parameters finished)
    segments: list[tuple[object, list[str], list[PlannedStep]]] = []
    for phase in ("prepare", "forward", "backward"):
        bound, owners = [], []
        for s in order:
            if s.phase != phase:
                continue
            for step in s.build(lookup):
                bound.append(step)
                owners.append(s)
            if phase == "backward" and id(s) in cuts:  # a bucket of gradients is final
                cut_at.append((len(bound), cuts[id(s)]))
        programs[phase] = rt.Program(bound)
        records[phase] = owners
        if phase == "backward" and cuts:
            start = 0
            for end, names in cut_at:
                segments.append((rt.Program(bound[start:end]), names, owners[start:end]))
                start = end
            if start < len(bound):
                segments.append((rt.Program(bound[start:]), [], owners[start:]))
    return programs, records, segments


def bucket_cuts(order: list[PlannedStep], values: dict[str, Value], gradients: dict[str, str],
                parameters: set[str], hook: GradientHook | None
                ) -> tuple[dict[int, list[str]], list[str]]:
    """With a gradient hook (a strategy that communicates during the backward): the
    parameters' gradients in the order the backward finishes them, handed to ``hook.layout``
    which returns the arrays to write them into (its buckets, laid out in that order), and the
    backward steps after which a bucket of at least ``hook.bucket_bytes`` is final ->
    the parameters it completes."""
    if hook is None:
        return {}, []
    grads = {name: g for name, g in gradients.items() if name in parameters}
    last: dict[str, int] = {}
    backward = [s for s in order if s.phase == "backward"]
    for i, step in enumerate(backward):
        for w in step.writes:
            last[w] = i
    done = sorted((n for n in grads if grads[n] in last), key=lambda n: last[grads[n]])
    arrays = hook.layout(done)
    for name in done:
        v = values[grads[name]]
        v.storage, v.array = "given", arrays[name]
    cuts: dict[int, list[str]] = {}
    pending, size = [], 0
    for k, name in enumerate(done):
        pending.append(name)
        size += values[grads[name]].nbytes
        boundary = k + 1 == len(done) or last[grads[done[k + 1]]] != last[grads[name]]
        if boundary and (size >= hook.bucket_bytes or k + 1 == len(done)):
            cuts[id(backward[last[grads[name]]])] = pending
            pending, size = [], 0
    return cuts, done
