"""Synchronous allreduce over pipelined replicas: pipeline parallelism inside a replica, data
parallelism across replicas (Megatron's and DeepSpeed's "PP x DP" grid).

``distributed: {"name": "hybrid_allreduce", "stages": 2, "micro_batches": 4}`` at
``mpiexec -n 4`` makes 2 replicas of 2 stages (``meta.lv3.hybrid.grid.ReplicaGrid``). Each replica
takes its shard of every epoch and runs it through its pipeline (``meta.lv3.pipeline.strategy``);
then stage ``s`` of every replica averages its gradients with the others' on the stage's data
communicator (one fused allreduce of that stage's parameters only) and applies the Level 2 rule.
Every copy of a stage thus takes the same step: the mean gradient over the global batch
(``replicas x batch_size`` examples, equal shards), as one process would on that batch.

Per step a stage sends its activations (and their gradients) to its neighbours and its own
gradients once around the allreduce; both are printed per stage and kept in ``metrics.json``
with the pipeline's bubble and per-stage memory.
"""

from __future__ import annotations

from typing import Any, ClassVar

from meta.common.component import Option
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link, ring_allreduce
from meta.lv3.comm.polling import poll_all
from meta.lv3.hybrid.grid import HybridPipeline, ReplicaGrid
from meta.lv3.pipeline.stage import PipelineExecutor
from meta.lv3.pipeline.strategy import Pipeline, stage_plan
from meta.lv3.workload import Workload, required


class HybridAllreduce(HybridPipeline):
    """Allreduce over pipelined replicas: stage s of every replica averages its gradients."""

    name = "hybrid_allreduce"
    options: ClassVar[dict[str, Option]] = {
        "stages": Option(2, "pipeline stages of every replica (consecutive ranks); the ranks "
                         "must be a multiple of it", low=1),
        **{k: Pipeline.options[k] for k in ("micro_batches", "schedule", "cuts", "balance")}}

    @classmethod
    def replica(cls, rank: int, size: int, stages: int = 2, **options: Any) -> tuple[int, int]:
        return ReplicaGrid(size, stages, 0, cls.name).replica(rank)

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    stages: int = 2, micro_batches: int = 4, schedule: str = "1f1b",
                    cuts: tuple[str, ...] = (), balance: str = "measured") -> HybridAllreduce:
        """Split the world into replicas, cut the workload's graph the same way on every rank
        and give this rank its stage (a collective)."""
        workload = required(workload, cls.name)
        grid = ReplicaGrid(comm.size, stages, 0, cls.name)
        cls.check(optimizer, comm, workload)
        part, make, sample = stage_plan(workload, comm, stages, micro_batches, cuts, balance)
        pipeline_comm, data_comm = grid.split(comm)
        pipe = PipelineExecutor(workload.graph, part, pipeline_comm, make, sample,
                                micro_batches, schedule)
        return cls(Optimizer(optimizer.transform, pipe.stage_graph.parameters), pipe, grid,
                   comm, data_comm)

    def __init__(self, optimizer: Optimizer, pipe: PipelineExecutor, grid: ReplicaGrid,
                 world: Communicator, data_comm: Communicator) -> None:
        super().__init__(optimizer, pipe, grid, world, data_comm)
        # Every replica starts from replica 0's weights (built alike from the seed anyway).
        data_comm.bcast(self.flat_params.buffer, root=0)

    def step(self, grads: Params) -> None:
        """Average this stage's gradients over the replicas, then apply the Level 2 rule."""
        t, group = self.timeline, self.group
        buffer = self.flat_grads.pack(grads)
        t.lap("pack")
        if group.size > 1:
            if self.oversubscribed:  # MPICH's blocking allreduce spins against other stages
                poll_all(group, [group.iallreduce(buffer)])
            else:
                group.allreduce(buffer)
            self.exchange_bytes += buffer.nbytes
            t.lap("communicate")
            buffer *= 1.0 / group.size
        self.step_stage(self.flat_grads.views)
        t.lap("update")

    def exchange_figures(self, steps: int) -> dict[str, float]:
        return {"allreduce_bytes_per_step": self.exchange_bytes / steps}

    def predict_comm_s(self, link: Link) -> float:
        """The pipeline's blocked time on rank 0, plus a ring allreduce of stage 0's
        gradients over the replicas."""
        replicas = self.group.size
        return super().predict_comm_s(link) + ring_allreduce(link, replicas,
                                                             self.flat_grads.nbytes)

