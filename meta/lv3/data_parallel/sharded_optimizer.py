"""One rank's share of an optimizer step, its state in memory the machine's ranks share.

ZeRO's stage 1 (Rajbhandari et al.) on one machine: with P ranks, each steps only its slice
[lo, hi) of the flat parameters, with the summed gradient of that slice, so a step's update
costs each rank 1/P of a whole one; the parameters and the optimizer's state live in shared
memory (``SharedSegments``), so no rank has to send the others its slice afterwards, and any
rank can read the whole state (a checkpoint written by rank 0 holds every slice).

Only an elementwise transformation (``GradientTransformation.elementwise``: SGD with or
without momentum, Adam, RMSProp, Adagrad, Adadelta, weight decay, learning-rate schedules)
can be cut so; ``takes`` says whether an optimizer is one. The state is initialised over the
whole flat buffer as one parameter named ``FLAT``, and shown to checkpoints per parameter
name, as the wrapped ``Optimizer`` would hold it: a checkpoint of a sharded run resumes
unsharded and back.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from meta.lv2.optimizers import Optimizer
from meta.lv3.comm.communicator import MPICommunicator
from meta.lv3.comm.shared_memory import SharedSegments
from meta.lv3.flat import FlatBuffer

FLAT = ""  # the name of the one "parameter" a slice is: no network parameter has it


def _map(tree: Any, leaf: Callable[[Any], Any], per_parameter: Callable[[dict], Any]) -> Any:
    """``tree`` (dicts, tuples, lists of arrays and numbers) rebuilt: ``per_parameter`` on
    each dict keyed by ``FLAT`` alone (a value per parameter), ``leaf`` on anything else that
    is not a container."""
    if isinstance(tree, dict):
        if set(tree) == {FLAT}:
            return per_parameter(tree)
        return {k: _map(v, leaf, per_parameter) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map(v, leaf, per_parameter) for v in tree)
    return leaf(tree)


def _zip(whole: Any, other: Any, per_parameter: Callable[[np.ndarray, Any], Any],
         leaf: Callable[[Any, Any], Any]) -> Any:
    """``whole`` rebuilt walking ``other`` (the same structure) beside it."""
    if isinstance(whole, dict):
        if set(whole) == {FLAT}:
            return {FLAT: per_parameter(whole[FLAT], other)}
        return {k: _zip(v, other[k], per_parameter, leaf) for k, v in whole.items()}
    if isinstance(whole, (tuple, list)):
        return type(whole)(_zip(w, o, per_parameter, leaf) for w, o in zip(whole, other))
    return leaf(whole, other)


def _copied(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) else value


class ShardedOptimizer:
    """Steps ``flat.buffer[lo:hi]`` with ``optimizer``'s transformation, from the state that
    optimizer holds (collective to build: the state's arrays are allocated in ``node``'s
    shared memory; fence them before another rank reads this rank's slice)."""

    @staticmethod
    def takes(optimizer: Any) -> bool:
        """Whether ``optimizer`` can be stepped a slice at a time."""
        return isinstance(optimizer, Optimizer) and optimizer.transform.elementwise

    def __init__(self, optimizer: Optimizer, flat: FlatBuffer, lo: int, hi: int,
                 node: MPICommunicator) -> None:
        self.transform, self.flat, self.lo, self.hi = optimizer.transform, flat, lo, hi
        """``transform``: the optimizer's transformation. ``flat``: the whole parameter buffer.
        ``lo``, ``hi``: this rank's slice of it."""
        self.windows: list[SharedSegments] = []
        """The shared windows holding the optimizer state (freed by ``release``)."""

        def share(values: dict) -> dict:  # the same order on every rank: collective
            window = SharedSegments.on_first(node, np.asarray(values[FLAT]))
            self.windows.append(window)
            return {FLAT: window.segments[0]}

        self.whole = _map(self.transform.init({FLAT: flat.buffer}), lambda v: v, share)
        """The whole optimizer state, its arrays in the node's shared memory."""
        self.part = Optimizer(self.transform, {FLAT: flat.buffer[lo:hi]})
        """An optimizer over this rank's slice of the parameters and state."""
        self.load_state_dict(optimizer.state_dict())  # a resumed run's state goes on
        optimizer.state = None  # the wrapped optimizer's own copy: this one replaces it

    def _slices(self, whole: Any) -> Any:
        return _map(whole, lambda v: v, lambda values: {FLAT: values[FLAT][self.lo:self.hi]})

    def step(self, summed: np.ndarray) -> None:
        """Update this rank's slice with ``summed``, the gradient of that slice."""
        self.part.step({FLAT: summed})

        def keep(whole: np.ndarray, part: Any) -> np.ndarray:  # a new array from a functional
            mine = whole[self.lo:self.hi]                       # update: back into the window
            if not np.may_share_memory(part[FLAT], mine):
                np.copyto(mine, part[FLAT])
            return whole

        self.whole = _zip(self.whole, self.part.state, keep, lambda w, p: p)
        self.part.state = self._slices(self.whole)

    def named_state(self) -> Any:
        """The whole state as the unsharded ``Optimizer`` lays it out: per parameter name
        (views of the shared memory: every rank's slice, as of the last fence)."""
        return _map(self.whole, lambda v: v, lambda values: FlatBuffer(
            self.flat.shapes, self.flat.dtype, buffer=values[FLAT]).views)

    def state_dict(self) -> dict:
        """The whole state per parameter name, copied out of the shared memory (which
        ``free`` releases: a view held past it would read freed memory)."""
        return {"state": _map(self.named_state(), _copied, lambda values: values)}

    def load_state_dict(self, saved: dict) -> None:
        """Take a saved state (per parameter name, as ``state_dict`` or an unsharded run wrote
        it): this rank writes its slice of each array (raises KeyError for a missing name)."""

        def mine(whole: np.ndarray, named: dict) -> np.ndarray:
            values = FlatBuffer(self.flat.shapes, self.flat.dtype)
            values.pack({name: named[name] for name in self.flat.shapes})
            whole[self.lo:self.hi] = values.buffer[self.lo:self.hi]
            return whole

        self.whole = _zip(self.whole, saved["state"], mine, lambda w, s: s)
        self.part.state = self._slices(self.whole)

    def free(self) -> None:
        """Release the shared state (collective); the optimizer cannot step afterwards."""
        for window in self.windows:
            window.free()
        self.windows = []
