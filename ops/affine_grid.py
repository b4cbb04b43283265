"""AffineGrid (ONNX opset 20+): the sampling grid of affine transforms ``theta`` (N, 2, 3) or
(N, 3, 4) over an output ``size`` (N, C, H, W) or (N, C, D, H, W), in normalised [-1, 1]
coordinates (pixel centres, or corners with ``align_corners=1``); grid (N, H, W, 2) or
(N, D, H, W, 3) holds (x, y[, z]). Backward w.r.t. theta: ``dgrid^T @ base``."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


def base_grid(sizes: list[int], align_corners: int) -> np.ndarray:
    """(prod(sizes), rank + 1): homogeneous (x, y[, z], 1) of every output position, the
    last spatial axis (x) varying fastest."""
    axes = []
    for n in sizes:
        if align_corners:
            axes.append(np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1))
        else:
            axes.append((np.arange(n) * 2 + 1) / n - 1)
    mesh = np.meshgrid(*axes, indexing="ij")  # (D, H, W) order
    coords = [m.reshape(-1) for m in reversed(mesh)]  # x first
    return np.stack([*coords, np.ones_like(coords[0])], axis=1)


@register("AffineGrid", since=20)
class AffineGrid(Operator):
    """ONNX AffineGrid-20: generates a 2D or 3D flow field (sampling grid), given a batch of
    affine matrices theta
    (https://pytorch.org/docs/stable/generated/torch.nn.functional.affine_grid.html)."""
    attributes = {"align_corners": 0}
    no_grad_inputs = (1,)

    def forward(self, ctx, theta, size):
        sizes = [int(v) for v in np.reshape(size, -1)][2:]
        rank = len(sizes)
        if theta.shape[1:] != (rank, rank + 1):
            raise ValueError(f"AffineGrid: theta {list(theta.shape)} must be (N, {rank}, "
                             f"{rank + 1}) for size {list(np.reshape(size, -1))}")
        base = base_grid(sizes, self.align_corners).astype(theta.dtype)
        grid = base @ np.swapaxes(theta, 1, 2)  # (N, P, rank)
        ctx.save(base=base)
        return grid.reshape(theta.shape[0], *sizes, rank)

    def backward(self, ctx, dgrid):
        n, rank = dgrid.shape[0], dgrid.shape[-1]
        g = dgrid.reshape(n, -1, rank)
        return (np.swapaxes(g, 1, 2) @ ctx.base, None)
