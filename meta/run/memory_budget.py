"""The run option ``memory_limit_gb``: a per-rank memory budget checked before training.

A run whose model state per rank (parameters, gradients, optimizer state and the strategy's
buffers) would exceed the budget is refused in one line before any step (every rank reaches
the same verdict from the same figures, without a collective), naming what it needs, the cap,
and what ``--set distributed=zero3`` would need at these ranks. The figures come from the
planner's memory model (``meta.planner.memory``), the one ``meta plan`` ranks and ``--memory``
filters with, so a plan and a refusal agree. Activations are not counted: they depend on the
executor and the batch, and a step's are measured by ``benchmarks/zero_memory.py``, not
predicted here (``meta plan`` adds its estimate of them).

Strategies in which each rank holds a whole replica (allreduce, model averaging, the
parameter servers' workers, ...) are counted as ZeRO stage 0 (16Ψ under Adam, plus a flat
gradient buffer): a lower bound for those that keep more (Downpour's copies). A strategy that
splits the model over ranks (pipelines, tensor parallelism) is not modelled here: with a
budget it is refused in one line rather than checked wrongly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meta.planner.memory import Memory, describe, mb, state_slots, zero3_groups, zero_memory

GB = 1 << 30  # memory_limit_gb's unit, as meta plan --memory's
MOST_RANKS = 4096  # the ranks a refusal's hint looks up to
SPLIT = ("pipeline", "hybrid_allreduce", "hybrid_downpour", "partitioned")


class MemoryBudgetError(ValueError):
    """A run refused by its ``memory_limit_gb`` (one line)."""


def model_state(strategy: str, options: dict, param_bytes: float, nodes: int,
                optimizer: str, optimizer_options: dict, ranks: int) -> Memory:
    """One rank's model state under ``strategy`` at ``ranks`` ranks (activations: 0)."""
    slots = state_slots(optimizer, optimizer_options)
    stage = {"zero2": 2, "zero3": 3}.get(strategy, 0)
    groups = options.get("groups") or zero3_groups(int(param_bytes) // 4, nodes)
    m = zero_memory(param_bytes, slots, 0.0, ranks, stage, groups)
    return replace(m, temporaries=0.0)  # a step's, not the state kept between steps


def check_memory_budget(recipe: str, limit_gb: float, strategy: str, options: dict,
                        graph: Any, optimizer: str, optimizer_options: dict,
                        ranks: int) -> Memory | None:
    """Refuse (``MemoryBudgetError``, one line) a run whose model state per rank exceeds
    ``limit_gb``; the state it predicts otherwise (None without a budget)."""
    if not limit_gb:
        return None
    if strategy in SPLIT:
        raise MemoryBudgetError(
            f"recipe {recipe!r}: memory_limit_gb {limit_gb:g} is checked for strategies whose "
            f"ranks each hold a replica or a ZeRO shard of it; distributed {strategy!r} splits "
            f"the model over ranks, which the memory model does not cover: leave "
            f"memory_limit_gb 0 (or use meta plan --memory)")
    param_bytes = float(sum(p.nbytes for p in graph.parameters.values()))
    nodes = len(graph.nodes)
    need = model_state(strategy, options, param_bytes, nodes, optimizer, optimizer_options,
                       ranks)
    cap = limit_gb * GB
    if need.total <= cap:
        return need
    sharded = model_state("zero3", {}, param_bytes, nodes, optimizer, optimizer_options, ranks)
    if strategy != "zero3" and sharded.total <= cap:
        hint = (f"--set distributed=zero3 needs {mb(sharded.total)} MB per rank at "
                f"{ranks} rank(s)")
    else:
        at = next((p for p in range(ranks + 1, MOST_RANKS + 1) if model_state(
            "zero3", {}, param_bytes, nodes, optimizer, optimizer_options, p).total <= cap),
            None)
        under = "" if strategy == "zero3" else "under --set distributed=zero3 "
        hint = (f"{under}it fits at mpiexec -n {at}" if at else
                f"it does not fit under distributed 'zero3' at up to {MOST_RANKS} ranks either "
                f"(its gathered layer groups alone take more)")
    raise MemoryBudgetError(
        f"recipe {recipe!r}: distributed {strategy!r} at {ranks} rank(s) needs "
        f"{describe(need)} per rank for the model state, over memory_limit_gb {limit_gb:g} "
        f"({mb(cap)} MB); {hint}")
