"""Deep belief networks: greedy layer-wise pre-training of stacked RBMs (seed 000, Algorithm 2),
and conversion into an ordinary meta graph for supervised fine-tuning (Algorithm 3).

Pre-training trains RBM 1 on the data, then RBM 2 on what RBM 1's hidden units make of the data,
and so on. The result converts into a classifier graph (Flatten, Gemm+Sigmoid per RBM, a new
softmax layer) that the usual executor, optimizer and ``Trainer`` fine-tune by backpropagation:

>>> from meta.lv2.datasets import ArrayDataset
>>> x = (np.random.default_rng(0).random((200, 1, 4, 4)) < 0.3).astype(np.float32)
>>> dbn = pretrain_dbn(ArrayDataset(x, np.zeros(200, np.int64)), layers=(8, 6), batch_size=50)
>>> dbn.layers, dbn.transform(x[:3]).shape
([16, 8, 6], (3, 6))
>>> [n.op_type for n in dbn.to_graph(classes=2).nodes]  # doctest: +NORMALIZE_WHITESPACE
['Flatten', 'Gemm', 'Sigmoid', 'Gemm', 'Sigmoid', 'Gemm', 'SoftmaxCrossEntropyLoss']

Data-parallel pre-training: ``pretrain_dbn(..., replica=(rank, size), average=mean_over_ranks)``
on every rank, with ``average`` a Level 3 allreduce passed in by the caller (``meta.run.runner``
does), gives every rank the stack one process would train at batch ``size * batch_size``.

Asynchronous data parallelism (the seed's Algorithm 4): ``pretrain_dbn(..., replica=(worker,
workers), connect=...)`` on every rank, with ``connect`` making a parameter exchange per RBM (a
Level 3 asynchronous strategy, passed in by the caller): each worker trains on its own shard of
the data and pushes every CD step to a server, from which it reads fresh parameters back; a
server rank only serves. Every rank ends each layer with the server's weights.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TextIO, TypeVar

import numpy as np

from meta.lv1.builder import GraphBuilder
from meta.lv1.graph import Graph
from meta.lv2.datasets import Dataset
from meta.lv2.rbm import RBM, Average, bernoulli
from meta.lv2.sampler import ShuffleSampler

PROPAGATIONS = ("sample", "mean")
MONITOR_EXAMPLES = 1000  # training examples the per-epoch pseudo-log-likelihood is taken on

T = TypeVar("T")
Progress = Callable[[dict[str, Any]], None]


class ParameterExchange(Protocol):
    """A parameter server as asynchronous pre-training uses it: a Level 3 asynchronous strategy
    whose wrapped optimizer adds the given step, e.g. in ``meta.run.runner``
    ``make_strategy("async_rma", Optimizer(scale(1.0), rbm.params), comm)``. Making one is
    collective; ``params`` are its arrays (the server's initial values); ``role`` is "worker"
    or "server"."""

    role: str

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The server's arrays by name (their initial values)."""

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """Add ``grads`` (an update step) to ``params`` and the server's copy; ``params`` may
        come back as the server's newer values."""

    def finish(self) -> None:
        """A worker is done (collective with ``serve``): ``params`` become the server's."""

    def serve(self) -> None:
        """A server rank: apply the workers' steps until all have finished."""


Connect = Callable[[dict[str, np.ndarray]], ParameterExchange]  # RBM params -> its exchange


def _per_layer(value: T | Sequence[T], n: int, name: str) -> list[T]:
    """One value per layer: a scalar repeated, or a sequence of exactly ``n``."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"pretrain_dbn: {name!r} lists {len(value)} values for {n} layers")
        return list(value)
    return [value] * n  # type: ignore[list-item]


def _flat(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), -1)


@dataclass
class DBN:
    """A stack of trained RBMs, bottom first; ``input_shape`` is one example's shape (what
    the graph's Flatten undoes), ``history`` the pre-training log (one dict per layer-epoch),
    ``time_s`` the pre-training wall time."""

    rbms: list[RBM]
    input_shape: tuple[int, ...]
    history: list[dict[str, Any]] = field(default_factory=list)
    time_s: float = 0.0  # pre-training wall time

    @classmethod
    def untrained(cls, input_shape: Sequence[int], layers: Sequence[int], seed: int = 0,
                  visible: str = "binary") -> DBN:
        """The stack as ``pretrain_dbn(..., seed=seed)`` starts it: its graph has the trained
        network's shapes, so a trainer can be built before pre-training runs (``assign`` then
        fills in the trained weights)."""
        widths = [int(np.prod(input_shape)), *layers]
        return cls([RBM(n_in, n_out, visible=visible if i == 0 else "binary",
                        rng=np.random.default_rng([seed, i]))
                    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:]))],
                   tuple(input_shape))

    def assign(self, params: dict[str, np.ndarray]) -> None:
        """Copy the RBMs' W and c into the ``fc{i}.weight``/``fc{i}.bias`` arrays of a graph
        made by ``to_graph`` (in place: an optimizer holding those arrays sees the values)."""
        for i, rbm in enumerate(self.rbms):
            for name, value in ((f"fc{i}.weight", rbm.W), (f"fc{i}.bias", rbm.c)):
                if name not in params or params[name].shape != value.shape:
                    got = list(params[name].shape) if name in params else "nothing"
                    raise ValueError(f"DBN.assign: expected {name} of shape {list(value.shape)}, "
                                     f"found {got}")
                np.copyto(params[name], value)

    @property
    def layers(self) -> list[int]:
        """Unit counts from the input up, e.g. [784, 500, 500]."""
        return [self.rbms[0].n_visible, *(r.n_hidden for r in self.rbms)]

    @property
    def output_name(self) -> str:
        """The graph tensor holding the top layer's hidden probabilities."""
        return f"hidden{len(self.rbms)}"

    def transform(self, x: np.ndarray, depth: int | None = None) -> np.ndarray:
        """Algorithm 3's mean-field features mu_l(x): mu_0 = x, mu_l = Q(h_l=1 | mu_{l-1}),
        up to layer ``depth`` (default the top)."""
        h = _flat(x)
        for rbm in self.rbms[:depth]:
            h = rbm.hidden_prob(h)
        return h

    # -- graphs ------------------------------------------------------------------------------
    def _stack(self, b: GraphBuilder, dtype: Any) -> str:
        x = b.input("input", dtype, ("N", *self.input_shape))
        h = b.node("Flatten", [x], name="flatten", axis=1)
        for i, rbm in enumerate(self.rbms):
            # Our W is (hidden, visible), so Gemm with transB=1 computes v W' + c = c + W v.
            w = b.initializer(f"fc{i}.weight", rbm.W.astype(dtype))  # a copy: fine-tuning
            c = b.initializer(f"fc{i}.bias", rbm.c.astype(dtype))   # leaves the RBMs alone
            h = b.node("Sigmoid", [b.node("Gemm", [h, w, c], name=f"fc{i}", transB=1)],
                       name=f"hidden{i + 1}")
        return h

    def stack_graph(self, dtype: Any = np.float32) -> Graph:
        """The pre-trained stack as a graph: input ``input``, output ``hidden{L}``, the top
        hidden probabilities (equal to ``transform``)."""
        b = GraphBuilder("dbn_stack")
        top = self._stack(b, dtype)
        b.output(top, dtype, ("N", self.layers[-1]))
        return b.build()

    def to_graph(self, classes: int = 10, seed: int = 0, dtype: Any = np.float32) -> Graph:
        """The classifier Algorithm 3 fine-tunes, with ``meta.lv1.mlp``'s conventions: inputs
        ``input`` (N, *input_shape) and ``labels`` (N,) int64, outputs ``logits`` and the mean
        softmax cross-entropy ``loss``. The hidden layers start from the RBMs' W and c; the
        output layer is new, Glorot-uniform from ``seed``, bias zero."""
        b = GraphBuilder("dbn")
        h = self._stack(b, dtype)
        labels = b.input("labels", np.int64, ("N",))
        top = self.layers[-1]
        bound = math.sqrt(6.0 / (top + classes))
        w = np.random.default_rng(seed).uniform(-bound, bound, (classes, top)).astype(dtype)
        i = len(self.rbms)
        logits = b.node("Gemm", [h, b.initializer(f"fc{i}.weight", w),
                                 b.initializer(f"fc{i}.bias", np.zeros(classes, dtype))],
                        name="logits", transB=1)
        loss = b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss", reduction="mean")
        b.output(logits, dtype, ("N", classes))
        b.output(loss, dtype, ())
        return b.build()


