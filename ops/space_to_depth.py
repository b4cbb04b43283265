"""SpaceToDepth: blocksize x blocksize spatial blocks moved into channels (ONNX opset 1+; the
newest opsets add ``mode`` DCR/CRD as DepthToSpace has); the gradient is DepthToSpace of dy."""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._blocks import depth_to_space, space_to_depth


@register("SpaceToDepth", since=1)
class SpaceToDepth(Operator):
    """ONNX SpaceToDepth-1: SpaceToDepth rearranges blocks of spatial data into depth."""
    attributes = {"blocksize": None, "mode": "DCR"}

    def forward(self, ctx, x):
        if self.mode not in ("DCR", "CRD"):
            raise ValueError(f"SpaceToDepth: mode must be 'DCR' or 'CRD', got {self.mode!r}")
        return space_to_depth(x, int(self.blocksize), self.mode)

    def backward(self, ctx, dy):
        return (None if dy is None else depth_to_space(dy, int(self.blocksize), self.mode),)
