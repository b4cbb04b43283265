"""Pipeline parallelism: a graph cut into consecutive stages, one per rank (GPipe, PipeDream).

``distributed: {"name": "pipeline", "stages": 2, "micro_batches": 4, "schedule": "1f1b"}``
cuts the recipe's network into stages (at ``cuts``, or balanced by a per-node ``balance``
cost: ``meta.lv1.partition``), and rank ``s`` trains stage ``s``: each batch is split
into micro-batches that flow forward through the stages and back (``meta.lv3.
pipeline_executor``), under GPipe's fill-drain or the one-forward-one-backward schedule
(``meta.lv3.pipeline.schedule``). The gradients of one step are those of the whole batch on
one process (up to summation order), so training follows the single-process path.

Every rank holds the batch (data inputs are fed where they are read, only activations and
their gradients travel) and gets the loss and logits from the last stage, so the trainer,
its metrics and its events run unchanged; evaluation flows through the pipeline too. At each
evaluation and at the end every stage broadcasts its parameters and state, so rank 0 exports
and checkpoints the whole trained network.

The strategy reports per stage its forward and backward time per micro-batch, its idle share
(measured bubble) against GPipe's (p - 1)/(m + p - 1), its parameter bytes and the peak bytes
of activations its tapes stored, and the step time the schedule predicts from the stages'
measured times and an α-β link (``pipeline_schedule.simulate``) beside the measured one.
A Level 2 gradient transformation (sgd, adam, ...) updates each stage's own parameters; a
clip by global norm sums its norm over every stage (a tied parameter counted once), as
Megatron-LM's clip over the pipeline's ranks does: the step is the single process's.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from meta.common import threads as _threads
from meta.common.component import ComponentError, Option
from meta.lv1.executor import ReferenceExecutor
from meta.lv1.graph import Graph
from meta.lv2.optimizers import Optimizer, Params, summed_over
from meta.lv3.comm.communicator import Communicator, SingleProcessCommunicator
from meta.lv3.comm.costmodel import Link, measure_link
from meta.lv3.comm.polling import POLL_S, poll_all, poll_barrier
from meta.lv1.partition import (
    BALANCES,
    Partition,
    PartitionError,
    node_costs,
    partition,
)
from meta.lv3.pipeline.schedule import (
    SCHEDULES,
    Simulated,
    bubble_estimate,
    in_flight,
    schedule,
    simulate,
)
from meta.lv3.pipeline.stage import (
    MAX_MICRO_BATCHES,
    PipelineExecutor,
    StageStats,
    stage_executor_kinds,
)
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload, required


def plan(graph: Graph, comm: Communicator, stages: int, cuts: tuple[str, ...] = (),
         balance: str = "measured", executor_factory: Any = None,
         sample: dict[str, np.ndarray] | None = None, loss: str = "loss",
         tied: bool = True) -> Partition:
    """The partition every rank of ``comm`` uses (a collective): rank 0 measures the node
    costs (``balance``), every rank cuts the same graph at the same costs. Parameters read in
    several stages are allowed (``tied``): the ``PipelineExecutor`` sums their gradients."""
    costs = None
    if not cuts and comm.rank == 0:
        try:
            costs = node_costs(graph, balance, executor_factory, sample, loss)
        except Exception as err:  # tell the other ranks, which would wait forever
            costs = err
    if not cuts:
        poll_barrier(comm)  # the others sleep, not spin, while rank 0 measures
        costs = comm.bcast_obj(costs, root=0)
        if isinstance(costs, Exception):
            raise PartitionError(f"measuring node costs ({balance}) failed on rank 0: "
                                 f"{costs}") from costs
    return partition(graph, stages, cuts, costs, balance, tied)


def stage_plan(workload: Workload, comm: Communicator, stages: int, micro_batches: int,
               cuts: tuple[str, ...] = (), balance: str = "measured"
               ) -> tuple[Partition, Callable[[Graph], ReferenceExecutor], dict[str, np.ndarray]]:
    """For the ``workload``'s graph: the partition into ``stages`` every rank of ``comm``
    agrees on (a collective: ``plan``), a maker of stage executors of the run's kind, and the
    sample batch the stages agree on shapes with. ``comm`` may hold more ranks than one
    pipeline (replicas of it, servers): all of them cut the graph alike."""
    make = workload.executor_maker()
    sample = workload.sample(max(3, workload.batch_size // micro_batches))
    part = plan(workload.graph, comm, stages, tuple(cuts), balance, make, sample,
                workload.names["loss"])
    return part, make, sample


class Pipeline(Strategy):
    """Pipeline parallelism: the network cut into stages, one per rank, micro-batched."""

    name = "pipeline"
    needs_workload: ClassVar[bool] = True
    options: ClassVar[dict[str, Option]] = {
        "stages": Option(0, "pipeline stages, one per rank (0: as many as ranks)", low=0),
        "micro_batches": Option(4, "micro-batches each batch is split into", low=1,
                                high=MAX_MICRO_BATCHES),
        "schedule": Option("1f1b", "gpipe (all forwards, then all backwards) or 1f1b (one "
                           "forward, one backward: at most p - s micro-batches stored)",
                           choices=SCHEDULES),
        "cuts": Option((), "the last node of every stage but the last (empty: balanced)",
                       type=tuple[str, ...]),
        "balance": Option("measured", "node cost the automatic cuts balance: measured "
                          "(profiled forward + backward time), flops or params",
                          choices=BALANCES),
    }
    consistent = True
    """after finish(): every rank holds every stage's trained values"""

    @classmethod
    def replica(cls, rank: int, size: int, stages: int = 0, **options: Any) -> tuple[int, int]:
        """Every rank takes every batch (each stage feeds what it reads of it)."""
        if stages not in (0, size):
            raise ComponentError(f"distributed 'pipeline': {stages} stages run on {stages} "
                                 f"ranks (mpiexec -n {stages}), this job has {size}; stages 0 "
                                 f"makes one stage per rank")
        return 0, 1

    @classmethod
    def check(cls, optimizer: Any, comm: Communicator, workload: Workload | None) -> None:
        if not isinstance(optimizer, Optimizer):
            raise ComponentError(f"distributed 'pipeline' updates each stage with a Level 2 "
                                 f"gradient transformation (sgd, adam, ...), not "
                                 f"{type(optimizer).__name__}")
        executor = workload.executor if workload is not None else None
        if executor is not None and type(executor) not in stage_executor_kinds():
            raise ComponentError(f"distributed 'pipeline' runs its stages with the reference, "
                                 f"native or planned executor, not {type(executor).__name__}")

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    stages: int = 0, micro_batches: int = 4, schedule: str = "1f1b",
                    cuts: tuple[str, ...] = (), balance: str = "measured") -> Pipeline:
        """Cut the workload's graph, give this rank its stage, and bring the pipeline as the
        executor the trainer runs (its updater's; a collective)."""
        workload = required(workload, cls.name)
        cls.replica(comm.rank, comm.size, stages)
        cls.check(optimizer, comm, workload)
        part, make, sample = stage_plan(workload, comm, comm.size, micro_batches, cuts, balance)
        pipe = PipelineExecutor(workload.graph, part, comm.split(0), make, sample,
                                micro_batches, schedule)
        return cls(Optimizer(optimizer.transform, pipe.stage_graph.parameters), pipe)

    def __init__(self, optimizer: Optimizer, pipe: PipelineExecutor) -> None:
        # A stage's parameters live on its rank alone: there is nothing to broadcast, and as
        # every rank gets the same loss and logits the trainer's sums across ranks are the
        # identity. The base class gets a size-1 communicator (its ``group``) for both.
        super().__init__(optimizer, SingleProcessCommunicator(), timeline=pipe.timeline)
        self.pipe, self.comm = pipe, pipe.comm
        """``pipe``: the pipeline executor the trainer runs. ``comm``: its ranks, one per stage."""
        self.trainer_executor = pipe
        """the trainer runs the pipeline"""
        for name, view in self.flat_params.views.items():  # the whole graph reads them too
            pipe.graph.initializers[name] = view
        self.model_bytes_sent = 0
        """by gather_model"""
        self.figures: dict[str, float] = {}
        """The step's measured and modelled figures for the report (filled by ``finish``)."""
        self.gathered: np.ndarray | None = None
        """every stage's StageStats, by rank"""
        self.link = Link(0.0, 0.0)
        """The link measured at ``finish`` for the report's prediction (zeros before)."""

    @property
    def partition(self) -> Partition:
        return self.pipe.partition

    def step(self, grads: Params) -> None:
        """Apply this stage's gradients (the pipelined step computed them). A tied parameter's
        copies got the same summed gradient; an elementwise transformation then updates them
        alike, but one that looks at a stage's gradients together might not (rounding), so
        then its first stage's copy is broadcast."""
        self.step_stage(grads)
        if not self.optimizer.transform.elementwise:
            for name, where in sorted(self.partition.tied.items()):
                self.comm.bcast(self.pipe.graph.initializers[name], root=where[0])
        self.timeline.lap("update")

    def step_stage(self, grads: Params) -> None:
        """This stage's update, a global-norm clip's norm summed over the stages (each tied
        parameter counted on its first stage only: ``optimizers.summed_over``)."""
        if self.optimizer.transform.elementwise:
            self.optimizer.step(grads)
            return
        tied, stage = self.partition.tied, self.pipe.rank
        wait = poll_all if self.pipe.oversubscribed else None
        with summed_over(lambda partial: self.comm.sum_float(partial, wait),
                         lambda name: name not in tied or tied[name][0] == stage):
            self.optimizer.step(grads)

    def gather_model(self) -> None:
        """Every stage broadcasts its parameters and state: each rank then holds the whole
        trained network (for evaluation elsewhere, checkpoints and the export)."""
        graph, roles = self.pipe.graph, self.pipe.graph.roles
        tied = self.partition.tied
        for stage in self.partition.stages:
            for name in stage.initializers:
                if name in tied and tied[name][0] != stage.index:
                    continue  # the same values as its first stage's copy
                if roles[name] in ("parameter", "state"):
                    self.comm.bcast(graph.initializers[name], root=stage.index)
                    if self.comm.rank == stage.index and self.comm.size > 1:
                        self.model_bytes_sent += graph.initializers[name].nbytes

    def sync_state(self, state: Any) -> None:
        """Before every evaluation: the whole model on every rank (see ``gather_model``)."""
        self.gather_model()

    def state_dict(self) -> dict:
        return {"stage": self.pipe.rank, "stages": self.pipe.stages, **super().state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        if (saved.get("stage"), saved.get("stages")) != (self.pipe.rank, self.pipe.stages):
            raise ComponentError(f"this checkpoint holds the optimizer state of stage "
                                 f"{saved.get('stage')} of {saved.get('stages')}, not of "
                                 f"stage {self.pipe.rank} of {self.pipe.stages}: resuming a "
                                 f"pipelined run is not supported yet")
        super().load_state_dict({k: v for k, v in saved.items() if k not in ("stage", "stages")})

    def finish(self) -> None:
        """The whole model on every rank; every stage's measurements on every rank."""
        self.gather_model()
        self.gathered = self.comm.allgather(self.pipe.summary().as_array())
        self.link = measure_link(self.comm)
        self.figures = self._figures()

    # -- the model of a step, and the report -----------------------------------------------
    def _stage(self, s: int) -> StageStats:
        row = self.gathered[s] if self.gathered is not None else self.pipe.stats.as_array()
        return StageStats.from_array(row)

    def _micro_batches(self) -> int:
        rows = self.pipe.stats.forwards / max(self.pipe.stats.steps, 1)
        return max(1, round(rows)) if self.pipe.stats.steps else self.pipe.micro_batches

    def simulated(self, link: Link) -> Simulated:
        """The step the schedule makes of the stages' measured times per micro-batch, with
        messages costed by ``link`` (sizes: the mean micro-batch's crossing tensors)."""
        p, m = self.pipe.stages, self._micro_batches()
        stats = [self._stage(s) for s in range(p)]
        forward = [st.forward_s / max(st.forwards, 1) for st in stats]
        backward = [st.backward_s / max(st.backwards, 1) for st in stats]
        rows = self.pipe.stats.rows / max(self.pipe.stats.forwards, 1)  # per micro-batch
        # a rank that sleeps between tests of its receives notices a message half a poll late
        late = POLL_S / 2 if self.pipe.oversubscribed else 0.0
        act, grad = [], []
        for stage in self.partition.stages[:-1]:
            sizes = [rows * int(np.prod(self.pipe.shapes[t][0]))
                     * self.pipe.shapes[t][1].itemsize for t in stage.sends]
            act.append(sum(link.message(b) for b in sizes) + late)
            differentiable = [b for t, b in zip(stage.sends, sizes)
                              if np.issubdtype(self.pipe.shapes[t][1], np.floating)]
            grad.append(sum(link.message(b) for b in differentiable) + late)
        plans = [schedule(self.pipe.schedule_name, s, p, m) for s in range(p)]
        return simulate(plans, forward, backward, act, grad, self.cores)

    @property
    def cores(self) -> int | None:
        """The cores the stages share when the ranks oversubscribe this machine, else None
        (the model then gives every stage its own)."""
        cores = _threads.cores()
        return cores if _threads.local_ranks() > cores else None

    def _figures(self) -> dict[str, float]:
        p, pipe = self.pipe.stages, self.pipe
        m = self._micro_batches()
        out: dict[str, float] = {"pipeline_stages": float(p), "micro_batches": float(m)}
        stats = [self._stage(s) for s in range(p)]
        if not stats[0].steps:
            return out
        idle = [1.0 - (st.forward_s + st.backward_s) / st.span_s if st.span_s > 0 else 0.0
                for st in stats]
        model = self.simulated(self.link)
        out.update(bubble_measured=float(np.mean(idle)), bubble_predicted=bubble_estimate(p, m),
                   bubble_modelled=model.bubble, step_predicted_ms=model.step_s * 1e3,
                   step_measured_ms=max(st.span_s / st.steps for st in stats) * 1e3,
                   step_median_ms=max(st.span_median_s for st in stats) * 1e3)
        roles = pipe.graph.roles
        for s, (stage, st) in enumerate(zip(self.partition.stages, stats)):
            params = [pipe.graph.initializers[k] for k in stage.initializers
                      if roles[k] == "parameter"]
            plan_ = schedule(pipe.schedule_name, s, p, m)
            out.update({f"stage{s}_forward_ms": st.forward_s / max(st.forwards, 1) * 1e3,
                        f"stage{s}_backward_ms": st.backward_s / max(st.backwards, 1) * 1e3,
                        f"stage{s}_bubble": idle[s],
                        f"stage{s}_parameters": float(sum(a.size for a in params)),
                        f"stage{s}_parameter_bytes": float(sum(a.nbytes for a in params)),
                        f"stage{s}_activation_peak_bytes": float(st.peak_stored_bytes),
                        f"stage{s}_micro_batches_stored": float(st.peak_in_flight),
                        f"stage{s}_micro_batches_stored_predicted": float(in_flight(plan_))})
        return out

    def report(self) -> dict[str, float]:
        out = super().report()
        out["bytes_sent_per_step"] = self.pipe.bytes_sent / max(self.timeline.steps, 1)
        out["model_bytes_sent"] = float(self.model_bytes_sent)
        out.update(self.figures)
        return out

    def predict_comm_s(self, link: Link) -> float:
        """Rank 0's modelled time blocked in receives per step (the bubble and transfers),
        comparable with its measured ``communicate`` phase."""
        if self.pipe.stages == 1 or not self.pipe.stats.steps:
            return 0.0
        model = self.simulated(link)
        return model.step_s - model.busy_s[0]

    def report_text(self) -> str:
        f = self.figures
        if "bubble_measured" not in f:
            return ""
        p, m, pipe = self.pipe.stages, int(f["micro_batches"]), self.pipe
        lines = [f"meta: pipeline of {p} stages ({self.partition.balance}: cuts after "
                 f"{self.partition.cuts or '-'}), {m} micro-batches, schedule "
                 f"{pipe.schedule_name}",
                 f"{'stage':>5} {'nodes':>5} {'parameters':>10} {'param MB':>8} "
                 f"{'stored MB':>9} {'stored':>6} {'fwd ms':>7} {'bwd ms':>7} {'idle':>6}"]
        for s, stage in enumerate(self.partition.stages):
            lines.append(
                f"{s:>5} {len(stage.nodes):>5} {f[f'stage{s}_parameters']:>10.0f} "
                f"{f[f'stage{s}_parameter_bytes'] / 1e6:>8.3f} "
                f"{f[f'stage{s}_activation_peak_bytes'] / 1e6:>9.3f} "
                f"{f[f'stage{s}_micro_batches_stored']:>3.0f}/"
                f"{f[f'stage{s}_micro_batches_stored_predicted']:<2.0f} "
                f"{f[f'stage{s}_forward_ms']:>7.3f} {f[f'stage{s}_backward_ms']:>7.3f} "
                f"{f[f'stage{s}_bubble']:>6.1%}")
        lines += [
            f"meta: bubble {f['bubble_measured']:.1%} measured (the stages' mean idle share of "
            f"a step), (p-1)/(m+p-1) = {f['bubble_predicted']:.1%}, "
            f"{f['bubble_modelled']:.1%} modelled from the stages' measured times",
            f"meta: pipelined step (forward and backward of all micro-batches, the slowest "
            f"stage's): measured {f['step_measured_ms']:.2f} ms (median "
            f"{f['step_median_ms']:.2f} ms), predicted {f['step_predicted_ms']:.2f} ms "
            f"(stage times per micro-batch measured, messages by α-β: {self.link}"
            + (f"; {self.cores} cores shared by {p} stages)" if self.cores else ")")]
        return "\n".join(lines)
