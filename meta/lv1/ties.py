"""Parameters an exporter wrote twice from one tied PyTorch parameter, trained as one.

PyTorch ties a GPT's token embedding and output head by sharing one tensor; both exporters
write it twice (the head's copy often as its transpose). Trained as two initializers, the model
unties at the first step. ``tie`` makes the derived copy the output of an Identity (or a
Transpose) of the kept one, so there is one storage and the executor sums both gradients into
it; ``meta.lv1.onnx_io.to_onnx`` writes both initializers back, and ``from_onnx(untie=True)``
keeps them apart.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from meta.lv1.graph import Graph, Node
from meta.lv1.roles import PARAMETER


def find_ties(graph: Graph) -> dict[str, tuple[str, str]]:
    """Parameters an exporter wrote twice from one tied PyTorch parameter (a GPT's embedding and
    output head): derived name -> (kept name, "equal" or "transpose"). Two parameters are one
    when their values are equal, or one is the other's transpose; tensors holding one repeated
    number (every LayerNorm's ones) are never taken for a tie. The kept one is the one the
    exporter marked PARAMETER, else the first in the file.

    Equal at export is not tied (the layers of an ``nn.TransformerEncoder`` are deep copies of
    one layer): where the file says where its initializers come from (PyTorch's dynamo
    exporter), only a tensor the exporter's optimizer made from a parameter still in the file
    (``folded_from``: a tied head's W^T) is tied to it; two parameters the exporter marked
    apart are two."""
    roles = graph.roles
    marks = getattr(graph, "exporter_marks", {})
    folded = getattr(graph, "folded_from", {})
    said = bool(getattr(graph, "signature_parameters", None)) or \
        any(v == "PARAMETER" for v in marks.values())
    order = {k: i for i, k in enumerate(graph.initializers)}
    names = sorted((k for k in graph.initializers if roles[k] == PARAMETER),
                   key=lambda k: (marks.get(k) != "PARAMETER", order[k]))
    seen: dict[tuple, list[str]] = {}  # (dtype, shape, digest of the bytes) -> names
    ties: dict[str, tuple[str, str]] = {}

    def key(value: np.ndarray) -> tuple:
        digest = hashlib.blake2b(np.ascontiguousarray(value).tobytes(), digest_size=16)
        return value.dtype.str, value.shape, digest.digest()

    def match(value: np.ndarray) -> str | None:
        return next((k for k in seen.get(key(value), ())
                     if np.array_equal(graph.initializers[k], value)), None)

    for name in names:
        value = graph.initializers[name]
        if value.size < 2 or np.all(value == value.flat[0]):
            continue
        if said:  # only what the exporter says is one
            for kept in folded.get(name, ()):
                other = graph.initializers.get(kept)
                if other is None or roles.get(kept) != PARAMETER or marks.get(name) is not None:
                    continue
                if other.shape == value.shape and np.array_equal(other, value):
                    ties[name] = (kept, "equal")
                elif other.ndim == 2 and other.T.shape == value.shape and \
                        np.array_equal(other.T, value):
                    ties[name] = (kept, "transpose")
                if name in ties:
                    break
            continue
        # Without the exporter's word: a parameter written under its own name is one of
        # PyTorch's (two named ones are two); a copy an exporter made (a generated name,
        # onnx::MatMul_12) is tied to a named one it equals, never to another copy.
        kept = match(value) if _generated(name) else None
        if kept is not None and not _generated(kept):
            ties[name] = (kept, "equal")
            continue
        if value.ndim == 2 and _generated(name):
            kept = match(value.T)
            if kept is not None and not _generated(kept):
                ties[name] = (kept, "transpose")
                continue
        seen.setdefault(key(value), []).append(name)
    return ties


def _generated(name: str) -> bool:
    """A name an exporter made up (``onnx::MatMul_12``, ``val_8``, ``123``), not a parameter's."""
    return re.match(r"(onnx::|val_\d|_v_\d|\d+$)", name) is not None


def tie(graph: Graph) -> dict[str, tuple[str, str]]:
    """Train each tie of ``find_ties`` as one parameter: the derived initializer becomes the
    output of an Identity (or Transpose) of the kept one, so there is one storage, the
    executor sums both gradients into it, and optimizers, checkpoints and strategies see one
    tensor. ``graph.ties`` records it; ``to_onnx`` writes both initializers back."""
    found = {k: v for k, v in find_ties(graph).items()
             if k not in {t.name for t in graph.inputs}}  # an optional feed stays a tensor
    for derived, (kept, kind) in found.items():
        del graph.initializers[derived]
        graph.exporter_marks.pop(derived, None)
        node = Node("Identity" if kind == "equal" else "Transpose", [kept], [derived],
                    f"tie/{derived}", attrs={} if kind == "equal" else {"perm": [1, 0]})
        graph.insert(node)
        graph.ties[derived] = (kept, kind, node.name)
    return found


def tie_note(found: dict[str, tuple[str, str]]) -> str:
    """The one line saying which initializers train as one."""
    pairs = [f"{d} = {k}{'ᵀ' if kind == 'transpose' else ''}" for d, (k, kind) in found.items()]
    shown = "; ".join(pairs[:3]) + (f"; and {len(pairs) - 3} more" if len(pairs) > 3 else "")
    return (f"tied: {shown} train as one parameter (the exporter wrote one tied parameter "
            f"twice); from_onnx(untie=True) keeps them apart")
