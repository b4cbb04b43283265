"""RotaryEmbedding (ONNX opset 23+): rotate pairs of features by position-dependent angles.

X is (B, H, S, D) or (B, S, H*D) (then ``num_heads`` is required); the first
``rotary_embedding_dim`` (default: all) features of each head are rotated, as halves
(x1 = first half, x2 = second) or, with ``interleaved=1``, as even/odd pairs:
``(x1 cos - x2 sin, x1 sin + x2 cos)``. cos_cache / sin_cache are (B, S, dim/2), or
(max_position, dim/2) indexed by position_ids (B, S).

Backward: w.r.t. X (the inverse rotation of dY) and the two caches (summed into the positions
read); position_ids has none.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("RotaryEmbedding", since=23)
class RotaryEmbedding(Operator):
    """ONNX RotaryEmbedding-23: RotaryEmbedding is the implementation of rotary positional
    embeddings (RoPE) based on the paper https://arxiv.org/pdf/2104.09864."""
    attributes = {"interleaved": 0, "num_heads": None, "rotary_embedding_dim": 0}
    no_grad_inputs = (3,)

    def to_heads(self, x):
        """X as (B, S, H, D)."""
        if x.ndim == 4:
            return x.transpose(0, 2, 1, 3)
        if not self.num_heads:
            raise ValueError(f"RotaryEmbedding: 3-D X {list(x.shape)} needs num_heads")
        b, s, hidden = x.shape
        return x.reshape(b, s, self.num_heads, hidden // self.num_heads)

    def from_heads(self, y, shape):
        return y.transpose(0, 2, 1, 3) if len(shape) == 4 else y.reshape(shape)

    def split(self, rot):
        if self.interleaved:
            return rot[..., 0::2], rot[..., 1::2]
        half = rot.shape[-1] // 2
        return rot[..., :half], rot[..., half:]

    def join(self, a, b):
        if self.interleaved:
            return np.stack((a, b), axis=-1).reshape(*a.shape[:-1], -1)
        return np.concatenate((a, b), axis=-1)

    def caches(self, cos, sin, position_ids):
        if position_ids is not None:
            cos, sin = cos[position_ids], sin[position_ids]
        return cos[:, :, None, :], sin[:, :, None, :]  # (B, S, 1, dim/2)

    def forward(self, ctx, x, cos_cache, sin_cache, position_ids=None):
        h = self.to_heads(x)
        dim = self.rotary_embedding_dim or h.shape[3]
        cos, sin = self.caches(cos_cache, sin_cache, position_ids)
        if cos.shape[-1] != dim // 2 or sin.shape[-1] != dim // 2:
            raise ValueError(f"RotaryEmbedding: the caches' last axis ({cos.shape[-1]}, "
                             f"{sin.shape[-1]}) must be rotary_embedding_dim / 2 = {dim // 2}")
        x1, x2 = self.split(h[..., :dim])
        rotated = self.join(cos * x1 - sin * x2, sin * x1 + cos * x2)
        y = np.concatenate((rotated, h[..., dim:]), axis=-1).astype(x.dtype, copy=False)
        ctx.save(x1=x1, x2=x2, cos=cos, sin=sin, dim=dim, shape=x.shape,
                 cache_shape=cos_cache.shape, position_ids=position_ids)
        return self.from_heads(y, x.shape)

    def backward(self, ctx, dy):
        g = self.to_heads(dy)
        dim, cos, sin = ctx.dim, ctx.cos, ctx.sin
        d1, d2 = self.split(g[..., :dim])
        dx = np.concatenate((self.join(cos * d1 + sin * d2, cos * d2 - sin * d1), g[..., dim:]),
                            axis=-1)
        dcos = (d1 * ctx.x1 + d2 * ctx.x2).sum(axis=2)  # (B, S, dim/2)
        dsin = (d2 * ctx.x1 - d1 * ctx.x2).sum(axis=2)
        if ctx.position_ids is not None:
            full_cos, full_sin = np.zeros(ctx.cache_shape, dy.dtype), \
                np.zeros(ctx.cache_shape, dy.dtype)
            np.add.at(full_cos, ctx.position_ids, dcos)
            np.add.at(full_sin, ctx.position_ids, dsin)
            dcos, dsin = full_cos, full_sin
        return (self.from_heads(dx, ctx.shape).astype(dy.dtype, copy=False),
                dcos.astype(dy.dtype, copy=False), dsin.astype(dy.dtype, copy=False), None)
