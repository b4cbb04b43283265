"""PyTorch's optimizers as Level 2 optimizers: ``torch.optim.SGD``, ``Adam``, ``AdamW``,
``RMSprop`` and ``Adagrad`` by name (``"optimizer": "torch_adam"``), with their options.

A ``TorchOptimizer`` wraps a ``torch.optim`` optimizer over tensors that share memory with
meta's parameter arrays (``torch.from_numpy``), so it works with any executor (reference,
native or PyTorch, which all hand back numpy gradients) and under any Level 3 strategy that
takes a plain optimizer (allreduce, parameter servers, ...): ``step(grads)`` sets each tensor's
``.grad`` from the numpy gradient, without a copy, and steps; the arrays change in place. When
a strategy re-points the parameters into its flat buffer the tensors follow at the next step.
The common options every meta optimizer takes work here too: ``weight_decay`` is PyTorch's
(L2 for SGD, Adam, RMSprop and Adagrad, decoupled for AdamW, as in meta's own), ``grad_clip``
clips the global norm as meta does, and ``lr_schedule``/``warmup_epochs`` set the learning
rate of every parameter group before each step. Checkpoints store ``state_dict()`` as numpy
arrays.

PyTorch is imported when such an optimizer is built, never by ``import meta``: registering
them needs only their declared options.

>>> import numpy as np
>>> opt = TorchOptimizer("SGD", {"w": np.array([1.0, 2.0])}, lr=0.1)  # doctest: +SKIP
>>> opt.step({"w": np.array([1.0, 1.0])}); opt.params["w"]             # doctest: +SKIP
array([0.9, 1.9])
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any, Callable

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv2.optimizers import OPTIMIZERS, LearningRate, Params, lr_option

INSTALL = "pip install 'meta[torch]'"


def _import_torch(what: str) -> Any:
    try:
        import torch
    except ImportError as err:
        raise ComponentError(f"optimizer {what!r} needs PyTorch, which is not installed "
                             f"({INSTALL})") from err
    return torch


def _tree(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` (dicts, lists, tuples) with every tensor or array passed through ``leaf``."""
    if isinstance(value, dict):
        return {k: _tree(v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_tree(v, leaf) for v in value)
    return leaf(value)


class TorchOptimizer:
    """``torch.optim.<name>`` over ``params`` (name -> numpy array, updated in place); the
    interface the trainer and Level 3 strategies use: ``params``, ``step(grads)``,
    ``state_dict()``/``load_state_dict()``. ``lr`` is a number or a schedule (step -> lr)."""

    framework = "pytorch"
    needs_closure = False  # a step takes gradients (no torch line search is registered)

    def __init__(self, name: str, params: Params, lr: LearningRate, grad_clip: float = 0.0,
                 label: str | None = None, **options: Any) -> None:
        self.label = label or f"torch_{name.lower()}"
        torch = _import_torch(self.label)
        self.torch = torch
        self.params = params
        self.lr = lr
        self.grad_clip = grad_clip
        self.steps = 0
        self._arrays: dict[str, np.ndarray] = {}
        self._tensors: dict[str, Any] = {}
        for key, array in params.items():
            self._arrays[key] = array
            self._tensors[key] = torch.from_numpy(self._shareable(key, array))
        cls = getattr(torch.optim, name)
        self.optimizer = cls(list(self._tensors.values()), lr=self._lr(0), **options)

    def _shareable(self, key: str, array: np.ndarray) -> np.ndarray:
        if not (isinstance(array, np.ndarray) and array.flags.writeable
                and array.dtype.isnative and all(s >= 0 for s in array.strides)):
            raise ComponentError(f"optimizer {self.label!r}: parameter {key!r} must be a "
                                 f"writable numpy array (got {type(array).__name__})")
        return array

    def _lr(self, step: int) -> float:
        return float(self.lr(step)) if callable(self.lr) else float(self.lr)

    def _bind(self) -> None:
        """Follow parameters re-pointed since the last step (a strategy's flat buffer)."""
        for key, tensor in self._tensors.items():
            array = self.params[key]
            if array is not self._arrays[key]:
                tensor.data = self.torch.from_numpy(self._shareable(key, array))
                self._arrays[key] = array

    def step(self, grads: Params) -> None:
        """Update the parameters in place with PyTorch's optimizer from ``grads`` (clipped first by
        meta's rule when ``grad_clip`` is set)."""
        missing = set(self.params) - set(grads)
        if missing:
            raise KeyError(f"optimizer step: no gradient for parameter(s) {sorted(missing)}")
        self._bind()
        grads = {k: np.asarray(grads[k], dtype=self._arrays[k].dtype) for k in self.params}
        if self.grad_clip:  # meta's rule (clip_by_global_norm), on copies
            norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
            if norm > self.grad_clip:
                grads = {k: g * (self.grad_clip / norm) for k, g in grads.items()}
        for key, tensor in self._tensors.items():
            g = grads[key]
            if not g.flags.writeable or any(s < 0 for s in g.strides):
                g = g.copy()
            tensor.grad = self.torch.from_numpy(g).reshape(tensor.shape)
        lr = self._lr(self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        for tensor in self._tensors.values():
            tensor.grad = None  # the caller's gradient arrays are not kept
        self.steps += 1

    @property
    def state(self) -> dict[str, Any]:
        """PyTorch's optimizer state as ``state_dict`` gives it."""
        return self.state_dict()

    @property
    def transform(self) -> Any:
        """Always raises: a PyTorch optimizer has no meta update rule to run elsewhere (a parameter
        server's)."""
        raise ComponentError(f"optimizer {self.label!r} steps PyTorch's own tensors and has no "
                             f"meta update rule to run elsewhere (Downpour's parameter "
                             f"servers need one): use a meta optimizer there")

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's state dict with numpy arrays for tensors (a checkpoint stores it)."""
        def to_numpy(v: Any) -> Any:
            return v.detach().cpu().numpy().copy() if isinstance(v, self.torch.Tensor) else v

        return {"torch": _tree(self.optimizer.state_dict(), to_numpy), "steps": self.steps}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (PyTorch's state and the step count)."""
        def to_tensor(v: Any) -> Any:
            return self.torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v

        state = _tree(saved["torch"], to_tensor)
        state["state"] = {int(k): v for k, v in state["state"].items()}
        self.optimizer.load_state_dict(state)
        self.steps = int(saved["steps"])

    def __repr__(self) -> str:
        return f"TorchOptimizer({type(self.optimizer).__name__}, {len(self.params)} tensors)"


def _register(name: str, torch_name: str, options: dict[str, Option], doc: str) -> None:
    def factory(params: Params, lr: LearningRate, weight_decay: float = 0.0,
                grad_clip: float = 0.0, **values: Any) -> TorchOptimizer:
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return TorchOptimizer(torch_name, params, lr, grad_clip, label=name,
                              weight_decay=weight_decay, **values)

    def problems(values: dict[str, Any]) -> list[str]:  # told before any data is loaded
        found = list(OPTIMIZERS.validate(values)) if OPTIMIZERS.validate else []
        if importlib.util.find_spec("torch") is None:
            found.append(f"PyTorch is not installed ({INSTALL})")
        return found

    factory.__qualname__ = factory.__name__ = name
    factory.options = options  # type: ignore[attr-defined]  # declared, not inferred
    OPTIMIZERS.add(name, factory, options, doc=doc, framework="pytorch", validate=problems)


_BETAS = Option((0.9, 0.999), "decay of the first and second moments", type=tuple[float, ...],
                low=0.0, below=1.0)
_AMSGRAD = Option(False, "AMSGrad: the maximum of the second moments")
_register("torch_sgd", "SGD", {
    "momentum": Option(0.0, "momentum", low=0.0, below=1.0),
    "dampening": Option(0.0, "dampening of the momentum", low=0.0, high=1.0),
    "nesterov": Option(False, "Nesterov momentum"), **lr_option(1e-3, "PyTorch's")},
    "torch.optim.SGD (needs PyTorch)")
_register("torch_adam", "Adam", {
    "betas": _BETAS, "eps": Option(1e-8, "added to the denominator", above=0.0),
    "amsgrad": _AMSGRAD, **lr_option(1e-3, "PyTorch's")},
    "torch.optim.Adam, weight_decay as L2 (needs PyTorch)")
_register("torch_adamw", "AdamW", {
    "betas": _BETAS, "eps": Option(1e-8, "added to the denominator", above=0.0),
    "amsgrad": _AMSGRAD, "weight_decay": Option(0.01, "decoupled weight decay", low=0.0),
    **lr_option(1e-3, "PyTorch's")},
    "torch.optim.AdamW, decoupled weight decay (needs PyTorch)")
_register("torch_rmsprop", "RMSprop", {
    "alpha": Option(0.99, "decay of the squared-gradient average", low=0.0, below=1.0),
    "eps": Option(1e-8, "added to the denominator", above=0.0),
    "momentum": Option(0.0, "momentum", low=0.0, below=1.0),
    "centered": Option(False, "divide by the gradient's estimated variance"),
    **lr_option(1e-2, "PyTorch's")},
    "torch.optim.RMSprop (needs PyTorch)")
_register("torch_adagrad", "Adagrad", {
    "lr_decay": Option(0.0, "learning-rate decay per step", low=0.0),
    "eps": Option(1e-10, "added to the denominator", above=0.0),
    "initial_accumulator_value": Option(0.0, "starting sum of squares", low=0.0),
    **lr_option(1e-2, "PyTorch's")},
    "torch.optim.Adagrad (needs PyTorch)")
