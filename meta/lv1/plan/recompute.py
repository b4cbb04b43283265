"""Activation recomputation on the planned executor (Chen et al. 2016's gradient
checkpointing; PyTorch's ``torch.utils.checkpoint``, Megatron's full recomputation).

A training step normally keeps every activation its backward reads from the forward until the
backward: for a transformer that is all its blocks' attention scores and MLP activations at
once. With ``PlannedExecutor(graph, recompute="blocks")`` the graph is cut into consecutive
segments (the pipeline's ``partition``, so what crosses a cut is derived, not declared), and a
step

* runs each segment's forward keeping only what crosses into the next segments (the
  segments' inputs, copied out). It runs the segment's stage plan (``forward_saving``; the
  next segment overwrites what it saved): the very plan that recomputes it later, so the
  recomputed activations are the first forward's bit for bit (a forward-only training plan
  fuses differently, and its outputs differed in the last bit);
* runs the last segment's forward and backward (``forward_saving`` / ``backward_seeded``) from
  the loss;
* then, last segment first, recomputes each segment's forward from its kept inputs
  (``forward_saving``) and runs its backward from the gradients of its outputs that the later
  segment handed back (``backward_seeded``, the segment's inputs among ``wrt``).

Every segment plan lays its arena in ONE shared arena (``memory.Arena``): only one segment's
activations exist at a time, so the step's activation memory is the largest segment's arena
plus the kept segment inputs (each middle segment's plan keeps its input in an array of its
own, ``inputs_outside``: that array is the kept copy), where it was the whole graph's arena.
It costs one more forward of every segment but the last (the last runs its forward and
backward at once): a quarter to a third more time for a transformer.

Where the segments come from (``segment_cuts``):

* ``"blocks"``: the graph's residual blocks, found from its structure (``residual_joins``):
  a segment ends after every Add that closes a skip connection (``x + f(x)``), so a
  pre-LayerNorm transformer layer is two segments (attention, MLP), a ResNet's block one.
  Structure, not names: an imported graph's node names follow no convention. Finer than one
  segment a layer because what one segment holds at its peak (a GPT's MLP: its 4x-wide
  activations, their derivative and gradient) is what the step then holds: for the GPT of
  recipes/shakespeare_gpt.py at sequence 256 a segment per layer held 0.63x of the step's
  activation memory (84 MiB arena + 12 MiB kept, of 152 MiB), a segment per residual block
  0.50x (60 + 16 MiB); the kept inputs (one activation per cut) are small beside it. A graph
  without skip connections is cut into about sqrt(N) runs of as many nodes (N nodes: Chen
  et al.'s sqrt(N) checkpoints).
* a list of node-name glob patterns (``["h*.mlp.residual"]``, or one comma-separated
  string from a recipe): a segment ends after every node that matches.

Parameters read by two segments (a language model's head tied to its token embedding) get
the sum of both segments' gradients (added in the order the backward runs them; the
unsegmented plan adds in that order too, but within one kernel's accumulation, so the sum may
differ in the last bit); every other parameter's gradient is the very array its segment's
plan computed, bit-identical to the unsegmented plan's where the kernels are the same.

Refused in one line (and the step runs unsegmented) where recomputation would be wrong or
useless: a graph that gives one segment, a node that draws random numbers (Dropout: the
recomputed forward would draw others), a partition the pipeline refuses. A state a training
forward updates (BatchNorm's running statistics) is put back after each recomputed forward,
so it is updated once per step.
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase
from typing import Callable, Sequence

import numpy as np

from meta.lv1.graph import Graph, GraphError
from meta.lv1.plan.memory import Arena

RANDOM = frozenset({"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike",
                    "RandomUniformLike", "Multinomial", "Bernoulli"})


class NotSegmentable(GraphError):
    """A graph recomputation cannot cut (or would compute wrongly): the message says why."""


def parse(spec: str | Sequence[str] | None) -> str | tuple[str, ...] | None:
    """The ``recompute`` option as given: None/"" (off), "blocks", or node-name patterns (a
    list, or a comma-separated string from a recipe)."""
    if spec is None or spec is False:
        return None
    if isinstance(spec, str):
        spec = spec.strip()
        if spec.lower() in ("", "none", "off", "false"):
            return None
        if spec == "blocks":
            return "blocks"
        spec = spec.split(",")
    patterns = tuple(p.strip() for p in spec if p.strip())
    return patterns or None


def residual_joins(graph: Graph) -> list[int]:
    """Positions (in the graph's order) of the nodes that close a residual block: an Add (or
    a Sum of two) of a stream ``x`` and a branch computed from ``x`` (an earlier reader of
    ``x`` is among the branch's ancestors). Tensors computed from initializers alone (a
    causal mask every layer adds, a bias) are not streams."""
    nodes = graph.nodes
    weights = set(graph.initializers)
    for node in nodes:  # weight-only tensors: computed from initializers alone
        if all(x in weights for x in node.dependencies()):
            weights.update(o for o in node.outputs if o)
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for x in dict.fromkeys(node.inputs):
            if x:
                readers.setdefault(x, []).append(i)
    joins = []
    for i, node in enumerate(nodes):
        inputs = [x for x in node.inputs if x]
        if node.op_type not in ("Add", "Sum") or len(inputs) != 2 or inputs[0] == inputs[1]:
            continue
        for stream, branch in (inputs, inputs[::-1]):
            if stream in weights or branch in weights or branch not in producer:
                continue
            earlier = {r for r in readers.get(stream, []) if r < producer[branch]}
            if earlier and _reaches(nodes, producer, producer[branch], earlier,
                                    producer.get(stream, -1)):
                joins.append(i)
                break
    return joins


def _reaches(nodes, producer: dict[str, int], start: int, targets: set[int], floor: int
             ) -> bool:
    """Whether node ``start`` depends on one of ``targets`` (searching nodes after ``floor``)."""
    seen, todo = set(), [start]
    while todo:
        i = todo.pop()
        if i in targets:
            return True
        if i in seen or i <= floor:
            continue
        seen.add(i)
        todo.extend(producer[x] for x in nodes[i].inputs if x in producer)
    return False


def segment_cuts(graph: Graph, spec: str | tuple[str, ...]) -> tuple[list[str], str]:
    """The nodes after which a segment ends, and how they were found (one phrase)."""
    order = [n.name for n in graph.nodes]
    if spec == "blocks":
        cuts = set(residual_joins(graph))
        if cuts - {len(order) - 1}:
            how = f"{len(cuts)} residual blocks"
        else:
            k = max(2, round(math.sqrt(len(order))))
            size = len(order) / k
            cuts = {round(size * j) - 1 for j in range(1, k)}
            how = f"no residual block: {k} runs of ~{size:.0f} nodes"
    else:
        cuts = {i for i, n in enumerate(order[:-1]) if any(fnmatchcase(n, p) for p in spec)}
        how = f"patterns {list(spec)}"
    return [order[i] for i in sorted(c for c in cuts if 0 <= c < len(order) - 1)], how


class Segments:
    """A graph cut into segments, each run by a planned executor of its own whose plans all
    lay their arenas in one shared ``arena`` (see the module docstring)."""

    def __init__(self, graph: Graph, spec: str | tuple[str, ...],
                 make: Callable[[Graph], object]) -> None:
        from meta.common.component import ComponentError
        from meta.lv1.partition import partition

        random = [n for n in graph.nodes if n.op_type in RANDOM]
        if random:
            raise NotSegmentable(f"node {random[0].name!r} ({random[0].op_type}) draws random "
                                 "numbers, which a recomputed forward would draw again, "
                                 "differently")
        cuts, how = segment_cuts(graph, spec)
        if not cuts:
            raise NotSegmentable(f"{how} give one segment")
        try:
            self.partition = partition(graph, len(cuts) + 1, cuts=cuts, tied=True)
        except ComponentError as err:
            raise NotSegmentable(str(err)) from err
        self.graph = graph
        self.how = f"{len(cuts) + 1} segments ({how})"
        """How the graph was cut, in words."""
        self.graphs = [self.partition.stage_graph(graph, s)
                       for s in range(len(self.partition.stages))]
        self.arena = Arena()
        """The bytes every segment plan lays its arena in."""
        self.executors = [make(g) for g in self.graphs]
        for ex in self.executors:
            ex.arena = self.arena
        for ex in self.executors[1:-1]:  # their inputs are what a step keeps (the last's
            ex.inputs_outside = True  # is used at once, the first's is the batch)
        self.readers: dict[str, list[int]] = {}
        """parameter -> the segments that read it, first to last"""
        for s, g in enumerate(self.graphs):
            for name in g.initializers:
                self.readers.setdefault(name, []).append(s)
        self.kept_bytes = 0
        """The most bytes held outside the arena at once in the last step: the segment
        plans' inputs (the kept segment inputs, and the batch), and the most in flight
        between segments (an output until the next segment takes it in, the input
        gradients one segment hands the one before)."""
        self._inputs: dict[int, np.ndarray] = {}
        self._sums: dict[str, np.ndarray] = {}  # a tied parameter's summed gradient
        self._layouts: dict[tuple, dict[str, np.ndarray]] = {}  # a hook's arrays per batch

    # -- the segments follow the whole graph -------------------------------------------------
    def sync(self, training: bool | None) -> None:
        """Point the segments' graphs at the whole graph's current arrays, roles and version
        (an optimizer or strategy may replace arrays and moves the version)."""
        whole = self.graph
        arrays, roles = whole.initializers, whole.roles
        for g, ex in zip(self.graphs, self.executors):
            for name in g.initializers:
                if g.initializers[name] is not arrays[name]:
                    g.initializers[name] = arrays[name]
                if g.role_overrides.get(name) != roles[name]:
                    g.role_overrides[name] = roles[name]
            g.version = whole.version
            if ex.training != training:
                ex.training = training
                ex._mode_changed()

    def takes(self, names: Sequence[str], wrt: Sequence[str]) -> str | None:
        """Why a request cannot run segmented (None: it can)."""
        if wrt:
            return "gradients with respect to wrt tensors"
        missing = [n for n in names if n not in self.partition.outputs]
        if missing:
            return f"outputs {missing}, which are not graph outputs"
        return None

    # -- one step --------------------------------------------------------------------------
    def backprop(self, feeds: dict, names: list[str], loss: str, seed: float, hook=None
                 ) -> tuple[dict, dict]:
        """One step's forward and backward, segment by segment: the values of ``names`` and
        the parameters' gradients (the hook's arrays with a hook, see ``PlannedExecutor``)."""
        stages, exs = self.partition.stages, self.executors
        last = len(stages) - 1
        kept: dict[str, np.ndarray] = {}
        self._inputs: dict[int, np.ndarray] = {}  # the plans' own input arrays, by id
        peak = 0
        for s in range(last):  # the forward, keeping only what crosses the cuts
            out, _ = self._forward(s, kept, feeds, stages[s].sends)
            kept.update(out)
            peak = max(peak, self._held(kept))
        layout = self._hook_layout(feeds, hook) if hook is not None else None
        pending: list[str] = []
        grads: dict[str, np.ndarray] = {}
        values, saved = self._forward(last, kept, feeds, names)
        seeds = {loss: np.full(saved.shapes[loss][0], seed * (hook.seed if hook else 1.0),
                               saved.shapes[loss][1])}
        back: dict[str, np.ndarray] = {}  # the later segment's gradients of what it received
        for s in range(last, -1, -1):
            if s < last:
                restore = self._state(s)
                _, saved = self._forward(s, kept, feeds, stages[s].sends)
                for name, before in restore:
                    np.copyto(self.graphs[s].initializers[name], before)
                seeds = {t: back[t] for t in stages[s].sends if t in back}
            peak = max(peak, self._held(kept, seeds))
            back = exs[s].backward_seeded(saved, seeds)
            del saved, seeds
            self._add(s, back, grads, layout)
            for t in stages[s].receives:  # kept inputs no earlier segment reads
                if not any(t in stages[k].receives for k in range(s)):
                    kept.pop(t, None)
            if layout is not None:
                pending += [p for p in self.graphs[s].parameters if self.readers[p][0] == s]
                size = sum(layout[p].nbytes for p in pending)
                if pending and (size >= hook.bucket_bytes or s == 0):
                    hook.ready(pending)
                    pending = []
        self.kept_bytes = peak + sum(a.nbytes for a in self._inputs.values())
        out = {}
        for name, array in self.graph.parameters.items():
            out[name] = layout[name] if layout is not None else \
                grads[name] if name in grads else np.zeros_like(array)
        return values, out

    def _forward(self, s: int, kept: dict, feeds: dict, outputs: list[str]):
        """Segment ``s``'s forward, saving for its backward; a plan that keeps its inputs in
        arrays of its own (``inputs_outside``) holds the kept inputs from then on: the copy
        made when the segment before computed them goes."""
        stage = self.partition.stages[s]
        given = self._given(s, kept, feeds)
        out, saved = self.executors[s].forward_saving(given, outputs,
                                                      wrt=self._floats(s, given))
        inputs = getattr(saved.state, "inputs", None) or {}  # a plan's (not a tape's)
        if not self.executors[s].inputs_outside:
            inputs = {}
        for t in stage.receives:
            if t in inputs:
                kept[t] = inputs[t]
        self._inputs.update((id(a), a) for a in inputs.values())
        return out, saved

    def _held(self, *arrays: dict) -> int:
        """Bytes of the arrays held outside the plans (copies in flight between segments)."""
        return sum(a.nbytes for group in arrays for a in group.values()
                   if id(a) not in self._inputs and np.ndim(a))

    def _given(self, s: int, kept: dict, feeds: dict) -> dict:
        stage = self.partition.stages[s]
        given = {t: kept[t] for t in stage.receives}
        given.update({t: feeds[t] for t in stage.feeds if t in feeds})
        return given

    def _floats(self, s: int, given: dict) -> list[str]:
        """The segment's inputs whose gradients the backward hands to the segment before."""
        return [t for t in self.partition.stages[s].receives
                if np.issubdtype(np.asarray(given[t]).dtype, np.floating)]

    def _state(self, s: int) -> list[tuple[str, np.ndarray]]:
        """The state a recomputed training forward of segment ``s`` would update a second
        time (running statistics), copied to be put back."""
        ex = self.executors[s]
        if not ex.training:
            return []
        return [(n, a.copy()) for n, a in self.graphs[s].state.items()]

    def _add(self, s: int, back: dict, grads: dict, layout: dict | None) -> None:
        """Segment ``s``'s parameter gradients into the step's: its plan's own array where it
        alone reads the parameter, else added to the others' (in the backward's order)."""
        for name in self.graphs[s].parameters:
            g = back[name]
            readers = self.readers[name]
            if layout is not None:
                if s == readers[-1]:
                    np.copyto(layout[name], g)
                else:
                    layout[name] += g
            elif len(readers) == 1:
                grads[name] = g
            elif s == readers[-1]:
                total = self._sums.get(name)
                if total is None or total.shape != g.shape:
                    total = self._sums[name] = np.empty_like(g)
                np.copyto(total, g)
                grads[name] = total
            else:
                grads[name] += g

    def _hook_layout(self, feeds: dict, hook) -> dict[str, np.ndarray]:
        """The hook's arrays for this batch's shapes, asked once: the parameters in the order
        the segmented backward finishes them (a segment's own, last segment first; a tied one
        with the earliest segment reading it)."""
        key = (id(hook), tuple((k, np.shape(v)) for k, v in feeds.items()))
        names = [p for s in range(len(self.graphs) - 1, -1, -1)
                 for p in self.graphs[s].parameters if self.readers[p][0] == s]
        if key not in self._layouts:
            self._layouts[key] = hook.layout(names)
        hook.use(names)
        return self._layouts[key]

    # -- what it holds -----------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Bytes: the shared arena, what the last step held outside it at most (``kept_bytes``)
        and what the segments' plans own besides (gradients, constants)."""
        from meta.lv1.plan.compiler import Plan

        owned = sum(p.owned_bytes - sum(a.nbytes for a in p.inputs.values())
                    * ex.inputs_outside for ex in self.executors for p in ex._plans.values()
                    if isinstance(p, Plan))  # the inputs a plan keeps are counted as kept
        return {"arena": self.arena.nbytes, "kept": self.kept_bytes, "owned": owned}
