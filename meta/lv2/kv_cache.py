"""Incremental decoding for meta's GPT: each layer's keys and values kept, one position a token.

Recomputing the whole window for every new token costs a forward pass of ``context`` positions
per token; a causal model's keys and values at earlier positions never change, so keeping them
(a key/value cache, as GPT-2's ``past``) leaves one position's projections and one row of
attention per token. ``GPTCache`` reads the weights of a graph that ``meta.lv1.gpt`` built (a
run's model.onnx included) and refuses any other graph: it rebuilds ``gpt`` with the same
sizes and requires the same nodes, so a graph it accepts computes what it computes. It runs
in the graph's float type with numpy, the LayerNormalization operator's own helper, Gelu
with erf, and the same masking (-1e9 added above the diagonal), so at temperature 0 it picks the
tokens recomputing picks (``tests/lv2/test_kv_cache.py``; ``benchmarks/kv_cache.py`` times it).

Positions are learned embeddings for ``context`` positions only: once the text is longer than
the context, the window slides and every position changes, so each further token recomputes
the window with the executor (as ``generate`` without the cache does): the cache pays within
the context.

>>> from meta.lv1 import gpt
>>> c = GPTCache(gpt((8,), classes=5, layers=1, heads=1, width=4))
>>> c.prefill([1, 2]).shape, c.step(3).shape, c.filled
((5,), (5,), 3)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from meta.lv1.graph import Graph, Node
from meta.lv1.language_models import gpt
from meta.lv2.sampling import sample_next
from meta.ops._normalize import standardize
from meta.ops._special import erfc


def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc in x's dtype: per element with ``math.erfc`` for one step's few hundred values
    (the vectorised series of ``meta.ops._special`` costs more than the rest of a step there),
    vectorised for a window."""
    if x.size > 4096:
        return erfc(x)
    flat = [math.erfc(v) for v in x.reshape(-1).tolist()]
    return np.array(flat, np.float64).astype(x.dtype).reshape(x.shape)


class CacheError(ValueError):
    """The graph is not one ``GPTCache`` can decode incrementally (not built by ``gpt``)."""


def _attr(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr(v) for v in value)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return value


def _canonical(nodes: Sequence[Node]) -> list[tuple[Any, ...]]:
    """The nodes as comparable tuples, Dropout (an identity at inference) taken out."""
    alias: dict[str, str] = {}
    out = []
    for n in nodes:
        inputs = [alias.get(i, i) for i in n.inputs]
        if n.op_type == "Dropout":
            alias[n.outputs[0]] = inputs[0]
            continue
        out.append((n.op_type, n.domain or "", tuple(inputs), tuple(n.outputs),
                    tuple(sorted((k, _attr(v)) for k, v in n.attrs.items()))))
    return out


