"""Tensor parallelism: each layer's neurons split over the ranks (DistBelief's partitioned
model, Megatron-LM's column and row splits): the split (``plan``), its collectives as
operators (``ops``) and the strategy (``strategy``)."""

from meta.lv3.tensor_parallel.strategy import Partitioned

__all__ = ["Partitioned"]
