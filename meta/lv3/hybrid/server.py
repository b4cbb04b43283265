"""The parameter servers of ``hybrid_downpour``: shards of every stage's parameters, each
piece served to the workers of its stage.

DistBelief's parameter server is sharded, and each partition of a model-parallel replica
"communicates only with the subset of parameter server shards that hold the model parameters
relevant to its partition". ``ShardLayout`` lays the parameters out as one global vector,
stage 0's first (each stage's in its own flat-buffer order), and cuts it into ``servers``
contiguous shards (``flat.shard_bounds``). A server's shard holds one *piece* per stage it
overlaps; the workers of that stage (one per replica) push gradients for, and fetch the values
of, that piece alone, so a stage's messages carry its own parameters only.

Each piece has its own copy of the update rule (a rule with state, Adagrad's accumulators or
momentum, must not move values no gradient came for), its own version count and so its own
staleness. The messages are Downpour's (``shard_server``'s tags; ``DownpourClient`` on the
workers): PUSH, FETCH answered by PARAMS, DONE; then the servers agree on the roster and the
first server of every worker sends it the VERDICT its client waits for. ``share_final`` ends
the run on every rank: each server broadcasts its shard, so every rank holds the servers' model.

>>> layout = ShardLayout([{"w": (2, 3)}, {"v": (4,)}], servers=2, dtype=np.float32)
>>> layout.stage_bounds, layout.shards, layout.route(0), layout.pieces(1)
([(0, 6), (6, 10)], [(0, 5), (5, 10)], [(0, 0, 5), (1, 5, 6)], [(0, 0, 1), (1, 1, 5)])
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from meta.common.component import ComponentError
from meta.lv1.graph import Graph
from meta.lv2.optimizers import GradientTransformation, Optimizer, scale
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link
from meta.lv3.comm.polling import poll_all, poll_any
from meta.lv3.flat import shard_bounds
from meta.lv3.hybrid.grid import ReplicaGrid
from meta.lv3.parameter_server.shard_server import (
    DONE,
    FETCH,
    FINISHED,
    PARAMS,
    PUSH,
    VERDICT,
    Roster,
    StalenessLog,
    say_if_rule_is_split,
)
from meta.lv1.partition import Partition
from meta.lv3.strategy import Strategy
from meta.lv3.timeline import Timeline


class ShardLayout:
    """The stages' parameters as one vector (stage by stage) cut into ``servers`` shards.

    ``stage_shapes[s]``: stage ``s``'s parameter names and shapes in its flat-buffer order.
    """

    def __init__(self, stage_shapes: list[dict[str, tuple[int, ...]]], servers: int,
                 dtype: np.dtype | type) -> None:
        self.stage_shapes, self.dtype = stage_shapes, np.dtype(dtype)
        """``stage_shapes``: each stage's parameters' shapes. ``dtype``: their dtype."""
        sizes = [sum(math.prod(shape) for shape in shapes.values()) for shapes in stage_shapes]
        edges = np.cumsum([0, *sizes]).tolist()
        self.stage_bounds = list(zip(edges[:-1], edges[1:]))
        """Each stage's (start, end) in the concatenation of every stage's parameters."""
        self.total = edges[-1]
        """Values in all stages."""
        self.shards = shard_bounds(self.total, servers)
        """Each server's (start, end) in that concatenation."""

    @classmethod
    def of(cls, graph: Graph, part: Partition, servers: int, strategy: str) -> ShardLayout:
        """The layout of ``graph`` cut by ``part``; refuses a stage without parameters (its
        workers would have nothing to push or fetch) and more servers than values."""
        shapes = []
        for s in range(len(part.stages)):
            params = part.stage_graph(graph, s).parameters
            if not len(params):
                raise ComponentError(f"distributed {strategy!r}: stage {s} "
                                     f"({', '.join(part.stages[s].nodes)}) has no parameters "
                                     f"to push or fetch; name other cuts or fewer stages")
            shapes.append({k: np.shape(v) for k, v in params.items()})
        dtypes = {np.asarray(v).dtype for v in graph.parameters.values()}
        layout = cls(shapes, servers, dtypes.pop() if len(dtypes) == 1 else np.float64)
        if servers > layout.total:
            raise ComponentError(f"distributed {strategy!r}: {servers} servers for "
                                 f"{layout.total} parameters; use at most {layout.total}")
        return layout

    def route(self, stage: int) -> list[tuple[int, int, int]]:
        """(server index, lo, hi) of every piece of ``stage``: [lo, hi) of the stage's buffer."""
        a, b = self.stage_bounds[stage]
        return [(j, max(a, lo) - a, min(b, hi) - a) for j, (lo, hi) in enumerate(self.shards)
                if max(a, lo) < min(b, hi)]

    def pieces(self, server: int) -> list[tuple[int, int, int]]:
        """(stage, lo, hi) of every piece server ``server`` holds: [lo, hi) of its shard."""
        lo, hi = self.shards[server]
        return [(s, max(a, lo) - lo, min(b, hi) - lo) for s, (a, b) in
                enumerate(self.stage_bounds) if max(a, lo) < min(b, hi)]

    def parameters(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` (a graph's initializers) by name in the global order."""
        return {k: arrays[k] for shapes in self.stage_shapes for k in shapes}

    def unpack(self, vector: np.ndarray, arrays: Mapping[str, np.ndarray]) -> None:
        """Copy the global ``vector`` into ``arrays``' own memory (every stage's names)."""
        offset = 0
        for shapes in self.stage_shapes:
            for name, shape in shapes.items():
                size = math.prod(shape)
                np.copyto(arrays[name], vector[offset:offset + size].reshape(shape),
                          casting="same_kind")
                offset += size


class Piece:
    """One stage's values on one server: a view of its shard, the rule's own copy, a version."""

    def __init__(self, stage: int, values: np.ndarray, rule: GradientTransformation) -> None:
        self.stage, self.values, self.updates = stage, values, 0
        """``stage``: the stage it belongs to. ``values``: a view of its values in the shard.
        ``updates``: pushes applied (its version)."""
        self.optimizer = Optimizer(rule, {"piece": values})
        """The update rule's optimizer over ``values``, with its own state."""


class PieceServer:
    """Serve every worker its stage's piece until each has sent DONE. ``served`` holds, per
    worker, (its rank, its index in the roster, its piece); one receive is posted per worker
    (any tag, so a worker's messages are handled in the order it sent them)."""

    def __init__(self, comm: Communicator, served: list[tuple[int, int, Piece]],
                 log: StalenessLog, roster: Roster, timeline: Timeline) -> None:
        self.comm, self.served, self.log, self.roster, self.timeline = (
            comm, served, log, roster, timeline)
        """``comm``: every rank. ``served``: the pieces this server holds. ``log``: the staleness
        log. ``roster``: per worker status. ``timeline``: this rank's timeline."""

    def run(self) -> None:
        comm, t = self.comm, self.timeline
        # Two values at least, as ShardServer's inboxes (a piece may be one value).
        inboxes = [np.empty(max(p.values.size, 2), p.values.dtype) for _, _, p in self.served]
        outboxes = [np.empty_like(p.values) for _, _, p in self.served]
        receives = [comm.irecv(box, w) for box, (w, _, _) in zip(inboxes, self.served)]
        sends: list = [None] * len(self.served)
        answered = [0] * len(self.served)  # the piece's version sent with the last fetch
        active = len(self.served)
        while active:
            t.begin()
            i, tag = poll_any(comm, receives)
            t.lap("communicate")
            rank, worker, piece = self.served[i]
            if tag == DONE:
                self.roster.mark(worker, FINISHED, pushes=self.log.pushes[worker])
                active -= 1
                continue
            if tag == PUSH:
                self.log.record(worker, piece.updates - answered[i])
                piece.optimizer.step({"piece": inboxes[i][:piece.values.size]})
                piece.updates += 1
                t.lap("update")
            elif tag == FETCH:
                poll_all(comm, [sends[i]])  # the previous answer has left the outbox
                np.copyto(outboxes[i], piece.values)
                sends[i] = comm.isend(outboxes[i], rank, PARAMS)
                answered[i] = piece.updates
                t.lap("pack")
            else:
                raise ValueError(f"hybrid_downpour server {comm.rank}: unexpected tag {tag} "
                                 f"from rank {rank}")
            receives[i] = comm.irecv(inboxes[i], rank)
        poll_all(comm, sends)


def share_final(world: Communicator, grid: ReplicaGrid, layout: ShardLayout,
                vector: np.ndarray, log: StalenessLog) -> None:
    """End of the run, a collective over ``world``: each server broadcasts its shard of the
    global ``vector``, so every rank holds the servers' model; staleness counts are summed."""
    for root, (lo, hi) in zip(grid.server_ranks, layout.shards):
        world.bcast(vector[lo:hi], root=root)
    log.merge(world)


def first_server(grid: ReplicaGrid, layout: ShardLayout, rank: int) -> int:
    """The server that sends worker ``rank`` its verdict: the first one its stage talks to."""
    stage = grid.position(rank)[1]
    return grid.server_ranks[layout.route(stage)[0][0]]


class HybridServer(Strategy):
    """A server rank of ``hybrid_downpour``: its shard of the global parameter vector."""

    name = "hybrid_downpour"
    role = "server"
    consistent = False

    def __init__(self, rule: GradientTransformation, world: Communicator,
                 servers_comm: Communicator, graph: Graph, grid: ReplicaGrid,
                 layout: ShardLayout) -> None:
        params = layout.parameters(graph.initializers)
        # The whole vector in one flat buffer the graph reads; its pieces step with their own
        # copies of ``rule``, so the strategy's optimizer is a stateless placeholder.
        super().__init__(Optimizer(scale(1.0), params), servers_comm)
        graph.initializers.update(params)
        self.comm, self.grid, self.layout = world, grid, layout
        """``grid``: the replicas' and stages' ranks. ``layout``: the stages' pieces on the
        servers."""
        self.staleness = StalenessLog(grid.workers)
        """The staleness of the pushes applied, and pushes per worker."""
        self.roster = Roster(grid.worker_ranks)
        """Per worker: status, steps, pushes and silence."""
        index = grid.server_ranks.index(world.rank)
        lo = layout.shards[index][0]
        say_if_rule_is_split("hybrid_downpour", rule,
                             sum(len(layout.pieces(i)) for i in range(len(layout.shards))),
                             index == 0)
        served = []
        for stage, a, b in layout.pieces(index):
            piece = Piece(stage, self.flat_params.buffer[lo + a:lo + b], rule)
            served += [(w, w, piece) for w in (grid.rank_of(r, stage)
                                               for r in range(grid.replicas))]
        self.server = PieceServer(world, served, self.staleness, self.roster, self.timeline)
        """This server rank's pieces and their serving loop."""

    def step(self, grads: dict) -> None:
        raise RuntimeError(f"hybrid_downpour: rank {self.comm.rank} is a server; it does not "
                           f"train")

    def serve(self) -> None:
        """Serve until every worker is done, agree on the roster with the other servers, send
        each worker whose first server this is its verdict, then end the run (collective)."""
        self.server.run()
        poll_all(self.comm, [self.group.iallreduce(self.roster.info, op="max")])
        poll_all(self.comm, [self.comm.isend(self.roster.info, w, VERDICT)
                             for w in self.grid.worker_ranks
                             if first_server(self.grid, self.layout, w) == self.comm.rank])
        share_final(self.comm, self.grid, self.layout, self.flat_params.buffer, self.staleness)

    def report(self) -> dict[str, float]:
        out = super().report()
        out.update(self.staleness.metrics())
        return out

    def predict_comm_s(self, link: Link) -> float:
        """A server only answers: the modelled exchange is the workers' (rank 0 reports)."""
        return 0.0

