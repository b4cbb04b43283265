"""Checkpoints: everything a training run needs to continue bit-identically after a crash.

A checkpoint holds the parameters (trainable and frozen), the network's state (BatchNorm's
running statistics), the optimizer's state, the trainer's position (epoch, batch
within the epoch, running metric sums, history) and the random-generator states of operators
that draw random numbers (any operator with an ``rng`` generator, such as Dropout). The sampler
needs no state: its order is a function of (seed, epoch). Files are written atomically (a
temporary file in the same folder, then a rename), so a kill at any moment leaves either the
previous checkpoint or the new one, never half of one.

Format: one ``.npz`` (no pickling) with the arrays and a JSON document describing the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meta.common.files import atomic_write
from meta.lv2.events import Event, Metrics

FORMAT_VERSION = 2  # 2: the network's state apart from its parameters
META_KEY = "__meta__"
FIELDS = ("info", "position", "rng_states", "params", "state", "optimizer")
POSITION = ("epoch", "step", "batch_in_epoch", "epoch_sums", "epoch_elapsed", "history")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the run (names file and key)."""


def flatten_tree(tree: Any, arrays: dict[str, np.ndarray], prefix: str = "t") -> Any:
    """A JSON description of ``tree`` (dicts, lists, tuples, arrays, numbers, None, str) whose
    arrays are moved into ``arrays`` under generated keys."""
    if isinstance(tree, np.ndarray):
        arrays[prefix] = tree
        return {"array": prefix}
    if isinstance(tree, dict):
        return {"dict": [[k, flatten_tree(v, arrays, f"{prefix}.{i}")]
                         for i, (k, v) in enumerate(tree.items())]}
    if isinstance(tree, (list, tuple)):
        kind = "tuple" if isinstance(tree, tuple) else "list"
        return {kind: [flatten_tree(v, arrays, f"{prefix}.{i}") for i, v in enumerate(tree)]}
    if isinstance(tree, np.generic):
        return {"value": tree.item()}
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return {"value": tree}
    raise TypeError(f"checkpoint: cannot store a {type(tree).__name__} at {prefix}")


def unflatten_tree(spec: Any, arrays: Any) -> Any:
    """Rebuild the nested dicts, lists and tuples that ``spec`` describes from the named ``arrays``
    of a checkpoint."""
    (kind, body), = spec.items()
    if kind == "array":
        return np.array(arrays[body])
    if kind == "dict":
        return {k: unflatten_tree(v, arrays) for k, v in body}
    if kind in ("list", "tuple"):
        items = [unflatten_tree(v, arrays) for v in body]
        return tuple(items) if kind == "tuple" else items
    return body


