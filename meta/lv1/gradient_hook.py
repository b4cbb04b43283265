"""The gradient hook: the one seam between an executor's backward and a Level 3 strategy.

A strategy that communicates during the backward (``Allreduce`` with ``overlap``, its
shared-memory ``NodeExchange``) hands an executor that ``supports_gradient_hook`` (the planned
executor) an object of this shape through ``inference_and_backprop(..., hook=...)``. Declared
here, in Level 1, because the executor is the side that calls it and Level 3 may import
Level 1 (never the reverse): both sides then name one type, and a strategy's hook that lacks
a member fails ``isinstance(hook, GradientHook)`` in a test instead of deep inside a plan.

The protocol, in the order the executor uses it:

* ``layout(names)``, once per plan: ``names`` are the trainable parameters in the order the
  backward finishes their gradients; the answer is one array per parameter (views of one
  buffer, laid out in that order) that the backward writes the gradients into.
* ``use(names)``, before each backward: the layout of the plan about to run (another batch
  size is another plan, with arrays of its own).
* ``ready(names)``, after each bucket of at least ``bucket_bytes`` of gradients is final: the
  strategy starts that bucket's exchange while the backward runs on.
* ``seed``: the factor on the loss's gradient (1/P, so that the exchanged sum is the mean).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class GradientHook(Protocol):
    """What an executor's backward calls to hand gradients to a strategy as they finish."""

    bucket_bytes: int  # bytes of final gradients between two ``ready`` calls (at least)
    seed: float  # the loss's gradient is scaled by it (1/P: the buckets sum to the mean)

    def layout(self, names: list[str]) -> dict[str, np.ndarray]:
        """Arrays to write the gradients of ``names`` (in the order the backward finishes
        them) into; asked once per plan."""
        ...

    def use(self, names: list[str]) -> None:
        """The layout of the plan about to run (the one ``layout`` gave for ``names``)."""
        ...

    def ready(self, names: list[str]) -> None:
        """The gradients of ``names`` are final: the strategy may send them."""
        ...
