"""What ZeRO-2 (``zero``) and ZeRO-3 (``zero3``) share: the flat shard's name, the walk over
an optimizer state's per-parameter dicts, the gathered state a checkpoint reads and the refusal
of an optimizer that cannot step a shard. Its own module so that ``zero`` (whose ``from_recipe``
picks ``zero3.Zero2Grouped`` on a planned executor) and ``zero3`` do not import each other."""

from __future__ import annotations

from typing import Any, Callable

from meta.common.component import ComponentError
from meta.lv2.optimizers import Optimizer

FLAT = ""  # the name of the one "parameter" a shard is: no network parameter has it


def _walk(tree: Any, per_parameter: Callable[[dict], Any], is_per_parameter: Callable[[dict], bool]
          ) -> Any:
    """``tree`` (dicts, tuples, lists, arrays, numbers) rebuilt, ``per_parameter`` applied to
    each dict ``is_per_parameter`` picks (a value per parameter); leaves kept."""
    if isinstance(tree, dict):
        if is_per_parameter(tree):
            return per_parameter(tree)
        return {k: _walk(v, per_parameter, is_per_parameter) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_walk(v, per_parameter, is_per_parameter) for v in tree)
    return tree


def gathered_state_dict(strategy: Any) -> dict:
    """The optimizer state a sharding strategy (ZeRO-2, ZeRO-3) last gathered whole, on rank 0;
    refused in one line on another rank, or when steps were taken since the gather (a stale
    state must not be saved)."""
    if not strategy.comm.is_root:
        raise RuntimeError(f"distributed {strategy.name!r}: rank {strategy.comm.rank} holds only "
                           f"its shard of the optimizer state; rank 0 holds it whole")
    if strategy._gathered_at != strategy.steps:
        raise RuntimeError(
            f"distributed {strategy.name!r}: the optimizer state is sharded over "
            f"{strategy.comm.size} ranks and was last gathered at step {strategy._gathered_at}, "
            f"not at step {strategy.steps}: checkpoints are written at epoch ends under "
            f"{strategy.name} (give the recipe test data, or leave checkpoint_every at 0)")
    return {"state": strategy._gathered}


def require_shardable(name: str, optimizer: Any) -> None:
    """Refuse, in one line, an optimizer whose rule cannot step one shard of the flat
    parameters apart from the rest (ZeRO-2 and ZeRO-3 both step shards)."""
    if not isinstance(optimizer, Optimizer) or not (optimizer.transform.elementwise
                                                     or optimizer.transform.shardable):
        raise ComponentError(
            f"distributed {name!r} steps each rank's shard of the flat parameters, "
            f"which needs an elementwise optimizer (SGD, momentum, Adam, RMSProp, Adagrad, "
            f"weight decay, grad_clip); this one is not (padding_rows, a rule by parameter "
            f"name, a user's rule not declared elementwise): use distributed 'allreduce'")
