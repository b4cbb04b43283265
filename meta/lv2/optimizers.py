"""Optimizers as composable gradient transformations (optax's init/update pairs).

A transformation is ``init(params) -> state`` and ``update(grads, state, params) ->
(updates, state)`` over flat ``dict[str, ndarray]``; ``chain`` composes them; ``Optimizer`` is the
thin stateful wrapper the trainer calls. SGD with momentum is ``chain(trace(m), scale(-lr))``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

Params = dict[str, np.ndarray]
State = Any


class GradientTransformation(NamedTuple):
    init: Callable[[Params], State]
    update: Callable[[Params, State, Params], tuple[Params, State]]


def scale(factor: float) -> GradientTransformation:
    """updates = factor * grads."""

    def init(params: Params) -> State:
        return ()

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        return {k: factor * g for k, g in grads.items()}, state

    return GradientTransformation(init, update)


def trace(decay: float, nesterov: bool = False) -> GradientTransformation:
    """Momentum: v <- decay * v + g; the update is v (or g + decay * v with Nesterov)."""

    def init(params: Params) -> State:
        return {k: np.zeros_like(p) for k, p in params.items()}

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        velocity = {k: decay * state[k] + g for k, g in grads.items()}
        if nesterov:
            return {k: g + decay * velocity[k] for k, g in grads.items()}, velocity
        return velocity, velocity

    return GradientTransformation(init, update)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply transformations in order, each on the previous one's updates."""

    def init(params: Params) -> State:
        return tuple(t.init(params) for t in transforms)

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        new_state = []
        for t, s in zip(transforms, state):
            grads, s = t.update(grads, s, params)
            new_state.append(s)
        return grads, tuple(new_state)

    return GradientTransformation(init, update)


def sgd(lr: float, momentum: float = 0.0, nesterov: bool = False) -> GradientTransformation:
    """Stochastic gradient descent, with optional (Nesterov) momentum.

    >>> opt = Optimizer(sgd(0.1), {"w": np.array([1.0])})
    >>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
    [0.8]
    """
    if lr <= 0:
        raise ValueError(f"sgd: learning rate must be positive, got {lr}")
    if momentum == 0.0:
        return scale(-lr)
    return chain(trace(momentum, nesterov), scale(-lr))


class Optimizer:
    """Holds a transformation's state and applies its updates to ``params`` in place.

    ``params`` are the network's own arrays, so the executor sees each step's new values.
    """

    def __init__(self, transform: GradientTransformation, params: Params) -> None:
        self.transform = transform
        self.params = params
        self.state = transform.init(params)

    def step(self, grads: Params) -> None:
        missing = set(self.params) - set(grads)
        if missing:
            raise KeyError(f"optimizer step: no gradient for parameter(s) {sorted(missing)}")
        updates, self.state = self.transform.update(grads, self.state, self.params)
        for name, u in updates.items():
            self.params[name] += u.astype(self.params[name].dtype, copy=False)
