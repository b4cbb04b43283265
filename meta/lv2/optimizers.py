"""Optimizers as composable gradient transformations (optax's init/update pairs).

A transformation is ``init(params) -> state`` and ``update(grads, state, params) ->
(updates, state)`` over flat ``dict[str, ndarray]``; ``chain`` composes them; ``Optimizer`` is the
thin stateful wrapper the trainer calls. The update rules follow seed 003 (the overview of
distributed deep learning): SGD with momentum is ``chain(trace(m), scale(-lr))``, Adam is
``chain(scale_by_adam(), scale(-lr))``, AdamW adds ``add_decayed_weights`` between the two.
``adam``/``adamw`` take ``torch.optim.Adam``/``AdamW``'s step (eps outside the bias-corrected
root); Kingma & Ba's form (seed 003's) is ``eps_form="kingma"``.
Weight decay, clipping and learning-rate schedules are transformations too, not flags.

States hold only arrays and integers, so a checkpoint can store them as they are.
"""

from __future__ import annotations

import difflib
import inspect
import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from meta.common.component import Component, ComponentError, Option, Registry
from meta.lv1.roles import TensorView
from meta.lv2.accumulate import accumulate_gradients
from meta.lv2.transform import (  # noqa: F401 - re-exported, their public path
    GradientTransformation,
    LearningRate,
    Params,
    Schedule,
    State,
)


def _zeros(params: Params) -> Params:
    return {k: np.zeros_like(p) for k, p in params.items()}


def _stateless(fn: Callable[[Params, Params], Params],
               elementwise: bool = False) -> GradientTransformation:
    return GradientTransformation(lambda params: (),
                                  lambda grads, state, params: (fn(grads, params), state),
                                  elementwise=elementwise)


def scale(factor: float) -> GradientTransformation:
    """updates = factor * grads."""
    return _stateless(lambda grads, params: {k: factor * g for k, g in grads.items()}, True)


def scale_by_schedule(schedule: Schedule) -> GradientTransformation:
    """updates = schedule(step) * grads, counting steps from 0 (learning-rate schedules)."""

    def update(grads: Params, step: int, params: Params) -> tuple[Params, int]:
        factor = schedule(step)
        return {k: factor * g for k, g in grads.items()}, step + 1

    return GradientTransformation(lambda params: 0, update, elementwise=True)


def scale_by_learning_rate(lr: LearningRate) -> GradientTransformation:
    """Descent: -lr * grads, with ``lr`` a number or a schedule."""
    if callable(lr):
        return scale_by_schedule(lambda step: -lr(step))
    if lr <= 0:
        raise ValueError(f"learning rate must be positive, got {lr}")
    return scale(-lr)


def trace(decay: float, nesterov: bool = False) -> GradientTransformation:
    """Momentum: v <- decay * v + g; the update is v, or g + decay * v with Nesterov.

    With a learning rate a this is seed 003's rule v' = mu v + a g (and Nesterov's
    v' = mu (mu v + a g) + a g) written for the unscaled velocity.
    """

    def update(grads: Params, state: Params, params: Params) -> tuple[Params, Params]:
        velocity = {}
        for k, g in grads.items():
            v = state[k]
            if v.dtype == g.dtype and v.shape == g.shape:  # the optimizer's own array: in place
                v *= decay
                v += g
                velocity[k] = v
            else:
                velocity[k] = decay * v + g
        if nesterov:
            return {k: g + decay * velocity[k] for k, g in grads.items()}, velocity
        return velocity, velocity

    return GradientTransformation(_zeros, update, elementwise=True)


def scale_by_adagrad(eps: float = 1e-8) -> GradientTransformation:
    """Adagrad: s <- s + g^2; update g / sqrt(s + eps)."""

    def update(grads: Params, state: Params, params: Params) -> tuple[Params, Params]:
        s = {k: state[k] + g * g for k, g in grads.items()}
        return {k: g / np.sqrt(s[k] + eps) for k, g in grads.items()}, s

    return GradientTransformation(_zeros, update, elementwise=True)