class GPTCache:
    """A GPT's weights and one sequence's keys and values: ``prefill(ids)`` starts a sequence
    (returning the next-token logits after its last id), ``step(id)`` appends one id."""

    def __init__(self, graph: Graph, logits: str = "logits") -> None:
        init = graph.initializers
        missing = [n for n in ("wte", "wpe", "attn.split_heads") if n not in init]
        if missing:
            raise CacheError(f"graph {graph.name!r} is not a GPT meta built (no initializer "
                             f"{missing[0]!r}): no key/value cache for it")
        layers = 0
        while f"h{layers}.ln1.weight" in init:
            layers += 1
        self.vocab, self.width = (int(d) for d in init["wte"].shape)
        self.context = int(init["wpe"].shape[0])
        self.heads = int(np.asarray(init["attn.split_heads"])[2])
        try:
            reference = gpt((self.context,), self.vocab, layers=layers, heads=self.heads,
                            width=self.width, dtype=init["wte"].dtype)
        except ValueError as err:
            raise CacheError(f"graph {graph.name!r}: {err}; no key/value cache for it") from err
        wanted = _canonical(reference.nodes_for(["logits"]))
        try:
            found = _canonical(graph.nodes_for([logits]))
        except Exception as err:  # noqa: BLE001 - any graph: say why, never crash
            raise CacheError(f"graph {graph.name!r} has no output {logits!r}") from err
        if found != wanted:
            diff = next((f"the node writing {', '.join(f[3])} is {f[0]}, gpt's {w[0]}"
                         for w, f in zip(wanted, found) if w != f),
                        f"{len(found)} nodes, expected {len(wanted)}")
            raise CacheError(f"graph {graph.name!r} is not a GPT meta built (first difference: "
                             f"{diff}): no key/value cache for it")
        for name, value in reference.initializers.items():
            if name not in init or np.shape(init[name]) != np.shape(value):
                raise CacheError(f"graph {graph.name!r}: initializer {name!r} missing or of "
                                 f"another shape: no key/value cache for it")
        self.layers = layers
        self.dtype = init["wte"].dtype
        self.w = w = {k: np.asarray(v) for k, v in init.items()}
        for i in range(layers):  # q, k and v in one product: a step is overhead-bound
            p = f"h{i}.attn"
            w[f"{p}.qkv.weight"] = np.concatenate([w[f"{p}.{n}.weight"] for n in "qkv"], 1)
            w[f"{p}.qkv.bias"] = np.concatenate([w[f"{p}.{n}.bias"] for n in "qkv"])
        self.head = np.ascontiguousarray(w["wte"].T)
        self.scale = w["attn.scale"]
        self.eps = np.float32(1e-5)
        shape = (layers, self.heads, self.context, self.width // self.heads)
        self.keys = np.zeros(shape, self.dtype)
        self.values = np.zeros(shape, self.dtype)
        self.filled = 0

    def _ln(self, name: str, x: np.ndarray) -> np.ndarray:
        xhat = standardize(x, (x.ndim - 1,), self.eps)[0]
        return (xhat * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]).astype(self.dtype)

    def _linear(self, name: str, x: np.ndarray) -> np.ndarray:
        return x @ self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def _forward(self, ids: np.ndarray) -> np.ndarray:
        """Positions ``filled .. filled + len(ids)``: their keys and values cached, the
        logits (vocab,) after the last."""
        start, t = self.filled, len(ids)
        end = start + t
        if end > self.context:
            raise CacheError(f"the cache holds {self.context} positions (the model's context); "
                             f"{end} asked")
        heads, d, w = self.heads, self.width // self.heads, self.w
        x = w["wte"][ids] + w["wpe"][start:end]  # (t, width)
        # The causal mask of these rows over every cached column, added as the graph adds it
        # (a single new row sees every column: nothing to add)
        mask = np.triu(np.full((t, end), -1e9, self.dtype), start + 1) if t > 1 else None
        for i in range(self.layers):
            p = f"h{i}"
            qkv = self._linear(f"{p}.attn.qkv", self._ln(f"{p}.ln1", x))
            q, k, v = qkv.reshape(t, 3, heads, d).transpose(1, 2, 0, 3)  # 3 x (heads, t, d)
            self.keys[i, :, start:end] = k
            self.values[i, :, start:end] = v
            s = (q @ self.keys[i, :, :end].transpose(0, 2, 1)) * self.scale
            if mask is not None:
                s = s + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            a = s / s.sum(-1, keepdims=True)
            y = (a @ self.values[i, :, :end]).transpose(1, 0, 2).reshape(t, self.width)
            x = x + self._linear(f"{p}.attn.proj", y)
            h = self._linear(f"{p}.mlp.fc", self._ln(f"{p}.ln2", x))
            h = (0.5 * h * _erfc(-h / np.sqrt(2))).astype(self.dtype)  # Gelu, as the op
            x = x + self._linear(f"{p}.mlp.proj", h)
        self.filled = end
        return (self._ln("ln_f", x[-1:]) @ self.head)[0]

    def prefill(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Start a sequence with ``ids`` (at most ``context``): the logits after the last."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        if not 0 < len(ids) <= self.context:
            raise CacheError(f"prefill takes 1 to {self.context} ids, got {len(ids)}")
        self.filled = 0
        return self._forward(ids)

    def step(self, token: int) -> np.ndarray:
        """Append one id: the logits after it."""
        return self._forward(np.array([token], np.int64))


def generate_cached(cache: GPTCache, prompt: Sequence[int] | np.ndarray, length: int,
                    temperature: float, top_k: int, rng: np.random.Generator,
                    recompute: Callable[[list[int]], np.ndarray] | None = None) -> np.ndarray:
    """``generate``'s tokens (its window, its draws from ``rng``) with the cache: the prompt's
    ids followed by ``length`` sampled ids. Once the window slides, ``recompute(window)`` (the
    executor's scores after a window; default: the cache's own ``prefill``) scores it."""
    from threadpoolctl import threadpool_limits

    recompute = recompute or cache.prefill
    ids = [int(i) for i in np.asarray(prompt, np.int64).reshape(-1)] or [0]
    # One BLAS thread: a position's products are far too small to share, and a BLAS pool
    # waiting for cores that other processes hold made them 100x slower (2 loaded cores)
    with threadpool_limits(limits=1, user_api="blas"):
        logits = cache.prefill(ids) if len(ids) <= cache.context else \
            recompute(ids[-cache.context:])
        for n in range(length):
            ids.append(sample_next(logits, temperature, top_k, rng))
            if n == length - 1:
                break
            if len(ids) <= cache.context:
                logits = cache.step(ids[-1])
            else:  # the window slid: every position moved
                logits = recompute(ids[-cache.context:])
    return np.array(ids, np.int64)
