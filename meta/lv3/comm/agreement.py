"""Ranks agree before they train: the same recipe, definitions and data on every rank.

Ranks started with different recipe files, ``--set`` values or data folders would otherwise
either fail deep inside MPI (buffers of different sizes) or, worse, train mismatched replicas
and report PASS. ``agree_on`` compares a digest of each value of a payload across the ranks (a
gather and a broadcast, before any other collective) and raises the same ``AgreementError`` on
every rank when they differ, naming the keys, their values and the ranks, e.g. ``ranks disagree
on the run: 'lr' (0.1 on ranks 0, 2; 0.2 on rank 1); start every rank with the same recipe,
--set values and data``.

>>> from meta.lv3 import world
>>> agree_on(world(), {"recipe": "mnist_mlp", "lr": 0.1})  # one rank: nothing to compare

Values are anything JSON can write (tuples as lists, other objects by ``repr``) and numpy
arrays, hashed by dtype, shape and contents (large arrays by an evenly spaced sample of rows,
``fingerprint``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import numpy as np

from meta.lv3.comm.communicator import Communicator

__all__ = ["AgreementError", "agree_on", "digest", "fingerprint", "run_payload"]

SAMPLE_BYTES = 1 << 24  # arrays larger than this are hashed by a sample of their rows
HINT = "start every rank with the same recipe, --set values and data"
_SHOWN_KEYS = 6  # a message names at most this many differing keys (then "and N more")


class AgreementError(RuntimeError):
    """The ranks of a job were not started alike; raised on every rank, with one message."""


def fingerprint(array: np.ndarray, max_bytes: int = SAMPLE_BYTES) -> str:
    """A digest of ``array``'s dtype, shape and values; beyond ``max_bytes`` of an evenly
    spaced sample of its rows (the first and last included), so 188 MB of MNIST costs ms."""
    array = np.asarray(array)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"ndarray {array.dtype.str} {array.shape}".encode())
    if array.nbytes > max_bytes and array.ndim and len(array) > 1:
        row = max(array.nbytes // len(array), 1)
        count = max(min(max_bytes // row, len(array)), 2)
        array = array[np.unique(np.linspace(0, len(array) - 1, count).astype(np.int64))]
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def digest(value: Any) -> str:
    """A digest of a JSON-able value (dict keys sorted) or a numpy array."""
    if isinstance(value, np.ndarray):
        return fingerprint(value)
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _shown(value: Any, limit: int = 40) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array {tuple(value.shape)} #{fingerprint(value)[:8]}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _disagreement(everyone: list[dict[str, tuple[str, str]]], what: str) -> str | None:
    """The message naming every key whose digests differ across ranks; None if none do."""
    keys = list(dict.fromkeys(k for payload in everyone for k in payload))
    problems = []
    for key in keys:
        groups: dict[str | None, list[int]] = {}
        shown: dict[str | None, str] = {}
        for rank, payload in enumerate(everyone):
            found = payload.get(key)
            group = found[0] if found else None
            groups.setdefault(group, []).append(rank)
            shown[group] = found[1] if found else "missing"
        if len(groups) > 1:
            parts = [f"{shown[g]} on {_ranks(r)}" for g, r in groups.items()]
            problems.append(f"{key!r} ({'; '.join(parts)})")
    if not problems:
        return None
    more = len(problems) - _SHOWN_KEYS
    listed = ", ".join(problems[:_SHOWN_KEYS]) + (f", and {more} more" if more > 0 else "")
    return f"ranks disagree on {what}: {listed}; {HINT}"


def agree_on(comm: Communicator, payload: Mapping[str, Any], what: str = "the run") -> None:
    """Check that every rank of ``comm`` passed an equal ``payload``; else raise the same
    ``AgreementError`` on every rank. A collective: every rank must call it. The payloads
    cross as digests and short previews, not as values."""
    if comm.size == 1:
        return
    mine = {str(key): (digest(value), _shown(value)) for key, value in payload.items()}
    everyone = comm.gather_obj(mine)
    message = _disagreement(everyone, what) if comm.is_root else None
    message = comm.bcast_obj(message)
    if message is not None:
        raise AgreementError(message)


def run_payload(recipe: str, definitions: Mapping[str, Any],
                parameters: Mapping[str, np.ndarray], data: Mapping[str, Any],
                position: Mapping[str, Any] | None) -> dict[str, Any]:
    """What every rank of a training run must have alike: the recipe's name and definitions,
    the network's ``parameters`` (shapes and dtypes), the ``data`` by split ("train",
    "test": their arrays by fingerprint) and, for a resumed run, the ``position`` it starts
    from (None: not resumed)."""
    payload: dict[str, Any] = {"recipe": recipe, **definitions, "resume": position is not None}
    payload["parameters"] = {k: [list(v.shape), str(v.dtype)] for k, v in parameters.items()}
    for split, dataset in data.items():
        for field in ("inputs", "labels"):
            if isinstance(getattr(dataset, field, None), np.ndarray):
                payload[f"{split} {field}"] = getattr(dataset, field)
    if position is not None:
        payload["resumed at"] = {k: position[k] for k in ("epoch", "step")}
    return payload
