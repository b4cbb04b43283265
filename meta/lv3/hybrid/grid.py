"""Data parallelism over pipelined replicas (DistBelief's arrangement): the grid and the base.

DistBelief trains many copies of a model at once, each copy itself partitioned over several
machines. Here a copy (a *replica*) is a pipeline of ``stages`` consecutive ranks, so the world
is a grid: rank ``r * stages + s`` runs stage ``s`` of replica ``r``; the last ``servers`` ranks,
where the strategy has any, are parameter-server shards (``hybrid_downpour``). Keeping a
replica's stages on neighbouring ranks puts rank 0, which prints and exports, on the first stage
of the first replica, and the activations (the heaviest traffic per step) between neighbours.

``ReplicaGrid.split`` cuts the world twice with ``Comm.Split``: a *pipeline* communicator per
replica (its stages in order: activations and their gradients) and a *data* communicator per
stage (stage ``s`` of every replica: ``hybrid_allreduce`` averages gradients there, and both
hybrids sum their metrics there, once per replica). Servers get a communicator of their own
from either split.

``HybridPipeline`` is the pipeline strategy of one replica that also knows the grid: it keeps
each stage's copies' running statistics in agreement, counts what a stage exchanges with the
other replicas or the servers besides its activations, and reports that per stage.

>>> grid = ReplicaGrid(5, stages=2, servers=1, strategy="hybrid_downpour")
>>> [grid.position(r) for r in range(4)], grid.server_ranks, grid.replica(4)
([(0, 0), (0, 1), (1, 0), (1, 1)], [4], (0, 1))
>>> ReplicaGrid(6, stages=2, servers=1, strategy="hybrid_downpour")
Traceback (most recent call last):
...
meta.common.component.ComponentError: distributed 'hybrid_downpour': 5 workers (6 ranks - 1 server) \
cannot make replicas of 2 stages each; run with -n 5 or -n 7 (1 server + a multiple of 2 ranks)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from meta.common import threads as _threads
from meta.common.component import ComponentError
from meta.lv2.optimizers import Optimizer
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.polling import poll_all
from meta.lv3.pipeline.stage import PipelineExecutor
from meta.lv3.pipeline.strategy import Pipeline


@dataclass(frozen=True)
class ReplicaGrid:
    """``size`` ranks as replicas of ``stages`` consecutive ranks, then ``servers`` ranks.

    Pure arithmetic (it can be asked before any collective); refuses, in one line naming the
    numbers, a size that does not make whole replicas.
    """

    size: int
    """Ranks in all."""
    stages: int
    """Pipeline stages per replica."""
    servers: int = 0
    """Ranks after the replicas that serve the parameters (HybridDownpour's); 0: none."""
    strategy: str = "hybrid"
    """The strategy whose grid this is, for messages."""

    def __post_init__(self) -> None:
        if self.stages < 1 or self.servers < 0:
            raise ComponentError(f"distributed {self.strategy!r}: stages must be >= 1 and "
                                 f"servers >= 0, got stages {self.stages}, servers "
                                 f"{self.servers}")
        if self.workers < self.stages or self.workers % self.stages:
            raise ComponentError(self._refusal())

    def _refusal(self) -> str:
        k = self.workers // self.stages
        fits = " or ".join(f"-n {self.servers + self.stages * j}" for j in (k, k + 1) if j >= 1)
        plus = f"{_count(self.servers, 'server')} + " if self.servers else ""
        tail = (f"cannot make replicas of {self.stages} stages each; run with {fits} "
                f"({plus}a multiple of {self.stages} ranks)")
        if not self.servers:
            return f"distributed {self.strategy!r}: {_count(self.size, 'rank')} {tail}"
        return (f"distributed {self.strategy!r}: {_count(self.workers, 'worker')} "
                f"({_count(self.size, 'rank')} - {_count(self.servers, 'server')}) {tail}")

    @property
    def workers(self) -> int:
        return self.size - self.servers

    @property
    def replicas(self) -> int:
        return self.workers // self.stages

    @property
    def worker_ranks(self) -> list[int]:
        return list(range(self.workers))

    @property
    def server_ranks(self) -> list[int]:
        return list(range(self.workers, self.size))

    def is_server(self, rank: int) -> bool:
        return rank >= self.workers

    def position(self, rank: int) -> tuple[int, int]:
        """(replica, stage) of a worker rank."""
        if self.is_server(rank):
            raise ValueError(f"rank {rank} is a server, not a stage of a replica")
        return divmod(rank, self.stages)

    def rank_of(self, replica: int, stage: int) -> int:
        return replica * self.stages + stage

    def replica(self, rank: int) -> tuple[int, int]:
        """(data shard, shards) for ``rank``: a replica's stages all take its shard (each
        feeds what it reads of the batch); servers train on none."""
        return (0, 1) if self.is_server(rank) else (rank // self.stages, self.replicas)

    def split(self, comm: Communicator) -> tuple[Communicator, Communicator]:
        """(pipeline, data) communicators of this rank (collective over ``comm``): its
        replica's stages in order, and its stage in every replica; a server gets the servers'
        communicator from both."""
        if comm.size != self.size:
            raise ValueError(f"ReplicaGrid of {self.size} ranks, communicator of {comm.size}")
        if self.is_server(comm.rank):
            index = comm.rank - self.workers
            return (comm.split(self.replicas, index), comm.split(self.stages, index))
        replica, stage = self.position(comm.rank)
        return comm.split(replica, stage), comm.split(stage, replica)

    def describe(self) -> str:
        servers = ""
        if self.servers:
            ranks = self.server_ranks
            named = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
            servers = f", {self.servers} server{'s' if self.servers > 1 else ''} ({named})"
        return (f"{self.replicas} replicas x {self.stages} stages (replica r on ranks "
                f"r*{self.stages}..r*{self.stages}+{self.stages - 1}){servers}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class HybridPipeline(Pipeline):
    """One replica's pipeline in a grid of them: this rank's stage, plus what it exchanges with
    the same stage elsewhere (subclasses: ``exchange_figures``)."""

    consistent = True

    def __init__(self, optimizer: Optimizer, pipe: PipelineExecutor, grid: ReplicaGrid,
                 world: Communicator, data_comm: Communicator) -> None:
        super().__init__(optimizer, pipe)
        self.grid, self.world = grid, world
        """``grid``: the replicas' and stages' ranks. ``world``: every rank."""
        self.group = data_comm
        """this stage in every replica: metrics are summed over them"""
        self.exchange_bytes = 0
        """sent to other replicas or to the servers, by training steps"""

    @property
    def cores(self) -> int | None:
        """This replica's share of the machine's cores when the ranks oversubscribe it (the
        other replicas and the servers run on the same cores), else None."""
        cores, ranks = _threads.cores(), _threads.local_ranks()
        return max(1, cores * self.pipe.stages // ranks) if ranks > cores else None

    def exchange_figures(self, steps: int) -> dict[str, float]:
        """Per step, this stage's traffic besides activations (names end in _bytes_per_step)."""
        return {"exchange_bytes_per_step": self.exchange_bytes / steps}

    def sync_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Every copy of a stage takes the mean of the copies' running statistics (over the
        data communicator, sleeping while it waits: other stages may still be computing);
        then each stage broadcasts its weights and state through its pipeline."""
        own = {k: v for k, v in state.items() if k in self.pipe.stage_graph.initializers}
        if own and self.group.size > 1:
            dtype = np.result_type(*own.values())
            buffer = np.concatenate([np.asarray(v, dtype).ravel() for v in own.values()])
            poll_all(self.group, [self.group.iallreduce(buffer)])
            buffer *= 1.0 / self.group.size
            self.state_bytes_sent += buffer.nbytes
            offset = 0
            for value in own.values():
                value[...] = buffer[offset:offset + value.size].reshape(value.shape)
                offset += value.size
        self.gather_model()

    def finish(self) -> None:
        """The pipeline's end (whole model, stage measurements), plus every stage's exchange
        figures on every rank of the replica."""
        super().finish()
        steps = max(self.timeline.steps, 1)
        mine = {"activation_bytes_per_step": self.pipe.bytes_sent / steps,
                **self.exchange_figures(steps)}
        rows = self.comm.allgather(np.array(list(mine.values()), np.float64))
        for s, row in enumerate(np.asarray(rows).reshape(self.pipe.stages, len(mine))):
            self.figures.update({f"stage{s}_{k}": float(v) for k, v in zip(mine, row)})
        self.figures.update(replicas=float(self.grid.replicas),
                            servers=float(self.grid.servers))

    def report(self) -> dict[str, float]:
        out = super().report()
        steps = max(self.timeline.steps, 1)
        out["activation_bytes_per_step"] = out["bytes_sent_per_step"]
        out.update(self.exchange_figures(steps))
        out["bytes_sent_per_step"] += self.exchange_bytes / steps
        return out

    def report_text(self) -> str:
        lines = [super().report_text(),
                 f"meta: {self.name}: {self.grid.describe()}; bytes per step by stage:"]
        f = self.figures
        keys = [k[len("stage0_"):] for k in f if k.startswith("stage0_")
                and k.endswith("_bytes_per_step")]
        for s in range(self.pipe.stages):
            parts = ", ".join(f"{k[:-len('_bytes_per_step')].replace('_', ' ')} "
                              f"{f[f'stage{s}_{k}'] / 1e3:.1f} KB" for k in keys)
            lines.append(f"  stage {s}: {parts}")
        return "\n".join(line for line in lines if line)

