"""What a lowering sees besides the plan builder (``Context``: the operators, who reads
what, the names that must exist as themselves, the mode) and the one-step wrapper around
Python code (``py_step``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import PlanBuilder


@dataclass(frozen=True)
class Traced:
    """What the trace keeps of a tensor it did not need to keep: its shape and dtype
    (the compiler's trace and the pattern rewrites that add nodes make them)."""

    shape: tuple[int, ...]
    dtype: np.dtype

F32 = np.dtype(np.float32)


def py_step(fn: Callable[[], None], name: str):
    from meta.lv1.plan.runtime import module

    return module().PyStep(fn, name)


@dataclass
class Context:
    """What kernels see besides the builder: the operators, who reads what, the names that
    must exist as themselves (fetched outputs, feeds), the mode."""

    pb: PlanBuilder
    ops: dict
    consumers: dict[str, list[Node]]
    protected: set[str]
    absorbed: set[str]
    training: bool | None
    backprop: bool
    traced: dict = field(default_factory=dict)
    state: set[str] = field(default_factory=set)  # state arrays a training forward updates
    static: set[str] = field(default_factory=set)  # constants and folded values
    order: dict[str, int] = field(default_factory=dict)  # node -> its place in the plan
    fused_into: dict[str, list[str]] = field(default_factory=dict)
    kernels: list = field(default_factory=list)
    objects: dict = field(default_factory=dict)
    precision: str = "f32"  # "bf16": products and convolutions read bf16 (plan/precision.py)

    @property
    def bf16(self) -> bool:
        """Whether this plan's matrix products and convolutions compute in bf16."""
        return self.precision == "bf16"

    @property
    def rt(self):
        return self.pb.rt

    def single_consumer(self, name: str, op_types, first: bool = True) -> Node | None:
        """The one node reading ``name`` if it is of ``op_types`` and ``name`` is needed by
        nothing else (not fetched, not fed): a candidate to fuse."""
        readers = self.consumers.get(name, [])
        if name in self.protected or len(readers) != 1 or readers[0].op_type not in op_types:
            return None
        node = readers[0]
        if node.name in self.absorbed or first and node.inputs[0] != name:
            return None
        return node

    def used(self, name: str) -> bool:
        """Whether anything reads ``name`` or the caller fetches it."""
        return bool(name) and (bool(self.consumers.get(name)) or name in self.protected)

    def absorb(self, into: Node, node: Node) -> None:
        self.absorbed.add(node.name)
        self.fused_into.setdefault(into.name, []).append(node.name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.traced[name].shape)

    def dtype(self, name: str) -> np.dtype:
        return self.traced[name].dtype

    def float32(self, *names: str) -> bool:
        return all(self.dtype(n) == F32 for n in names if n)

    def needs(self, name: str) -> bool:
        return self.backprop and bool(name) and name in self.pb.requires

    def mode(self, as_written: bool) -> bool:
        return as_written if self.training is None else self.training

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a folded or constant input (None when it varies)."""
        if name in self.static:
            return self.traced[name]
        return None
