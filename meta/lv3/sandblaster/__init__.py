"""Sandblaster L-BFGS (DistBelief's batch method): a coordinator, portions of each batch
handed to workers (``portions``), what a worker evaluates (``rows``) and the parameters and
history kept in shards (``shards``)."""

from meta.lv3.sandblaster.rows import Evaluation
from meta.lv3.sandblaster.strategy import Sandblaster

__all__ = ["Evaluation", "Sandblaster"]
