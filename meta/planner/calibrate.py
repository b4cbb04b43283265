"""``meta plan --calibrate``: measure this machine for the planner.

Two things are measured. (1) A recipe's step on one rank: a few training steps of its network
on its executor with the executor's profiling on (the reference and planned executors record
every node's forward and backward time), plus the optimizer's update, timed apart. (2) Under
``mpiexec -n 2`` (or more), the link between two ranks of this node: ping-pongs for α and β
(``measure_link``) and blocking allreduces of the recipe's gradient size read back through the
ring formula (``measure_allreduce``), the larger of the two fits kept, since the strategies
send both kinds of message. Without MPI (one process) the links stay the cost model's
defaults and the written file says so. Ranks on several nodes (MPI's shared-memory groups)
also measure the link between nodes: a ping-pong between two nodes' first ranks, and the
allreduce over all ranks, which crosses it. On one host, groups of ranks with shared memory
switched off between them emulate nodes (``benchmarks/planner_validation.py --two-nodes``);
they share the host's cores. On one node ``inter`` stays the default or what the user typed.
(3) With a recipe under MPI, the asynchronous strategies' patterns, the same training step as
the workers' work (``meta.planner.async_pattern``): a worker's step in each, its waits, and
the polled link of its exchanges with a server (``polled``), which replaces the polled
ping-pong that a calibration without a recipe measures.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable, TextIO

import numpy as np

from meta.lv2 import build_optimizer
from meta.lv3 import world
from meta.lv3.comm.costmodel import Link, measure_allreduce, measure_link, measure_shared_reads
from meta.lv3.comm.shared_memory import node_of
from meta.lv3.flat import FlatBuffer
from meta.planner.async_pattern import measure_async_pattern
from meta.planner.machine import GIB, Machine, RecipeCosts
from meta.planner.workload import build_network, feeds_for, graph_signature
from meta.run.recipe import Recipe

# two groups of ranks as two nodes on one host, for MPICH (with its UCX network module, the
# wheel's): shared memory only within each group (even and odd ranks), and what crosses
# between them through the TCP stack, as between two machines
TWO_NODES_ENV = {"MPIR_CVAR_NUM_CLIQUES": "2", "UCX_TLS": "tcp,self"}
CACHE_FLUSH_BYTES = 64 << 20  # more than a node's last-level cache
ONE_OFF = 3.0  # a step this many times the median is a one-time cost, not the step's
REPEATS = 3  # rounds of the step measured apart: their spread says how far to trust it
SPREAD_LIMIT = 0.25  # rounds further apart than this share of the median: unreliable
LOAD_LIMIT = 0.5  # other work beyond this share of the cores while measuring: unreliable
CPU_LIMIT = 0.7  # a CPU for less than this share of its due while measuring: unreliable
UNRELIABLE_NOTE = "calibration unreliable"  # in a machine's source: meta plan warns again


@dataclass
class TrainingStep:
    """A recipe's network on its executor (profiling on where it has it) with its optimizer,
    built once: the recipe's measurement and the asynchronous pattern step the same one."""

    graph: Any
    train: Any
    executor: Any
    optimizer: Any
    batch: int

    @classmethod
    def build(cls, recipe: Recipe, profile: bool = True) -> TrainingStep:
        """As ``meta run`` builds it; ``profile``: the executor's per-node timing on, where it
        has it (the calibration's; a measured run leaves it off)."""
        d = recipe.definitions
        graph, train = build_network(recipe)
        choice = d.choices["executor"]
        options = dict(choice.options)
        if profile and "profile" in choice.component.options:
            options["profile"] = True
        executor = choice.component.build(graph, **options)
        executor.train(True)
        opt = d.choices["optimizer"]
        optimizer = build_optimizer(opt.component, opt.options, graph.parameters, 1000, 1)
        return cls(graph, train, executor, optimizer, int(d.batch_size))

    def feeds(self, batch: int) -> dict:
        return feeds_for(self.graph, self.train, batch)

    def flat_update(self) -> Callable[[np.ndarray], np.ndarray]:
        """The optimizer as a server applies it: a flat gradient in, the flat parameters
        out. At its first call the parameters move into one buffer (a server's own training
        is over by then)."""
        flat: list[FlatBuffer] = []

        def update(grads: np.ndarray) -> np.ndarray:
            if not flat:
                flat.append(FlatBuffer.adopt(self.optimizer.params))
            params = flat[0]
            self.optimizer.step(FlatBuffer(params.shapes, params.dtype, grads).views)
            return params.buffer
        return update

    def runner(self) -> Callable[[], None]:
        """One training step at the recipe's batch: forward, backward and the update."""
        feeds = self.feeds(self.batch)

        def run() -> None:
            _values, grads = self.executor.inference_and_backprop(feeds)
            self.optimizer.step(grads)
        return run


