"""DepthToSpace: channels moved into blocksize x blocksize spatial blocks (ONNX opset 1+; 11
added ``mode`` CRD beside the default DCR); the gradient is SpaceToDepth of dy."""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._blocks import depth_to_space, space_to_depth


@register("DepthToSpace", since=1)
class DepthToSpace(Operator):
    """ONNX DepthToSpace-1: DepthToSpace rearranges (permutes) data from depth into blocks of
    spatial data."""
    attributes = {"blocksize": None, "mode": "DCR"}

    def forward(self, ctx, x):
        return depth_to_space(x, int(self.blocksize), self.mode)

    def backward(self, ctx, dy):
        return (None if dy is None else space_to_depth(dy, int(self.blocksize), self.mode),)
