"""Col2Im (ONNX opset 18+): sum sliding blocks back into an image, the adjoint of im2col.

input (N, C * prod(block_shape), L), image_shape and block_shape (the spatial sizes) give
(N, C, *image_shape); the L blocks are the windows of a convolution with ``strides``,
``dilations`` and ``pads`` over the image, in row-major order; overlapping blocks add.
Backward: im2col of dY (``ops/_window.py``).
"""

from __future__ import annotations

import math

import numpy as np

from meta.lv0 import Operator, register

from . import _window


@register("Col2Im", since=18)
class Col2Im(Operator):
    """ONNX Col2Im-18: the operator rearranges column blocks back into a multidimensional image
    Col2Im behaves similarly to PyTorch's fold
    https://pytorch.org/docs/stable/generated/torch.nn.Fold.html, but it only supports ..."""
    attributes = {"dilations": None, "pads": None, "strides": None}
    no_grad_inputs = (1, 2)

    def window(self, x, image_shape, block_shape):
        image = [int(v) for v in np.reshape(image_shape, -1)]
        block = [int(v) for v in np.reshape(block_shape, -1)]
        win = _window.geometry("Col2Im", image, block, self.strides, self.dilations, self.pads)
        k, blocks = math.prod(block), math.prod(win.out_shape)
        if x.ndim != 3 or x.shape[1] % k or x.shape[2] != blocks:
            raise ValueError(f"Col2Im: input {list(x.shape)} must be (N, C * {k}, {blocks}) "
                             f"for blocks {block} over image {image}")
        return win

    def forward(self, ctx, x, image_shape, block_shape):
        win = self.window(x, image_shape, block_shape)
        n, c = x.shape[0], x.shape[1] // win.size
        cols = x.reshape(n, c, *win.kernel, *win.out_shape)
        ctx.save(win=win, x_shape=x.shape)
        return np.ascontiguousarray(_window.unpad(_window.col2im(cols, win), win))

    def backward(self, ctx, dy):
        cols = _window.windows(_window.pad(dy, ctx.win), ctx.win)
        return (np.ascontiguousarray(cols).reshape(ctx.x_shape), None, None)