def measure_recipe(recipe: Recipe, steps: int = 5, warmup: int = 2,
                   comm: Any = None, built: TrainingStep | None = None,
                   repeats: int = REPEATS) -> RecipeCosts:
    """``measure_step``'s costs, without the conditions it measured them under."""
    return measure_step(recipe, steps, warmup, comm, built, repeats)[0]


def measure_step(recipe: Recipe, steps: int = 5, warmup: int = 2, comm: Any = None,
                 built: TrainingStep | None = None,
                 repeats: int = REPEATS) -> tuple[RecipeCosts, Conditions]:
    """Per-node forward/backward seconds and step seconds of ``repeats`` rounds of ``steps``
    training steps at the recipe's batch size, after ``warmup`` steps (plans compiled, caches
    warm), and the conditions they were measured under (``Conditions``: the rounds' steps,
    the load, this process's share of a CPU). A node's figure is its median over the steps
    (and the rounds); the step's is the median of the rounds' means: a round's mean is what a
    run of many steps takes (the fastest step predicted a run 30 % too fast on this shared
    machine, the median 10-15 %: benchmarks/planner_validation.py), and the median round leaves
    out a round that other work on the machine slowed (one sample of a shared machine gave
    81.5, 10.3 and 370 ms for the same step within 40 minutes: issue 45). The steps' spread
    around it is kept for the wait of a synchronous step on its slowest rank
    (``step_spread``). The same at an eighth of the batch fits each figure as a fixed time
    per call plus a part linear in the batch: a pipeline's micro-batch of 16 samples costs
    more than an eighth of 128 (mnist_pipeline's were predicted 45-69 % fast without it).
    Under ``comm`` (collective: every rank measures at once, sharing the cores as in
    training) the step's mean and spread are every rank's steps pooled. ``built``: the step
    to time (else built here)."""
    built = built or TrainingStep.build(recipe)
    graph, executor, optimizer = built.graph, built.executor, built.optimizer
    choice = recipe.definitions.choices["executor"]
    big = built.batch
    small = max(1, big // 8)
    ranks = comm.size if comm is not None else 1
    load_before = _load()
    wall, cpu = time.perf_counter(), time.process_time()
    rounds: list[float] = []
    pooled: list[float] = []
    fwds, bwds, updates = [], [], []
    profiled = True
    for r in range(max(1, repeats)):
        f, b, steps_s, u, prof = _timed(graph, executor, optimizer, built.feeds(big), steps,
                                        warmup if r == 0 else 0)
        steps_s = _pooled(_without_one_offs(steps_s), comm)
        rounds.append(float(np.mean(steps_s)))
        pooled += steps_s
        fwds.append(f)
        bwds.append(b)
        updates.append(u)
        profiled = profiled and prof
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    conditions = Conditions(tuple(rounds), steps, (load_before, _load()),
                            cpu / wall if wall > 0 else 1.0, os.cpu_count() or 1,
                            _ranks_here(comm))
    fwd = {k: float(np.median([f[k] for f in fwds])) for k in fwds[0]}
    bwd = {k: float(np.median([b[k] for b in bwds])) for k in bwds[0]}
    update = float(np.median(updates))
    step = float(np.median(rounds))
    spread = (synchronized_spread(built.runner(), comm, steps, warmup) if ranks > 1 else
              tuple(round(float(x) / step, 4) for x in pooled))
    if not profiled:  # an executor without profiling: the whole step, on the nodes by size
        sizes = {n.name: sum(graph.parameters[x].size for x in n.inputs
                             if x in graph.parameters) for n in graph.nodes}
        total = sum(sizes.values()) or 1
        fwd = {k: (step - update) / 3 * v / total for k, v in sizes.items()}
        bwd = {k: 2 * x for k, x in fwd.items()}
    fixed_f: dict[str, float] = {}
    fixed_b: dict[str, float] = {}
    extra_fixed = 0.0
    if small < big and profiled:
        f2, b2, steps2, update2, _ = _timed(graph, executor, optimizer,
                                            built.feeds(small), steps, warmup)
        step2 = float(np.mean(_pooled(_without_one_offs(steps2), comm)))
        fixed_f = {k: _intercept(f2.get(k, 0.0), v, small, big) for k, v in fwd.items()}
        fixed_b = {k: _intercept(b2.get(k, 0.0), v, small, big) for k, v in bwd.items()}
        extra = max(step - update - sum(fwd.values()) - sum(bwd.values()), 0.0)
        extra2 = max(step2 - update2 - sum(f2.values()) - sum(b2.values()), 0.0)
        extra_fixed = _intercept(extra2, extra, small, big)
    return RecipeCosts(graph_signature(graph), choice.name, big, fwd, bwd, step, update,
                       fixed_f, fixed_b, extra_fixed, spread, ranks), conditions


@dataclass(frozen=True)
class Conditions:
    """What a calibration's step was measured under, and whether its figures can be trusted:
    the repeated rounds' mean steps (their spread: what another calibration would likely
    find), the 1-minute load average before and after (other work on the machine), and this
    process's CPU seconds over the wall seconds it measured in (below its share of the
    cores: it waited for a CPU that other work held). A plan is only as good as its step
    time: an MLP's 64-rank advice flipped between three calibrations (issue 45)."""

    rounds_s: tuple[float, ...]  # each round's mean step, seconds
    steps: int  # steps in a round
    load: tuple[float | None, float | None]  # load average before, after (None: unknown)
    cpu_share: float  # process CPU seconds over wall seconds while measuring
    cores: int
    ranks_here: int = 1  # this calibration's ranks on this node (each a CPU's worth of load)

    @property
    def step_s(self) -> float:
        """The median round's mean step, which the calibration keeps."""
        return float(np.median(self.rounds_s))

    @property
    def spread(self) -> float:
        """(slowest round - fastest round) / the median round: 0 for a steady machine."""
        return (max(self.rounds_s) - min(self.rounds_s)) / self.step_s if self.step_s else 0.0

    @property
    def other_load(self) -> float | None:
        """The load average beyond this calibration's own ranks (the larger of before and
        after), or None where the platform has no load average."""
        known = [x for x in self.load if x is not None]
        return max(max(known) - self.ranks_here, 0.0) if known else None

    @property
    def expected_cpu_share(self) -> float:
        """A rank's share of a CPU when only this calibration runs: 1, or less where its
        ranks outnumber the cores."""
        return min(1.0, self.cores / max(self.ranks_here, 1))

    def warnings(self) -> list[str]:
        """Why the fit is unreliable, one sentence each (empty: nothing seen)."""
        out = []
        ms = ", ".join(f"{x * 1e3:.3g}" for x in self.rounds_s)
        if len(self.rounds_s) > 1 and self.spread > SPREAD_LIMIT:
            out.append(f"the step's {len(self.rounds_s)} rounds of {self.steps} steps took "
                       f"{ms} ms: a spread of {self.spread * 100:.0f} % of the median "
                       f"{self.step_s * 1e3:.3g} ms (over {SPREAD_LIMIT * 100:.0f} %)")
        other = self.other_load
        if other is not None and other > LOAD_LIMIT * self.cores:
            out.append(f"other work loaded the machine: load average {other:.1f} beyond this "
                       f"calibration's {self.ranks_here} rank(s) on {self.cores} cores")
        if self.cpu_share < CPU_LIMIT * self.expected_cpu_share:
            out.append(f"this process had a CPU for {self.cpu_share * 100:.0f} % of the time "
                       f"it measured (expected {self.expected_cpu_share * 100:.0f} %): other "
                       f"work held the cores")
        return out

    def __str__(self) -> str:
        load = "unknown" if self.other_load is None else \
            " to ".join(f"{x:.2f}" for x in self.load if x is not None)
        return (f"step over {len(self.rounds_s)} rounds of {self.steps} steps: "
                + ", ".join(f"{x * 1e3:.3f}" for x in self.rounds_s)
                + f" ms (spread {self.spread * 100:.0f} % of the median); load average "
                f"{load} on {self.cores} cores; CPU {self.cpu_share * 100:.0f} % of the wall "
                f"time")


def _load() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _ranks_here(comm: Any) -> int:
    """This calibration's ranks on this node (1 without MPI)."""
    if comm is None or comm.size < 2:
        return 1
    node = node_of(comm)
    return node.size if node is not None else 1


def synchronized_spread(run: Callable[[], None], comm: Any, steps: int,
                        warmup: int) -> tuple[float, ...]:
    """Each rank's step over the mean of the ranks' same step, pooled (collective): the
    ranks step together as a synchronous strategy makes them (a barrier before each step),
    so what slows every rank at once (a slow spell of the host, the cores' clock) cancels
    and only what makes one rank late is left, which is what a synchronous step waits for.
    Ranks stepping freely spread far more: a 16-core Xeon's GPT steps, pooled over 8 such
    ranks, predicted a wait of 59 % of the step against 10 % measured."""
    mine = []
    for i in range(warmup + steps):
        comm.barrier()
        start = time.perf_counter()
        run()
        if i >= warmup:
            mine.append(time.perf_counter() - start)
    table = np.array(comm.bcast_obj(comm.gather_obj(mine)))  # ranks x steps, begun together
    means = table.mean(axis=0)
    keep = means <= ONE_OFF * float(np.median(means))  # a step all ranks found slow: one-off
    return tuple(round(float(x), 4) for x in (table[:, keep] / means[keep]).ravel())


def _pooled(steps: list[float], comm: Any) -> list[float]:
    """Every rank's steps (collective), or these without MPI: the ranks' counts differ once
    one-offs are left out."""
    if comm is None or comm.size < 2:
        return steps
    gathered = comm.gather_obj(steps)
    return comm.bcast_obj([x for mine in gathered or [] for x in mine])


def _without_one_offs(steps: list[float]) -> list[float]:
    """The steps less those over ``ONE_OFF`` times their median: a one-time cost (a plan
    compiled for a new shape, a collection of the garbage a first step left) that a run of
    many steps amortises, but that moves the mean of a calibration's 20 steps by half (the
    GPT's mean at 2 ranks was 130 ms against 76 measured in the run)."""
    limit = ONE_OFF * float(np.median(steps))
    return [x for x in steps if x <= limit]


def _intercept(t_small: float, t_big: float, small: int, big: int) -> float:
    """The time at batch 0 of the line through two measurements, kept within [0, t_big]."""
    slope = (t_big - t_small) / (big - small)
    return float(min(max(t_big - slope * big, 0.0), t_big))


def _timed(graph: Any, executor: Any, optimizer: Any, feeds: dict, steps: int,
           warmup: int) -> tuple[dict[str, float], dict[str, float], list[float], float, bool]:
    """Median per-node forward and backward seconds, every step's seconds and the median
    update seconds over ``steps``."""
    fwd: dict[str, list[float]] = defaultdict(list)
    bwd: dict[str, list[float]] = defaultdict(list)
    step_s, update_s = [], []
    profiled = hasattr(executor, "records")
    for i in range(warmup + steps):
        if profiled:
            executor.reset_profile()
        start = time.perf_counter()
        _values, grads = executor.inference_and_backprop(feeds)
        middle = time.perf_counter()
        optimizer.step(grads)
        end = time.perf_counter()
        if i < warmup:
            continue
        step_s.append(end - start)
        update_s.append(end - middle)
        if profiled:
            f: dict[str, float] = defaultdict(float)
            b: dict[str, float] = defaultdict(float)
            for node, _op, phase, ns in executor.records:
                (f if phase == "forward" else b)[node] += ns / 1e9
            for n in graph.nodes:
                fwd[n.name].append(f.get(n.name, 0.0))
                bwd[n.name].append(b.get(n.name, 0.0))
    profiled = profiled and any(any(v) for v in fwd.values())
    return ({k: float(np.median(v)) for k, v in fwd.items()},
            {k: float(np.median(v)) for k, v in bwd.items()},
            step_s, float(np.median(update_s)), profiled)


@dataclass(frozen=True)
class Layout:
    """How MPI placed the ranks: each node's ranks (MPI's shared-memory groups), and whether
    they all run on one host (several groups on one host: nodes emulated, e.g. MPICH's
    ``MPIR_CVAR_NUM_CLIQUES``, which share the host's cores)."""

    nodes: tuple[tuple[int, ...], ...]
    one_host: bool

    @property
    def ranks_per_node(self) -> int:
        return max(len(n) for n in self.nodes)


def layout_of(comm: Any) -> Layout:
    """The nodes of ``comm``'s ranks (collective); one node of one rank without MPI."""
    if comm.size < 2:
        return Layout(((0,),), True)
    node = node_of(comm)
    leader = comm.rank if node is None else node.bcast_obj(comm.rank)
    seen = comm.gather_obj((leader, comm.rank, os.uname().nodename))
    groups: dict[int, list[int]] = defaultdict(list)
    for lead, rank, _host in seen or []:
        groups[lead].append(rank)
    layout = Layout(tuple(tuple(sorted(g)) for _, g in sorted(groups.items())),
                    len({host for *_, host in seen or []}) == 1)
    return comm.bcast_obj(layout)


def measure_links(comm: Any, grad_bytes: int, layout: Layout,
                  polled: Link | None = None) -> tuple[Link, Link | None, Link | None, str]:
    """The link between two ranks of a node, the link between two nodes (None on one node)
    and a node's polled waits' link, or the default and Nones with the reason (one
    process). The allreduce fit over all ranks goes with the slowest link it crosses.
    ``polled``: already measured (the asynchronous pattern's exchange); else a polled
    ping-pong within a node, the other ranks waiting."""
    if comm.size < 2:
        return Machine().intra, None, None, "links: the cost model's defaults (no MPI: run " \
            "under mpiexec -n 2 to measure them)"
    sizes = sorted({4096, max(grad_bytes // 4, 8192), max(grad_bytes, 16384)})
    ring = measure_allreduce(comm, sizes)
    within = next((n[:2] for n in layout.nodes if len(n) > 1), None)
    polled_how = (f"polled exchange {polled} (asynchronous pattern)" if polled is not None
                  else "polled: not measured, one rank a node")
    if within is not None:
        ping = measure_link(comm, pair=within)
        if polled is None:
            polled = measure_link(comm, (4096, max(grad_bytes, 16384)), repeats=10,
                                  polled=True, pair=within)
            polled_how = f"polled ping-pong {polled}"
    how = f"links measured with {comm.size} ranks"
    if len(layout.nodes) == 1:
        intra = Link(max(ping.alpha, ring.alpha), max(ping.beta, ring.beta))
        return intra, None, polled, f"{how} (ping-pong {ping}; allreduce {ring}; {polled_how})"
    across = measure_link(comm, pair=(layout.nodes[0][0], layout.nodes[1][0]))
    inter = Link(max(across.alpha, ring.alpha), max(across.beta, ring.beta))
    intra = ping if within is not None else Machine().intra
    return intra, inter, polled, f"{how} on {len(layout.nodes)} nodes" + (
        " (emulated on one host)" if layout.one_host else "") + \
        f" (within a node: ping-pong {intra if within else 'not measured, one rank a node'};" \
        f" between nodes: ping-pong {across}, allreduce {ring}; {polled_how})"


def calibrate(recipe: Recipe | None, base: Machine | None = None, comm: Any = None,
              steps: int = 5, stream: TextIO | None = None,
              repeats: int = REPEATS) -> Machine:
    """This machine measured: ranks per node (the CPUs), memory, the intra-node link, the
    compute and copy rates and the recipe's step costs. Given ``base`` (a described cluster
    whose nodes are like this one), only the compute figures and the recipe's costs are
    added to it; its shape, memory and links stay as described. Collective over ``comm``:
    every rank calls it. The step is measured in ``repeats`` rounds; where their spread, the
    load or the CPU share say the figures cannot be trusted (``Conditions.warnings``), a
    warning line each goes to ``stream`` and the machine's source says ``UNRELIABLE_NOTE``
    with the reasons in brackets, which ``meta plan`` repeats when it plans with it."""
    comm = comm if comm is not None else world()
    described = base is not None
    base = base or Machine(name=os.uname().nodename)
    cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / cores
    except (ValueError, OSError):
        memory = 4 * GIB
    costs = dict(base.costs)
    grad_bytes = 1 << 20
    notes = []
    unreliable: list[str] = []
    pattern = None
    if recipe is not None:
        built = TrainingStep.build(recipe)
        measured, conditions = measure_step(recipe, steps=steps, comm=comm, built=built,
                                            repeats=repeats)
        notes.append(f"{recipe.name} measured on {measured.executor}: step "
                     f"{measured.step_s * 1e3:.3f} ms at batch {measured.batch}")
        notes.append(str(conditions))
        unreliable = conditions.warnings()
        if unreliable:
            notes.append(f"{UNRELIABLE_NOTE} [" + " | ".join(unreliable) + "]")
        params = built.graph.parameters.values()
        grad_bytes = int(sum(v.nbytes for v in params))
        pattern = measure_async_pattern(comm, built.runner(), built.flat_update(),
                                        int(sum(v.size for v in params)),
                                        rounds=max(20, 2 * steps))
        if pattern is not None:
            measured = replace(measured, pattern=pattern)
            notes.append(str(pattern))
        costs[recipe.name] = measured
    layout = layout_of(comm)
    link, inter, polled, how = measure_links(comm, grad_bytes, layout,
                                             pattern.link if pattern else None)
    shared_read_beta = measure_shared_reads(comm, grad_bytes)  # None without shared memory
    if shared_read_beta is not None:
        how += f"; reads of what another rank just wrote {shared_read_beta * 1e9:.3f} ns/B"
    notes.append(how)
    # the compute rate, for recipes without measured costs: a float32 matrix product
    a = np.ones((512, 512), np.float32)
    a @ a
    start = time.perf_counter()
    for _ in range(5):
        a @ a
    flops = 5 * 2 * 512 ** 3 / (time.perf_counter() - start)
    flops = float(comm.allreduce(np.array([flops]))[0] / comm.size)
    # a memory copy of the gradients' size as a strategy makes it: after a step's compute has
    # gone through the caches (a buffer larger than them touched first), so the copy reads
    # and writes memory. One warm 1 MiB buffer copied again and again stays in cache and was
    # 3-5x faster than Downpour's passes over the same bytes measured in a run
    size = max(grad_bytes, 1 << 20) // 4
    src, dst = np.ones(size, np.float32), np.empty(size, np.float32)
    flush = np.zeros(CACHE_FLUSH_BYTES // 4, np.float32)
    copies = []
    for _ in range(9):
        flush += 1.0
        start = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - start)
    copy_beta = float(np.median(copies[1:])) / (size * 4)
    copy_beta = float(comm.allreduce(np.array([copy_beta]))[0] / comm.size)
    if described:  # a cluster of nodes like this one: its shape and links are the user's
        machine = replace(base, flops=flops, costs=costs, copy_beta=copy_beta,
                          source=f"{base.source}; compute measured by meta plan --calibrate"
                          f" on {os.uname().nodename}: " + "; ".join(notes[:-1]))
    else:  # this machine: one node, or (the link between them measured) several, of which
        # groups emulating them on one host share its cores
        shape = dict(nodes=1, ranks_per_node=cores, cores=cores)
        unmeasured = "; inter: not measurable on one machine (default)"
        if inter is not None:
            nodes = len(layout.nodes)
            shape = dict(nodes=nodes, ranks_per_node=layout.ranks_per_node, inter=inter,
                         cores=max(1, cores // nodes) if layout.one_host else cores)
            unmeasured = ""
        machine = replace(base, **shape, polled=polled, memory_bytes=float(memory),
                          shared_read_beta=shared_read_beta,
                          flops=flops, intra=link, costs=costs, copy_beta=copy_beta,
                          source="measured by meta plan --calibrate; " + "; ".join(notes)
                          + unmeasured)
    if stream is not None and comm.rank == 0:
        for note in notes:
            if not note.startswith(UNRELIABLE_NOTE):
                print(f"meta plan: {note}", file=stream)
        for warning in unreliable:
            print(f"meta plan: warning: {warning}: the fit is unreliable (calibrate again on "
                  f"a quiet machine, or with more --steps or --repeats)", file=stream)
    return machine