def scale_by_rms(decay: float = 0.9, eps: float = 1e-8) -> GradientTransformation:
    """RMSProp: s <- mu s + (1 - mu) g^2; update g / sqrt(s + eps)."""

    def update(grads: Params, state: Params, params: Params) -> tuple[Params, Params]:
        s = {k: decay * state[k] + (1 - decay) * g * g for k, g in grads.items()}
        return {k: g / np.sqrt(s[k] + eps) for k, g in grads.items()}, s

    return GradientTransformation(_zeros, update, elementwise=True)


def scale_by_adadelta(rho: float = 0.9, eps: float = 1e-6) -> GradientTransformation:
    """Adadelta: lambda <- rho lambda + (1-rho) g^2; dW = g sqrt((delta + eps)/(lambda + eps));
    delta <- rho delta + (1-rho) dW^2. Needs no learning rate (use scale(-1.0) after it)."""

    def init(params: Params) -> State:
        return {"sq_grad": _zeros(params), "sq_update": _zeros(params)}

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        sq_grad = {k: rho * state["sq_grad"][k] + (1 - rho) * g * g for k, g in grads.items()}
        delta = {k: g * np.sqrt((state["sq_update"][k] + eps) / (sq_grad[k] + eps))
                 for k, g in grads.items()}
        sq_update = {k: rho * state["sq_update"][k] + (1 - rho) * d * d
                     for k, d in delta.items()}
        return delta, {"sq_grad": sq_grad, "sq_update": sq_update}

    return GradientTransformation(init, update, elementwise=True)


ADAM_FORMS = ("pytorch", "kingma")


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, amsgrad: bool = False,
                  eps_form: str = "pytorch") -> GradientTransformation:
    """Adam's direction: m, v moving averages of g and g^2, t the step count from 1.

    ``eps_form`` says where ``eps`` sits, which decides the step while ``sqrt(v)`` is near
    ``eps`` (early steps, rarely used weights):

    * ``"pytorch"`` (default, as ``torch.optim.Adam``/``AdamW``): ``m / (1 - b1^t) /
      (sqrt(v / (1 - b2^t)) + eps)``, so a user moving from PyTorch gets the same update
      from the same name;
    * ``"kingma"`` (Kingma & Ba's efficient form, the end of their Algorithm 1, and seed 003's):
      ``sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``, which is the first with ``eps``
      scaled by ``sqrt(1 - b2^t)``.

    ``amsgrad`` (Reddi et al., 2018, as PyTorch does it) divides by the running maximum of
    ``v`` instead of ``v``, bias-corrected by the current step's ``1 - b2^t``.

    >>> t = scale_by_adam()
    >>> u, s = t.update({"w": np.array([2.0])}, t.init({"w": np.zeros(1)}), {})
    >>> round(float(u["w"][0]), 6), s["t"]
    (1.0, 1)
    """
    if eps_form not in ADAM_FORMS:
        raise ValueError(f"eps_form must be one of {list(ADAM_FORMS)}, got {eps_form!r}")
    kingma = eps_form == "kingma"

    def init(params: Params) -> State:
        state = {"m": _zeros(params), "v": _zeros(params), "t": 0}
        if amsgrad:
            state["v_max"] = _zeros(params)
        return state

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        t = state["t"] + 1
        m = {k: b1 * state["m"][k] + (1 - b1) * g for k, g in grads.items()}
        v = {k: b2 * state["v"][k] + (1 - b2) * g * g for k, g in grads.items()}
        new_state = {"m": m, "v": v, "t": t}
        if amsgrad:
            v = new_state["v_max"] = {k: np.maximum(state["v_max"][k], v[k]) for k in grads}
        bias1, root_bias2 = 1 - b1**t, math.sqrt(1 - b2**t)
        if kingma:
            step = root_bias2 / bias1
            return {k: step * m[k] / (np.sqrt(v[k]) + eps) for k in grads}, new_state
        return {k: m[k] / (np.sqrt(v[k]) / root_bias2 + eps) / bias1 for k in grads}, new_state

    return GradientTransformation(init, update, elementwise=True)


