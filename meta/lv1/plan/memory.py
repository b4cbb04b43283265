"""The values of a plan and where they live: one arena for everything a step computes, laid
out once from the values' lifetimes (TensorFlow Lite's and PyTorch's static planners do the
same: greedy by size, each value at the lowest offset free for its whole lifetime).

A value is a tensor of fixed shape, dtype and layout. Its storage is the ``arena`` (activations,
gradients of activations, temporaries, the fed inputs), ``external`` (the graph's own arrays:
parameters, state, frozen parameters and constants, read and written where they are), ``owned``
(arrays the plan keeps across calls: folded constants and the parameters' gradients, which the
executor hands out), a view of another value (``base``: a Reshape's output is its input's
bytes), or ``none``: declared for its shape (and its gradient's) but never written nor read,
so it has no bytes and no array (the float32 value a bf16 plan keeps only as its bf16 holder,
``precision.bf16_holder``, and the views of one).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from math import prod
from typing import Callable

import numpy as np

ALIGN = 64  # bytes: every arena value starts on a cache line (and an AVX-512 vector)


@dataclass
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str = "plain"  # or a blocked / channels-last layout of a 4-D activation
    storage: str = "arena"  # "arena", "external", "owned", "view" or "none"
    base: str | None = None  # storage == "view": whose bytes
    offset: int = 0  # a view's first element in its base
    nbytes: int = 0  # in its layout (a blocked layout pads channels)
    array: np.ndarray | None = None  # bound storage

    def __post_init__(self) -> None:
        self.dtype = np.dtype(self.dtype)
        self.shape = tuple(int(d) for d in self.shape)
        if not self.nbytes:
            self.nbytes = prod(self.shape) * self.dtype.itemsize


def root(values: dict[str, Value], name: str) -> str:
    """The value whose bytes ``name`` is: itself, or the base its chain of views ends in."""
    while values[name].storage == "view":
        name = values[name].base
    return name


def lifetimes(steps: list, values: dict[str, Value], keep: set[str]) -> dict[str, tuple[int, int]]:
    """Arena value -> (first step that touches it, last step that reads it); a view extends its
    base's lifetime; values in ``keep`` (what the caller fetches) live to the end."""
    span: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        for name in (*step.reads, *step.writes):
            r = root(values, name)
            if values[r].storage != "arena":
                continue
            if r not in span:
                span[r] = [i, i]
            else:
                span[r][1] = i
    end = len(steps)
    for name in keep:
        r = root(values, name)
        if r in span:
            span[r][1] = end
    return {k: (a, b) for k, (a, b) in span.items()}


def assign_offsets(sizes: dict[str, int], spans: dict[str, tuple[int, int]]
                   ) -> tuple[dict[str, int], int]:
    """Offsets in one arena such that values alive at the same time never overlap; returns the
    offsets and the arena's size. Greedy, each value at the lowest free offset, in three
    orders, the smallest arena kept (the first where equal): largest first, of equal sizes
    the earlier-born first, or the longer-lived first; or longest-lived first, of equal
    lifetimes the larger first. Many values of one size (a transformer's per-layer
    activations) packed by birth left holes the long-lived ones then could not reuse: the
    bf16 GPT step's arena at sequence 256 was 45.8 MiB for 43.8 MiB ever alive at once.
    With its bf16 values of three sizes (the MLP's 4 MiB, the residual stream's 2 MiB, the
    attention's 1 MiB), the long-lived ones (the saved activations) placed first, below
    the short-lived gradients, gave 42.3 MiB for 41.9 alive, where largest-first gave 42.8."""
    orders = (lambda n: (-sizes[n], spans[n][0], n),
              lambda n: (-sizes[n], spans[n][0] - spans[n][1], n),
              lambda n: (spans[n][0] - spans[n][1], -sizes[n], n))
    best: tuple[dict[str, int], int] | None = None
    for key in orders:
        offsets, total = _first_fit(sizes, spans, sorted(sizes, key=key))
        if best is None or total < best[1]:
            best = offsets, total
    return best


def _first_fit(sizes: dict[str, int], spans: dict[str, tuple[int, int]], order: list[str]
               ) -> tuple[dict[str, int], int]:
    """Each value of ``order`` in turn at the lowest offset free for its whole lifetime."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets: dict[str, int] = {}
    total = 0
    for name in order:
        size = -(-sizes[name] // ALIGN) * ALIGN
        first, last = spans[name]
        clashes = sorted((o, e) for o, e, f, la in placed if not (la < first or f > last))
        offset = 0
        for o, e in clashes:
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[name] = offset
        placed.append((offset, offset + size, first, last))
        total = max(total, offset + size)
    return offsets, total


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data starts on an ALIGN boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


def view_of(buffer: np.ndarray, value: Value) -> np.ndarray:
    """``value``'s array in ``buffer`` (bytes): its shape when plain, else flat (a blocked
    layout is not a numpy shape; only kernels read it)."""
    if value.layout == "plain":
        count = prod(value.shape)
        return buffer[:count * value.dtype.itemsize].view(value.dtype).reshape(value.shape)
    return buffer[:value.nbytes].view(value.dtype)


class Arena:
    """The bytes one or more plans lay their arena values in.

    A plan has one of its own by default. Plans that never run at the same time can share one
    (activation recomputation: each segment's plans, run one after another): it is as large
    as the largest of them. When a plan compiled later needs more, ``reserve`` allocates a
    larger buffer and rebinds every plan bound to it (``bind``) at once, so the smaller
    buffer is freed; after every plan has been compiled once the arena no longer moves.

    ``generation`` counts the forwards run in it (``PlannedExecutor`` steps it): what one
    plan's forward saved for its backward is valid only until the next forward of any plan
    sharing the arena, which a stage's handle checks (``backward_seeded``).
    """

    def __init__(self) -> None:
        self.buffer = aligned_empty(ALIGN)
        self.generation = 0
        self._plans: list[tuple[weakref.ref, Callable]] = []

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    def reserve(self, nbytes: int) -> np.ndarray:
        """The buffer, grown to at least ``nbytes`` (every bound plan rebound to it)."""
        if nbytes > self.buffer.nbytes:
            self.buffer = aligned_empty(nbytes)
            self.generation += 1  # whatever a forward saved is gone
            live = [(ref, rebind) for ref, rebind in self._plans if ref() is not None]
            self._plans = live
            for ref, rebind in live:
                rebind(ref())
        return self.buffer

    def bind(self, plan: object, rebind: Callable[[object], None]) -> None:
        """Remember ``plan`` (weakly): ``rebind(plan)`` is called when the buffer grows."""
        self._plans.append((weakref.ref(plan), rebind))