def pretrain_dbn(
    train: Dataset,
    layers: Sequence[int] = (500, 500),
    *,
    epochs: int | Sequence[int] = 1,
    lr: float | Sequence[float] = 0.1,
    k: int | Sequence[int] = 1,
    batch_size: int = 100,
    momentum: float = 0.5,
    weight_decay: float = 2e-4,
    persistent: bool = False,
    visible: str = "binary",
    propagate: str = "sample",
    seed: int = 0,
    progress: Progress | None = None,
    replica: tuple[int, int] = (0, 1),
    average: Average | None = None,
    connect: Connect | None = None,
) -> DBN:
    """Greedy layer-wise pre-training (Algorithm 2) of RBMs with ``layers`` hidden units each.

    Layer l is trained for ``epochs[l]`` epochs of CD-``k[l]`` (or PCD with ``persistent``) at
    learning rate ``lr[l]``; a scalar applies to every layer. Its input is the data pushed
    through the layers below: with ``propagate="sample"`` binary samples g_i ~ Q(g_i|g_{i-1}),
    drawn afresh for every batch, as Algorithm 2 does; with ``"mean"`` the probabilities
    Q(g_i=1|g_{i-1}) (Hinton and Salakhutdinov's practice, and what Algorithm 3 computes).
    Only the first layer's visible units may be ``"gaussian"`` (standardised input); binary
    ones need input in [0, 1] (``mnist(normalize=False)``): pixel intensities are used as they
    are, as probabilities, not binarised.

    ``progress`` is called after every layer-epoch with ``layer``, ``epoch``,
    ``reconstruction_error`` (training mean), ``pseudo_log_likelihood`` (binary layers, on the
    first ``MONITOR_EXAMPLES`` training examples; NaN for a Gaussian layer) and ``time_s``;
    the same dicts are kept in ``DBN.history``. Everything is seeded by ``seed``: RBM l draws
    from Generator([seed, l]), its input samples from Generator([seed, l, 1]), batches come
    from ``ShuffleSampler(seed + l)``.

    Data parallelism: with ``replica=(rank, size)``, size > 1, every rank calls this with the
    same arguments and an ``average`` (flat buffer -> its mean over the ranks, e.g. an
    allreduce). Each global batch of ``size * batch_size`` examples is split by rows
    (``rank::size``), every RBM update averages its statistics through ``average`` and
    the noise is drawn as one process would for the whole batch (``rbm.draw``): the ranks end
    bit-identical, equal to one process at batch ``size * batch_size`` up to float summation
    order. An incomplete last global batch is dropped (fewer than ``size * batch_size``
    examples an epoch, a different few each epoch), so that every rank joins every update.

    Asynchronous data parallelism (Algorithm 4 of the seed): with ``connect`` instead of
    ``average``, every rank (the servers too) calls this with the same arguments and its
    ``replica``: for a worker (index, number of workers), for a server anything. For each RBM,
    ``connect(rbm.params)`` makes the exchange. A worker trains on its fixed shard of the data
    (examples ``index::workers``, reshuffled each epoch, ``batch_size`` per update) and pushes
    every update's step through ``exchange.step``, which adds it at the server and refreshes
    the worker's parameters; a server rank runs ``exchange.serve()``. So an epoch is one pass
    over the data by all workers together, as in one process. Workers keep their own momentum;
    worker 0 draws its noise as one process would, the others from ``Generator([seed, l, 2,
    index])``. Every rank ends each layer with the server's weights (``exchange.finish``); a
    worker's ``history`` holds its own shard's reconstruction error, a server's one record per
    layer with NaN for it.
    """
    if not layers or min(layers) <= 0:
        raise ValueError(f"pretrain_dbn: layers must list positive widths, got {list(layers)}")
    if propagate not in PROPAGATIONS:
        raise ValueError(f"pretrain_dbn: propagate must be one of {PROPAGATIONS}, "
                         f"got {propagate!r}")
    rank, size = replica
    if average is not None and connect is not None:
        raise ValueError("pretrain_dbn: give average (synchronous) or connect (asynchronous) "
                         "data parallelism, not both")
    if size > 1 and average is None and connect is None:
        raise ValueError(f"pretrain_dbn: replica {tuple(replica)} needs an average over the "
                         "replicas (e.g. an allreduce mean) or a connect to a parameter server")
    if connect is not None:
        if len(train) < size:
            raise ValueError(f"pretrain_dbn: {len(train)} examples make no shard for each of "
                             f"{size} workers")
        return _pretrain_async(train, layers, epochs, lr, k, batch_size, momentum, weight_decay,
                               persistent, visible, propagate, seed, progress, replica, connect)
    if len(train) < size * batch_size:
        raise ValueError(f"pretrain_dbn: {len(train)} examples make no global batch of "
                         f"{size} x {batch_size}")
    start, n = time.perf_counter(), len(layers)
    epochs_, lr_, k_ = _per_layer(epochs, n, "epochs"), _per_layer(lr, n, "lr"), \
        _per_layer(k, n, "k")
    x0, _ = train.batch(np.arange(min(len(train), MONITOR_EXAMPLES)))
    dbn = DBN([], tuple(x0.shape[1:]))
    monitor = _flat(x0)
    width = monitor.shape[1]
    for layer, hidden in enumerate(layers):
        rbm = RBM(width, hidden, visible=visible if layer == 0 else "binary", k=k_[layer],
                  persistent=persistent, lr=lr_[layer], momentum=momentum,
                  weight_decay=weight_decay, rng=np.random.default_rng([seed, layer]),
                  replica=replica)
        below = _Propagator(dbn.rbms, propagate, np.random.default_rng([seed, layer, 1]),
                            replica)
        sampler = ShuffleSampler(len(train), size * batch_size, seed + layer,
                                 drop_last=size > 1)
        for epoch in range(epochs_[layer]):
            sampler.set_epoch(epoch)
            batches = (below(_flat(train.batch(i[rank::size])[0])) for i in sampler)
            metrics = rbm.train_epoch(batches, average)
            pll = rbm.pseudo_log_likelihood(monitor) if rbm.visible == "binary" else math.nan
            record = {"layer": layer + 1, "epoch": epoch + 1,
                      "reconstruction_error": metrics["reconstruction_error"],
                      "pseudo_log_likelihood": pll, "time_s": metrics["time_s"]}
            dbn.history.append(record)
            if progress is not None:
                progress(record)
        dbn.rbms.append(rbm)
        monitor = rbm.hidden_prob(monitor)  # the next layer is monitored on its own input
        width = hidden
    dbn.time_s = time.perf_counter() - start
    return dbn


