"""The types every update rule is written in (optax's): a ``GradientTransformation`` is an
``init(params) -> state`` and ``update(grads, state, params) -> (updates, state)`` pair over a
flat ``dict[str, ndarray]``. Its own module, below the optimizers and the wrappers built around
them (``meta.lv2.accumulate``), which ``meta.lv2.optimizers`` re-exports."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

Params = dict[str, np.ndarray]
State = Any
Schedule = Callable[[int], float]  # step (0-based) -> multiplier
LearningRate = float | Schedule


class GradientTransformation(NamedTuple):
    init: Callable[[Params], State]
    update: Callable[[Params, State, Params], tuple[Params, State]]
    # Optional: the same step applied to the parameters in place, in fewer passes (a fused
    # kernel); takes (grads, state, params), returns the new state, laid out as ``update``'s.
    in_place: Callable[[Params, State, Params], State] | None = None
    # Whether each value's update depends on that value alone (its gradient, parameter and
    # state): then any slice of the flat parameters can be stepped apart from the rest, which
    # a strategy that shares the update out among ranks needs (``ShardedOptimizer``). False
    # where unknown (a user's transformation), by name (masked, partition) or global (clipping).
    elementwise: bool = False
    # Whether a slice of the flat parameters can be stepped apart from the rest provided the
    # sums over all values go through ``global_sum`` (``summed_over``): elementwise ones, and
    # the global-norm clip, whose norm a sharded strategy (ZeRO-2/3) then sums over its ranks.
    shardable: bool = False
