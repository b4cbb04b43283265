"""Sandblaster L-BFGS (DistBelief's batch method): a coordinator, portions of each batch
handed to workers (``portions``), what a worker evaluates (``rows``) and the parameters and
history kept in shards (``shards``)."""

from meta.common.moved import forward_names
from meta.lv3.sandblaster.rows import Evaluation
from meta.lv3.sandblaster.strategy import Sandblaster

__all__ = ["Evaluation", "Sandblaster"]
# what else the module meta.lv3.sandblaster held, before it became this package
__getattr__ = forward_names(__name__, "meta.lv3.sandblaster.strategy")