def _pretrain_async(train: Dataset, layers: Sequence[int], epochs: int | Sequence[int],
                    lr: float | Sequence[float], k: int | Sequence[int], batch_size: int,
                    momentum: float, weight_decay: float, persistent: bool, visible: str,
                    propagate: str, seed: int, progress: Progress | None,
                    replica: tuple[int, int], connect: Connect) -> DBN:
    """``pretrain_dbn`` against a parameter server (see there)."""
    start, n = time.perf_counter(), len(layers)
    epochs_, lr_, k_ = _per_layer(epochs, n, "epochs"), _per_layer(lr, n, "lr"), \
        _per_layer(k, n, "k")
    index, workers = replica
    shard = np.arange(index, len(train), workers)  # balanced partitions, as in the seed
    x0, _ = train.batch(np.arange(min(len(train), MONITOR_EXAMPLES)))
    dbn = DBN([], tuple(x0.shape[1:]))
    monitor = _flat(x0)
    width = monitor.shape[1]
    own = [] if index == 0 else [2, index]  # worker 0 draws as one process would
    for layer, hidden in enumerate(layers):
        rbm = RBM(width, hidden, visible=visible if layer == 0 else "binary", k=k_[layer],
                  persistent=persistent, lr=lr_[layer], momentum=momentum,
                  weight_decay=weight_decay, rng=np.random.default_rng([seed, layer]))
        exchange = connect(rbm.params)  # collective: every rank, servers too
        rbm.bind(exchange.params)
        if own:  # after the initial weights, which every rank draws alike
            rbm.rng = np.random.default_rng([seed, layer, *own])
        if exchange.role == "server":
            began = time.perf_counter()
            exchange.serve()
            records = [{"layer": layer + 1, "epoch": epochs_[layer],
                        "reconstruction_error": math.nan,
                        "time_s": time.perf_counter() - began}]
        else:
            below = _Propagator(dbn.rbms, propagate,
                                np.random.default_rng([seed, layer, 1, *own]))
            sampler = ShuffleSampler(len(shard), batch_size, seed + layer)
            records = []
            for epoch in range(epochs_[layer]):
                sampler.set_epoch(epoch)
                batches = (below(_flat(train.batch(shard[i])[0])) for i in sampler)
                metrics = rbm.train_epoch(batches, push=exchange.step)
                records.append({"layer": layer + 1, "epoch": epoch + 1,
                                "reconstruction_error": metrics["reconstruction_error"],
                                "time_s": metrics["time_s"]})
                if epoch + 1 < epochs_[layer]:  # the last epoch reports the server's weights
                    _report(dbn, records[-1], rbm, monitor, progress)
            began = time.perf_counter()
            exchange.finish()
            records[-1]["time_s"] += time.perf_counter() - began
        rbm.bind({name: p.copy() for name, p in rbm.params.items()})  # off the exchange's buffer
        _report(dbn, records[-1], rbm, monitor, progress)
        dbn.rbms.append(rbm)
        monitor = rbm.hidden_prob(monitor)
        width = hidden
    dbn.time_s = time.perf_counter() - start
    return dbn


