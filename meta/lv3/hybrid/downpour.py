"""Downpour SGD over pipelined replicas: DistBelief's model-parallel replicas and sharded
parameter servers (seed 001, its Figure 2).

``distributed: {"name": "hybrid_downpour", "stages": 2, "servers": 1}`` at ``mpiexec -n 5``
makes 2 replicas of 2 stages and 1 server (``meta.lv3.hybrid.grid.ReplicaGrid``). Each replica
trains its shard of the data through its pipeline (``meta.lv3.pipeline.strategy``), never waiting
for the other replicas; each *stage* of it runs Downpour's client loop (``downpour.DownpourClient``,
Algorithm 1.1) on its own parameters: it fetches them every ``n_fetch`` steps and pushes its
accrued gradients every ``n_push`` steps, to and from the server shards that hold them only
(``meta.lv3.hybrid.server``), and steps locally in between. The two stages of a replica thus
fetch independently, as DistBelief's partitions did, and a step's parameters may be of two
server versions; the pipeline keeps their gradients exact for the weights each stage holds.

At the end every server broadcasts its shard: all ranks hold the servers' model, which rank 0
evaluates and exports. Per stage the run reports the bytes of activations, pushes and fetches
per step, the pipeline's bubble and memory, and the staleness of the applied pushes.

What plain ``downpour`` has and this does not (yet): the warm start (each stage of replica 0
would have to train alone and the others wait, per stage), ``leave`` and ``worker_timeout_s``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from meta.common.component import Option
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link
from meta.lv3.hybrid.grid import HybridPipeline, ReplicaGrid
from meta.lv3.hybrid.server import HybridServer, ShardLayout, share_final
from meta.lv3.parameter_server.downpour import Downpour, DownpourClient
from meta.lv3.parameter_server.shard_server import Roster, StalenessLog
from meta.lv3.pipeline.stage import PipelineExecutor
from meta.lv3.pipeline.strategy import Pipeline, stage_plan
from meta.lv3.strategy import Strategy
from meta.lv3.timeline import Timeline
from meta.lv3.workload import Workload, required


class StepContinued:
    """The pipelined step's timeline as the Downpour client sees it: the client's ``begin``
    continues the step the pipeline began (one step, not two)."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        """The strategy's timeline this one continues."""

    def begin(self) -> None:
        self.timeline.lap("compute")

    def lap(self, phase: str) -> None:
        self.timeline.lap(phase)


class StageRoute:
    """What ``DownpourClient`` asks of its owner, for one stage's worker: the world
    communicator, the stage's flat buffers and local rule, the servers that hold its pieces
    (``bounds``: each piece's range of the stage's buffer), every worker and their roster."""

    warm_start_steps = 0
    """none over replicas (see the module's docstring)"""

    def __init__(self, strategy: HybridDownpour, world: Communicator, servers: list[int],
                 bounds: list[tuple[int, int]], workers: list[int], n_fetch: int,
                 n_push: int) -> None:
        self.comm, self.servers, self.bounds, self.workers = world, servers, bounds, workers
        """``comm``: every rank. ``servers``: the servers of this stage's pieces. ``bounds``: the
        pieces' offsets in the stage's flat buffers. ``workers``: the ranks that push to them."""
        self.flat_params, self.flat_grads = strategy.flat_params, strategy.flat_grads
        """``flat_params``, ``flat_grads``: the stage's buffers, the strategy's."""
        self.optimizer = strategy.optimizer
        """The stage's optimizer, the strategy's."""
        self.timeline = StepContinued(strategy.timeline)
        """The strategy's timeline, without starting a step of its own."""
        self.roster = Roster(workers)
        """Per worker: status, steps and pushes, as the servers report them."""
        self.n_fetch, self.n_push = n_fetch, n_push
        """``n_fetch``, ``n_push``: steps between fetches and between pushes."""
        self.blocking_fetch = False
        """A stage's fetches are nonblocking, as DistBelief's (Downpour's ``blocking_fetch``
        is an option of the flat strategy only)."""
        self.strategy = strategy
        """The HybridDownpour this route serves."""

    @property
    def bytes_sent(self) -> int:
        """Pushed bytes (``DownpourClient`` adds them here): the strategy's exchange."""
        return self.strategy.exchange_bytes

    @bytes_sent.setter
    def bytes_sent(self, value: int) -> None:
        self.strategy.exchange_bytes = value


