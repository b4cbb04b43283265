"""Optional (ONNX opset 15+): an optional holding the input, or empty (None) without one."""

from __future__ import annotations

from meta.lv0 import Operator, register


@register("Optional", since=15)
class Optional(Operator):
    """ONNX Optional-15: constructs an optional-type value containing either an empty optional
    of a certain type specified by the attribute, or a non-empty value containing the input
    element."""
    attributes = {"type": None}
    no_grad_inputs = (0,)

    def forward(self, ctx, value=None):
        return (value,)
