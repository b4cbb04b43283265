"""Drawing the next token from one position's scores: the highest at temperature 0, else
temperature and top-k sampling. Its own module, below both ways of generating text (the
executor's, ``meta.lv2.generate``, and the key/value cache's, ``meta.lv2.kv_cache``), so that
they draw alike without importing each other."""

from __future__ import annotations

import numpy as np


def sample_next(logits: np.ndarray, temperature: float, top_k: int,
                rng: np.random.Generator) -> int:
    """One token id from the scores of one position: the highest at temperature 0, else a draw
    from softmax(logits / temperature) over the ``top_k`` highest (0: all)."""
    logits = np.asarray(logits, np.float64)
    if temperature <= 0:
        return int(logits.argmax())
    if 0 < top_k < len(logits):
        cut = np.partition(logits, -top_k)[-top_k]
        logits = np.where(logits >= cut, logits, -np.inf)
    z = logits / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(len(p), p=p / p.sum()))
