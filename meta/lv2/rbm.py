"""Restricted Boltzmann machines trained by contrastive divergence (seed 000, Algorithm 1).

An RBM has visible units v, hidden units h, weights W (hidden x visible), a visible bias b and a
hidden bias c. Hidden units are binary: P(h=1|v) = sigmoid(c + W v). Visible units are either
binary, P(v=1|h) = sigmoid(b + W'h), or Gaussian with unit variance, v|h ~ N(b + W'h, 1), for
real-valued input standardised per feature.

``RBM.cd_update`` is one step of Algorithm 1 (RBMupdate) on a minibatch, CD-k or persistent CD:

>>> rbm = RBM(6, 3, lr=0.1, rng=0)
>>> stats = rbm.cd_update(np.eye(6, dtype=np.float32))
>>> stats.grad_W.shape, round(float(stats.reconstruction_error), 2)
((3, 6), 0.25)

Data parallelism without Level 3: ``replica=(rank, size)`` says this RBM holds rows
``rank::size`` of every global minibatch, and ``cd_update(batch, average=...)`` takes a function
returning the mean of a flat buffer over the replicas (a Level 3 allreduce, passed in by the
caller). Replicas then stay bit-identical and together do what one process does on the whole
batch (up to float summation order).

Asynchronous data parallelism (the seed's parameter server): ``cd_update(batch, push=...)`` hands
the step it would add to W, b, c to ``push``, which adds it to the parameters itself, here and at
a server, and may replace them with the server's fresher ones (``bind`` first makes the RBM train
the exchange's arrays). Each replica then keeps its own momentum and noise, as asynchronous SGD
workers keep their optimizer state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from meta.lv2.sampler import ShuffleSampler

VISIBLE_UNITS = ("binary", "gaussian")
Average = Callable[[np.ndarray], np.ndarray]  # flat buffer in, its mean over the replicas out
# An update step per parameter name in; the callee adds it to the RBM's arrays (and shares it).
Push = Callable[[dict[str, np.ndarray]], None]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) without overflow (the formula of ``ops/sigmoid.py``)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), stable for large |x|."""
    return np.logaddexp(0, x)


def as_generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A Generator as given, or a new one seeded with the int (None: seed 0, never the clock:
    every RBM in meta is reproducible)."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(0 if rng is None else rng)


def draw(rng: np.random.Generator, method: str, shape: tuple[int, ...], dtype: Any,
         replica: tuple[int, int] = (0, 1)) -> np.ndarray:
    """``rng.<method>(shape)`` ("random" or "standard_normal") for this replica's rows.

    Replica ``rank`` of ``size`` holds rows ``rank::size`` of a global batch of
    ``size * shape[0]`` rows, so it draws the noise of the whole batch and keeps its rows: equal
    generators then give every replica the noise one process would draw for those examples, which
    makes data-parallel CD equal to single-process CD at the combined batch. The extra draws cost
    O(size * batch * units), small next to the O(batch * units * visible) products.
    """
    rank, size = replica
    if size == 1:
        return getattr(rng, method)(shape, dtype=dtype)
    return getattr(rng, method)((size * shape[0], *shape[1:]), dtype=dtype)[rank::size]


def bernoulli(p: np.ndarray, rng: np.random.Generator,
              replica: tuple[int, int] = (0, 1)) -> np.ndarray:
    """Binary samples, 1 where a uniform draw (``rng.random``, one per unit) falls below p;
    ``replica``: see ``draw``."""
    return (draw(rng, "random", p.shape, p.dtype, replica) < p).astype(p.dtype)


