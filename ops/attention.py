"""Attention (ONNX opsets 23-24, and 25+ with sliding windows): scaled dot-product attention.

Q (B, Hq, Lq, D) or (B, Lq, Hq*D) with K, V likewise (3-D inputs need ``q_num_heads`` and
``kv_num_heads``); optional ``attn_mask`` (bool: attend where true; float: added to the
logits; shorter than the keys is padded as masked), ``past_key``/``past_value`` (prepended to
K and V, which come out as ``present_key``/``present_value``) and, from 24,
``nonpad_kv_seqlen`` (keys past each batch's length are masked). ``is_causal`` masks keys after
each query, aligned to the bottom right (a query block after a cache sees the cache);
``left_window_size``/``right_window_size`` (25) bound how far a query looks. Grouped-query
attention repeats each K/V head for ``Hq / Hk`` query heads. The logits are
``(Q sqrt(s)) (K sqrt(s))^T`` with ``s = scale`` or ``1/sqrt(D)``, then
``softcap * tanh(logits / softcap)`` when ``softcap > 0``, then the mask; softmax (in
``softmax_precision`` when given) gives the weights, a fully masked query row gets zeros.
``qk_matmul_output`` is the (softcapped) logits (mode 0, 1), with the mask added (2), or the
weights (3). The order of operations, and so the rounding in float16, follows onnx.reference.

Backward: gradients w.r.t. Q, K, V, past_key, past_value and a float ``attn_mask``, through
every output (Y, the presents and the QK output in any mode).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from meta.lv0 import Operator, register


def _bias(q_len, kv_len, dtype, mask, causal, offset, windows, nonpad, batch):
    """The additive bias (0 or -inf, or the float mask's values), broadcastable to
    (B, H, Lq, Lk), as onnx.reference builds it."""
    bias = np.zeros((q_len, kv_len), dtype)
    if mask is not None:
        pad = kv_len - mask.shape[-1]
        if pad > 0:
            fill = False if mask.dtype == np.bool_ else -np.inf
            mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=fill)
        if mask.dtype == np.bool_:
            mask = np.where(mask, dtype.type(0), dtype.type(-np.inf))
    i = np.arange(q_len).reshape(-1, 1)
    j = np.arange(kv_len).reshape(1, -1)
    if np.ndim(offset):
        shift = np.reshape(offset, (-1, 1, 1))  # per batch: (B, 1, 1)
    else:
        shift = int(offset)

    def allowed_to_bias(allowed):
        b = np.where(allowed, dtype.type(0), dtype.type(-np.inf))
        return b.reshape(b.shape[0], 1, q_len, kv_len) if np.ndim(offset) else b

    if causal:
        base = bias if mask is None else mask.astype(dtype, copy=True)
        if windows != (-1, -1):
            base = bias + base
        bias = base + allowed_to_bias(j <= i + shift)
    elif mask is not None:
        bias = bias + mask.astype(dtype, copy=False)
    if windows != (-1, -1):
        left, right = windows
        diff = (i + shift) - j
        allowed = np.ones_like(diff, dtype=bool)
        if left >= 0:
            allowed &= diff <= left
        if right >= 0:
            allowed &= -diff <= right
        bias = allowed_to_bias(allowed) + (np.zeros((q_len, kv_len), dtype) + bias)
    if nonpad is not None:
        keep = np.arange(kv_len) < np.reshape(nonpad, (-1, 1))
        bias = bias + np.where(keep, 0, -np.inf).astype(bias.dtype).reshape(batch, 1, 1, kv_len)
    return bias, mask


@register("Attention", since=23)
class Attention(Operator):
    """ONNX Attention-23: computes scaled dot product attention on query, key and value tensors,
    using an optional attention mask if passed."""
    attributes = {"is_causal": 0, "kv_num_heads": None, "q_num_heads": None,
                  "qk_matmul_output_mode": 0, "scale": None, "softcap": 0.0,
                  "softmax_precision": None}
    no_grad_inputs = (6,)
    windows = (-1, -1)

    def heads(self, x, n, what):
        """(B, L, H*D) -> (B, H, L, D)."""
        if n is None:
            raise ValueError(f"Attention: 3-D {what} needs q_num_heads and kv_num_heads")
        b, length, hidden = x.shape
        return x.reshape(b, length, n, hidden // n).transpose(0, 2, 1, 3)

    def forward(self, ctx, q, k, v, attn_mask=None, past_key=None, past_value=None,
                nonpad_kv_seqlen=None):
        if (past_key is None) != (past_value is None):
            raise ValueError("Attention: give past_key and past_value together")
        if q.ndim != k.ndim or q.ndim != v.ndim or q.ndim not in (3, 4):
            raise ValueError(f"Attention: Q {list(q.shape)}, K {list(k.shape)}, V "
                             f"{list(v.shape)} must all be 3-D or all 4-D")
        flat = q.ndim == 3
        if flat:
            q = self.heads(q, self.q_num_heads, "Q")
            k = self.heads(k, self.kv_num_heads, "K")
            v = self.heads(v, self.kv_num_heads, "V")
        dtype = q.dtype
        scale = 1 / np.sqrt(q.shape[3]) if self.scale is None else self.scale
        s = dtype.type(np.sqrt(scale))
        key = k if past_key is None else np.concatenate((past_key, k), axis=2)
        value = v if past_value is None else np.concatenate((past_value, v), axis=2)
        q_len, kv_len = q.shape[2], key.shape[2]
        if past_key is None and nonpad_kv_seqlen is not None:
            offset = np.reshape(nonpad_kv_seqlen, -1) - q_len
        else:
            offset = past_key.shape[2] if past_key is not None else 0
        bias, mask = _bias(q_len, kv_len, dtype, attn_mask, self.is_causal, offset,
                           tuple(self.windows), nonpad_kv_seqlen, q.shape[0])
        reps = q.shape[1] // key.shape[1]
        kr = np.repeat(key, reps, axis=1) if reps > 1 else key
        vr = np.repeat(value, reps, axis=1) if reps > 1 else value
        qs, ks = q * s, kr * s
        logits = qs @ np.swapaxes(ks, -1, -2)
        capped = logits
        if self.softcap > 0:
            capped = np.tanh(logits / self.softcap) * self.softcap
        with np.errstate(invalid="ignore"):
            biased = capped + bias
        work = biased if self.softmax_precision is None else biased.astype(
            helper.tensor_dtype_to_np_dtype(self.softmax_precision))
        top = work.max(axis=-1, keepdims=True)
        top = np.where(np.isneginf(top), 0, top)
        e = np.exp(work - top)
        total = e.sum(axis=-1, keepdims=True)
        probs = e / np.where(total == 0, 1, total)
        masked_rows = np.isneginf(np.max(bias, axis=-1, keepdims=True))
        probs = np.where(masked_rows, 0, probs)
        mode = self.qk_matmul_output_mode
        qk = {0: capped, 1: capped, 2: biased, 3: probs}[mode].astype(dtype, copy=False)
        p = probs.astype(dtype, copy=False)
        y = p @ vr
        if flat:
            y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
        ctx.save(qs=qs, ks=ks, vr=vr, p=p, logits=logits, s=s, reps=reps, flat=flat,
                 masked_rows=masked_rows, float_mask=attn_mask is not None
                 and attn_mask.dtype != np.bool_, mask_shape=np.shape(attn_mask),
                 past=0 if past_key is None else past_key.shape[2])
        return y, key, value, qk

    def backward(self, ctx, dy, dkey=None, dvalue=None, dqk=None):
        p, vr, qs, ks = ctx.p, ctx.vr, ctx.qs, ctx.ks
        dtype = p.dtype
        dp = np.zeros_like(p)
        dvr = np.zeros_like(vr)
        if dy is not None:
            if ctx.flat:  # (B, Lq, H*Dv) -> (B, H, Lq, Dv)
                b, length, _ = dy.shape
                dy = dy.reshape(b, length, p.shape[1], -1).transpose(0, 2, 1, 3)
            dp = dy @ np.swapaxes(vr, -1, -2)
            dvr = np.swapaxes(p, -1, -2) @ dy
        mode = self.qk_matmul_output_mode
        if dqk is not None and mode == 3:
            dp = dp + dqk
        # softmax (rows zeroed for fully masked queries pass nothing back)
        dbiased = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        dbiased = np.where(ctx.masked_rows | ~np.isfinite(dbiased), 0, dbiased)
        if dqk is not None and mode == 2:
            dbiased = dbiased + dqk
        dcapped = dbiased
        if dqk is not None and mode in (0, 1):
            dcapped = dcapped + dqk
        dlogits = dcapped
        if self.softcap > 0:
            t = np.tanh(ctx.logits / self.softcap)
            dlogits = dcapped * (1 - t * t)
        dq = (dlogits @ ks) * ctx.s
        dkr = (np.swapaxes(dlogits, -1, -2) @ qs) * ctx.s

        def ungroup(g):  # the repeated K/V heads sum back into their source head
            if ctx.reps == 1:
                return g
            b, h, length, d = g.shape
            return g.reshape(b, h // ctx.reps, ctx.reps, length, d).sum(axis=2)

        dkey_total, dvalue_total = ungroup(dkr), ungroup(dvr)
        if dkey is not None:
            dkey_total = dkey_total + dkey
        if dvalue is not None:
            dvalue_total = dvalue_total + dvalue
        past = ctx.past
        dk, dv = dkey_total[:, :, past:], dvalue_total[:, :, past:]
        dpast_k = dkey_total[:, :, :past] if past else None
        dpast_v = dvalue_total[:, :, :past] if past else None
        if ctx.flat:
            def merge(g):
                return g.transpose(0, 2, 1, 3).reshape(g.shape[0], g.shape[2], -1)
            dq, dk, dv = merge(dq), merge(dk), merge(dv)
        dmask = None
        if ctx.float_mask and ctx.needs(3):
            shape = ctx.mask_shape
            g = dbiased[..., :shape[-1]]  # padded columns are constants
            lead = g.ndim - len(shape)
            g = g.sum(axis=tuple(range(lead))) if lead > 0 else g
            axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
            dmask = (g.sum(axis=axes, keepdims=True) if axes else g).astype(dtype)
        cast = [None if g is None else g.astype(dtype, copy=False) for g in
                (dq, dk, dv, dmask, dpast_k, dpast_v)]
        return (*cast, None)


@register("Attention", since=25)
class Attention25(Attention):
    """Opset 25 adds ``left_window_size`` and ``right_window_size`` (-1: unbounded)."""

    attributes = {**Attention.attributes, "left_window_size": -1, "right_window_size": -1}

    @property
    def windows(self):
        return (self.left_window_size, self.right_window_size)
