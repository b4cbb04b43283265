"""The machinery RNN, GRU and LSTM share: layouts, directions, sequence lengths, activations
with their derivatives, clipping, and backpropagation through time.

A cell (``RNNCell``, ``GRUCell``, ``LSTMCell`` in the op files) implements one time step for one
direction, ``step(x_t, state, params) -> (state, cache)``, and its backward,
``step_back(d_state, cache, params, grads) -> (dx_t, d_prev_state)``, accumulating parameter
gradients into ``grads``. Everything else (the time loop, reversing within each sequence's own
length, holding the state past a sequence's end, zero outputs there, layout 0/1, stacking the
directions) lives here, once.

States are tuples: (h,) for RNN and GRU, (h, c) for LSTM. Padded steps (t >= sequence_lens[b])
leave a batch entry's state unchanged and output zeros, as onnxruntime does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from meta.lv0 import Operator

from ._elementwise import f32


# -- activations ------------------------------------------------------------------------------
def _sigmoid(z):
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


# name -> (f(z, a, b), f'(z, y, a, b), default alpha, default beta)
ACTIVATIONS: dict[str, tuple[Callable, Callable, float | None, float | None]] = {
    "sigmoid": (lambda z, a, b: _sigmoid(z), lambda z, y, a, b: y * (1 - y), None, None),
    "tanh": (lambda z, a, b: np.tanh(z), lambda z, y, a, b: 1 - y * y, None, None),
    "relu": (lambda z, a, b: np.maximum(z, 0), lambda z, y, a, b: (z > 0).astype(z.dtype),
             None, None),
    "affine": (lambda z, a, b: a * z + b, lambda z, y, a, b: np.full_like(z, a), 1.0, 0.0),
    "leakyrelu": (lambda z, a, b: np.where(z >= 0, z, a * z),
                  lambda z, y, a, b: np.where(z >= 0, 1.0, a).astype(z.dtype), 0.01, None),
    "thresholdedrelu": (lambda z, a, b: np.where(z > a, z, 0),
                        lambda z, y, a, b: (z > a).astype(z.dtype), 1.0, None),
    "scaledtanh": (lambda z, a, b: a * np.tanh(b * z),
                   lambda z, y, a, b: a * b * (1 - np.tanh(b * z) ** 2), 1.0, 1.0),
    "hardsigmoid": (lambda z, a, b: np.clip(a * z + b, 0, 1),
                    lambda z, y, a, b: np.where((y > 0) & (y < 1), a, 0).astype(z.dtype),
                    0.2, 0.5),
    "elu": (lambda z, a, b: np.where(z > 0, z, a * np.expm1(np.minimum(z, 0))),
            lambda z, y, a, b: np.where(z > 0, 1.0, a * np.exp(np.minimum(z, 0))), 1.0, None),
    "softsign": (lambda z, a, b: z / (1 + np.abs(z)),
                 lambda z, y, a, b: 1 / (1 + np.abs(z)) ** 2, None, None),
    "softplus": (lambda z, a, b: np.logaddexp(0, z), lambda z, y, a, b: _sigmoid(z), None, None),
}


@dataclass
class Activation:
    """One activation function with its alpha/beta, applied after clipping."""

    name: str
    alpha: float | None
    beta: float | None
    clip: float | None

    def __call__(self, z: np.ndarray) -> np.ndarray:
        if self.clip is not None:
            z = np.clip(z, -self.clip, self.clip)
        return ACTIVATIONS[self.name][0](z, self.alpha, self.beta).astype(z.dtype, copy=False)

    def grad(self, z: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """dL/dz from dL/dy, given the pre-activation z (unclipped) and the output y."""
        inside = None
        if self.clip is not None:
            inside = np.abs(z) <= self.clip
            z = np.clip(z, -self.clip, self.clip)
        g = dy * ACTIVATIONS[self.name][1](z, y, self.alpha, self.beta)
        return g if inside is None else g * inside


def activations(op: str, names: list[str] | None, alphas: list[float] | None,
                betas: list[float] | None, defaults: list[str], directions: int,
                clip: float | None) -> list[list[Activation]]:
    """The activations of each direction; alphas and betas are consumed in order by the
    functions that take them (onnxruntime's rule)."""
    names = list(names) if names else defaults * directions
    if len(names) != len(defaults) * directions:
        raise ValueError(f"{op}: activations {names} must name {len(defaults)} functions per "
                         f"direction ({directions} direction(s))")
    alphas, betas = list(alphas or []), list(betas or [])
    out = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise ValueError(f"{op}: unknown activation {name!r} (known: "
                             f"{', '.join(sorted(ACTIVATIONS))})")
        _, _, da, db = ACTIVATIONS[key]
        a = f32(alphas.pop(0)) if da is not None and alphas else da
        b = f32(betas.pop(0)) if db is not None and betas else db
        out.append(Activation(key, a, b, None if clip is None else f32(clip)))
    k = len(defaults)
    return [out[d * k:(d + 1) * k] for d in range(directions)]


# -- the time loop ----------------------------------------------------------------------------
@dataclass
class Params:
    """One direction's weights: W (G*H, I), R (G*H, H), Wb and Rb (G*H), P (3*H) or None."""

    W: np.ndarray
    R: np.ndarray
    Wb: np.ndarray
    Rb: np.ndarray
    P: np.ndarray | None
    acts: list[Activation]
    hidden: int


def _time_index(steps: int, lengths: np.ndarray, reverse: bool) -> np.ndarray:
    """(T, B) time index each step reads: t, or len_b - 1 - t for a reverse pass (padded steps
    read themselves and are masked)."""
    t = np.arange(steps)[:, None]
    if not reverse:
        return np.broadcast_to(t, (steps, lengths.size))
    return np.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)


