"""What lowering a graph writes into: the plan's values, its steps in three programs
(``prepare``: weights into the kernels' layouts; ``forward``; ``backward``), layout changes and
the bookkeeping of gradients.

Kernels (``meta.lv1.plan.kernels``) lower one node at a time through this interface: they read
the shapes the trace found (``value``), ask for their inputs in a layout
(``require_layout``), declare their outputs (``output``) and add steps (``step``), each with
the values it reads and writes and a ``build`` function that binds the C++ step once the arena
is laid out. Backward steps are added in reverse node order; a gradient's first contribution
writes its buffer and every later one adds to it (``grad_target``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from meta.lv1.plan.memory import Value

Lookup = Callable[[str], np.ndarray]


@dataclass
class PlannedStep:
    name: str
    phase: str  # "prepare", "forward" or "backward"
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    build: Callable[[Lookup], list]  # -> the bound C++ steps (or PySteps)
    node: str = ""  # the graph node it belongs to (profiles)
    op_type: str = ""


@dataclass
class Lowered:
    """A node as the plan runs it: its backward (None when it has none) adds its steps."""

    node: object
    backward: Callable[[PlanBuilder], None] | None = None
    kind: str = "native"  # "native" (C++ steps), "python" (the operator's own code), "view"


class PlanBuilder:
    def __init__(self, values: dict[str, Value], training: bool | None, rt) -> None:
        self.values = values
        self.training = training
        self.rt = rt  # meta._plan
        self.steps: list[PlannedStep] = []
        self.requires: set[str] = set()  # values whose gradient is wanted
        self.lowered: list[Lowered] = []
        self._layouts: dict[tuple[str, str], str] = {}
        self._grads: dict[str, str] = {}  # value -> its gradient value, once contributed to
        self._pending: list[tuple[str, str]] = []  # (temporary, gradient) to add up
        self.consumers: dict[str, int] = {}  # how many backward contributions a value gets
        self.reaches_loss: set[str] = set()  # what the loss depends on through gradients
        self.current: object = None  # the node being lowered (names its steps)
        self._count = 0

    # -- values ----------------------------------------------------------------------------
    def value(self, name: str) -> Value:
        return self.values[name]

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}#{self._count}"

    def output(self, name: str, shape: Sequence[int], dtype=np.float32, layout: str = "plain"
               ) -> str:
        nbytes = 0 if layout == "plain" else self.rt.layout_bytes(list(shape), layout)
        self.values[name] = Value(name, tuple(shape), dtype, layout, nbytes=nbytes)
        return name

    def temp(self, like: str, layout: str | None = None) -> str:
        v = self.values[like]
        return self.output(self.fresh(like), v.shape, v.dtype, layout or v.layout)

    def view(self, name: str, base: str, shape: Sequence[int], offset: int = 0) -> str:
        """``name`` is ``base``'s bytes seen with another shape, from element ``offset`` on
        (plain layouts only)."""
        b = self.values[base]
        self.values[name] = Value(name, tuple(shape), b.dtype, b.layout, "view", base, offset,
                                  nbytes=b.nbytes if b.layout != "plain" else 0)
        return name

    def step(self, name: str, reads: Sequence[str], writes: Sequence[str],
             build: Callable[[Lookup], list], phase: str = "forward") -> None:
        node = self.current
        self.steps.append(PlannedStep(name, phase, tuple(x for x in reads if x),
                                      tuple(x for x in writes if x), build,
                                      getattr(node, "name", ""), getattr(node, "op_type", "")))

    # -- layouts ---------------------------------------------------------------------------
    def require_layout(self, name: str, layout: str) -> str:
        """A value holding ``name`` in ``layout``: itself, or a reordered copy (made once, with
        the reorder's backward when a gradient flows through it)."""
        v = self.values[name]
        if v.layout == layout or len(v.shape) != 4 and layout == "plain":
            return name
        key = (name, layout)
        if key in self._layouts:
            return self._layouts[key]
        out = self.output(self.fresh(f"{name}@{layout}"), v.shape, v.dtype, layout)
        dims = list(v.shape)
        src_layout = v.layout
        self.step(f"reorder {src_layout}->{layout}", [name], [out],
                  lambda a: [self.rt.reorder(dims, src_layout, layout, a(name), a(out))])
        if name in self.requires:
            self.requires.add(out)

            def backward(pb: PlanBuilder) -> None:
                g = pb.grad(out)
                if g is None:  # before grad_target, which counts a contribution: a fetched
                    return  # copy nobody reads made the next one add to unwritten bytes
                target = pb.grad_target(name)
                if target is None:
                    return
                dest, _ = target
                pb.step(f"reorder {layout}->{src_layout} (backward)", [g], [dest],
                        lambda a: [pb.rt.reorder(dims, layout, src_layout, a(g), a(dest))],
                        "backward")
            self.lowered.append(Lowered(self.current, backward, "native"))
        self._layouts[key] = out
        return out

    # -- gradients -------------------------------------------------------------------------
    def grad(self, name: str) -> str | None:
        """The gradient of ``name`` if anything contributed to it (None: no gradient)."""
        return self._grads.get(name)

    def make_grad(self, name: str) -> str:
        v = self.values[name]
        g = f"{name}@grad"
        self.values[g] = Value(g, v.shape, v.dtype, v.layout, nbytes=v.nbytes)
        return g

    def grad_target(self, name: str, can_accumulate: bool = False) -> tuple[str, bool] | None:
        """Where a step writes its contribution to ``name``'s gradient, and whether it adds
        (only when ``can_accumulate``): the gradient itself for the first contribution, else
        a temporary added in after the step (``flush``). None: no gradient wanted."""
        if name not in self.requires:
            return None
        if name not in self._grads:
            self._grads[name] = self.make_grad(name)
            return self._grads[name], False
        g = self._grads[name]
        if can_accumulate:
            return g, True
        t = self.temp(g)
        self._pending.append((t, g))
        return t, False

    def alias_grad(self, name: str, of: str) -> bool:
        """Let ``name``'s gradient be ``of``'s bytes (a view's backward) when this is its only
        contribution and both are plain; False when the caller must copy instead."""
        if name not in self.requires or name in self._grads or self.consumers.get(name) != 1 \
                or self.values[name].storage == "external":  # a parameter's: its own array
            return False
        g = self.grad(of)
        v = self.values[name]
        if g is None or v.layout != "plain" or self.values[g].layout != "plain":
            return False
        self._grads[name] = self.view(f"{name}@grad", g, v.shape)
        return True

    def flush(self) -> None:
        for t, g in self._pending:
            n = self.values[g].nbytes // 4
            self.step("accumulate gradient", [t, g], [g],
                      lambda a, t=t, g=g, n=n: [self.rt.copy(a(t), a(g), n, True)], "backward")
        self._pending.clear()
