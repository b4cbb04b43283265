"""Einsum: Einstein summation over any number of operands (ONNX opset 12+), numpy's
conventions: implicit output (letters seen once, sorted), ellipsis broadcasting.

The equation is first rewritten with one letter per axis (ellipsis axes get unused letters)
and size-1 ellipsis axes are broadcast, so backward is again einsum: the gradient of operand i
is dy contracted with the other operands onto i's letters, broadcast over letters only i has,
written onto the diagonal where i repeats a letter, and summed where i was broadcast.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from meta.lv0 import Operator, register


@dataclass
class Plan:
    terms: list[str]
    output: str
    sizes: dict[str, int]


def plan(equation: str, shapes: list[tuple[int, ...]]) -> Plan:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"Einsum: equation {equation!r} has {len(terms)} operands, got "
                         f"{len(shapes)} inputs")
    spare = [c for c in string.ascii_letters if c not in eq]
    ell = max((len(s) - len(t.replace("...", "")) for t, s in zip(terms, shapes)
               if "..." in t), default=0)
    letters = spare[:ell]
    explicit = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            k = len(s) - len(t.replace("...", ""))
            t = t.replace("...", "".join(letters[ell - k:]))
        if len(t) != len(s):
            raise ValueError(f"Einsum: term {t!r} of {equation!r} does not fit an input of "
                             f"shape {list(s)}")
        explicit.append(t)
    if arrow:
        output = rhs.replace("...", "".join(letters))
    else:
        seen = "".join(explicit)
        output = "".join(letters) + "".join(sorted(c for c in set(seen) if seen.count(c) == 1
                                                   and c not in letters))
    sizes: dict[str, int] = {}
    for t, s in zip(explicit, shapes):
        for c, n in zip(t, s):
            old = sizes.get(c)
            if old is None or old == 1:
                sizes[c] = n
            elif n not in (1, old):
                raise ValueError(f"Einsum: letter {c!r} of {equation!r} has sizes {old} and {n}")
    return Plan(explicit, output, sizes)


@register("Einsum", since=12)
class Einsum(Operator):
    """ONNX Einsum-12: an einsum of the form term1, term2 -> output-term produces an output
    tensor using the following equation output[output-term] = reduce-sum( input1[term1] *
    input2[term2] ) where the reduce-sum ..."""
    attributes = {"equation": None}

    def forward(self, ctx, *xs):
        p = plan(self.equation, [x.shape for x in xs])
        full = [np.broadcast_to(x, [p.sizes[c] for c in t]) for x, t in zip(xs, p.terms)]
        spec = ",".join(p.terms) + "->" + p.output
        y = np.einsum(spec, *full, optimize=len(xs) > 2)
        ctx.save(plan=p, xs=full, shapes=[x.shape for x in xs])
        return np.asarray(y, dtype=np.result_type(*xs))

    def backward(self, ctx, dy):
        p, xs = ctx.plan, ctx.xs
        if dy is None:
            return (None,) * len(xs)
        grads = []
        for i, (term, x, shape) in enumerate(zip(p.terms, xs, ctx.shapes)):
            if not ctx.needs(i) or x.dtype.kind != "f":
                grads.append(None)
                continue
            others = [t for j, t in enumerate(p.terms) if j != i]
            reachable = set(p.output).union(*others)
            unique = "".join(dict.fromkeys(term))
            kept = "".join(c for c in unique if c in reachable)
            spec = ",".join([p.output, *others]) + "->" + kept
            g = np.einsum(spec, dy, *(x for j, x in enumerate(xs) if j != i),
                          optimize=len(xs) > 2)
            # letters only this operand has were summed alone: the gradient is constant there
            g = np.broadcast_to(g.reshape([p.sizes[c] if c in kept else 1 for c in unique]),
                                [p.sizes[c] for c in unique])
            if len(unique) != len(term):  # a repeated letter: only the diagonal is read
                full = np.zeros(x.shape, dy.dtype)
                np.einsum(term + "->" + unique, full)[...] = g
                g = full
            g = np.asarray(g, dtype=dy.dtype)
            stretched = tuple(a for a, (n, m) in enumerate(zip(shape, g.shape)) if n != m)
            if stretched:
                g = g.sum(axis=stretched, keepdims=True)
            # a copy in C order, keeping 0-d operands 0-d (ascontiguousarray makes them (1,))
            grads.append(g.reshape(shape).copy(order="C"))
        return tuple(grads)