def _report(dbn: DBN, record: dict[str, Any], rbm: RBM, monitor: np.ndarray,
            progress: Progress | None) -> None:
    record["pseudo_log_likelihood"] = rbm.pseudo_log_likelihood(monitor) \
        if rbm.visible == "binary" else math.nan
    dbn.history.append(record)
    if progress is not None:
        progress(record)


class _Propagator:
    """Pushes a batch of data up through trained RBMs: Algorithm 2's inner loop."""

    def __init__(self, rbms: list[RBM], propagate: str, rng: np.random.Generator,
                 replica: tuple[int, int] = (0, 1)) -> None:
        self.rbms, self.sample, self.rng = list(rbms), propagate == "sample", rng
        self.replica = replica

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for rbm in self.rbms:
            x = rbm.hidden_prob(x)
            if self.sample:
                x = bernoulli(x, self.rng, self.replica)
        return x


def print_progress(stream: TextIO | None = None) -> Progress:
    """A ``progress`` callback printing one line per layer-epoch (for ``meta run``)."""

    def show(m: dict[str, Any]) -> None:
        pll = "" if math.isnan(m["pseudo_log_likelihood"]) else \
            f", pseudo-log-likelihood {m['pseudo_log_likelihood']:.2f}"
        print(f"pretrain layer {m['layer']} epoch {m['epoch']}: reconstruction error "
              f"{m['reconstruction_error']:.4f}{pll}, {m['time_s']:.1f}s",
              file=stream or sys.stdout, flush=True)

    return show


def dbn_classifier(train: Dataset, hidden: Sequence[int] = (500, 500), classes: int = 10,
                   seed: int = 0, **pretrain: Any) -> tuple[Graph, DBN]:
    """Pre-train a DBN on ``train`` and convert it for fine-tuning: what a recipe with
    ``model: dbn`` needs in one call (``pretrain``: ``pretrain_dbn``'s keyword arguments).
    Returns the classifier graph and the DBN (whose ``stack_graph`` exports the features)."""
    dbn = pretrain_dbn(train, hidden, seed=seed, **pretrain)
    return dbn.to_graph(classes=classes, seed=seed), dbn
