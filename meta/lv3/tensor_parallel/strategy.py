"""Partitioned layers: one model's neurons split over the ranks (DistBelief's model
parallelism, Megatron-LM's tensor parallelism).

``distributed: {"name": "partitioned", "param_budget_mb": 8}`` splits the recipe's network
over all ranks of the job (``meta.lv3.tensor_parallel.plan``): fully connected and
convolutional layers by output neurons / channels, in column-then-row pairs that need one
allreduce forward and one backward (none backward when the input is the data), grouped
convolutions whose groups fall on the ranks with no communication at all; a transformer's
blocks as Megatron-LM splits them (attention by heads, the MLP by its hidden features: one
allreduce per attention and per MLP each way). A graph with Dropout is refused (each rank
would draw its own masks for the values the ranks hold alike). Each rank runs its
part of the graph with an executor of the trainer's kind; the collectives are nodes of that
graph (``meta.lv3.tensor_parallel.ops``), so a step's gradients are the single process's, and
each rank updates only the parameters it holds (a Level 2 gradient transformation per rank).

Every rank takes every batch (only activations and their gradients travel) and gets the same
loss and logits, so the trainer, metrics and events run unchanged. Before each evaluation and
at the end the ranks broadcast their shards, so rank 0 checkpoints and exports the whole
network.

``param_budget_mb`` is the parameter memory one rank may hold: a model that exceeds it on the
ranks it is given is refused before training, naming how many ranks it needs. The strategy
reports the bytes each step sent and the step a model predicts: compute from the whole
graph's measured node times (rank 0, one process) times the share of each node a rank runs,
communication from the α-β model of the collectives the plan makes.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

from meta.common import threads as _threads
from meta.common.component import ComponentError, Option
from meta.lv1.executor import Executor, ReferenceExecutor
from meta.lv1.gradient_hook import GradientHook
from meta.lv1.graph import Graph, GraphError
from meta.lv1.partition import node_costs
from meta.lv2.optimizers import Optimizer, Params, summed_over
from meta.lv3.comm.communicator import Communicator, SingleProcessCommunicator
from meta.lv3.comm.costmodel import Link, measure_link, ring_allreduce
from meta.lv3.comm.polling import poll_barrier
from meta.lv3.pipeline.stage import stage_executor_kinds
from meta.lv3.strategy import Strategy
from meta.lv3.tensor_parallel.ops import Group, bind, groups
from meta.lv3.tensor_parallel.plan import Plan, PlanError, Shapes, plan, probe, step_shape
from meta.lv3.workload import Workload, required

MAX_RANKS = 256  # the most ranks a budget refusal searches for a plan that fits
MB = 1e6


class PartitionedExecutor(Executor):
    """What the trainer sees as its executor: ``graph`` (the whole network: evaluated,
    checkpointed and exported once gathered) run as this rank's part (``executor``, over
    ``plan``'s local graph). Measures every training step's time and bytes."""

    def __init__(self, graph: Graph, plan_: Plan, executor: ReferenceExecutor,
                 group: Group, shapes: Shapes) -> None:
        self.graph, self.plan, self.executor, self.group = graph, plan_, executor, group
        """``graph``: the whole graph. ``plan``: this rank's part of it. ``executor``: the
        executor running that part. ``group``: the ranks it is split over."""
        self.shapes = shapes
        """what the plans were made from (every rank's, for the model)"""
        self.spans: list[float] = []
        """training steps, the first (warm-up) left out"""
        self.comm_s: list[float] = []
        """Per training step: seconds inside the collectives beyond what was waited for before
        them."""
        self.steps = 0
        """Training steps run."""
        self.bytes_sent = 0
        """by training steps"""
        self.rows = 0
        """Examples trained on."""

    @property
    def local_graph(self) -> Graph:
        return self.executor.graph

    @property
    def params(self) -> list[str]:
        return list(self.local_graph.parameters)

    def _mode_changed(self) -> None:
        self.executor.train(bool(self.training))

    def placement(self) -> dict[str, str]:
        """Where this rank's part runs its nodes."""
        return self.executor.placement()

    def inference_and_backprop(self, feeds: dict, loss: str = "loss",
                               outputs: Iterable[str] | None = None, micro_batches: int = 1,
                               wrt: Sequence[str] = (), hook: GradientHook | None = None,
                               ) -> tuple[dict, dict]:
        """One partitioned step: (the loss and ``outputs``, alike on every rank; gradients of
        the parameters this rank holds)."""
        self._refuse_hook(hook)
        if wrt:
            raise GraphError(f"a partitioned graph has no gradients with respect to "
                             f"{list(wrt)}: each rank holds a part of the layers")
        sent, waited = self.group.bytes_sent, self.group.seconds
        start = time.perf_counter()
        values, grads = self.executor.inference_and_backprop(feeds, loss, outputs,
                                                             micro_batches)
        if self.plan.partial_gradients or self.plan.partial_outputs:
            values, grads = self._sum_partial(values, grads)
        span = time.perf_counter() - start
        self.steps += 1
        self.bytes_sent += self.group.bytes_sent - sent
        if self.steps > 1:
            self.spans.append(span)
            self.comm_s.append(self.group.seconds - waited)
            self.rows += len(next(v for v in feeds.values() if np.ndim(v) >= 1))
        return values, grads


    def _sum_partial(self, values: dict, grads: dict) -> tuple[dict, dict]:
        """The loss's parts (``Plan.partial_outputs``) and the gradients of
        ``Plan.partial_gradients`` (each rank's of its own rows, under sequence parallelism)
        summed over the ranks: one allreduce of them all."""
        outs = [n for n in self.plan.partial_outputs if n in values]
        names = [n for n in self.plan.partial_gradients if n in grads]
        parts = [np.ravel(values[n]) for n in outs] + [np.ravel(grads[n]) for n in names]
        if not parts:
            return values, grads
        flat = self.group.allreduce(np.concatenate(parts))
        values, grads, at = dict(values), dict(grads), 0
        for table, keys in ((values, outs), (grads, names)):
            for n in keys:
                size = np.size(table[n])
                table[n] = flat[at:at + size].reshape(np.shape(table[n])).astype(
                    np.asarray(table[n]).dtype, copy=False)
                at += size
        return values, grads

    def inference(self, feeds: dict, outputs: Iterable[str] | None = None) -> dict:
        """The graph's ``outputs`` on every rank (a collective: every rank passes the batch;
        a loss of which each rank computes a part summed)."""
        values = self.executor.inference(feeds, outputs)
        if any(n in values for n in self.plan.partial_outputs):
            values = self._sum_partial(values, {})[0]
        return values


def check_budget(graph: Graph, shapes: Shapes, ranks: int, budget_mb: float) -> None:
    """Refuse, in one line, a model whose largest shard on ``ranks`` ranks exceeds
    ``budget_mb`` of parameters (naming how many ranks it needs). Rank 0 holds the most: it
    takes the first of uneven splits and the row-parallel biases."""
    if budget_mb <= 0:
        return
    budget = budget_mb * MB
    held = plan(graph, shapes, 0, ranks).bytes_of(graph)
    if held <= budget:
        return
    total = graph.parameters.nbytes()
    need = next((n for n in range(ranks + 1, MAX_RANKS + 1)
                 if plan(graph, shapes, 0, n).bytes_of(graph) <= budget), None)
    where = f"needs {total / MB:.2f} MB of parameters" if ranks == 1 else \
        f"needs {held / MB:.2f} MB of parameters on rank 0 of {ranks} ({total / MB:.2f} MB " \
        f"in all)"
    advice = f"partition it over {need} ranks with distributed: partitioned (mpiexec -n " \
             f"{need})" if need else f"its replicated layers alone exceed it on " \
                                     f"{MAX_RANKS} ranks: raise the budget"
    raise ComponentError(f"model {graph.name!r} {where}, more than the budget of "
                         f"{budget_mb:g} MB per rank (distributed.param_budget_mb): {advice}")


def measured_costs(graph: Graph, comm: Communicator, make: Any, sample: dict,
                   loss: str) -> dict[str, float]:
    """Every node's forward + backward time on one process (rank 0 measures, every rank
    gets them; the others sleep meanwhile): the compute the model divides over the ranks."""
    costs: Any = None
    if comm.rank == 0:
        try:
            costs = node_costs(graph, "measured", make, sample, loss)
        except Exception as err:  # tell the other ranks, which would wait forever
            costs = err
    poll_barrier(comm)
    costs = comm.bcast_obj(costs, root=0)
    if isinstance(costs, Exception):
        raise PlanError(f"measuring node times failed on rank 0: {costs}") from costs
    return costs


def refuse_dropout(graph: Graph) -> None:
    """Each rank draws its own dropout masks, so a Dropout of values every rank holds alike
    (a residual stream) would make the ranks' copies differ: refused, naming the node."""
    drops = [n.name for n in graph.nodes if n.op_type == "Dropout"]
    if drops:
        raise ComponentError(f"distributed 'partitioned': node {drops[0]!r} (Dropout) would "
                             f"draw different masks on the ranks for values they must hold "
                             f"alike; train without dropout (model.dropout: 0)")


class Partitioned(Strategy):
    """Model parallelism by neurons: every layer's outputs split over the ranks."""

    name = "partitioned"
    needs_workload: ClassVar[bool] = True
    options: ClassVar[dict[str, Option]] = {
        "param_budget_mb": Option(0.0, "parameter memory one rank may hold, in MB (1e6 "
                                  "bytes); a model that needs more is refused (0: no limit)",
                                  low=0.0),
        "sequence_parallel": Option(True, "split the work every rank would repeat (the "
                                    "embeddings, LayerNorms, residual adds, the head and the "
                                    "loss) by rows, with a reduce-scatter and an all-gather "
                                    "in place of each allreduce (Megatron-LM's sequence "
                                    "parallelism), where the graph allows it"),
    }
    consistent = True
    """after finish(): every rank holds the whole trained network"""

    @classmethod
    def replica(cls, rank: int, size: int, **options: Any) -> tuple[int, int]:
        """Every rank takes every batch (each holds a part of every layer)."""
        return 0, 1

    @classmethod
    def check(cls, optimizer: Any, comm: Communicator, workload: Workload | None) -> None:
        if not isinstance(optimizer, Optimizer):
            raise ComponentError(f"distributed 'partitioned' updates each rank's neurons with "
                                 f"a Level 2 gradient transformation (sgd, adam, ...), not "
                                 f"{type(optimizer).__name__}")
        if workload is None:
            return
        if type(workload.executor) not in stage_executor_kinds():
            raise ComponentError(f"distributed 'partitioned' runs each rank's part with the "
                                 f"reference, native or planned executor, not "
                                 f"{type(workload.executor).__name__}")
        refuse_dropout(workload.graph)

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    param_budget_mb: float = 0.0, sequence_parallel: bool = True
                    ) -> Partitioned:
        """Split the workload's graph over ``comm``, give this rank its part and bring the
        partitioned executor for the trainer to run (a collective; the budget is checked
        first)."""
        workload = required(workload, cls.name)
        cls.check(optimizer, comm, workload)
        graph, make = workload.graph, workload.executor_maker()
        sample = workload.sample(workload.batch_size)
        shapes = probe(graph, {k: v[:2] for k, v in sample.items()}, make)
        check_budget(graph, shapes, comm.size, param_budget_mb)
        costs = measured_costs(graph, comm, make, sample, workload.names["loss"])
        key = bind(comm.split(0))
        mine = plan(graph, shapes, comm.rank, comm.size, key, sequence=sequence_parallel)
        local = make(mine.local_graph(graph))
        part = PartitionedExecutor(graph, mine, local, groups(key), shapes)
        return cls(Optimizer(optimizer.transform, local.graph.parameters), part, costs,
                   len(next(iter(sample.values()))), param_budget_mb)

    def __init__(self, optimizer: Optimizer, part: PartitionedExecutor,
                 costs: dict[str, float] | None = None, cost_rows: int = 0,
                 budget_mb: float = 0.0) -> None:
        """``costs``: the whole graph's node times (s) on one process for ``cost_rows``
        examples (``measured_costs``), which the model of a step divides over the ranks."""
        # The shards live on their ranks alone: nothing to broadcast, and every rank gets the
        # same loss and logits, so the base class gets a size-1 communicator (``group``).
        super().__init__(optimizer, SingleProcessCommunicator())
        self.part, self.comm = part, part.group.comm
        """``part``: the partitioned executor the trainer runs. ``comm``: the ranks the layers
        are split over."""
        self.trainer_executor = part
        """the trainer runs the partitioned graph"""
        whole = part.graph.initializers
        for name, view in self.flat_params.views.items():  # replicated: the graph reads them
            if not part.plan.shards[name][part.plan.rank].split:
                whole[name] = view
        self.costs, self.cost_rows, self.budget_mb = costs or {}, cost_rows, budget_mb
        """``costs``: the whole graph's node times on one process for ``cost_rows`` examples, for
        the model of a step. ``budget_mb``: the parameter memory a rank may hold."""
        self.model_bytes_sent = 0
        """by gather_model"""
        self.figures: dict[str, float] = {}
        """The step's measured and modelled figures for the report."""
        self.link = Link(0.0, 0.0)
        """The link measured for the report's prediction (zeros before)."""

    @property
    def plan(self) -> Plan:
        return self.part.plan

    def step(self, grads: Params) -> None:
        """Apply this rank's gradients (the partitioned step computed them). A global-norm
        clip's norm is the whole model's, as Megatron-LM's: the shards' squares summed over the
        ranks, each replicated parameter counted once (on rank 0), so every rank scales alike
        and the replicated copies stay equal."""
        self.timeline.begin()
        if self.optimizer.transform.elementwise:
            self.optimizer.step(grads)
        else:
            shards, rank = self.plan.shards, self.plan.rank
            with summed_over(self.comm.sum_float,
                             lambda name: shards[name][rank].split or rank == 0):
                self.optimizer.step(grads)
        self.timeline.lap("update")

    def gather_model(self) -> None:
        """Every rank broadcasts its shards: each then holds the whole trained network (for
        checkpoints, the export and the final report)."""
        graph, roles, plan_ = self.part.graph, self.part.graph.roles, self.plan
        local = self.part.local_graph.initializers
        for name, shards in plan_.shards.items():
            if roles[name] not in ("parameter", "state") or not shards[0].split:
                continue
            whole = graph.initializers[name]
            for rank, shard in enumerate(shards):
                if not shard.held_by(rank):
                    continue
                if rank == self.comm.rank:
                    part = np.ascontiguousarray(local[name])
                    self.model_bytes_sent += part.nbytes if self.comm.size > 1 else 0
                else:
                    part = np.empty(shard.shape(whole.shape), whole.dtype)
                self.comm.bcast(part, root=rank)
                shard.put(whole, part)

    def sync_state(self, state: Any) -> None:
        """Before every evaluation: the whole model on every rank (``gather_model``)."""
        self.gather_model()

    def state_dict(self) -> dict:
        return {"partition": self.plan.rank, "partitions": self.plan.ranks,
                **super().state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        if self.plan.ranks > 1 or saved.get("partitions", 1) > 1:
            raise ComponentError(f"this checkpoint holds rank {saved.get('partition')}'s part "
                                 f"of the optimizer state of {saved.get('partitions')} "
                                 f"partitions: resuming a partitioned run is not supported yet")
        super().load_state_dict({k: v for k, v in saved.items()
                                 if k not in ("partition", "partitions")})

    def finish(self) -> None:
        """The whole model on every rank; the measured link and the report's figures."""
        self.gather_model()
        self.link = measure_link(self.comm)
        self.figures = self._figures()

    # -- the model of a step, and the report ---------------------------------------------
    def predicted(self, link: Link, batch: int) -> dict[str, float]:
        """Seconds of a step of ``batch`` examples: compute (the slowest rank's share of the
        single-process node times, scaled from the measured batch) and communication (α-β,
        the backward's allreduces behind the weight gradients)."""
        p, plan_ = self.plan.ranks, self.plan
        scale = batch / max(self.cost_rows, 1)
        compute = 0.0
        sequence = any(layer.kind == "rows" for layer in plan_.layers.values())
        for rank in range(p):
            layers = plan(self.part.graph, self.part.shapes, rank, p,
                          sequence=sequence).layers \
                if rank != plan_.rank \
                else plan_.layers
            compute = max(compute, sum(t * layers[n].share for n, t in self.costs.items()))
        if _threads.local_ranks() > _threads.cores():  # ranks take turns on the cores
            compute *= _threads.local_ranks() / _threads.cores()
        # the plan's allreduces as the planner costs them (``StepShape.waited``): a backward
        # one behind the weight gradients of the layers reading its copy (a product's
        # forward and backward are three products alike, the weight gradient one of them),
        # at least its bandwidth term (MPICH moves it inside the plan's tests, on this core)
        shape = step_shape(self.part.graph, self.part.shapes, p, sequence)
        comm, _hidden = shape.waited(
            batch, lambda v: ring_allreduce(link, p, v),
            lambda v: 2 * (p - 1) / p * v * link.beta,
            lambda n: self.costs.get(n, 0.0) * shape.shares.get(n, 1.0) * scale / 3)
        return {"compute": compute * scale, "comm": comm,
                "single": sum(self.costs.values()) * scale}

    def _figures(self) -> dict[str, float]:
        part, plan_, graph = self.part, self.plan, self.part.graph
        p, roles = plan_.ranks, graph.roles
        held = self.comm.allgather(np.array([float(plan_.bytes_of(graph))]))[:, 0]
        out: dict[str, float] = {
            "partitions": float(p),
            "parameters": float(sum(a.size for a in graph.parameters.values())),
            "parameter_bytes": float(graph.parameters.nbytes()),
            "param_budget_mb": float(self.budget_mb),
            "layers_column": float(plan_.count("column")),
            "layers_row": float(plan_.count("row")),
            "layers_grouped": float(plan_.count("grouped")),
            "layers_replicated": float(sum(
                1 for n in graph.nodes if plan_.layers[n.name].kind == "replicated"
                and any(roles.get(x) == "parameter" for x in n.inputs))),
            "collectives_per_step": float(len(plan_.collectives)),
            **{f"rank{r}_parameter_bytes": float(b) for r, b in enumerate(held)}}
        if not part.spans or not self.costs:
            return out
        batch = round(part.rows / len(part.spans))
        model = self.predicted(self.link, batch)
        out.update(step_measured_ms=float(np.median(part.spans)) * 1e3,
                   step_mean_ms=float(np.mean(part.spans)) * 1e3,
                   comm_measured_ms=float(np.median(part.comm_s)) * 1e3,
                   step_predicted_ms=(model["compute"] + model["comm"]) * 1e3,
                   compute_predicted_ms=model["compute"] * 1e3,
                   comm_predicted_ms=model["comm"] * 1e3,
                   single_process_step_ms=model["single"] * 1e3,
                   bytes_per_step_predicted=float(plan_.step_bytes(batch)),
                   batch_size=float(batch))
        return out

    def report(self) -> dict[str, float]:
        out = super().report()
        out["bytes_sent_per_step"] = self.part.bytes_sent / max(self.part.steps, 1)
        out["model_bytes_sent"] = float(self.model_bytes_sent)
        if self.part.comm_s:  # what the α-β prediction is compared with (report.py)
            out["communicate_ms_per_step"] = float(np.mean(self.part.comm_s)) * 1e3
        out.update(self.figures)
        return out

    def predict_comm_s(self, link: Link) -> float:
        """The α-β time of the collectives of one step (the mean batch of the run)."""
        if self.plan.ranks == 1 or not self.part.spans:
            return 0.0
        return self.predicted(link, round(self.part.rows / len(self.part.spans)))["comm"]

    def report_text(self) -> str:
        f, plan_ = self.figures, self.plan
        if "step_measured_ms" not in f:
            return ""
        p = plan_.ranks
        held = [f[f"rank{r}_parameter_bytes"] / MB for r in range(p)]
        budget = f", budget {self.budget_mb:g} MB per rank" if self.budget_mb else ""
        lines = [f"meta: partitioned over {p} ranks: {plan_.count('column')} column-parallel, "
                 f"{plan_.count('row')} row-parallel, {plan_.count('grouped')} grouped "
                 f"(local) layer(s); parameters per rank "
                 f"{', '.join(f'{b:.2f}' for b in held)} MB of {f['parameter_bytes'] / MB:.2f} "
                 f"MB{budget}"]
        for c in plan_.collectives:
            lines.append(f"  {c.label:<14} {c.phase:<8} {c.tensor:<24} "
                         f"{c.nbytes(int(f['batch_size'])):>10,} bytes")
        lines += [
            f"meta: bytes per step {self.part.bytes_sent / max(self.part.steps, 1):,.0f} "
            f"measured, {f['bytes_per_step_predicted']:,.0f} from the plan",
            f"meta: partitioned step (forward and backward): measured "
            f"{f['step_measured_ms']:.2f} ms (median; mean {f['step_mean_ms']:.2f}), predicted "
            f"{f['step_predicted_ms']:.2f} ms = compute {f['compute_predicted_ms']:.2f} ms (one "
            f"process's node times {f['single_process_step_ms']:.2f} ms, each node times the "
            f"share a rank runs) + communication {f['comm_predicted_ms']:.2f} ms (measured "
            f"{f['comm_measured_ms']:.2f} ms; α-β: {self.link})"]
        return "\n".join(lines)
