"""OptionalGetElement (ONNX opset 15+; 18 also takes a plain tensor or sequence): the value an
optional holds; an empty one is an error."""

from __future__ import annotations

from meta.lv0 import Operator, register


@register("OptionalGetElement", since=15)
class OptionalGetElement(Operator):
    """ONNX OptionalGetElement-15: outputs the element in the optional-type input."""
    no_grad_inputs = (0,)

    def forward(self, ctx, value=None):
        if value is None:
            raise ValueError("OptionalGetElement: the optional is empty")
        return (value,)
