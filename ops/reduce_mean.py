"""ReduceMean: mean over axes (attribute before opset 18, int64 input with noop option from 18)."""

from __future__ import annotations

from meta.lv0 import register

from ._reduce import Reduce


@register("ReduceMean", since=18)
class ReduceMean(Reduce):
    mean = True


@register("ReduceMean", since=1)
class ReduceMean1(ReduceMean):
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
