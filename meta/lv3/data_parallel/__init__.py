"""Data parallelism: every rank holds the whole model and a shard of each batch.

``allreduce`` (gradients averaged, optionally compressed or quantized; on one machine through
``node_exchange`` and the ZeRO-1 ``sharded_optimizer``), ``averaging`` (local SGD, the ring),
``neighbours`` (gossip over a process topology) and ``hogwild`` (lock-free SGD in memory one
machine shares).
"""

from meta.lv3.data_parallel.allreduce import Allreduce, AllreduceOptimizer, allreduce_mean
from meta.lv3.data_parallel.averaging import ModelAveraging, RingAveraging
from meta.lv3.data_parallel.hogwild import Hogwild
from meta.lv3.data_parallel.neighbours import NeighbourAveraging

__all__ = ["Allreduce", "AllreduceOptimizer", "Hogwild", "ModelAveraging",
           "NeighbourAveraging", "RingAveraging", "allreduce_mean"]