@dataclass
class Checkpoint:
    params: dict[str, np.ndarray]
    optimizer: Any
    position: dict[str, Any]
    rng_states: dict[str, Any]
    info: dict[str, Any]
    state: dict[str, np.ndarray] = field(default_factory=dict)
    average: dict[str, np.ndarray] | None = None  # the weights' moving average (ema_decay)


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` atomically to ``path``; returns the path."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    document = {"format": FORMAT_VERSION, "info": ckpt.info, "position": ckpt.position,
                "rng_states": ckpt.rng_states,
                "params": flatten_tree(ckpt.params, arrays, "param"),
                "state": flatten_tree(ckpt.state, arrays, "state"),
                "optimizer": flatten_tree(ckpt.optimizer, arrays, "opt")}
    if ckpt.average is not None:  # optional: a run without ema_decay has none
        document["average"] = flatten_tree(ckpt.average, arrays, "ema")
    arrays[META_KEY] = np.frombuffer(json.dumps(document).encode(), dtype=np.uint8)
    with atomic_write(path, "wb") as f:  # synced, renamed; on a full disk no .tmp is left
        np.savez(f, **arrays)
    return path


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The checkpoint saved at ``path``; ``CheckpointError`` naming the file when it is missing or
    unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        document = json.loads(arrays.pop(META_KEY).tobytes())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as err:
        raise CheckpointError(f"{path}: not a readable meta checkpoint ({err})") from err
    if document.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {document.get('format')} is not "
                              f"{FORMAT_VERSION} (written by another version of meta)")
    missing = [k for k in FIELDS if k not in document] + [
        f"position.{k}" for k in POSITION if k not in document.get("position", POSITION)]
    try:
        if not missing:
            return Checkpoint(unflatten_tree(document["params"], arrays),
                              unflatten_tree(document["optimizer"], arrays),
                              document["position"], document["rng_states"], document["info"],
                              unflatten_tree(document["state"], arrays),
                              unflatten_tree(document["average"], arrays)
                              if "average" in document else None)
    except KeyError as err:  # an array the description names is not in the file
        missing = [f"array {err.args[0]}"]
    raise CheckpointError(f"{path}: the checkpoint has no {', '.join(missing)} (a damaged or "
                          f"edited file); resume from another checkpoint, or start again "
                          f"without --resume")


def vocabulary_digest(vocabulary: Any) -> str:
    """A short hash of what a language model's token ids mean (a vocabulary's ``state()``, or
    its kind and symbols): two corpora with vocabularies of one size but other characters give
    other digests, so a checkpoint that keeps it refuses to resume on the wrong corpus."""
    state = getattr(vocabulary, "state", None)
    if hasattr(vocabulary, "symbols") or not callable(state):  # meta.lv2.text's Vocabulary
        symbols = getattr(vocabulary, "symbols", None)
        document = {"kind": getattr(vocabulary, "kind", type(vocabulary).__name__),
                    "symbols": None if symbols is None else list(symbols)}
    else:  # another tokenizer: what rebuilds it
        document = state()
    text = json.dumps(document, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _random_ops(trainer: Any) -> dict[str, Any]:
    ops = trainer.executor.ops
    return {name: op for name, op in ops.items() if hasattr(op, "rng")}


def capture(trainer: Any, info: dict[str, Any] | None = None) -> Checkpoint:
    """The trainer's complete state as a Checkpoint (arrays copied)."""
    graph = trainer.executor.graph
    return Checkpoint(
        params={k: v.copy() for k, v in _weights(graph).items()},
        state={k: v.copy() for k, v in graph.state.items()},
        optimizer=trainer.optimizer.state_dict(),
        position=trainer.position(),
        rng_states={name: op.rng.bit_generator.state for name, op in _random_ops(trainer).items()},
        info=dict(info or {}),
        average=trainer.average.state() if getattr(trainer, "average", None) else None,
    )


def _weights(graph: Any) -> dict[str, np.ndarray]:
    """The parameters a checkpoint keeps: trainable and frozen (a frozen layer may have been
    trained before it was frozen)."""
    return {**graph.parameters, **graph.frozen}


def _check_fit(what: str, target: dict[str, np.ndarray], saved: dict[str, np.ndarray],
               source: str) -> None:
    """Every name and shape of ``saved`` fits ``target``, else a CheckpointError naming them."""
    if set(target) != set(saved):
        missing = sorted(set(target) - set(saved))
        extra = sorted(set(saved) - set(target))
        raise CheckpointError(f"{source}: {what} does not match the network "
                              f"(missing {missing}, unexpected {extra})")
    for name, value in saved.items():
        if target[name].shape != value.shape:
            raise CheckpointError(f"{source}: {what} {name!r} has shape {value.shape}, "
                                  f"the network has {target[name].shape}")


def restore(trainer: Any, ckpt: Checkpoint, source: str = "checkpoint") -> None:
    """Put ``ckpt`` back into the trainer: parameters and state in place, optimizer, position,
    RNGs."""
    graph = trainer.executor.graph
    pairs = [(_weights(graph), ckpt.params), (dict(graph.state), ckpt.state)]
    for what, (target, saved) in zip(("parameters", "state"), pairs):
        _check_fit(what, target, saved, source)  # all of it fits before anything changes
    for target, saved in pairs:
        for name, value in saved.items():
            target[name][...] = value
    graph.touch()  # written in place: executors holding the weights re-read them
    try:
        trainer.optimizer.load_state_dict(ckpt.optimizer)
    except KeyError as err:
        raise CheckpointError(f"{source}: the optimizer state has no {err.args[0]!r} (saved "
                              f"by another optimizer or strategy, or a damaged file)") from err
    trainer.restore_position(ckpt.position)
    if getattr(trainer, "average", None) is not None:  # None: starts at the resumed weights
        trainer.average.load(ckpt.average)
    for name, op in _random_ops(trainer).items():
        if name in ckpt.rng_states:
            op.rng.bit_generator.state = ckpt.rng_states[name]


class CheckpointEvent(Event):
    """Writes a checkpoint every ``every_steps`` steps (0: never mid-epoch) and after each epoch."""

    priority = -100  # after the events that compute and log metrics

    def __init__(self, path: str | os.PathLike, every_steps: int = 0,
                 info: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.every_steps = every_steps
        self.info = info or {}

    def write(self, trainer: Any) -> None:
        """Save the trainer's state (parameters, optimizer, samplers, step, history) to the event's
        path now."""
        save_checkpoint(self.path, capture(trainer, self.info))

    def on_step_end(self, trainer: Any, observation: Metrics) -> None:
        if self.every_steps and observation["step"] % self.every_steps == 0:
            self.write(trainer)

    def on_epoch_end(self, trainer: Any, metrics: Metrics) -> None:
        self.write(trainer)
