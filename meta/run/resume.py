"""Continuing a run from its checkpoint (``meta run --resume``): every rank reads it, so the
replicas agree. How long to train may change; what is trained may not: other definitions,
another vocabulary, another dtype or a damaged file are one CheckpointError each."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, TextIO

import numpy as np

from meta.lv2 import Trainer, load_checkpoint
from meta.lv2.checkpoint import CheckpointError, restore, vocabulary_digest
from meta.run.recipe import Definitions

CHECKPOINT = "checkpoint.npz"


def vocabulary_info(train_data: Any) -> dict[str, Any]:
    """A language model's vocabulary as a checkpoint keeps it (kind, size, digest of the
    ids' meaning), so that ``--resume`` on another corpus is refused; {} without one."""
    vocabulary = getattr(train_data, "vocabulary", None)
    if vocabulary is None:
        return {}
    return {"vocabulary": {"kind": getattr(vocabulary, "kind", type(vocabulary).__name__),
                           "size": len(vocabulary), "digest": vocabulary_digest(vocabulary)}}


def resume(trainer: Trainer, output_dir: Path, definitions: Definitions,
           vocabulary: Mapping[str, Any], stream: TextIO, prints: bool) -> None:
    """Continue ``trainer`` from ``output_dir/checkpoint.npz``, after checking that it was
    written by a run with these ``definitions`` and ``vocabulary`` (``vocabulary_info``);
    ``prints``: say so on ``stream`` (rank 0)."""
    path = output_dir / CHECKPOINT
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError:
        raise
    except Exception as err:  # zipfile's and zlib's other complaints about a damaged file
        raise CheckpointError(f"{path}: not a readable meta checkpoint ({type(err).__name__}"
                              f": {err}); resume from another checkpoint, or start again "
                              f"without --resume") from err
    _check_position(path, ckpt.position)
    saved, now = ckpt.info.get("definitions", {}), definitions.as_dict()
    run_length = {"events"} | ({"epochs"} if now.get("optimizer.lr_schedule") != "cosine"
                               else set())
    changed = sorted(k for k, v in now.items()
                     if k in saved and saved[k] != v and k not in run_length)
    if changed:
        raise CheckpointError(f"{path} was written by a run with other definitions "
                              f"({', '.join(f'{k}: {saved[k]!r}' for k in changed)}); "
                              f"resume with the same recipe and --set values")
    saved_vocabulary = ckpt.info.get("vocabulary")
    if "vocabulary" in ckpt.info and saved_vocabulary != vocabulary.get("vocabulary"):
        raise CheckpointError(f"{path} was trained on another vocabulary "
                              f"({_vocabulary_text(saved_vocabulary)}) than this run's "
                              f"corpus gives ({_vocabulary_text(vocabulary.get('vocabulary'))}"
                              f"): its token ids would mean other characters; resume with "
                              f"the corpus it was trained on, or start again without "
                              f"--resume")
    done, epochs = int(ckpt.position["epoch"]), definitions.epochs
    if epochs < done:
        raise CheckpointError(f"{path} has {done} epoch(s) done and epochs is {epochs}; "
                              f"resume with --set epochs={done + 1} or more (epochs is "
                              f"the run's total), or start again without --resume")
    graph = trainer.executor.graph
    network = {**graph.parameters, **graph.frozen, **graph.state}
    saved = {**ckpt.params, **ckpt.state}
    changed = [f"{k!r} is {np.asarray(v).dtype} in the checkpoint, {network[k].dtype} in "
               f"the network" for k, v in saved.items()
               if k in network and np.asarray(v).dtype != network[k].dtype]
    if changed:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise CheckpointError(f"{path}: {'; '.join(changed[:3])}{more}; resume with the "
                              f"dtype it was trained in, or start again without --resume")
    restore(trainer, ckpt, source=str(path))
    if prints:
        print(f"meta: resuming from {path} at epoch {ckpt.position['epoch'] + 1}, step "
              f"{ckpt.position['step']}", file=stream, flush=True)


def _check_position(path: Path, position: Any) -> None:
    """The checkpoint's loop position has the types the trainer reads (an edited file is a
    CheckpointError naming the field, not a ValueError from deep inside)."""
    counts = ("epoch", "step", "batch_in_epoch")
    wrong = [f"position.{k}" for k in counts
             if not isinstance(position.get(k), int) or isinstance(position.get(k), bool)
             or position[k] < 0]
    sums = position.get("epoch_sums")
    if not (isinstance(sums, list) and len(sums) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in sums)):
        wrong.append("position.epoch_sums")
    elapsed = position.get("epoch_elapsed")
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool):
        wrong.append("position.epoch_elapsed")
    history = position.get("history")
    if not (isinstance(history, list) and all(isinstance(m, dict) for m in history)):
        wrong.append("position.history")
    if wrong:
        raise CheckpointError(f"{path}: {', '.join(wrong)} do(es) not hold what a checkpoint "
                              f"writes (a damaged or edited file); resume from another "
                              f"checkpoint, or start again without --resume")


def _vocabulary_text(info: Any) -> str:
    """A checkpoint's record of a vocabulary in words."""
    if not isinstance(info, dict):
        return "none"
    return (f"{info.get('kind')}, {info.get('size')} tokens, digest "
            f"{str(info.get('digest'))[:8]}")
