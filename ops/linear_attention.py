"""LinearAttention (ONNX opset 27+): recurrent linear attention with a (d_k, d_v) state per
KV head, for decoding (T = 1) and prefill (T > 1).

query (B, T, Hq*d_k), key (B, T, Hkv*d_k), value (B, T, Hkv*d_v); optional past_state
(B, Hkv, d_k, d_v), decay (B, T, Hkv or Hkv*d_k, log-space) and beta (B, T, Hkv or 1).
Per step, with ``e = exp(decay_t)`` scaling the state's rows:

- linear: S = S + k v^T;  gated: S = e S + k v^T;
- delta: S = S + k (beta (v - S^T k))^T;  gated_delta: the same with e S in place of S;

and each query head reads ``scale * q^T S`` of its KV head (grouped query: Hq / Hkv query
heads share one). Outputs (B, T, Hq*d_v) and the final state. ``chunk_size`` is a hint with
no effect. The recurrence runs in float32 for float16/float32 inputs (as onnx.reference) and
in float64 for float64.

Backward: through time, w.r.t. query, key, value, past_state, decay and beta, from both
outputs.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    """(B, T, H*D) -> (B, H, T, D)."""
    b, t, hd = x.shape
    if hd % n:
        raise ValueError(f"LinearAttention: last axis of {list(x.shape)} is not a multiple of "
                         f"{n} heads")
    return x.reshape(b, t, n, hd // n).transpose(0, 2, 1, 3)


def _unheads(x: np.ndarray) -> np.ndarray:
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


@register("LinearAttention", since=27)
class LinearAttention(Operator):
    """ONNX LinearAttention-27: unified linear attention operator for autoregressive decoding
    (T=1) and prefill (T>1)."""
    attributes = {"chunk_size": 64, "kv_num_heads": None, "q_num_heads": None, "scale": 0.0,
                  "update_rule": "gated_delta"}

    def check(self, decay, beta):
        rule = self.update_rule
        if rule not in ("linear", "gated", "delta", "gated_delta"):
            raise ValueError(f"LinearAttention: unknown update_rule {rule!r}")
        if not self.q_num_heads or not self.kv_num_heads or \
                self.q_num_heads % self.kv_num_heads:
            raise ValueError(f"LinearAttention: q_num_heads ({self.q_num_heads}) must be a "
                             f"positive multiple of kv_num_heads ({self.kv_num_heads})")
        gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        if gated != (decay is not None):
            raise ValueError(f"LinearAttention: update_rule {rule!r} "
                             f"{'needs' if gated else 'takes no'} decay")
        if delta != (beta is not None):
            raise ValueError(f"LinearAttention: update_rule {rule!r} "
                             f"{'needs' if delta else 'takes no'} beta")
        return gated, delta

    def forward(self, ctx, query, key, value, past_state=None, decay=None, beta=None):
        gated, delta = self.check(decay, beta)
        hq, hk = self.q_num_heads, self.kv_num_heads
        work = np.float64 if query.dtype == np.float64 else np.float32
        q, k, v = (_heads(a, n).astype(work) for a, n in ((query, hq), (key, hk), (value, hk)))
        b, _, steps, dk = q.shape
        dv = v.shape[3]
        group = hq // hk
        scale = 1 / np.sqrt(dk) if not self.scale else float(self.scale)
        e = None
        if gated:
            width = decay.shape[-1]
            if width not in (hk, hk * dk):
                raise ValueError(f"LinearAttention: decay {list(decay.shape)} must end in "
                                 f"{hk} or {hk * dk}")
            g = _heads(decay, hk).astype(work)  # (B, H, T, 1 or dk)
            e = np.exp(g)
        if delta:
            if beta.shape[-1] not in (hk, 1):
                raise ValueError(f"LinearAttention: beta {list(beta.shape)} must end in {hk} "
                                 f"or 1")
            bt = beta.reshape(b, steps, beta.shape[-1], 1).transpose(0, 2, 1, 3).astype(work)
        state = np.zeros((b, hk, dk, dv), work) if past_state is None \
            else past_state.astype(work)
        outs = np.zeros((b, hq, steps, dv), work)
        saved = []
        for t in range(steps):
            before = state
            if gated:
                state = state * e[:, :, t, :, None]
            decayed = state
            u = v[:, :, t]
            if delta:
                retrieved = np.einsum("bhdm,bhd->bhm", state, k[:, :, t])
                u = bt[:, :, t] * (u - retrieved)
            state = state + k[:, :, t, :, None] * u[:, :, None, :]
            read = np.repeat(state, group, axis=1) if group > 1 else state
            outs[:, :, t] = scale * np.einsum("bhd,bhdm->bhm", q[:, :, t], read)
            saved.append((before, decayed, u, state))
        ctx.save(q=q, k=k, v=v, e=e, bt=bt if delta else None, saved=saved, scale=scale,
                 group=group, gated=gated, delta=delta, shapes=(query.dtype, past_state,
                                                               decay, beta))
        state_dtype = query.dtype if past_state is None else past_state.dtype
        return _unheads(outs).astype(query.dtype), state.astype(state_dtype)

    def backward(self, ctx, dout, dstate=None):
        q, k, v, e, bt = ctx.q, ctx.k, ctx.v, ctx.e, ctx.bt
        dtype, past_state, decay, beta = ctx.shapes
        b, hq, steps, dk = q.shape
        hk, dv, group = k.shape[1], v.shape[3], ctx.group
        work = q.dtype
        do = np.zeros((b, hq, steps, dv), work) if dout is None else \
            _heads(dout, hq).astype(work)
        ds = np.zeros((b, hk, dk, dv), work) if dstate is None else dstate.astype(work)
        dq, dk_, dv_ = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        dg = np.zeros_like(e) if ctx.gated else None
        dbt = np.zeros_like(bt) if ctx.delta else None
        for t in reversed(range(steps)):
            before, decayed, u, state = ctx.saved[t]
            read = np.repeat(state, group, axis=1) if group > 1 else state
            dq[:, :, t] = ctx.scale * np.einsum("bhdm,bhm->bhd", read, do[:, :, t])
            reads = ctx.scale * q[:, :, t, :, None] * do[:, :, t, None, :]  # (B, Hq, dk, dv)
            ds = ds + reads.reshape(b, hk, group, dk, dv).sum(axis=2)
            # state = decayed + k u^T
            dk_[:, :, t] += np.einsum("bhdm,bhm->bhd", ds, u)
            du = np.einsum("bhdm,bhd->bhm", ds, k[:, :, t])
            ddecayed = ds
            if ctx.delta:  # u = beta (v - decayed^T k)
                retrieved = np.einsum("bhdm,bhd->bhm", decayed, k[:, :, t])
                dv_[:, :, t] += bt[:, :, t] * du
                share = (du * (v[:, :, t] - retrieved)).sum(axis=-1, keepdims=True)
                dbt[:, :, t] += share.sum(axis=1, keepdims=True) if bt.shape[1] == 1 else share
                dr = -bt[:, :, t] * du
                ddecayed = ddecayed + k[:, :, t, :, None] * dr[:, :, None, :]
                dk_[:, :, t] += np.einsum("bhdm,bhm->bhd", decayed, dr)
            else:
                dv_[:, :, t] += du
            if ctx.gated:  # decayed = before * e (rows)
                de = (ddecayed * before).sum(axis=-1)  # (B, H, dk)
                if e.shape[-1] == 1:
                    de = de.sum(axis=-1, keepdims=True)
                dg[:, :, t] += de * e[:, :, t]
                ds = ddecayed * e[:, :, t, :, None]
            else:
                ds = ddecayed
        grads = [_unheads(dq).astype(dtype), _unheads(dk_).astype(dtype),
                 _unheads(dv_).astype(dtype),
                 None if past_state is None else ds.astype(past_state.dtype),
                 None if decay is None else _unheads(dg).astype(decay.dtype),
                 None]
        if beta is not None:
            g = dbt[..., 0].transpose(0, 2, 1)  # (B, T, Hkv or 1)
            grads[5] = g.astype(beta.dtype)
        return tuple(grads)