class HybridDownpour(HybridPipeline):
    """Downpour over pipelined replicas: each stage fetches and pushes its own parameters."""

    name = "hybrid_downpour"
    consistent = False
    """replicas differ until the end, when all take the servers' model"""
    options: ClassVar[dict[str, Option]] = {
        "stages": Option(2, "pipeline stages of every replica (consecutive ranks)", low=1),
        **{k: Downpour.options[k] for k in ("servers", "n_fetch", "n_push")},
        **{k: Pipeline.options[k] for k in ("micro_batches", "schedule", "cuts", "balance")}}

    @classmethod
    def replica(cls, rank: int, size: int, stages: int = 2, servers: int = 1,
                **options: Any) -> tuple[int, int]:
        return ReplicaGrid(size, stages, servers, cls.name).replica(rank)

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    stages: int = 2, servers: int = 1, n_fetch: int = 1, n_push: int = 1,
                    micro_batches: int = 4, schedule: str = "1f1b", cuts: tuple[str, ...] = (),
                    balance: str = "measured") -> Strategy:
        """A stage of a replica on the workers, a ``HybridServer`` on the last ``servers``
        ranks (a collective: every rank cuts the graph alike and lays out the shards)."""
        workload = required(workload, cls.name)
        grid = ReplicaGrid(comm.size, stages, servers, cls.name)
        cls.check(optimizer, comm, workload)
        part, make, sample = stage_plan(workload, comm, stages, micro_batches, cuts, balance)
        graph = workload.graph
        layout = ShardLayout.of(graph, part, servers, cls.name)
        pipeline_comm, data_comm = grid.split(comm)
        if grid.is_server(comm.rank):
            return HybridServer(optimizer.transform, comm, data_comm, graph, grid, layout)
        pipe = PipelineExecutor(graph, part, pipeline_comm, make, sample, micro_batches,
                                schedule)
        return cls(Optimizer(optimizer.transform, pipe.stage_graph.parameters), pipe, grid,
                   comm, data_comm, layout, n_fetch, n_push)

    def __init__(self, optimizer: Optimizer, pipe: PipelineExecutor, grid: ReplicaGrid,
                 world: Communicator, data_comm: Communicator, layout: ShardLayout,
                 n_fetch: int = 1, n_push: int = 1) -> None:
        super().__init__(optimizer, pipe, grid, world, data_comm)
        self.layout, self.n_fetch, self.n_push = layout, n_fetch, n_push
        """``layout``: the stages' pieces on the servers. ``n_fetch``, ``n_push``: steps between
        fetches and between pushes."""
        route = layout.route(grid.position(world.rank)[1])
        self.route = StageRoute(self, world, [grid.server_ranks[j] for j, _, _ in route],
                                [(lo, hi) for _, lo, hi in route], grid.worker_ranks,
                                n_fetch, n_push)
        """This stage's servers, pieces and workers, as a Downpour client sees them."""
        self.client = DownpourClient(self.route)
        """The Downpour client pushing this stage's gradients and fetching its parameters."""
        self.staleness = StalenessLog(grid.workers)
        """the servers' counts, summed at the end"""

    def step(self, grads: Params) -> None:
        """Accrue, step locally, push and fetch this stage's parameters (Algorithm 1.1)."""
        self.client.step(grads)

    def finish(self) -> None:
        """Push what is accrued and tell the servers; take the servers' whole model (a
        collective over the world, with the servers); then the pipeline's end."""
        self.client.finish()
        vector = np.empty(self.layout.total, self.flat_params.dtype)
        share_final(self.world, self.grid, self.layout, vector, self.staleness)
        self.layout.unpack(vector, self.pipe.graph.initializers)  # this stage's: its buffer
        super().finish()

    def exchange_figures(self, steps: int) -> dict[str, float]:
        fetches = 1 + self.client.steps // self.n_fetch  # the step-0 fetch, then every n_fetch
        return {"push_bytes_per_step": self.exchange_bytes / steps,
                "fetch_bytes_per_step": fetches * self.flat_params.nbytes / steps}

    def report(self) -> dict[str, float]:
        out = super().report()
        out.update(self.staleness.metrics())
        for j, (lo, hi) in enumerate(self.layout.shards):
            out[f"server{j}_parameter_bytes"] = float((hi - lo) * self.layout.dtype.itemsize)
        return out

    def report_text(self) -> str:
        return "\n".join([super().report_text(), self.staleness.format()])

    def predict_comm_s(self, link: Link) -> float:
        """The pipeline's blocked time on rank 0, plus its stage's push and fetch averaged
        over the steps that carry them."""
        nbytes = self.flat_params.nbytes
        return (super().predict_comm_s(link) + link.message(nbytes) / self.n_push
                + link.message(nbytes) / self.n_fetch)