class Recurrent(Operator):
    """Base of RNN, GRU and LSTM: subclasses set ``gates``, ``default_activations``,
    ``n_states`` and the cell's ``step``/``step_back``."""
    learnable_inputs = (1, 2, 3)  # W, R and B; initial states are not

    gates: ClassVar[int] = 1
    default_activations: ClassVar[list[str]] = ["Tanh"]
    n_states: ClassVar[int] = 1  # 2 for LSTM (h, c)
    clipped: ClassVar[int] = 2  # how many of a direction's activations see clipped inputs
    no_grad_inputs = (4,)  # sequence_lens
    attributes = {"activation_alpha": None, "activation_beta": None, "activations": None,
                  "clip": None, "direction": "forward", "hidden_size": None, "layout": 0}

    # a cell: subclasses implement these two
    def step(self, x: np.ndarray, state: tuple, p: Params) -> tuple[tuple, Any]:
        """One time step of the cell: (the new state, what ``step_back`` needs of it)."""
        raise NotImplementedError

    def step_back(self, d_state: list, cache: Any, p: Params, grads: dict) -> tuple:
        """Back through one time step: the gradient of the previous state, given the new
        state's and the step's ``cache``; the weights' gradients are added into ``grads``."""
        raise NotImplementedError

    # -- forward ------------------------------------------------------------------------------
    def _directions(self) -> list[bool]:
        if self.direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"{self.op_type}: direction must be forward, reverse or "
                             f"bidirectional, got {self.direction!r}")
        return {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[
            self.direction]

    def forward(self, ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, *extra):
        initial_c = extra[0] if extra else None
        p = extra[1] if len(extra) > 1 else None
        name = self.op_type
        reverse_flags = self._directions()
        dirs = len(reverse_flags)
        if self.layout:  # (B, T, I) -> (T, B, I); states (B, D, H) -> (D, B, H)
            x = np.swapaxes(x, 0, 1)
            initial_h = None if initial_h is None else np.swapaxes(initial_h, 0, 1)
            initial_c = None if initial_c is None else np.swapaxes(initial_c, 0, 1)
        steps, batch, _ = x.shape
        hidden = int(self.hidden_size) if self.hidden_size is not None else r.shape[-1]
        g = self.gates
        if w.shape[:2] != (dirs, g * hidden) or r.shape != (dirs, g * hidden, hidden):
            raise ValueError(f"{name}: W {list(w.shape)} and R {list(r.shape)} must be "
                             f"({dirs}, {g * hidden}, input) and ({dirs}, {g * hidden}, {hidden})"
                             f" for direction={self.direction!r}, hidden_size={hidden}")
        dtype = x.dtype
        given = (b is not None, initial_h is not None, initial_c is not None, p is not None)
        if b is None:
            b = np.zeros((dirs, 2 * g * hidden), dtype)
        lengths = np.full(batch, steps, np.int64) if sequence_lens is None else \
            np.asarray(sequence_lens, np.int64).reshape(batch)
        if lengths.size and (lengths.min() < 0 or lengths.max() > steps):
            raise ValueError(f"{name}: sequence_lens {lengths.tolist()} must be in [0, {steps}]")
        zeros = np.zeros((dirs, batch, hidden), dtype)
        h0 = zeros if initial_h is None else initial_h
        c0 = zeros if initial_c is None else initial_c
        acts = activations(name, self.activations, self.activation_alpha, self.activation_beta,
                           self.default_activations, dirs, self.clip)
        for group in acts:
            for act in group[self.clipped:]:  # LSTM's h(c) reads the cell state unclipped
                act.clip = None
        ys, finals, tapes = [], [], []
        for d, reverse in enumerate(reverse_flags):
            params = Params(w[d], r[d], b[d, :g * hidden], b[d, g * hidden:],
                            None if p is None else p[d], acts[d], hidden)
            state = (h0[d], c0[d])[:self.n_states]
            index = _time_index(steps, lengths, reverse)
            cols = np.arange(batch)
            y = np.zeros((steps, batch, hidden), dtype)
            tape = []
            for t in range(steps):
                live = (t < lengths)[:, None]
                new, cache = self.step(x[index[t], cols], state, params)
                state_next = tuple(np.where(live, n, s) for n, s in zip(new, state))
                y[index[t], cols] = np.where(live, new[0], 0)
                tape.append((cache, live))
                state = state_next
            ys.append(y)
            finals.append(state)
            tapes.append((params, index, tape))
        y = np.stack(ys, axis=1)  # (T, D, B, H)
        y_h = np.stack([s[0] for s in finals])
        outs = [y, y_h]
        if self.n_states == 2:
            outs.append(np.stack([s[1] for s in finals]))
        if self.layout:
            outs = [np.moveaxis(y, 2, 0)] + [np.swapaxes(o, 0, 1) for o in outs[1:]]
        ctx.save(tapes=tapes, shape=x.shape, dims=(dirs, hidden, g), dtype=dtype, given=given)
        return tuple(o.astype(dtype, copy=False) for o in outs)

    # -- backward -----------------------------------------------------------------------------
    def backward(self, ctx, dy=None, dy_h=None, dy_c=None):
        dirs, hidden, g = ctx.dims
        steps, batch, n_in = ctx.shape
        dtype = ctx.dtype
        if self.layout:
            dy = None if dy is None else np.moveaxis(dy, 0, 2)
            dy_h = None if dy_h is None else np.swapaxes(dy_h, 0, 1)
            dy_c = None if dy_c is None else np.swapaxes(dy_c, 0, 1)
        dx = np.zeros((steps, batch, n_in), dtype)
        dw = np.zeros((dirs, g * hidden, n_in), dtype)
        dr = np.zeros((dirs, g * hidden, hidden), dtype)
        db = np.zeros((dirs, 2 * g * hidden), dtype)
        dp = np.zeros((dirs, 3 * hidden), dtype)
        dh0 = np.zeros((dirs, batch, hidden), dtype)
        dc0 = np.zeros((dirs, batch, hidden), dtype)
        cols = np.arange(batch)
        for d, (params, index, tape) in enumerate(ctx.tapes):
            zero = np.zeros((batch, hidden), dtype)
            carry = [zero if dy_h is None else dy_h[d].astype(dtype)]
            if self.n_states == 2:
                carry.append(zero if dy_c is None else dy_c[d].astype(dtype))
            grads = {"W": dw[d], "R": dr[d], "Wb": db[d, :g * hidden], "Rb": db[d, g * hidden:],
                     "P": dp[d]}
            for t in range(steps - 1, -1, -1):
                cache, live = tape[t]
                # y_t = live * h_new; state_t = live * new + (1 - live) * state_{t-1}
                d_new = [np.where(live, c, 0) for c in carry]
                if dy is not None:
                    d_new[0] = d_new[0] + np.where(live, dy[index[t], d, cols], 0)
                dx_t, d_prev = self.step_back(d_new, cache, params, grads)
                dx[index[t], cols] += dx_t
                carry = [np.where(live, 0, c) + dp_ for c, dp_ in zip(carry, d_prev)]
            dh0[d] = carry[0]
            if self.n_states == 2:
                dc0[d] = carry[1]
        if self.layout:
            dx = np.swapaxes(dx, 0, 1)
            dh0, dc0 = np.swapaxes(dh0, 0, 1), np.swapaxes(dc0, 0, 1)
        has_b, has_h, has_c, has_p = ctx.given
        out = [dx, dw, dr, db if has_b else None, None, dh0 if has_h else None]
        if self.n_states == 2:
            out += [dc0 if has_c else None, dp if has_p else None]
        return tuple(o if ctx.needs(i) else None for i, o in enumerate(out))
