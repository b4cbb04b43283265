"""Gradient accumulation in one process: the optimizer steps every ``every`` micro-batches on
their mean gradient, as it would on one batch ``every`` times larger (optax's ``MultiSteps``).

A ``GradientTransformation`` wrapping the whole update rule (clipping, decay and schedule
included), so anything that steps a Level 2 optimizer's transformation accumulates alike: the
one-process ``Optimizer``, a Level 3 strategy that wraps it, a sharded (ZeRO) step of a slice
(the accumulation is elementwise where the rule is). The micro-batches of one step are the
ones the sampler hands out in a row; a step left unfinished at an epoch's end is finished by
the next epoch's first micro-batches, as a stream of batches would be. The rule's own step
count (a schedule's) counts optimizer steps, not micro-batches.

>>> import numpy as np
>>> from meta.lv2.optimizers import Optimizer, sgd
>>> w = {"w": np.array([1.0])}
>>> opt = Optimizer(accumulate_gradients(sgd(0.1), 2), w)
>>> opt.step({"w": np.array([1.0])}); w["w"].tolist()   # first micro-batch: no step yet
[1.0]
>>> opt.step({"w": np.array([3.0])}); w["w"].tolist()   # the mean gradient 2.0
[0.8]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.lv2.transform import GradientTransformation, Params, State


def accumulate_gradients(inner: GradientTransformation, every: int) -> GradientTransformation:
    """``inner`` applied every ``every`` updates to the mean of their gradients; the updates
    between are zero (and nothing is written in place). State: (inner's, sums, count)."""
    if every < 1:
        raise ValueError(f"accumulate must be at least 1, got {every}")

    def init(params: Params) -> State:
        return (inner.init(params), {k: np.zeros_like(p) for k, p in params.items()}, 0)

    def add(grads: Params, state: State) -> tuple[Any, Params, int]:
        inner_state, sums, count = state
        for k, g in grads.items():
            sums[k] += g
        return inner_state, sums, count + 1

    def mean(sums: Params) -> Params:
        return {k: s / every for k, s in sums.items()}

    def cleared(sums: Params) -> Params:
        for s in sums.values():
            s[...] = 0
        return sums

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        inner_state, sums, count = add(grads, state)
        if count < every:
            return {k: np.zeros_like(g) for k, g in grads.items()}, (inner_state, sums, count)
        updates, inner_state = inner.update(mean(sums), inner_state, params)
        return updates, (inner_state, cleared(sums), 0)

    def in_place(grads: Params, state: State, params: Params) -> State:
        inner_state, sums, count = add(grads, state)
        if count < every:
            return inner_state, sums, count
        if inner.in_place is not None:
            inner_state = inner.in_place(mean(sums), inner_state, params)
        else:
            updates, inner_state = inner.update(mean(sums), inner_state, params)
            for k, u in updates.items():
                params[k] += u.astype(params[k].dtype, copy=False)
        return inner_state, cleared(sums), 0

    # summing is per value: a shard accumulates its own slice as the whole would
    return GradientTransformation(init, update, in_place, elementwise=inner.elementwise,
                                  shardable=inner.elementwise or inner.shardable)
