"""One performance model per strategy and option: step time, memory per rank, bytes sent.

Compute comes from the workload (measured per-node costs, or the machine's rate);
communication from Level 3's α-β formulas (``meta.lv3.comm.costmodel``: ring allreduce, the
shared-memory exchange, gather + broadcast) and the seeds' (the Deep500 slides: an
allreduce's 2L·log2(P) + 2γmG(P−1)/P, a sharded parameter server's 2L + 2Pγm/s·G); pipelines
are played by the pipeline wing's own simulator (``meta.lv3.pipeline.schedule.simulate``), so
GPipe's bubble (S−1)/(M+S−1) and 1F1B's come out of the same schedules the strategy runs.
The strategies' ``predict_comm_s`` need a live communicator of P ranks; these mirror them
for any P. A collective over ranks of more than one node is costed on the ``inter`` link,
within one node on ``intra``.

Throughput (samples per second over the whole job) ranks the configurations, since they
train different global batches in a step: the table says each one's samples per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from meta.lv3.comm.bf16 import GRAD_BYTES
from meta.lv3.comm.costmodel import Link, gather_bcast, ring_allreduce, shared_reduce
from meta.lv3.comm.polling import POLL_S
from meta.lv3.data_parallel.allreduce import Allreduce
from meta.lv3.pipeline.schedule import schedule, simulate
from meta.planner.async_pattern import DOWNPOUR_PASSES
from meta.planner.machine import Machine
from meta.planner.memory import RECOMPUTE, Memory, rank_memory, zero3_groups
from meta.planner.workload import Layer, Workload

MICRO_BATCHES = (4, 8, 16, 32)
STAGES = (2, 4, 8)
INTERVALS = ((1, 1), (4, 4), (16, 16), (1, 16))  # Downpour's (n_push, n_fetch)
ACCUMULATE_PASSES = 1.0  # a pipeline stage's sum of a micro-batch's gradients, in copies


@dataclass(frozen=True)
class Prediction:
    strategy: str  # the registry's name (distributed: NAME)
    label: str
    sets: dict[str, str]  # the recipe's --set lines that choose it
    ranks: int
    samples: int  # samples per step over the whole job
    step_s: float
    compute_s: float
    comm_s: float
    memory: Memory  # per rank at the step's peak, by part (the busiest rank)
    bytes_sent: float  # per rank per step (the busiest rank)
    fits: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def memory_bytes(self) -> float:
        return self.memory.total

    @property
    def throughput(self) -> float:
        return self.samples / self.step_s if self.step_s > 0 else math.inf


def tree_allreduce(link: Link, p: int, nbytes: float) -> float:
    """The seeds' allreduce (recursive halving and doubling, Rabenseifner): 2 log2(P)
    latencies and the bandwidth term 2(P-1)/P n β."""
    if p < 2:
        return 0.0
    return 2 * math.log2(p) * link.alpha + 2 * (p - 1) / p * nbytes * link.beta


def allreduce_s(machine: Machine, p: int, nbytes: float) -> float:
    """An MPI allreduce of n bytes over p ranks: the faster of ring and tree (MPI picks its
    algorithm by size), on the slowest link the group crosses."""
    link = machine.link(p)
    return min(ring_allreduce(link, p, nbytes), tree_allreduce(link, p, nbytes))


def sharded_server_s(link: Link, workers: int, servers: int, nbytes: float) -> float:
    """The seeds' sharded parameter server: 2L + 2Pγ(m/s)G, every worker's push and fetch of
    its 1/s share queueing at each of the s servers."""
    return 2 * link.alpha + 2 * workers * nbytes / servers * link.beta


def _replica_memory(work: Workload, params: float, act_samples: float,
                    buffers: float = 0.0) -> Memory:
    """Parameters, gradients, optimizer state and the activations a backward keeps."""
    return Memory(params, params, params * work.state_slots,
                  work.activation_bytes * act_samples, buffers)


def _dp_memory(work: Workload, p: int, stage: int, groups: int = 2,
               overlapped: bool = False, extra: float = 0.0) -> Memory:
    """A data-parallel rank's memory (``meta.planner.memory.rank_memory``) for ``work``;
    ``extra``: bytes of buffers besides (bf16 gradients' copy)."""
    m = rank_memory(work.facts, work.param_bytes, work.batch, p, stage, groups,
                    overlapped=overlapped, state_slots=work.state_slots,
                    activation_bytes=work.activation_bytes)
    return replace(m, buffers=m.buffers + extra) if extra else m


BUCKET_BYTES = Allreduce.options["bucket_bytes"].default  # the overlapped buckets' size
# grad_dtype bf16: passes over the float32 gradients' bytes at the copy rate (rounding them to
# bf16, summing this rank's chunk, expanding the result): estimated, not measured
BF16_PASSES = 3.0


def allreduce_costs(work: Workload, machine: Machine, p: int,
                    grad_dtype: str = "f32") -> list[Prediction]:
    """Allreduce, plain and overlapped, and ZeRO-1 in shared memory where the ranks share a
    node. ``grad_dtype`` (the recipe's ``distributed.grad_dtype``): the gradients travel in
    it, ``GRAD_BYTES`` per value (bf16: half the bytes of float32, always through MPI, so no
    shared-memory row)."""
    n = work.param_bytes
    wire = n * GRAD_BYTES[grad_dtype] // 4  # the parameters are float32
    bf16 = grad_dtype != "f32"
    chosen = {"distributed.grad_dtype": grad_dtype} if bf16 else {}
    out = []
    wait = work.sync_s(p)  # the slowest rank's step, beyond the mean
    for overlap in (False, True):
        comm = allreduce_s(machine, p, wire)
        if bf16 and p > 1:
            comm += BF16_PASSES * n * machine.copy_beta
        if overlap:  # buckets are written in place (no packing); the last one goes after
            # the backward and waits for the slowest rank's: neither is ever hidden. The
            # others move during the backward only where MPI progresses on its own: else
            # only inside the tests at each bucket's start (MLP, LeNet-5, GPT: overlapped
            # within 0-5 % of not, measured)
            tail = comm * min(1.0, BUCKET_BYTES / max(n, 1))
            rest = comm - tail
            if machine.progress:
                rest = max(rest - work.backward_s, 0.0)
            comm = tail + rest + wait
            hidden = work.forward_s + work.backward_s + comm + work.extra_s
        else:  # packed into one buffer, scaled by 1/P after (the overlapped backward
            # writes into the buckets, its loss seeded with 1/P)
            comm += (2 * n * machine.copy_beta if p > 1 else 0.0) + wait
            hidden = work.compute_s + comm
        step = hidden + work.update_s
        out.append(Prediction(
            "allreduce", f"allreduce{' overlapped' if overlap else ''}"
                         f"{f' {grad_dtype}' if bf16 else ''}",
            {"distributed": "allreduce", "distributed.overlap": str(overlap).lower(),
             "distributed.shared_memory": "false", **chosen}, p, work.batch * p, step,
            work.compute_s + work.update_s, step - work.compute_s - work.update_s,
            _dp_memory(work, p, 0, overlapped=overlap, extra=wire if bf16 else 0),
            2 * (p - 1) / p * wire if p > 1 else 0))
    if p <= machine.ranks_per_node and not bf16:  # ZeRO-1 in shared memory: one machine only
        comm = shared_reduce(machine.intra, p, n, machine.shared_read_beta) + \
            yielding_wait(work, machine, p)
        update = work.update_s / p
        step = work.compute_s + comm + update
        memory = _dp_memory(work, p, 1)
        out.append(Prediction(
            "allreduce", "allreduce ZeRO-1 (shared memory)",
            {"distributed": "allreduce", "distributed.shared_memory": "true"}, p,
            work.batch * p, step, work.compute_s + update, comm, memory,
            (p - 1) / p * n if p > 1 else 0))
    return out


def reduce_scatter_s(link: Link, p: int, nbytes: float) -> float:
    """A ring reduce-scatter of n bytes over p ranks: P-1 messages of n/P bytes; an
    allgather of n bytes in all costs the same (half a ring allreduce each)."""
    if p < 2:
        return 0.0
    return (p - 1) * link.alpha + (p - 1) / p * nbytes * link.beta


def zero_costs(work: Workload, machine: Machine, p: int) -> list[Prediction]:
    """``zero2`` and ``zero3`` (``meta/lv3/data_parallel/zero.py``, ``zero3.py``), from the
    link model the allreduce's cost uses. ZeRO-2: the gradients reduce-scattered (bucketed,
    during the backward where MPI progresses on its own), each rank's 1/P of the update, the
    parameters all-gathered after it (never hidden: the next forward reads them). ZeRO-3:
    every one of G layer groups all-gathered before its forward and again before its
    backward (2G allgathers of n/G bytes, prefetched while the group before computes where
    MPI progresses), the gradients reduce-scattered group by group. Memory: ``zero_memory``."""
    if p < 2:
        return []
    n, link = work.param_bytes, machine.link(p)
    wait = work.sync_s(p)
    update = work.update_s / p
    half = reduce_scatter_s(link, p, n)  # one reduce-scatter (or allgather) of the model
    scatter = half
    if machine.progress:  # all but the last bucket's under the backward
        tail = half * min(1.0, BUCKET_BYTES / max(n, 1))
        scatter = tail + max(half - tail - work.backward_s, 0.0)
    comm = scatter + half + wait
    out = [Prediction(
        "zero2", "ZeRO-2 (gradients and state sharded)", {"distributed": "zero2"}, p,
        work.batch * p, work.compute_s + update + comm, work.compute_s + update, comm,
        _dp_memory(work, p, 2), 2 * (p - 1) / p * n)]
    groups = zero3_groups(n // 4, len(work.layers))
    gathers = 2 * groups * reduce_scatter_s(link, p, n / groups)  # each group, twice
    scatters = groups * reduce_scatter_s(link, p, n / groups)
    if machine.progress:  # the first group's gather is waited for; the rest prefetched
        first = gathers / (2 * groups)
        gathers = first + max(gathers - first - work.forward_s - work.backward_s, 0.0)
    comm = gathers + scatters + wait
    out.append(Prediction(
        "zero3", f"ZeRO-3 (fully sharded, {groups} layer groups)", {"distributed": "zero3"},
        p, work.batch * p, work.compute_s + update + comm, work.compute_s + update, comm,
        _dp_memory(work, p, 3, groups), 3 * (p - 1) / p * n))
    return out


def yielding_wait(work: Workload, machine: Machine, p: int) -> float:
    """The wait for the slowest rank when the ranks wait by yielding their core, as the
    shared-memory exchange does with more ranks than cores (``NodeExchange``'s polling
    fences): a rank that is done gives its core to the ranks sharing it, so with as many
    ranks on every core a step ends with the slowest core's share of the steps, whose sums
    of p/C steps spread 1/sqrt(p/C) as much, over C cores. Else (fewer ranks than cores, or
    a core with a rank fewer, which idles) the wait of ranks that hold their cores,
    ``sync_s(p)``. Measured on 2 cores: ZeRO-1 at 4 ranks stepped as fast as the ranks
    without any exchange (MLP, LeNet-5, GPT), at 3 ranks 3.5 ms over them."""
    cores = machine.cores_per_node
    if p > cores and p % cores == 0:
        return work.sync_fraction(cores) / math.sqrt(p // cores) * work.compute_s
    return work.sync_s(p)


def averaging_costs(work: Workload, machine: Machine, p: int) -> list[Prediction]:
    """``model_averaging``: local steps, the parameters averaged every k steps (the
    strategy's own ``predict_comm_s``: an allreduce of them over k). The averaging waits for
    the slowest rank's k steps: independent steps' sums spread by sqrt(k) times one step's
    spread, so the wait per step is ``sync_s(p) / sqrt(k)``."""
    if p < 2:
        return []
    n, out = work.param_bytes, []
    for every in (4, 16):
        comm = (allreduce_s(machine, p, n) + 2 * n * machine.copy_beta) / every \
            + work.sync_s(p) / math.sqrt(every)
        step = work.compute_s + work.update_s + comm
        out.append(Prediction(
            "model_averaging", f"model averaging every {every} steps",
            {"distributed": "model_averaging", "distributed.average_every": str(every)}, p,
            work.batch * p, step, work.compute_s + work.update_s, comm,
            _replica_memory(work, n, work.batch, n), 2 * (p - 1) / p * n / every))
    return out


EXACT_QUEUE = 20_000  # clients up to which ``closed_queue`` runs its recursion
_CHUNK = 1 << 14  # terms of ``_finite_source``'s sum summed at once
_NEGLIGIBLE = 40.0  # a term this far below the largest (in log) is left out: e^-40


def closed_queue(workers: int, think_s: float, service_s: float) -> float:
    """Mean value analysis of a closed network (Reiser and Lavenberg): ``workers`` clients
    each away ``think_s``, then queueing at one server that takes ``service_s`` each; the
    mean time a request spends at the server, its own service included. Exact for
    exponential service; the asynchronous parameter server's queue. The recursion takes a
    step per client: beyond ``EXACT_QUEUE`` clients (``meta plan --ranks 1000000000`` must
    answer in seconds) the same model's closed form instead (``_finite_source``)."""
    if workers > EXACT_QUEUE and think_s > 0 and service_s > 0:
        return _finite_source(workers, think_s, service_s)
    queue = response = 0.0
    for k in range(1, workers + 1):
        response = service_s * (1 + queue)
        queue = k / (think_s + response) * response
    return response


def _finite_source(workers: int, think_s: float, service_s: float) -> float:
    """``closed_queue`` from the machine-repairman model's product form. By the arrival
    theorem a request finds the mean queue of the network with one client fewer (N = workers
    - 1), and there i clients are at the server with probability proportional to
    N!/(N-i)! (D/Z)^i; the response is D (1 + that mean). The terms rise to a peak at
    i = N - Z/D and fall away from it: summed (relative to the peak) outward from it, chunk by
    chunk, until they are negligible: a few times sqrt(N) terms at most."""
    n, log_r = workers - 1, math.log(think_s / service_s)
    peak = min(n, max(0, math.floor(n - think_s / service_s)))
    total, weighted = 1.0, float(peak)  # the peak's term, over itself, and i times it
    for step in (1, -1):  # right of the peak, then left of it
        at, level = peak, 0.0
        while 0 <= at + step <= n:
            m = np.arange(at, min(at + _CHUNK, n), dtype=np.float64) if step == 1 else \
                np.arange(at - 1, max(at - 1 - _CHUNK, -1), -1, dtype=np.float64)
            # term(i+1)/term(i) = (N - i)/r: the logs of the terms at m+1 (right), m (left)
            logs = level + step * np.cumsum(np.log(n - m) - log_r)
            terms = np.exp(logs)
            total += float(terms.sum())
            weighted += float((terms * (m + (step == 1))).sum())
            at, level = at + step * len(m), float(logs[-1])
            if logs.max() < -_NEGLIGIBLE:
                break
    return service_s * (1 + weighted / total)


def parameter_server_costs(work: Workload, machine: Machine, p: int) -> list[Prediction]:
    """The consistent server, the asynchronous one and Downpour's configurations. A worker
    of the asynchronous ones with one server steps as measured in that pattern at these
    ranks, when it was (``Workload.as_worker``); otherwise its servers, which wait more than
    they compute, are left out and only the workers share a node's cores."""
    n, link, full = work.param_bytes, machine.link(p), work
    copy = n * machine.copy_beta
    out = []
    comm = gather_bcast(link, p, n) + (2 * copy if p > 1 else 0.0) + work.sync_s(p)
    step = work.compute_s + comm + work.update_s
    out.append(Prediction("parameter_server", "consistent parameter server (rank 0)",
                          {"distributed": "parameter_server"}, p, work.batch * p, step,
                          work.compute_s + work.update_s, comm,
                          _replica_memory(work, n, work.batch, n * (p > 1)),
                          (p - 1) * n if p > 1 else 0))
    if p < 2:
        return out
    workers = p - 1
    link = machine.polled_link(p)  # servers and workers wait by polling
    issue = machine.link(p).alpha  # a worker's call that starts a message
    work = work.as_worker(p, min(workers, machine.ranks_per_node), machine.cores_per_node)
    # a worker: pack, send the gradient, wait for the parameters; the server applies each
    # gradient and copies the parameters out, one worker after another (a closed queue)
    service = work.update_s + copy
    think = work.compute_s + copy + 2 * link.message(n)
    comm = 2 * link.message(n) + closed_queue(workers, think, service)
    out.append(Prediction("async_parameter_server", "asynchronous parameter server (1)",
                          {"distributed": "async_parameter_server"}, p, work.batch * workers,
                          work.compute_s + copy + comm, work.compute_s + copy, comm,
                          _replica_memory(work, n, work.batch).larger(
                              Memory(n, 0.0, n * work.state_slots)),
                          workers * n))
    for servers in sorted({1, 2, 4, 8, 16, 64}):
        if servers >= p:
            break
        w = p - servers
        # one server at the ranks the patterns were measured at: Downpour's own pattern
        pattern = full.measured_pattern(p) if servers == 1 else None
        work = full.as_worker(p if servers == 1 else 0, min(w, machine.ranks_per_node),
                              machine.cores_per_node, overlapped=True)
        for n_push, n_fetch in INTERVALS:
            per_step = 1 / n_push + 1 / n_fetch
            if pattern is None:
                # MPI moves a nonblocking message's bytes inside the calls that test or wait
                # on it (no progress thread): a worker pays its push's and fetch's transfer
                local = work.compute_s + work.update_s + (DOWNPOUR_PASSES + per_step) * copy \
                    + per_step * n * link.beta
                handoffs = 0.0
            else:  # measured: its passes, and its waits for the last push and fetch
                local = work.compute_s + work.update_s \
                    + (DOWNPOUR_PASSES + per_step) * pattern.pass_s
                handoffs = pattern.push_wait_s / n_push + pattern.fetch_wait_s / n_fetch
            # a server, per push: the shard's update; per fetch: its shard copied out
            push_service = work.update_s / servers + copy / servers
            fetch_service = copy / servers
            load = w * (push_service / n_push + fetch_service / n_fetch)  # per worker step
            # a fetch has the next n_fetch steps to come back (nonblocking); what it takes
            # beyond them is waited for, and the servers' work per step bounds the step
            trip = 2 * link.message(n / servers) + closed_queue(
                w, local * n_fetch, push_service * n_fetch / n_push + fetch_service)
            wait = max(max(trip - local * n_fetch, 0.0) / n_fetch, handoffs)
            step = max(local + wait + issue * servers * per_step, load)
            out.append(Prediction(
                "downpour", f"Downpour, {servers} server(s), push/{n_push} fetch/{n_fetch}",
                {"distributed": "downpour", "distributed.servers": str(servers),
                 "distributed.n_push": str(n_push), "distributed.n_fetch": str(n_fetch)},
                p, work.batch * w, step, work.compute_s + work.update_s,
                max(step - work.compute_s - work.update_s, 0.0),
                _replica_memory(work, n, work.batch, 3 * n).larger(
                    Memory(n / servers, 0.0, n / servers * work.state_slots)),
                w * n / servers * (1 / n_push + 1 / n_fetch) if servers else 0))
    return out


def cut(layers: tuple[Layer, ...], stages: int) -> list[list[Layer]]:
    """Contiguous groups of layers with balanced forward+backward time (greedy: a group
    closes once it reaches its share of what is left)."""
    groups: list[list[Layer]] = []
    rest = list(layers)
    for s in range(stages, 0, -1):
        total = sum(x.forward_s + x.backward_s for x in rest)
        target, group, acc = total / s, [], 0.0
        while rest and (len(rest) > s - 1) and (not group or acc + (
                rest[0].forward_s + rest[0].backward_s) / 2 <= target):
            acc += rest[0].forward_s + rest[0].backward_s
            group.append(rest.pop(0))
        groups.append(group)
    return groups


def pipeline_cost(work: Workload, machine: Machine, p: int, stages: int, m: int,
                   sched: str, replicas: int, servers: int = 0) -> Prediction:
    link = machine.link(stages)
    groups = cut(work.layers, stages)
    # a micro-batch's node times: each node's fixed part per call, the rest over M; the step's
    # time no node owns (the executor's own work around each node, copies): its fixed part
    # shared out by the stages' numbers of nodes, the rest by their node time
    f = 1 / m
    owned = work.forward_s + work.backward_s
    rest = (work.extra_s - work.extra_fixed_s) * f
    fwd, bwd = [], []
    for g in groups:
        share = sum(x.forward_s + x.backward_s for x in g) / owned if owned > 0 else 0.0
        nodes = len(g) / len(work.layers)
        fw = sum(x.at(f).forward_s for x in g)
        bw = sum(x.at(f).backward_s for x in g)
        added = work.extra_fixed_s * nodes + rest * share
        fwd.append(fw + added * (fw / (fw + bw) if fw + bw > 0 else 0.5))
        # a stage sums each micro-batch's gradients into its accumulators (``PipelineStage``:
        # ``grads[p] += g[p]``): a pass over its parameters per backward, about a copy's
        # time (three streams of memory the caches mostly hold); without it the pipelines
        # of 2 stages were predicted 7-15 % fast
        bwd.append(bw + added * (bw / (fw + bw) if fw + bw > 0 else 0.5)
                   + ACCUMULATE_PASSES * sum(x.param_bytes for x in g) * machine.copy_beta)
    edge = [g[-1].activation_bytes * work.batch / m if g else 0 for g in groups[:-1]]
    act = [link.message(b) for b in edge]
    plans = [schedule(sched, s, stages, m) for s in range(stages)]
    sim = simulate(plans, fwd, bwd, act, act)
    notes = [f"bubble {sim.bubble:.3f}"]
    sim_s = sim.step_s
    cores = machine.cores_per_node if machine.cores_per_node < stages <= \
        machine.ranks_per_node else None
    if cores:
        # more stages than cores on one node (the validation's 4 stages on 2 cores): the
        # times above are the calibration's, every rank stepping at once, as if every stage
        # always shared the cores (an upper bound: 4 stages were measured 2-31 % faster).
        # Stages that take turns, each operation at a core's speed and a polled message half
        # a poll late (``PipelineStrategy.simulated``), are a lower bound (19-34 % slower
        # measured: a stage woken between computing ones waits for a core, which neither
        # holds). The step is taken midway, both bounds noted
        factor = work.slowdown(cores, cores)  # as many ranks computing as cores
        late = [a + POLL_S / 2 for a in act]
        turns = simulate(plans, [x * factor for x in fwd], [x * factor for x in bwd], late,
                         late, cores).step_s
        sim_s = (turns + sim.step_s) / 2
        notes.append(f"stages take turns on {cores} cores: {turns * 1e3:.2f}-"
                     f"{sim.step_s * 1e3:.2f} ms")
    stage_params = [sum(x.param_bytes for x in g) for g in groups]
    update = work.update_s * max(stage_params) / max(work.param_bytes, 1)
    compute = max(fw + bw for fw, bw in zip(fwd, bwd)) * m
    stored = [m if sched == "gpipe" else min(m, stages - s) for s in range(stages)]
    memory = max((Memory(sp, sp, sp * work.state_slots, sum(x.activation_bytes for x in g)
                         * work.batch / m * k)
                  for sp, g, k in zip(stage_params, groups, stored)), key=lambda x: x.total)
    sent = max(2 * sum(edge), 0)
    comm = sim_s - compute
    sets = {"distributed": "pipeline", "distributed.stages": str(stages),
            "distributed.micro_batches": str(m), "distributed.schedule": sched}
    label = f"pipeline {stages} stages x {m} micro-batches, {sched}"
    # the stages meet at every micro-batch's hand-over: a step ends with its slowest stage,
    # whose step's work is the busiest stage's (``compute``), not the whole network's: the
    # measured steps' relative spread applies to that (as a fraction, as in allreduce)
    step = sim_s + update + work.sync_fraction(stages) * compute
    samples = work.batch
    if replicas > 1 and servers == 0:
        grads = allreduce_s(machine, p, max(stage_params)) + work.sync_s(replicas)
        step += grads
        comm += grads
        sent += 2 * max(stage_params)
        sets["distributed"] = "hybrid_allreduce"
        label = f"hybrid: {replicas} x {label}, allreduce"
        samples = work.batch * replicas
    elif servers:
        n = work.param_bytes
        queue = sharded_server_s(machine.link(p), replicas, servers, n)
        step = max(step, queue)
        comm = step - compute - update
        sent += 2 * max(stage_params)
        sets.update({"distributed": "hybrid_downpour", "distributed.servers": str(servers)})
        label = f"hybrid: {replicas} x {label}, Downpour {servers} server(s)"
        samples = work.batch * replicas
    return Prediction(sets["distributed"], label, sets, p, samples, step, compute + update,
                      max(comm, 0.0), memory, sent, notes=tuple(notes))


def pipeline_costs(work: Workload, machine: Machine, p: int) -> list[Prediction]:
    weighted = sum(1 for x in work.layers if x.param_bytes)
    out = []
    for stages in STAGES:
        if stages > weighted or stages > p or p % stages:
            continue
        replicas = p // stages
        for m in MICRO_BATCHES:
            if m > work.batch:
                continue
            for sched in ("gpipe", "1f1b"):
                out.append(pipeline_cost(work, machine, p, stages, m, sched, replicas))
            if replicas > 2:  # the servers take ranks of their own: a replica fewer
                servers = max(1, replicas // 16)
                trained = (p - servers) // stages
                out.append(pipeline_cost(work, machine, p, stages, m, "1f1b", trained,
                                          servers))
    return out


WEIGHT_GRADIENT_SHARE = 0.5  # of a matrix product's backward: dW = x^T dy, as many
# multiply-adds as dX = dy W^T


def tensor_parallel_costs(work: Workload, machine: Machine, p: int) -> list[Prediction]:
    """``partitioned``: every rank takes the whole batch and runs its share of each node as
    the strategy's plan splits the graph (``Workload.partitioned``: Megatron's pairs, attention
    by heads; each allreduce the plan makes); where that plan is not known, every weighted
    layer split 1/P in pairs, one allreduce of a pair's output forward and one backward."""
    if p < 2 or p > 64:
        return []
    shape = work.partitioned(p) if work.partitioned is not None else None
    notes: tuple[str, ...] = ()
    if shape is not None:
        # the strategy's own plan (``step_shape``): each node at the share the busiest rank
        # runs (attention split by heads, LayerNorms and embeddings whole), each allreduce
        # the plan makes once, the update of the parameters that rank holds
        compute = sum((x.forward_s + x.backward_s) * shape.shares.get(x.name, 1.0)
                      for x in work.layers)
        # a ring allreduce sends 2(P-1)/P of its buffer, a reduce-scatter or all-gather half
        sent = sum((1 if half else 2) * (p - 1) / p * v for v, half in shape.volumes(work.batch))
        comm, hidden = _partitioned_comm(work, machine, p, shape)
        # the ranks meet at every allreduce: each waits for the other's lateness over the
        # work since the last one, the measured steps' relative spread of this rank's compute
        # (not of the whole graph's, which no rank runs)
        comm += work.sync_fraction(p) * compute
        compute += work.update_s * shape.held_fraction
        notes = (f"overlap hides {hidden * 1e3:.2f} ms",)  # backward allreduces behind dW
    else:  # by layer kind: every weighted layer split, pairs of them, one allreduce each way
        gemms = [x for x in work.layers if x.param_bytes]
        compute = sum(x.forward_s + x.backward_s for x in gemms) / p + sum(
            x.forward_s + x.backward_s for x in work.layers if not x.param_bytes)
        volume = [2 * x.activation_bytes * work.batch for x in gemms[1::2]]
        comm = sum(allreduce_s(machine, p, v / 2) * 2 for v in volume) + work.sync_s(p)
        compute += work.update_s / p
        sent = sum(2 * (p - 1) / p * v for v in volume)
    compute += work.extra_s
    n = work.param_bytes
    memory = Memory(n / p, n / p, n / p * work.state_slots, work.activation_bytes * work.batch)
    return [Prediction("partitioned", f"tensor parallel over {p} ranks",
                       {"distributed": "partitioned"}, p, work.batch, compute + comm, compute,
                       comm, memory, sent, notes=notes)]


def _partitioned_comm(work: Workload, machine: Machine, p: int,
                      shape: Any) -> tuple[float, float]:
    """(seconds of the plan's allreduces a step waits for, seconds the overlap hides):
    ``StepShape.waited`` with this machine's allreduce, its bandwidth term as the floor
    unless MPI has a progress thread (``Machine.progress``), and each column layer's weight
    gradient (half of its backward) at the share this rank runs."""
    layers = {x.name: x for x in work.layers}
    link = machine.link(p)

    def cover(name: str) -> float:
        layer = layers.get(name)
        return layer.backward_s * shape.shares.get(name, 1.0) * WEIGHT_GRADIENT_SHARE \
            if layer is not None else 0.0

    return shape.waited(work.batch, lambda v: allreduce_s(machine, p, v),
                        lambda v: 0.0 if machine.progress else 2 * (p - 1) / p * v * link.beta,
                        cover)


def recompute_costs(work: Workload, predictions: list[Prediction]) -> list[Prediction]:
    """The data-parallel configurations again with the planned executor's activation
    recomputation (``recompute=blocks``, ``meta.lv1.plan.recompute``), where the recipe's
    executor takes it: the activations its segmented step holds (``StepFacts.recomputed``:
    one segment's working set, the segments' inputs, under a gradient hook the segments'
    own gradients; ZeRO-3 recomputes its own layer groups: ``StepFacts.zero3_recompute``),
    and one more forward of every segment but the last (about the whole forward) in each
    step."""
    facts = work.facts
    if facts is None or facts.recompute is None:
        return []
    out = []
    for pr in predictions:
        if pr.strategy not in ("allreduce", "zero2", "zero3") or "recompute" in pr.sets:
            continue
        if pr.strategy == "zero3":  # its own recompute: its layer groups are the segments
            if facts.zero3_recompute is None:
                continue
            fixed, per = facts.zero3_recompute
            act = max(0.0, fixed + per * work.batch)
        else:
            hooked = pr.sets.get("distributed.overlap") != "false"  # all but plain allreduce
            act = facts.recomputed(work.batch, work.param_bytes, hooked)
        out.append(replace(
            pr, label=f"{pr.label} + recompute {RECOMPUTE}",
            sets={**pr.sets, "recompute": RECOMPUTE}, step_s=pr.step_s + work.forward_s,
            compute_s=pr.compute_s + work.forward_s,
            memory=replace(pr.memory, activations=act)))
    return out


def predict_all(work: Workload, machine: Machine, p: int,
                grad_dtype: str = "f32") -> list[Prediction]:
    """Every configuration at P ranks (``grad_dtype``: the type allreduce's gradients travel
    in, as the recipe sets it)."""
    machine = machine.sized(p)
    out = allreduce_costs(work, machine, p, grad_dtype) + zero_costs(work, machine, p)
    out += averaging_costs(work, machine, p)
    out += parameter_server_costs(work, machine, p)
    out += pipeline_costs(work, machine, p) + tensor_parallel_costs(work, machine, p)
    out += recompute_costs(work, out)
    # the process's own resident bytes beyond its arrays: every rank of every row has them
    runtime = work.facts.runtime if work.facts is not None else 0.0
    out = [replace(pr, memory=replace(pr.memory, runtime=runtime)) for pr in out]
    return [pr if pr.memory_bytes <= machine.memory_bytes else
            Prediction(**{**pr.__dict__, "fits": False}) for pr in out]


def rank_configurations(work: Workload, machine: Machine, p: int,
                        grad_dtype: str = "f32") -> list[Prediction]:
    """Every configuration at P ranks, fastest (samples/s) first; those that do not fit in a
    rank's memory last."""
    return sorted(predict_all(work, machine, p, grad_dtype),
                  key=lambda x: (not x.fits, -x.throughput))


def grad_dtype_of(recipe: Any) -> str:
    """The type the recipe's allreduce sends gradients in (``distributed.grad_dtype``):
    "f32" unless it chose allreduce with another."""
    choice = recipe.definitions.choices.get("distributed")
    if choice is None or choice.name != "allreduce":
        return "f32"
    return str(choice.values().get("grad_dtype", "f32"))


def within_memory(predictions: list[Prediction], limit_bytes: float
                  ) -> tuple[list[Prediction], list[Prediction]]:
    """``predictions`` split into those whose memory per rank fits ``limit_bytes`` (``meta
    plan --memory``), in their order, and those that do not."""
    kept = [pr for pr in predictions if pr.memory_bytes <= limit_bytes]
    return kept, [pr for pr in predictions if pr.memory_bytes > limit_bytes]
