"""What one training step of a recipe costs on one rank: per graph node, its forward and
backward seconds, parameter bytes and activation bytes per sample.

Times come from the machine's measured costs of this recipe (``meta plan --calibrate``)
when their network signature matches, scaled linearly to the batch asked for; otherwise from
the machine's compute rate and a node's multiply-adds (2 per weight per sample forward, twice
that backward), which is what a roofline-free planner can say without measuring. Either way
the step is attributed per node, so a pipeline cut or a tensor-parallel split can be costed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from meta.lv1 import build_model
from meta.lv1.executor import ReferenceExecutor
from meta.lv2 import build_dataset
from meta.lv2.dataset_registry import classes
from meta.planner.async_pattern import AsyncPattern
from meta.planner.machine import Machine, RecipeCosts
from meta.planner.memory import STATE_SLOTS, StepFacts, state_slots, step_facts  # noqa: F401
from meta.run.recipe import Recipe


@dataclass(frozen=True)
class Layer:
    """One graph node as the planner costs it (times at the workload's batch)."""

    name: str
    op_type: str
    forward_s: float
    backward_s: float
    param_bytes: int
    activation_bytes: int  # its outputs, per sample
    forward_fixed_s: float = 0.0  # of forward_s, what a call costs whatever its batch
    backward_fixed_s: float = 0.0

    def slowed(self, f: float) -> Layer:
        """This node with every time ``f`` times as long."""
        return Layer(self.name, self.op_type, self.forward_s * f, self.backward_s * f,
                     self.param_bytes, self.activation_bytes, self.forward_fixed_s * f,
                     self.backward_fixed_s * f)

    def at(self, f: float) -> Layer:
        """This node on ``f`` times the batch: the fixed part stays, the rest scales."""
        return Layer(self.name, self.op_type, scale(self.forward_s, self.forward_fixed_s, f),
                     scale(self.backward_s, self.backward_fixed_s, f), self.param_bytes,
                     self.activation_bytes, self.forward_fixed_s, self.backward_fixed_s)


def scale(t: float, fixed: float, f: float) -> float:
    """A time of ``fixed`` per call plus a part linear in the batch, at ``f`` times it."""
    fixed = min(fixed, t)
    return fixed + (t - fixed) * f


@dataclass(frozen=True)
class Workload:
    recipe: str
    batch: int
    layers: tuple[Layer, ...]
    param_bytes: int
    state_slots: int
    update_s: float
    source: str  # "measured ..." or "estimated ..."
    extra_s: float = 0.0  # measured step time no node owns, besides the update
    extra_fixed_s: float = 0.0  # of extra_s, per executor call whatever the batch
    spread: tuple[float, ...] = ()  # measured steps over their mean (RecipeCosts.step_spread)
    ranks_measured: int = 1  # ranks stepping at once when the times were measured
    # the asynchronous patterns measured with this step (RecipeCosts.pattern), and the step
    # (update included) they are relative to: its time with every rank stepping
    pattern: AsyncPattern | None = None
    pattern_base_s: float = 0.0
    # what the step holds besides the parameters, asked from the recipe's optimizer and
    # executor (``meta.planner.memory.step_facts``); None: the name table and node outputs
    facts: StepFacts | None = None
    # ranks -> what a partitioned (tensor-parallel) step does at that many ranks: each node's
    # share on the busiest rank and the allreduces (``meta.lv3.tensor_parallel.plan.
    # step_shape``, the strategy's own plan); None: not known (an estimate by layer kind)
    partitioned: Callable[[int], Any] | None = field(default=None, compare=False)

    def busy(self, active: int, cores: int) -> Workload:
        """This step with ``active`` ranks computing at once on a node of ``cores`` cores,
        rescaled from the ``ranks_measured`` that shared them while it was measured: a
        compute-bound rank's time grows with the ranks per core beyond one. On this 2-core
        machine a calibration at 3 ranks steps 3 at once, while Downpour's 2 workers compute
        and its server mostly waits."""
        return self._slowed(self.slowdown(active, cores), active)

    def slowdown(self, active: int, cores: int) -> float:
        """How much longer each time is with ``active`` ranks computing on ``cores`` cores
        than with the ``ranks_measured`` that shared them while it was measured."""
        return max(1.0, active / cores) / max(1.0, self.ranks_measured / cores)

    def measured_pattern(self, ranks: int) -> AsyncPattern | None:
        """The asynchronous patterns, if they were measured at ``ranks`` ranks."""
        if self.pattern is not None and self.pattern.ranks == ranks and self.pattern_base_s:
            return self.pattern
        return None

    def as_worker(self, ranks: int, active: int, cores: int,
                  overlapped: bool = False) -> Workload:
        """This step on a worker of an asynchronous strategy with one server at ``ranks``
        ranks: as measured in its pattern (``overlapped``: Downpour's) at those ranks
        (``meta.planner.async_pattern``), else ``busy(active, cores)``. On a node with more
        ranks than cores the pattern differs from both (its docstring has the figures)."""
        pattern = self.measured_pattern(ranks)
        if pattern is None:
            return self.busy(active, cores)
        step = pattern.overlapped_step_s if overlapped else pattern.step_s
        return self._slowed(step / self.pattern_base_s, self.ranks_measured)

    def _slowed(self, f: float, active: int) -> Workload:
        if f == 1.0:
            return self
        return replace(self, layers=tuple(x.slowed(f) for x in self.layers),
                       update_s=self.update_s * f, extra_s=self.extra_s * f,
                       extra_fixed_s=self.extra_fixed_s * f, ranks_measured=active)

    def sync_fraction(self, p: int) -> float:
        """What a step synchronised over ``p`` ranks waits beyond the mean step, as a fraction
        of it: the expected maximum of ``p`` draws from the measured steps (order statistics
        of the empirical distribution: sum of x_(i) ((i/n)^p - ((i-1)/n)^p)) over their mean,
        less one. Beyond the sample's size this saturates at the slowest measured step, so at
        large P it errs low."""
        if p < 2 or not self.spread:
            return 0.0
        x = sorted(self.spread)
        n = len(x)
        expected_max = sum(v * ((i / n) ** p - ((i - 1) / n) ** p) for i, v in
                           enumerate(x, start=1))
        return max(expected_max / (sum(x) / n) - 1.0, 0.0)

    def sync_s(self, p: int) -> float:
        """``sync_fraction`` of this step's compute: the wait of ``p`` ranks that each run the
        whole step (data parallelism)."""
        return self.sync_fraction(p) * self.compute_s

    @property
    def forward_s(self) -> float:
        return sum(layer.forward_s for layer in self.layers)

    @property
    def backward_s(self) -> float:
        return sum(layer.backward_s for layer in self.layers)

    @property
    def compute_s(self) -> float:
        """Forward, backward and the rest of a step on one rank, the update excluded."""
        return self.forward_s + self.backward_s + self.extra_s

    @property
    def activation_bytes(self) -> int:
        """Bytes a backward keeps per sample (every node's outputs)."""
        return sum(layer.activation_bytes for layer in self.layers)

    def at_batch(self, batch: int) -> Workload:
        """The same step on ``batch`` samples: node times scale linearly, the update not."""
        f = batch / self.batch
        return replace(self, batch=batch, layers=tuple(x.at(f) for x in self.layers),
                       extra_s=scale(self.extra_s, self.extra_fixed_s, f))


def graph_signature(graph: Any) -> str:
    """The network's identity for measured costs: its nodes and its parameters' shapes."""
    text = ";".join(f"{n.name}:{n.op_type}" for n in graph.nodes) + "|" + ";".join(
        f"{k}:{tuple(v.shape)}" for k, v in sorted(graph.parameters.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_network(recipe: Recipe) -> tuple[Any, Any]:
    """The recipe's graph and its training data, as ``meta run`` builds them."""
    d = recipe.definitions
    data = d.choices["dataset"]
    train, test, _augment = build_dataset(data.component, data.options, d.seed)
    model = d.choices["model"]
    built = build_model(model.component, model.options, train.inputs.shape[1:],
                        classes(train, test), d.seed, train.inputs.dtype)
    return getattr(built, "graph", built), train


def feeds_for(graph: Any, train: Any, batch: int) -> dict[str, np.ndarray]:
    """A batch of the training data under the graph's input names."""
    inputs, labels = train.batch(np.arange(min(batch, len(train))))
    reps = -(-batch // len(inputs))
    inputs, labels = np.concatenate([inputs] * reps)[:batch], np.concatenate([labels] * reps)[
        :batch]
    names = [t.name for t in graph.inputs if t.name not in graph.initializers]
    data = [n for n in names if n != "labels"]
    feeds = {data[0]: inputs}
    if "labels" in names:
        feeds["labels"] = labels
    return feeds


def node_shapes(graph: Any, train: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Per node: its parameters' bytes and its outputs' bytes per sample (a forward of two
    samples on the reference executor)."""
    params = graph.parameters
    param_bytes = {n.name: int(sum(params[x].nbytes for x in n.inputs if x in params))
                   for n in graph.nodes}
    wanted = [o for n in graph.nodes for o in n.outputs if o]
    ex = ReferenceExecutor(graph)
    ex.train(False)
    values = ex.inference(feeds_for(graph, train, 2), outputs=wanted)
    out = {}
    for n in graph.nodes:
        total = 0
        for o in n.outputs:
            v = values.get(o)
            if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == 2:
                total += v.nbytes // 2
        out[n.name] = total
    return param_bytes, out


def make_workload(recipe: Recipe, machine: Machine, graph: Any = None,
                  train: Any = None) -> Workload:
    """The recipe's step on one rank of ``machine``, at the recipe's batch size."""
    if graph is None:
        graph, train = build_network(recipe)
    d = recipe.definitions
    batch = int(d.batch_size)
    param_bytes, act = node_shapes(graph, train)
    total_params = int(sum(v.nbytes for v in graph.parameters.values()))
    opt = d.choices["optimizer"]
    slots = state_slots(opt.name, opt.values())
    facts = recipe_facts(recipe, graph, train, slots)
    split = partitioned_shape(graph, train)
    costs: RecipeCosts | None = machine.costs.get(recipe.name)
    if costs is not None and costs.signature == graph_signature(graph):
        f = batch / costs.batch
        owned = sum(costs.forward_s.values()) + sum(costs.backward_s.values())
        # the nodes' medians over more than the step's median round: trimmed to it, so the
        # plan's step at the calibrated batch is the calibration's step (issue 45)
        trim = min(1.0, max(costs.step_s - costs.update_s, 0.0) / owned) if owned else 1.0
        layers = tuple(Layer(n.name, n.op_type, costs.forward_s.get(n.name, 0.0),
                             costs.backward_s.get(n.name, 0.0), param_bytes[n.name],
                             act[n.name], costs.forward_fixed_s.get(n.name, 0.0),
                             costs.backward_fixed_s.get(n.name, 0.0)).slowed(trim).at(f)
                       for n in graph.nodes)
        owned *= trim
        extra = max(costs.step_s - owned - costs.update_s, 0.0)
        return Workload(recipe.name, batch, layers, total_params, slots, costs.update_s,
                        f"measured on {costs.executor} at batch {costs.batch}",
                        scale(extra, costs.extra_fixed_s, f), min(costs.extra_fixed_s, extra),
                        costs.step_spread, costs.ranks_measured, costs.pattern, costs.step_s,
                        facts, split)
    # 2 flops per multiply-add; a weight is used once per sample (convolutions: once per
    # output position, which this estimate misses: it errs low for them)
    layers = []
    for n in graph.nodes:
        weights = param_bytes[n.name] / 4
        fwd = 2 * weights * batch / machine.flops + act[n.name] * batch / 4 / machine.flops
        layers.append(Layer(n.name, n.op_type, fwd, 2 * fwd, param_bytes[n.name], act[n.name]))
    update = 4 * total_params / 4 / machine.flops  # a few flops per weight
    return Workload(recipe.name, batch, tuple(layers), total_params, slots, update,
                    f"estimated from {machine.flops:.3g} flop/s (no measured costs for "
                    f"{recipe.name!r}: run meta plan --calibrate)", facts=facts,
                    partitioned=split)


def partitioned_shape(graph: Any, train: Any) -> Callable[[int], Any]:
    """ranks -> the ``StepShape`` of ``graph`` split over that many ranks as the
    ``partitioned`` strategy splits it (each computed once, when asked; None where the graph
    cannot be probed or planned: the planner then estimates by layer kind)."""
    made: dict[int, Any] = {}
    shapes: list[Any] = []

    def shape(ranks: int) -> Any:
        if ranks not in made:
            from meta.lv3.tensor_parallel.plan import probe, step_shape

            try:
                if not shapes:
                    shapes.append(probe(graph, feeds_for(graph, train, 2)))
                made[ranks] = step_shape(graph, shapes[0], ranks)
            except Exception:  # noqa: BLE001  (a graph the split cannot run: the estimate)
                made[ranks] = None
        return made[ranks]

    return shape


def recipe_facts(recipe: Recipe, graph: Any, train: Any, slots: float) -> StepFacts | None:
    """The recipe's ``StepFacts``: its optimizer and executor, built as ``meta run`` builds
    them, asked what a step holds (None where the executor cannot run a training step here)."""
    from meta.lv2 import build_optimizer

    d = recipe.definitions
    opt, executor = d.choices["optimizer"], d.choices["executor"]
    try:
        return step_facts(graph, lambda batch: feeds_for(graph, train, batch),
                          lambda params: build_optimizer(opt.component, opt.options, params,
                                                         1, 1),
                          lambda g, **o: executor.component.build(
                              g, **{**executor.options, **o}), slots)
    except Exception:  # noqa: BLE001  (a step the probe cannot take: the estimate instead)
        return None
