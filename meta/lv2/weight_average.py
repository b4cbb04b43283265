"""An exponential moving average of the weights (``ema_decay``): evaluated and exported in
place of the last step's weights, as timm's ``ModelEmaV2`` and ``torch.optim.swa_utils``'
``AveragedModel`` do. An average of the weights along the path is often better than its end.

After each training step ``average = decay * average + (1 - decay) * weights`` (the first
step's weights start it). Evaluation during training swaps the average in and the weights back
(``swapped``); when training ends the average replaces the weights (``install``), so the
metrics after training, the exported model.onnx and the final checkpoint are the average's.

>>> import numpy as np
>>> w = {"w": np.array([0.0])}
>>> avg = WeightAverage(0.5)
>>> for value in (2.0, 4.0):
...     w["w"][...] = value; avg.update(w)
>>> with avg.swapped(w):
...     float(w["w"][0])
3.0
>>> float(w["w"][0])
4.0
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, MutableMapping

import numpy as np

Params = MutableMapping[str, np.ndarray]


class WeightAverage:
    """The running average of the parameters it is shown (``update`` after each step)."""

    def __init__(self, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.average: dict[str, np.ndarray] | None = None

    def update(self, params: Params) -> None:
        """Move the average towards ``params`` (copies them on the first call)."""
        if self.average is None:
            self.average = {k: np.array(p, copy=True) for k, p in params.items()}
            return
        for k, p in params.items():
            a = self.average[k]
            a *= self.decay
            a += (1.0 - self.decay) * p

    def state(self) -> dict[str, np.ndarray] | None:
        """The average, copied, for a checkpoint (None before the first update)."""
        return None if self.average is None else {k: a.copy() for k, a in self.average.items()}

    def load(self, saved: dict[str, np.ndarray] | None) -> None:
        """Continue from a checkpoint's average (None: start anew at the next update)."""
        self.average = None if saved is None else {k: np.array(a) for k, a in saved.items()}

    def install(self, params: Params) -> None:
        """Write the average into ``params`` in place (their arrays stay the graph's, or a
        strategy's flat buffer's views). Nothing before the first update."""
        for k, a in (self.average or {}).items():
            params[k][...] = a

    @contextmanager
    def swapped(self, params: Params) -> Iterator[None]:
        """The average in ``params`` inside the block, the weights as they were after it."""
        if self.average is None:
            yield
            return
        kept = {k: np.array(p, copy=True) for k, p in params.items()}
        self.install(params)
        try:
            yield
        finally:
            for k, p in kept.items():
                params[k][...] = p
