"""What one rank holds during a training step, in parts: parameters, gradients, optimizer
state, the activations a backward keeps, and a strategy's own buffers.

Rajbhandari et al.'s ZeRO paper counts a model of Ψ parameters trained in float32 with Adam
as 4Ψ bytes of parameters, 4Ψ of gradients and 8Ψ of optimizer state (two moments) on every
data-parallel rank: 16Ψ. Stage 1 shares out the state (8Ψ/P), stage 2 the state and the
gradients (4Ψ/P), stage 3 all three (16Ψ/P). ``zero_memory`` follows those formulas for each
part, and puts what meta's implementations hold beyond them in ``buffers``, so a prediction
is the paper's figure plus what this framework keeps, each named:

* allreduce: the flat buffer its gradients are packed into (or the overlapped buckets,
  written in place in one flat buffer): Ψ·4 bytes;
* ZeRO-2 (``meta/lv3/data_parallel/zero.py``): the backward writes the whole gradient into
  the flat gradient buffer, kept between steps, before each rank keeps its reduce-scattered
  shard (DeepSpeed holds a bucket at a time instead): 4Ψ;
* ZeRO-3 (``zero3.py``): at most two layer groups gathered at once (the running one and the
  prefetched one) and one group's gradients while they are reduce-scattered: 3 × 4Ψ/G for G
  groups (``zero3_groups``, the strategy's own default count).

The same model serves ``meta plan`` (its ranking, ``--memory``) and the run's
``memory_limit_gb`` check (``meta.run.memory_budget``), so a plan and a refusal agree.
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1 << 20
ZERO3_GROUP_PARAMS = 2_000_000  # Zero3's default: a layer group per 2 M parameters


@dataclass(frozen=True)
class Memory:
    """Bytes one rank holds at a step's peak, by part."""

    parameters: float
    gradients: float
    state: float
    activations: float = 0.0
    buffers: float = 0.0

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.state + self.activations + self.buffers

    @property
    def model_state(self) -> float:
        """Everything but the activations: what stays between steps (the buffers at most)."""
        return self.total - self.activations

    def parts_mb(self) -> str:
        """``params+grads+state+activations+buffers`` in MB (2^20 bytes), for a table."""
        return "+".join(mb(v).replace(",", "") for v in (
            self.parameters, self.gradients, self.state, self.activations, self.buffers))

    def larger(self, other: Memory) -> Memory:
        """The one of two ranks' memories with the larger total (the busiest rank)."""
        return other if other.total > self.total else self


# optimizer -> slots of state per parameter (momentum: 1, Adam: 2); unknown: 2, erring high
STATE_SLOTS = {"sgd": 1, "nesterov": 1, "adagrad": 1, "rmsprop": 1, "adam": 2, "adamw": 2,
               "adadelta": 2, "lbfgs": 2}


def state_slots(optimizer: str, values: dict) -> int:
    """Arrays of optimizer state the size of the parameters that ``optimizer`` (a recipe's
    optimizer name, with its option ``values``) keeps: plain SGD none, momentum one, Adam
    two (amsgrad three)."""
    slots = STATE_SLOTS.get(optimizer, 2)
    if optimizer == "sgd" and not values.get("momentum", 0.0):
        slots = 0
    if optimizer in ("adam", "adamw") and values.get("amsgrad"):
        slots = 3  # the running maximum of v, as PyTorch's amsgrad keeps it
    return slots


def zero3_groups(param_count: int, nodes: int) -> int:
    """The layer groups ``Zero3`` cuts a graph into when its ``groups`` option is 0."""
    count = max(2, min(nodes, param_count // ZERO3_GROUP_PARAMS + 1))
    return min(count, nodes)


def zero_memory(param_bytes: float, state_slots: int, activations: float, ranks: int,
                stage: int, groups: int = 2, shared_buffer: bool = True) -> Memory:
    """A data-parallel rank's memory under ZeRO ``stage`` (0: plain allreduce) at ``ranks``
    ranks: ``param_bytes`` of parameters (4Ψ in float32), ``state_slots`` arrays of state
    the size of the parameters (Adam: 2), ``activations`` the bytes the backward keeps for
    this rank's batch. ``shared_buffer``: stage 0 packs its gradients into a flat buffer."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage}: must be 0, 1, 2 or 3")
    p = max(1, ranks)
    n = float(param_bytes)
    params = n / p if stage >= 3 else n
    grads = n / p if stage >= 2 else n
    state = n * state_slots / p if stage >= 1 else n * state_slots
    if stage == 0:
        buffers = n if shared_buffer else 0.0
    elif stage == 2:
        buffers = n if p > 1 else 0.0
    elif stage == 3:
        buffers = 3 * n / max(1, groups) if p > 1 else 0.0
    else:
        buffers = 0.0
    return Memory(params, grads, state, float(activations), buffers)


def mb(nbytes: float) -> str:
    """Bytes in MB (2^20 bytes): one decimal below 10 MB, whole MB above."""
    return f"{nbytes / MB:,.{1 if nbytes < 10 * MB else 0}f}"


def describe(memory: Memory) -> str:
    """One line: the total and each part in MB (activations where counted), for messages."""
    act = f", activations {mb(memory.activations)}" if memory.activations else ""
    return (f"{mb(memory.total)} MB (parameters {mb(memory.parameters)}, gradients "
            f"{mb(memory.gradients)}, optimizer state {mb(memory.state)}{act}, buffers "
            f"{mb(memory.buffers)})")
