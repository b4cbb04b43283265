"""Data parallelism over pipelined replicas (DistBelief's arrangement): the grid of replicas
and stages (``grid``), allreduce over it (``allreduce``), and Downpour over it (``downpour``,
its servers in ``server``)."""

from meta.common.moved import forward_names
from meta.lv3.hybrid.allreduce import HybridAllreduce
from meta.lv3.hybrid.downpour import HybridDownpour
from meta.lv3.hybrid.grid import HybridPipeline, ReplicaGrid

__all__ = ["HybridAllreduce", "HybridDownpour", "HybridPipeline", "ReplicaGrid"]
# what else the module meta.lv3.hybrid held, before it became this package
__getattr__ = forward_names(__name__, "meta.lv3.hybrid.grid")