@dataclass(frozen=True)
class CDStatistics:
    """What one contrastive-divergence step saw and the update direction it computed.

    The ``grad_*`` fields are the positive minus the negative statistics averaged over the
    minibatch (and over the fantasy particles for the negative phase): an estimate of the
    log-likelihood gradient, before learning rate, momentum and weight decay.
    """

    v0: np.ndarray  # the data
    h0_prob: np.ndarray  # Q(h0=1|v0)
    h0: np.ndarray  # sample of Q(h0|v0): the positive statistics use it, as Algorithm 1 does
    v_neg: np.ndarray  # the chain's visible state after k Gibbs steps (v_k)
    h_neg_prob: np.ndarray  # Q(h_k=1|v_k): the negative statistics
    h_neg: np.ndarray  # sample of Q(h_k|v_k): where a persistent chain continues
    grad_W: np.ndarray  # mean(h0 v0') - mean(Q(h_k=1|v_k) v_k')
    grad_b: np.ndarray  # mean(v0) - mean(v_k)                       (visible bias)
    grad_c: np.ndarray  # mean(h0) - mean(Q(h_k=1|v_k))              (hidden bias)
    reconstruction_error: float  # mean over the batch and units of (v0 - E[v|h0])^2


class RBM:
    """A binary-binary or Gaussian-binary RBM with CD-k or persistent CD, momentum and L2.

    Parameters: ``W`` (n_hidden, n_visible) drawn from N(0, ``init_std``^2) (Hinton's practical
    guide; Algorithm 2 of the seed starts from W = 0, which ``init_std=0`` reproduces: only the
    sampling noise then breaks the symmetry between hidden units), ``b`` and ``c`` zero.

    The update (Hinton's guide, section 9: momentum on the increment, L2 on W only)::

        dW <- momentum dW + lr (grad_W - weight_decay W);  W <- W + dW   (b, c alike, no decay)

    The seed's slide writes ``W <- W - eps(...)``; with ``grad_W`` = positive minus negative
    statistics that would climb the energy of the data, so we add, as in Bengio's RBMupdate
    (Learning Deep Architectures for AI, 2009), which the slide transcribes.

    Reconstruction (the "Go Down" step): binary visible units are *sampled* from P(v|h), as in
    Algorithm 1; Gaussian ones use the mean b + W'h by default (``sample_visible=False``), since
    unit-variance noise on standardised data mostly adds variance to the gradient (Hinton's
    guide, section 13.2). ``sample_visible`` overrides either choice.

    ``persistent=True`` is PCD (Tieleman, 2008): the negative chain does not restart at the
    data's hidden sample but continues from the hidden state of ``fantasy`` particles left by
    the previous update (as many particles as the first batch has examples).

    Randomness comes only from ``rng`` (a Generator, or an int seed), so equal seeds give equal
    weights bit for bit. Draws per update, in order: uniforms for h0, then per Gibbs step
    uniforms (binary) or standard normals (Gaussian, if sampled) for v, then uniforms for h.

    ``replica=(rank, size)``: this RBM is one of ``size`` data-parallel copies, fed rows
    ``rank::size`` of each global minibatch (all copies the same number of rows) and built from
    the same ``rng`` seed; it draws the whole batch's noise and keeps its rows (``draw``), and
    ``cd_update`` must then get an ``average`` over the copies.
    """

    def __init__(
        self,
        n_visible: int,
        n_hidden: int,
        *,
        visible: str = "binary",
        k: int = 1,
        persistent: bool = False,
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        sample_visible: bool | None = None,
        init_std: float = 0.01,
        rng: np.random.Generator | int | None = None,
        dtype: Any = np.float32,
        replica: tuple[int, int] = (0, 1),
    ) -> None:
        if visible not in VISIBLE_UNITS:
            raise ValueError(f"RBM: visible units must be one of {VISIBLE_UNITS}, got {visible!r}")
        if n_visible <= 0 or n_hidden <= 0:
            raise ValueError(f"RBM: unit counts must be positive, got {n_visible} visible and "
                             f"{n_hidden} hidden")
        if k < 1:
            raise ValueError(f"RBM: CD-k needs k >= 1 Gibbs steps, got k={k}")
        if not 0 <= momentum < 1:
            raise ValueError(f"RBM: momentum must be in [0, 1), got {momentum}")
        if not 0 <= replica[0] < replica[1]:
            raise ValueError(f"RBM: replica must be (rank, size) with 0 <= rank < size, "
                             f"got {tuple(replica)}")
        self.replica = (int(replica[0]), int(replica[1]))
        self.visible = visible
        self.k = k
        self.persistent = persistent
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.sample_visible = visible == "binary" if sample_visible is None else sample_visible
        self.rng = as_generator(rng)
        self.dtype = np.dtype(dtype)
        self.W = (init_std * self.rng.standard_normal((n_hidden, n_visible))).astype(self.dtype)
        self.b = np.zeros(n_visible, self.dtype)
        self.c = np.zeros(n_hidden, self.dtype)
        self.velocity = {name: np.zeros_like(p) for name, p in self.params.items()}
        self.fantasy: np.ndarray | None = None  # PCD's hidden chain state
        self.updates = 0

    @property
    def n_visible(self) -> int:
        """The number of visible units."""
        return self.W.shape[1]

    @property
    def n_hidden(self) -> int:
        """The number of hidden units."""
        return self.W.shape[0]

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The weights ``W`` (hidden x visible) and the visible and hidden biases ``b``, ``c``."""
        return {"W": self.W, "b": self.b, "c": self.c}

    def __repr__(self) -> str:
        chain = "PCD" if self.persistent else "CD"
        return (f"RBM({self.n_visible} {self.visible} -> {self.n_hidden} binary, "
                f"{chain}-{self.k}, lr={self.lr}, momentum={self.momentum}, "
                f"weight_decay={self.weight_decay})")

    # -- conditionals -------------------------------------------------------------------------
    def hidden_prob(self, v: np.ndarray) -> np.ndarray:
        """Q(h=1|v) = sigmoid(c + W v), one row per example."""
        return sigmoid(v @ self.W.T + self.c)

    def visible_mean(self, h: np.ndarray) -> np.ndarray:
        """E[v|h]: sigmoid(b + W'h) for binary units, b + W'h for Gaussian ones."""
        a = h @ self.W + self.b
        return sigmoid(a) if self.visible == "binary" else a

    def sample_hidden(self, p: np.ndarray) -> np.ndarray:
        """Binary hidden states drawn with probabilities ``p``."""
        return bernoulli(p, self.rng, self.replica)

    def reconstruct(self, mean: np.ndarray) -> np.ndarray:
        """The visible state of a Gibbs step: a sample of P(v|h), or its mean (mean-field)."""
        if not self.sample_visible:
            return mean
        if self.visible == "binary":
            return bernoulli(mean, self.rng, self.replica)
        return mean + draw(self.rng, "standard_normal", mean.shape, self.dtype, self.replica)

    def gibbs(self, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """k steps h -> v -> h from hidden state ``h``: (v_k, Q(h_k=1|v_k), h_k, E[v_1|h])."""
        first_mean = None
        for _ in range(k):
            mean = self.visible_mean(h)
            first_mean = mean if first_mean is None else first_mean
            v = self.reconstruct(mean)
            h_prob = self.hidden_prob(v)
            h = self.sample_hidden(h_prob)
        return v, h_prob, h, first_mean

    # -- learning -----------------------------------------------------------------------------
    def _check_batch(self, batch: np.ndarray) -> np.ndarray:
        v0 = np.asarray(batch, dtype=self.dtype)
        if v0.ndim != 2 or v0.shape[1] != self.n_visible:
            raise ValueError(f"RBM.cd_update: expected a batch of shape (N, {self.n_visible}), "
                             f"got {list(np.shape(batch))}")
        if self.visible == "binary" and (v0.min() < 0 or v0.max() > 1):
            raise ValueError(f"RBM.cd_update: binary visible units need data in [0, 1], got "
                             f"values in [{v0.min():.3g}, {v0.max():.3g}] (standardised data "
                             "wants visible='gaussian', or load MNIST with normalize=False)")
        return v0

    def bind(self, params: dict[str, np.ndarray]) -> None:
        """Train ``params["W"]``, ``["b"]``, ``["c"]`` in place from now on (same shapes and
        dtype; e.g. views of a parameter exchange's flat buffer), keeping their values."""
        for name, mine in self.params.items():
            given = params.get(name)
            if given is None or given.shape != mine.shape or given.dtype != mine.dtype:
                got = "nothing" if given is None else f"{list(given.shape)} {given.dtype}"
                raise ValueError(f"RBM.bind: expected {name} of shape {list(mine.shape)} "
                                 f"{mine.dtype}, got {got}")
        self.W, self.b, self.c = params["W"], params["b"], params["c"]

    def cd_update(self, batch: np.ndarray, average: Average | None = None,
                  push: Push | None = None) -> CDStatistics:
        """One RBMupdate (Algorithm 1) on ``batch`` (N, n_visible); updates W, b, c in place.

        Go up: h0 ~ Q(h|v0). Go down and up k times: v_i ~ P(v|h_{i-1}), h_i ~ Q(h|v_i),
        starting from h0 (CD-k) or from the fantasy particles (PCD). Then move W, b, c along
        (h0 v0' - Q(h_k=1|v_k) v_k', v0 - v_k, h0 - Q(h_k=1|v_k)), each averaged over its rows.

        ``average`` (data parallelism): called once per update on one flat buffer holding the
        three gradient statistics and the reconstruction error; its mean over the replicas
        replaces them before the momentum step, so equal replicas take equal steps (one
        collective per update, as in a fused allreduce).

        ``push`` (asynchronous data parallelism): gets this update's step (the momentum
        increments, by parameter name) instead of the RBM adding it, and must add it to W, b, c
        itself; an asynchronous exchange also sends it to a server and may refresh W, b, c.
        """
        v0 = self._check_batch(batch)
        h0_prob = self.hidden_prob(v0)
        h0 = self.sample_hidden(h0_prob)
        start = h0 if not self.persistent or self.fantasy is None else self.fantasy
        v_neg, h_neg_prob, h_neg, first_mean = self.gibbs(start, self.k)
        if start is not h0:  # PCD: the chain's first step reconstructs the fantasy, not v0
            first_mean = self.visible_mean(h0)
        if self.persistent:
            self.fantasy = h_neg
        n, m = len(v0), len(v_neg)
        grads = {"W": h0.T @ v0 / n - h_neg_prob.T @ v_neg / m,
                 "b": v0.mean(0) - v_neg.mean(0),
                 "c": h0.mean(0) - h_neg_prob.mean(0)}
        error = float(np.mean(np.square(v0 - first_mean)))
        if average is not None:
            grads, error = self._averaged(grads, error, average)
        self._apply(grads, push)
        return CDStatistics(
            v0=v0, h0_prob=h0_prob, h0=h0, v_neg=v_neg, h_neg_prob=h_neg_prob, h_neg=h_neg,
            grad_W=grads["W"], grad_b=grads["b"], grad_c=grads["c"], reconstruction_error=error)

    def _averaged(self, grads: dict[str, np.ndarray], error: float,
                  average: Average) -> tuple[dict[str, np.ndarray], float]:
        """The statistics' mean over the replicas: one flat buffer through ``average``."""
        flat = np.concatenate([*(g.ravel() for g in grads.values()), [error]]).astype(self.dtype)
        mean = np.asarray(average(flat), dtype=self.dtype)
        if mean.shape != flat.shape:
            raise ValueError(f"RBM.cd_update: average returned shape {list(mean.shape)} for a "
                             f"buffer of shape {list(flat.shape)}")
        out, start = {}, 0
        for name, g in grads.items():
            out[name] = mean[start:start + g.size].reshape(g.shape)
            start += g.size
        return out, float(mean[-1])

    def _apply(self, grads: dict[str, np.ndarray], push: Push | None = None) -> None:
        for name, param in self.params.items():
            step = grads[name] - self.weight_decay * param if name == "W" else grads[name]
            velocity = self.velocity[name]
            velocity *= self.momentum
            velocity += (self.lr * step).astype(self.dtype, copy=False)
            if push is None:
                param += velocity
        if push is not None:
            push(self.velocity)
        self.updates += 1

    def train_epoch(self, batches: Iterable[np.ndarray], average: Average | None = None,
                    push: Push | None = None) -> dict[str, float]:
        """``cd_update`` on every batch (``average``, ``push``: see there); the mean
        reconstruction error (weighted by batch size) and the wall time."""
        start, total, count = time.perf_counter(), 0.0, 0
        for batch in batches:
            stats = self.cd_update(batch, average, push)
            total += stats.reconstruction_error * len(batch)
            count += len(batch)
        return {"reconstruction_error": total / max(count, 1),
                "time_s": time.perf_counter() - start}

    def fit(self, data: np.ndarray, epochs: int = 1, batch_size: int = 100, seed: int = 0,
            progress: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
        """Train on the rows of ``data`` for ``epochs`` epochs of shuffled minibatches (the
        order from ``ShuffleSampler(seed)``); returns one metrics dict per epoch.

        >>> x = (np.random.default_rng(1).random((64, 8)) < 0.3).astype(np.float32)
        >>> log = RBM(8, 4, rng=1).fit(x, epochs=2, batch_size=16)
        >>> [m["epoch"] for m in log]
        [1, 2]
        """
        data = np.asarray(data, dtype=self.dtype).reshape(len(data), -1)
        sampler = ShuffleSampler(len(data), batch_size, seed)
        history = []
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            metrics = {"epoch": epoch + 1, **self.train_epoch(data[i] for i in sampler)}
            history.append(metrics)
            if progress is not None:
                progress(metrics)
        return history

    # -- monitors -----------------------------------------------------------------------------
    def free_energy(self, v: np.ndarray) -> np.ndarray:
        """F(v) = -log sum_h exp(-E(v, h)), per example: -b'v - sum softplus(c + W v) for
        binary visible units, |v - b|^2 / 2 - sum softplus(c + W v) for Gaussian ones."""
        v = np.asarray(v, dtype=self.dtype)
        hidden = softplus(v @ self.W.T + self.c).sum(1)
        if self.visible == "binary":
            return -(v @ self.b) - hidden
        return 0.5 * np.square(v - self.b).sum(1) - hidden

    def reconstruction_error(self, v: np.ndarray) -> float:
        """Mean squared error of the mean-field reconstruction E[v | Q(h=1|v)] (deterministic)."""
        v = np.asarray(v, dtype=self.dtype)
        return float(np.mean(np.square(v - self.visible_mean(self.hidden_prob(v)))))

    def pseudo_log_likelihood(self, v: np.ndarray,
                              rng: np.random.Generator | int | None = None) -> float:
        """Mean over examples of the stochastic pseudo-log-likelihood (binary units only).

        log PL(v) = sum_i log P(v_i | v_-i), estimated per example from one visible unit i
        drawn at random (Marlin et al., 2010; Theano's RBM tutorial):
        n_visible * log sigmoid(F(v with bit i flipped) - F(v)). The draw comes from ``rng``
        (default seed 0), never from the training generator, so monitoring does not change
        training.
        """
        if self.visible != "binary":
            raise ValueError("RBM.pseudo_log_likelihood: defined for binary visible units only; "
                             "monitor a Gaussian RBM by reconstruction_error or free_energy")
        v = np.asarray(v, dtype=self.dtype)
        bit = as_generator(rng).integers(0, self.n_visible, len(v))
        rows = np.arange(len(v))
        flipped = v.copy()
        flipped[rows, bit] = 1 - flipped[rows, bit]
        gap = self.free_energy(flipped).astype(np.float64) - self.free_energy(v)
        return float(np.mean(-self.n_visible * softplus(-gap)))