def add_decayed_weights(weight_decay: float) -> GradientTransformation:
    """updates = grads + weight_decay * params (L2 before a rule, decoupled after Adam)."""
    return _stateless(lambda grads, params: {k: g + weight_decay * params[k]
                                             for k, g in grads.items()}, True)


class _Shards(NamedTuple):
    """How this rank's parameters make up the whole model's: ``total`` sums a partial figure
    over the ranks, ``counts(name)`` says whether this rank counts that parameter in it."""

    total: Callable[[float], float]
    counts: Callable[[str], bool]


_ALONE = _Shards(lambda x: x, lambda name: True)
_SHARDS: ContextVar[_Shards] = ContextVar("shards", default=_ALONE)


def global_sum(partial: float) -> float:
    """``partial`` summed over every shard the parameters are split into (itself, unless a
    sharded strategy steps its shard inside ``summed_over``)."""
    return _SHARDS.get().total(partial)


def counted(name: str) -> bool:
    """Whether this rank counts parameter ``name`` in a ``global_sum``: False for a copy some
    other rank counts (a replicated tensor-parallel parameter, a pipeline's tied copy), so
    that a sum over the ranks sees every parameter once."""
    return _SHARDS.get().counts(name)


@contextmanager
def summed_over(total: Callable[[float], float],
                counts: Callable[[str], bool] | None = None) -> Iterator[None]:
    """Within it, ``global_sum`` is ``total`` (a sharded strategy's sum over its ranks) and
    ``counted`` is ``counts`` (default: every parameter this rank steps is its own): a
    shardable transformation stepping one shard then sees the whole parameters' sums."""
    token = _SHARDS.set(_Shards(total, counts or _ALONE.counts))
    try:
        yield
    finally:
        _SHARDS.reset(token)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Scale all gradients down together when their joint L2 norm exceeds ``max_norm`` (over
    every shard: ``global_sum``, each parameter counted once: ``counted``), as PyTorch's
    ``clip_grad_norm_`` and Megatron-LM's clip over the model-parallel ranks do."""

    def clip(grads: Params, params: Params) -> Params:
        mine = sum(float(np.vdot(g, g)) for k, g in grads.items() if counted(k))
        norm = math.sqrt(global_sum(mine))
        if norm <= max_norm:
            return grads
        return {k: g * (max_norm / norm) for k, g in grads.items()}

    return _stateless(clip)._replace(shardable=True)


def zero_grad_rows(rows: dict[str, Sequence[int]]) -> GradientTransformation:
    """The gradient of the named parameters' rows set to zero before any other transformation
    sees it: what ``nn.Embedding(..., padding_idx=i)`` does in PyTorch's backward, which an
    ONNX file cannot say (it has no padding index). As in PyTorch the rows' momentum and Adam
    moments stay zero, so without weight decay the rows never move; weight decay after it
    (L2 or AdamW's decoupled) still reaches them, as PyTorch's does.

    >>> t = zero_grad_rows({"emb": [0]})
    >>> t.update({"emb": np.ones((3, 2))}, (), {})[0]["emb"][:, 0].tolist()
    [0.0, 1.0, 1.0]
    """
    index = {name: np.asarray(sorted(set(r)), np.intp) for name, r in rows.items()}

    def zero(grads: Params, params: Params) -> Params:
        out = dict(grads)
        for name, r in index.items():
            if name in out and len(r):
                g = np.array(out[name])  # a copy: the executor may hand out its own buffer
                g[r] = 0
                out[name] = g
        return out

    return _stateless(zero)


