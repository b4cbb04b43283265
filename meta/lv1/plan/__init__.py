"""The planned executor: graphs compiled into plans of oneDNN kernels (``executor: planned``)."""

from meta.lv1.plan.executor import PlannedExecutor

__all__ = ["PlannedExecutor"]
