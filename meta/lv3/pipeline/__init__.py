"""Pipeline parallelism: the graph cut into stages (``partition``), the order of the
micro-batches (``schedule``), one rank's stage running them (``stage``) and the strategy that
ties them to the trainer (``strategy``)."""

from meta.common.moved import forward_names
from meta.lv3.pipeline.strategy import Pipeline, plan, stage_plan

__all__ = ["Pipeline", "plan", "stage_plan"]
# what else the module meta.lv3.pipeline held, before it became this package
__getattr__ = forward_names(__name__, "meta.lv3.pipeline.strategy")