def padding_rows_problems(rows: Any, params: Params) -> list[str]:
    """What is wrong with a ``padding_rows`` option over ``params`` (a dict of parameter name to
    a row index or a list of them): each problem one line naming the parameter."""
    if not isinstance(rows, dict):
        return [f"padding_rows must be a dict of parameter name to row indices, e.g. "
                f"{{'embeddings.word_embeddings.weight': [0]}}, got {rows!r}"]
    problems = []
    for name, indices in rows.items():
        if name not in params:
            near = difflib.get_close_matches(str(name), list(params), 1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            problems.append(f"padding_rows: {name!r} is not a trainable parameter{hint}")
            continue
        listed = [indices] if isinstance(indices, int) else indices
        height = params[name].shape[0] if params[name].ndim else 0
        if not isinstance(listed, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in listed):
            problems.append(f"padding_rows: {name!r} takes row indices (an int or a list of "
                            f"ints), got {indices!r}")
        elif any(not 0 <= i < height for i in listed):
            problems.append(f"padding_rows: {name!r} has {height} rows "
                            f"{list(params[name].shape)}, rows {listed} asked")
    return problems


def masked(inner: GradientTransformation,
           mask: Callable[[str], bool]) -> GradientTransformation:
    """``inner`` applied to the parameters whose name ``mask`` accepts; the others' updates
    pass through unchanged (optax's ``masked``): e.g. weight decay on weights only,
    ``masked(add_decayed_weights(1e-4), lambda name: name.endswith(".weight"))``."""

    def pick(tree: Params) -> Params:
        return {k: v for k, v in tree.items() if mask(k)}

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        updates, state = inner.update(pick(grads), state, pick(params))
        return {**grads, **updates}, state

    return GradientTransformation(lambda params: inner.init(pick(params)), update)


def partition(transforms: dict[str, GradientTransformation],
              label: Callable[[str], str]) -> GradientTransformation:
    """Each parameter updated by the transformation its label names (optax's ``partition``):
    e.g. another learning rate for the last layer. A label without a transformation is an
    error naming the parameter."""

    def split(tree: Params) -> dict[str, Params]:
        groups: dict[str, Params] = {key: {} for key in transforms}
        for name, value in tree.items():
            key = label(name)
            if key not in groups:
                raise KeyError(f"partition: parameter {name!r} has label {key!r}, which has no "
                               f"transformation (labels: {sorted(transforms)})")
            groups[key][name] = value
        return groups

    def init(params: Params) -> State:
        return {key: transforms[key].init(group) for key, group in split(params).items()}

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        grad_groups, param_groups = split(grads), split(params)
        updates: Params = {}
        new_state = {}
        for key, transform in transforms.items():
            group_updates, new_state[key] = transform.update(grad_groups[key], state[key],
                                                            param_groups[key])
            updates.update(group_updates)
        return updates, new_state

    return GradientTransformation(init, update)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply transformations in order, each on the previous one's updates."""

    def init(params: Params) -> State:
        return tuple(t.init(params) for t in transforms)

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        new_state = []
        for t, s in zip(transforms, state):
            grads, s = t.update(grads, s, params)
            new_state.append(s)
        return grads, tuple(new_state)

    return GradientTransformation(init, update,
                                  elementwise=all(t.elementwise for t in transforms),
                                  shardable=all(t.elementwise or t.shardable
                                                for t in transforms))


# -- learning-rate schedules: step -> learning rate ----------------------------------------

def step_table(lr: float, epochs: list[int], factor: float = 0.1,
               steps_per_epoch: int = 1) -> Schedule:
    """lr times ``factor`` once for each boundary epoch passed (a step table per epoch)."""
    return lambda step: lr * factor ** sum(step >= e * steps_per_epoch for e in epochs)


def cosine_decay(lr: float, total_steps: int, final: float = 0.0) -> Schedule:
    """Cosine from ``lr`` to ``final`` over ``total_steps``, then ``final``."""
    def schedule(step: int) -> float:
        progress = min(step, total_steps) / max(total_steps, 1)
        return final + (lr - final) * 0.5 * (1 + math.cos(math.pi * progress))
    return schedule


def warmup(schedule: Schedule | float, warmup_steps: int) -> Schedule:
    """Linear warm-up from ~0 to the schedule over ``warmup_steps``."""
    inner = schedule if callable(schedule) else (lambda step: schedule)
    return lambda step: inner(step) * min(1.0, (step + 1) / max(warmup_steps, 1))


# -- the named optimizers -------------------------------------------------------------------

def _with_decay(rule: list[GradientTransformation], lr: LearningRate,
                weight_decay: float) -> GradientTransformation:
    decay = [add_decayed_weights(weight_decay)] if weight_decay else []
    return chain(*decay, *rule, scale_by_learning_rate(lr))


def sgd(lr: LearningRate, momentum: float = 0.0, nesterov: bool = False,
        weight_decay: float = 0.0) -> GradientTransformation:
    """Stochastic gradient descent, with optional (Nesterov) momentum and L2 weight decay.

    >>> opt = Optimizer(sgd(0.1), {"w": np.array([1.0])})
    >>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
    [0.8]
    """
    transform = _with_decay([trace(momentum, nesterov)] if momentum else [], lr, weight_decay)
    if momentum and not weight_decay and not callable(lr):
        transform = transform._replace(in_place=_fused_momentum(lr, momentum, nesterov))
    return transform


def _fused_momentum(lr: float, momentum: float, nesterov: bool
                    ) -> Callable[[Params, State, Params], State]:
    """chain(trace(momentum), scale(-lr)) as one pass per tensor (meta's native kernel: one
    read of p, v, g and one write of p, v where numpy's chain makes four passes); arrays the
    kernel does not take (another dtype, not contiguous) go the chain's way."""

    def in_place(grads: Params, state: State, params: Params) -> State:
        from meta.lv0 import native

        kernel = native.module().sgd_momentum_
        velocity = state[0]
        for name, g in grads.items():
            p, v = params[name], velocity[name]
            if (p.dtype == v.dtype == g.dtype and p.dtype in native.NATIVE_DTYPES
                    and p.shape == v.shape == g.shape and p.flags.c_contiguous
                    and v.flags.c_contiguous and g.flags.c_contiguous):
                kernel(p, v, g, lr, momentum, nesterov)
            else:
                v *= momentum
                v += g
                p -= lr * (g + momentum * v if nesterov else v)
        return state

    return in_place


def adagrad(lr: LearningRate = 0.01, eps: float = 1e-8,
            weight_decay: float = 0.0) -> GradientTransformation:
    """Adagrad (Duchi et al., 2011): steps scaled by the root of each parameter's summed squared
    gradients."""
    return _with_decay([scale_by_adagrad(eps)], lr, weight_decay)


def rmsprop(lr: LearningRate = 0.01, decay: float = 0.9, eps: float = 1e-8,
            weight_decay: float = 0.0) -> GradientTransformation:
    """RMSProp (Tieleman and Hinton, 2012): steps scaled by a moving root mean square of the
    gradients (``decay``)."""
    return _with_decay([scale_by_rms(decay, eps)], lr, weight_decay)


def adadelta(lr: LearningRate = 1.0, rho: float = 0.9, eps: float = 1e-6,
             weight_decay: float = 0.0) -> GradientTransformation:
    """Adadelta (Zeiler, 2012): step sizes from moving averages of squared gradients and squared
    updates; ``lr`` 1.0 as in the paper."""
    return _with_decay([scale_by_adadelta(rho, eps)], lr, weight_decay)


def adam(lr: LearningRate = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         weight_decay: float = 0.0, amsgrad: bool = False,
         eps_form: str = "pytorch") -> GradientTransformation:
    """Adam, ``torch.optim.Adam``'s update by default (``eps_form``: see ``scale_by_adam``);
    ``weight_decay`` here is L2 added to the gradient, as PyTorch's Adam does (see ``adamw``
    for decoupled)."""
    return _with_decay([scale_by_adam(b1, b2, eps, amsgrad, eps_form)], lr, weight_decay)


def adamw(lr: LearningRate = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01, amsgrad: bool = False,
          eps_form: str = "pytorch") -> GradientTransformation:
    """Adam with decoupled weight decay (Loshchilov & Hutter), ``torch.optim.AdamW``'s update by
    default: ``p <- p - lr * (adam_direction + weight_decay * p)``, the decay skipping Adam's
    scaling."""
    return chain(scale_by_adam(b1, b2, eps, amsgrad, eps_form),
                 add_decayed_weights(weight_decay), scale_by_learning_rate(lr))


class Optimizer:
    """Holds a transformation's state and applies its updates to ``params`` in place.

    ``params`` are the network's own arrays (``graph.parameters``), so the executor sees each
    step's new values. An optimizer over some of them (a fine-tuned last layer) takes their
    gradients from a step's and leaves the rest alone.
    """

    needs_closure = False  # a step takes gradients, not a closure (the line searches do)

    def __init__(self, transform: GradientTransformation, params: Params) -> None:
        self.transform = transform
        self.params = params
        self.state = transform.init(params)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state, for a checkpoint."""
        return {"state": self.state}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore the state ``state_dict`` returned."""
        self.state = saved["state"]

    def step(self, grads: Params) -> None:
        """Update the parameters in place from ``grads`` (one per parameter; a ``KeyError`` names
        any missing)."""
        missing = set(self.params) - set(grads)
        if missing:
            raise KeyError(f"optimizer step: no gradient for parameter(s) {sorted(missing)}")
        grads = {name: grads[name] for name in self.params}
        if isinstance(self.params, TensorView):  # the graph's version stamp moves on
            self.params.touch()
        if self.transform.in_place is not None:
            self.state = self.transform.in_place(grads, self.state, self.params)
            return
        updates, self.state = self.transform.update(grads, self.state, self.params)
        for name, u in updates.items():
            self.params[name] += u.astype(self.params[name].dtype, copy=False)


# -- the registry recipes choose from ---------------------------------------------------------

OptimizerFactory = Callable[..., GradientTransformation]
SCHEDULES = ("constant", "step", "cosine")
def _schedule_problems(values: dict[str, Any]) -> list[str]:
    if values["lr_schedule"] == "step" and not values["lr_decay_epochs"]:
        return ["lr_schedule 'step' needs 'lr_decay_epochs' (the epochs where the learning "
                "rate drops)"]
    if values.get("warmup_epochs") and values.get("lr_warmup_steps"):
        return ["give warmup_epochs or lr_warmup_steps, not both (one warm-up)"]
    return []


OPTIMIZERS = Registry("optimizer", context=("lr",), validate=_schedule_problems, common={
    "lr": Option(0.05, "learning rate", above=0.0),
    "weight_decay": Option(0.0, "L2 penalty added to the gradients", low=0.0),
    "grad_clip": Option(0.0, "clip the gradients' global L2 norm to this (0: off)", low=0.0),
    "lr_schedule": Option("constant", "constant, step or cosine", choices=SCHEDULES),
    "lr_decay_epochs": Option((), "lr_schedule step: epochs where lr is multiplied ...",
                              type=tuple[int, ...], low=1),
    "lr_decay_factor": Option(0.1, "... by this factor", above=0.0),
    "warmup_epochs": Option(0, "linear learning-rate warm-up", low=0),
    "lr_warmup_steps": Option(0, "linear learning-rate warm-up over this many optimizer steps "
                              "(instead of warmup_epochs)", low=0),
    "accumulate": Option(1, "micro-batches per optimizer step: it steps on their mean gradient, "
                            "as on one batch this many times larger (gradient accumulation)",
                         low=1),
    "padding_rows": Option({}, "rows whose gradient is zero, as nn.Embedding(padding_idx=0) "
                               "(ONNX has no padding index): {'word_embeddings.weight': [0]}",
                           type=dict),
})


def lr_option(default: float, source: str) -> dict[str, Option]:
    """An optimizer's own default learning rate, saying where it comes from. Each rule takes
    the one its paper and PyTorch give it, so a recipe that names ``adam`` and no ``lr`` trains
    as a PyTorch user expects (with one shared default, Adam ran at 0.05 and diverged)."""
    return {"lr": Option(default, f"learning rate (default: {source})", above=0.0)}


_MOMENTUM = Option(0.9, "momentum", low=0.0, below=1.0)
# SGD: no paper fixes a rate, and PyTorch's 1e-3 goes with its momentum 0; with meta's momentum
# 0.9, 0.05 trains the shipped MLPs (recipes/mnist_mlp.py).
OPTIMIZERS.add("sgd", sgd, {"momentum": _MOMENTUM, "nesterov": Option(False, "Nesterov momentum"),
                            **lr_option(0.05, "meta's, for momentum 0.9; PyTorch 1e-3 at 0")})
OPTIMIZERS.add("adagrad", adagrad, {"eps": Option(1e-8, "added to the denominator", above=0),
                                    **lr_option(1e-2, "PyTorch's")})
OPTIMIZERS.add("rmsprop", rmsprop, {"decay": Option(0.9, "of the squared-gradient average",
                                                    low=0.0, below=1.0),
                                    "eps": Option(1e-8, "added to the denominator", above=0),
                                    **lr_option(1e-2, "PyTorch's; Keras 1e-3")})
OPTIMIZERS.add("adadelta", adadelta, {"rho": Option(0.9, "decay of the averages", low=0.0,
                                                    below=1.0),
                                      "eps": Option(1e-6, "added inside the roots", above=0),
                                      **lr_option(1.0, "Zeiler 2012 and PyTorch")})
_ADAM = {"b1": Option(0.9, "decay of the first moment", low=0.0, below=1.0),
         "b2": Option(0.999, "decay of the second moment", low=0.0, below=1.0),
         "eps": Option(1e-8, "added to the denominator", above=0),
         "amsgrad": Option(False, "divide by the running maximum of the second moment "
                                  "(Reddi et al. 2018, as PyTorch)"),
         "eps_form": Option("pytorch", "pytorch: m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps), as "
                                       "torch.optim.Adam; kingma: sqrt(1-b2^t)/(1-b1^t) * "
                                       "m / (sqrt(v) + eps), Kingma & Ba's form",
                            choices=ADAM_FORMS)}
OPTIMIZERS.add("adam", adam, {**_ADAM, **lr_option(1e-3, "Kingma & Ba 2015 and PyTorch")})
OPTIMIZERS.add("adamw", adamw, {**_ADAM, "weight_decay": Option(0.01, "decoupled weight decay",
                                                                low=0.0),
                                **lr_option(1e-3, "Loshchilov & Hutter 2019 and PyTorch")})


def register_optimizer(name: str, **options: Option) -> Callable[[OptimizerFactory],
                                                                 OptimizerFactory]:
    """Make ``factory(lr, **hyperparameters) -> GradientTransformation`` selectable by name
    (``"optimizer": name`` in a recipe); its hyperparameters are options (declared here, or
    read from the factory's defaults), beside the learning rate, schedule, weight decay and
    clipping every optimizer takes.

    >>> @register_optimizer("sign_sgd")
    ... def sign_sgd(lr):
    ...     sign = GradientTransformation(
    ...         lambda params: (),
    ...         lambda grads, state, params: ({k: np.sign(g) for k, g in grads.items()}, state))
    ...     return chain(sign, scale_by_learning_rate(lr))
    >>> "sign_sgd" in OPTIMIZERS
    True

    A default ``lr`` in the factory's signature is the optimizer's default learning rate (else
    the common 0.05).
    """
    def decorate(factory: OptimizerFactory) -> OptimizerFactory:
        lr = inspect.signature(factory).parameters.get("lr")
        own = {} if lr is None or lr.default is inspect.Parameter.empty or "lr" in options \
            else lr_option(float(lr.default), f"{name}'s own")
        OPTIMIZERS.add(name, factory, {**own, **options})
        return factory

    return decorate


def learning_rate(values: dict[str, Any], steps_per_epoch: int, epochs: int) -> LearningRate:
    """The learning rate the common options describe: a number, or a schedule over steps."""
    lr: LearningRate = values["lr"]
    if values["lr_schedule"] == "step":
        if not values["lr_decay_epochs"]:
            raise ComponentError("optimizer: lr_schedule 'step' needs 'lr_decay_epochs' (the "
                                 "epochs where the learning rate drops)")
        lr = step_table(values["lr"], list(values["lr_decay_epochs"]), values["lr_decay_factor"],
                        steps_per_epoch)
    elif values["lr_schedule"] == "cosine":
        lr = cosine_decay(values["lr"], epochs * steps_per_epoch)
    if values["warmup_epochs"] or values.get("lr_warmup_steps"):
        lr = warmup(lr, values.get("lr_warmup_steps") or values["warmup_epochs"] * steps_per_epoch)
    return lr


def build_optimizer(component: Component, options: dict[str, Any], params: Params,
                    steps_per_epoch: int, epochs: int) -> Any:
    """The optimizer a recipe names, over ``params``: an update rule with its schedule, weight
    decay and clipping wrapped in ``Optimizer``, or (``meta['line_search']``) an optimizer
    class that takes the parameters itself (L-BFGS, CG), or (``meta['framework']``) another
    framework's optimizer over them (``torch_adam``: the learning rate or its schedule,
    weight decay and clipping are handed to it)."""
    values = component.resolve(options)
    if component.meta.get("line_search"):
        return component.factory(params, **values)
    common = {k: values.pop(k) for k in list(values) if k in OPTIMIZERS.common}
    every = common.get("accumulate", 1)
    steps_per_epoch = steps_per_epoch / every  # a schedule counts optimizer steps
    rows = common.get("padding_rows") or {}
    problems = padding_rows_problems(rows, params) if rows else []
    if problems:
        raise ComponentError(f"{component.label}: {'; '.join(problems)}")
    if rows and component.meta.get("framework"):
        raise ComponentError(f"{component.label}: padding_rows is applied by meta's own "
                             f"optimizers (sgd, adam, adamw, ...), not by another "
                             f"framework's; choose one of them")
    if every > 1 and component.meta.get("framework"):
        raise ComponentError(f"{component.label}: accumulate is applied by meta's own "
                             f"optimizers (sgd, adam, adamw, ...), not by another framework's; "
                             f"choose one of them")
    if component.meta.get("framework"):  # another framework's optimizer: it steps the arrays
        return component.factory(params, learning_rate(common, steps_per_epoch, epochs),
                                 weight_decay=common["weight_decay"],
                                 grad_clip=common["grad_clip"], **values)
    accepted = inspect.signature(component.factory).parameters
    decay = common["weight_decay"]
    if "weight_decay" in accepted:
        values["weight_decay"] = decay
        decay = 0.0
    transform = component.factory(learning_rate(common, steps_per_epoch, epochs), **values)
    if decay:
        transform = chain(add_decayed_weights(decay), transform)
    if common["grad_clip"]:
        transform = chain(clip_by_global_norm(common["grad_clip"]), transform)
    if rows:  # first: PyTorch's padding row has a zero gradient before clipping and decay
        transform = chain(zero_grad_rows({k: [v] if isinstance(v, int) else list(v)
                                          for k, v in rows.items()}), transform)
    if every > 1:  # last: the mean gradient is clipped and decayed, as a larger batch's is
        transform = accumulate_gradients(transform, every)
    return Optimizer(transform, params)
