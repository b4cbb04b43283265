"""Strategies by name, as recipes select them (``distributed: ...``): the ``strategy`` registry.

Each strategy class declares its options (``Strategy.options``) and builds itself from a
recipe (``from_recipe``); a user's strategy is a Strategy subclass registered with
``register_strategy`` or given as itself in the recipe file.

>>> import numpy as np
>>> from meta.lv2.optimizers import Optimizer, sgd
>>> make_strategy("model_averaging", Optimizer(sgd(0.1), {"w": np.zeros(2)}), average_every=4)
ModelAveraging(1 tensors, 16 bytes, SingleProcessCommunicator(rank=0, size=1))
"""

from __future__ import annotations

from typing import Any

from meta.common.component import Option, Registry, first_sentence
from meta.lv2.optimizers import Optimizer
from meta.lv3.comm.communicator import Communicator, world
from meta.lv3.data_parallel.allreduce import Allreduce
from meta.lv3.data_parallel.averaging import ModelAveraging, RingAveraging
from meta.lv3.data_parallel.hogwild import Hogwild
from meta.lv3.data_parallel.neighbours import NeighbourAveraging
from meta.lv3.data_parallel.zero import Zero2
from meta.lv3.data_parallel.zero3 import Zero3
from meta.lv3.hybrid.allreduce import HybridAllreduce
from meta.lv3.hybrid.downpour import HybridDownpour
from meta.lv3.parameter_server.central import AsyncParameterServer, ParameterServer
from meta.lv3.parameter_server.downpour import Downpour
from meta.lv3.parameter_server.hierarchical import HierarchicalParameterServer
from meta.lv3.parameter_server.rma import AsyncRMA
from meta.lv3.pipeline.strategy import Pipeline
from meta.lv3.sandblaster.strategy import Sandblaster
from meta.lv3.strategy import Strategy
from meta.lv3.tensor_parallel.strategy import Partitioned
from meta.lv3.workload import Workload

STRATEGIES = Registry("strategy", context=("optimizer", "comm", "workload"))
for _cls in (Allreduce, ParameterServer, AsyncParameterServer, ModelAveraging, RingAveraging,
             AsyncRMA, Downpour, Pipeline, HierarchicalParameterServer, NeighbourAveraging,
             Hogwild, HybridAllreduce, HybridDownpour, Partitioned, Zero2, Zero3):
    STRATEGIES.add(_cls.name, _cls.from_recipe, _cls.options,
                   doc=first_sentence(_cls.__doc__ or ""), cls=_cls)
STRATEGIES.add("sandblaster", Sandblaster.from_recipe, Sandblaster.options,
               doc=first_sentence(Sandblaster.__doc__ or ""), cls=Sandblaster,
               requires={"optimizer": ("lbfgs",)})


def register_strategy(name: str | None = None, **options: Option):
    """Make a Strategy subclass selectable by name (``distributed: name``); its ``options``
    and ``from_recipe`` say what a recipe may set and how it is built."""

    def decorate(cls: type[Strategy]) -> type[Strategy]:
        STRATEGIES.add(name or cls.name or cls.__name__, cls.from_recipe,
                       {**cls.options, **options}, doc=first_sentence(cls.__doc__ or ""),
                       cls=cls)
        return cls

    return decorate


def strategy_class(name: str) -> type[Strategy]:
    return STRATEGIES[name].meta["cls"]


def replica(name: str, rank: int, size: int, **options: Any) -> tuple[int, int]:
    """(index among the training ranks, their number) for ``rank`` under strategy ``name``
    with its recipe ``options`` (Downpour's ``servers`` train nothing)."""
    return strategy_class(name).replica(rank, size, **options)


def make_strategy(name: str, optimizer: Optimizer, comm: Communicator | None = None,
                  workload: Workload | None = None, **options: Any) -> Strategy:
    """Wrap ``optimizer`` in the strategy called ``name`` with its recipe ``options``
    (a collective: every rank calls it)."""
    component = STRATEGIES[name]
    return component.build(optimizer, world() if comm is None else comm, workload, **options)
