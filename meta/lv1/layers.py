"""Models in code, as brief as PyTorch's: layers that write ONNX nodes into a meta ``Graph``.

>>> net = Sequential(Conv(6, 5, padding=2), Relu(), MaxPool(2), Flatten(), Linear(10))
>>> graph = net.graph(input_shape=(1, 28, 28), seed=0)
>>> [t.name for t in graph.inputs], [t.name for t in graph.outputs]
(['input', 'labels'], ['logits', 'loss'])
>>> {k: v.shape for k, v in graph.parameters.items()}["fc1.weight"]
(10, 1176)

Why layers and not a second executor: a layer only *writes* graph nodes (Conv, Gemm, Relu,
...), so every executor (reference, native, planned, PyTorch, onnxruntime) runs the result and
it exports to ONNX as is. Each layer knows the activation shape before it (per sample, without
the batch axis), so channel counts and flatten widths are inferred from ``input_shape`` and a
shape that pools away to nothing is refused by name.

Names: a layer without ``name=`` is called after its kind and a counter per kind, from 1, in
its scope (``conv1``, ``conv2``, ``fc1``, ``bn1``); its parameters are ``<name>.weight`` and
``<name>.bias`` (BatchNorm adds the state ``running_mean``/``running_var``). A named
``Sequential`` or ``Residual`` opens a scope: its layers are ``<scope>.conv1`` and so on.

Initialisation (``init``, per layer or for the whole graph): ``"torch"`` (the default) is
PyTorch's for Conv and Linear, weight and bias uniform in +-1/sqrt(fan_in) (kaiming-uniform with
a = sqrt(5)); ``"he"`` is He-uniform weights (+-sqrt(6/fan_in), suited to ReLU) and zero biases,
what meta's built-in builders use. Every draw comes from one generator seeded by ``seed``, in
layer order, so a graph is a function of its layers and its seed.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from meta.lv1.builder import DEFAULT_OPSET, GraphBuilder
from meta.lv1.graph import Graph

INITS = ("torch", "he")


def _tuple(value: int | Sequence[int], n: int, what: str) -> tuple[int, ...]:
    """An int for every spatial axis, or one per axis (PyTorch's convention)."""
    if isinstance(value, (int, np.integer)):
        return (int(value),) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ValueError(f"{what}: {list(value)} gives {len(value)} values for {n} spatial axes")
    return value


def _count(net: Net, name: str, what: str, value: Any) -> int:
    """A layer's size argument (channels, features, groups): an int >= 1, else the error
    names the layer and the argument (not the input size it would fail on later)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{net.name}: {name}: {what} must be an integer >= 1, got {value!r}")
    return int(value)


class Net:
    """What layers build into: the graph builder, the activation shape (per sample), the
    generator every initialiser draws from, the dtype and the naming scopes."""

    def __init__(self, name: str, input_shape: Sequence[int], seed: int = 0,
                 dtype: Any = np.float32, init: str = "torch", opset: int = DEFAULT_OPSET,
                 input_dtype: Any = None) -> None:
        if init not in INITS:
            raise ValueError(f"{name}: init {init!r} is not one of {list(INITS)}")
        self.name = name
        self.b = GraphBuilder(name, opset)
        self.rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)
        self.init = init
        self.input_shape = tuple(int(s) for s in input_shape)
        self.shape = self.input_shape
        self.x = self.b.input("input", input_dtype or dtype, ("N", *self.input_shape))
        self._scopes: list[tuple[str, dict[str, int]]] = [("", {})]
        self._taken: set[str] = set()

    # -- naming ----------------------------------------------------------------------------
    def name_of(self, layer: Layer) -> str:
        """``layer``'s full name: its own or ``<kind><n>``, inside the current scope."""
        prefix, counts = self._scopes[-1]
        if layer.name is not None:
            own = layer.name
        else:
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
            own = f"{layer.kind}{counts[layer.kind]}"
        return self.take(f"{prefix}{own}")

    def take(self, name: str) -> str:
        """``name``, refused if a layer already has it (its parameters would be replaced)."""
        if name in self._taken:
            raise ValueError(f"{self.name}: two layers are named {name!r}; name one of them "
                             f"otherwise")
        self._taken.add(name)
        return name

    def enter(self, scope: str) -> None:
        self._scopes.append((f"{scope}.", {}))

    def leave(self) -> None:
        self._scopes.pop()

    # -- parameters ------------------------------------------------------------------------
    def uniform(self, name: str, bound: float, shape: tuple[int, ...]) -> str:
        # float64 draws cast to the dtype: the same numbers in every dtype's leading digits
        return self.b.initializer(name, self.rng.uniform(-bound, bound, shape)
                                  .astype(self.dtype))

    def full(self, name: str, value: float, shape: tuple[int, ...]) -> str:
        return self.b.initializer(name, np.full(shape, value, self.dtype))

    def weight_and_bias(self, name: str, shape: tuple[int, ...], fan_in: int, bias: bool,
                        init: str | None) -> list[str]:
        """Conv/Linear parameters as ``init`` draws them (see the module's doc)."""
        init = init or self.init
        if init not in INITS:
            raise ValueError(f"{name}: init {init!r} is not one of {list(INITS)}")
        if init == "he":
            out = [self.uniform(f"{name}.weight", math.sqrt(6.0 / fan_in), shape)]
            return out + ([self.full(f"{name}.bias", 0.0, shape[:1])] if bias else [])
        bound = 1.0 / math.sqrt(fan_in)
        out = [self.uniform(f"{name}.weight", bound, shape)]
        return out + ([self.uniform(f"{name}.bias", bound, shape[:1])] if bias else [])

    def check(self, layer: str, shape: Sequence[int]) -> tuple[int, ...]:
        """The new activation shape, refused by name when an axis is gone."""
        shape = tuple(int(s) for s in shape)
        if min(shape, default=1) < 1:
            raise ValueError(f"{self.name}: input shape {list(self.input_shape)} is too small "
                             f"for its convolutions and pools ({layer} gives {list(shape)})")
        self.shape = shape
        return shape


class Layer:
    """One step of a model: ``build(net, x)`` adds its nodes after tensor ``x`` and returns
    the tensor it produces, updating ``net.shape``. Subclasses set ``kind`` (the automatic
    name's stem)."""

    kind = "layer"

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def build(self, net: Net, x: str) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        own = {k: v for k, v in vars(self).items() if v is not None and k != "layers"}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in own.items())})"


# -- containers ---------------------------------------------------------------------------------
class Sequential(Layer):
    """Layers applied in order; with a ``name``, a scope for their names.

    ``graph(input_shape)`` makes a classifier graph of it: see ``Sequential.graph``.
    """

    kind = "seq"

    def __init__(self, *layers: Layer, name: str | None = None) -> None:
        super().__init__(name)
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"Sequential: item {i} is {type(layer).__name__}, not a layer "
                                f"(write Relu(), not Relu)")
        self.layers = list(layers)

    def build(self, net: Net, x: str) -> str:
        if self.name is not None:
            net.enter(net.name_of(self))
        for layer in self.layers:
            x = layer.build(net, x)
        if self.name is not None:
            net.leave()
        return x

    def graph(self, input_shape: Sequence[int], classes: int | None = None, seed: int = 0,
              dtype: Any = np.float32, init: str = "torch", loss: str | None = "cross_entropy",
              name: str = "model", opset: int = DEFAULT_OPSET, input_dtype: Any = None
              ) -> Graph:
        """A graph meeting the model-component contract: inputs ``input`` (N, *input_shape)
        and ``labels`` (N,) int64; outputs ``logits`` (the last layer's output: the node
        writing it is renamed ``logits``, its parameters keep the layer's name) and
        ``loss``, the mean softmax cross-entropy (``loss=None``: no labels, no loss).
        ``classes``, when given, is checked against the last layer's width."""
        net = Net(name, input_shape, seed, dtype, init, opset, input_dtype)
        h = self.build(net, net.x)
        if h == net.x:
            raise ValueError(f"{name}: the model has no layers")
        logits = _rename_output(net.b, h, "logits")
        if classes is not None and net.shape != (classes,):
            raise ValueError(f"{name}: the last layer gives {list(net.shape)} per sample, not "
                             f"the {classes} classes (end with Linear({classes}))")
        net.b.output(logits, net.dtype, ("N", *net.shape))
        if loss is not None:
            if loss != "cross_entropy":
                raise ValueError(f"{name}: loss {loss!r} is not 'cross_entropy' or None")
            labels = net.b.input("labels", np.int64, ("N",))
            out = net.b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss",
                             reduction="mean")
            net.b.output(out, net.dtype, ())
        return net.b.build()


def _rename_output(b: GraphBuilder, old: str, new: str) -> str:
    """Give the tensor ``old`` and the node that writes it the name ``new`` (its parameters
    keep the layer's name: an MLP's last layer is the node ``logits`` with ``fc2.weight``)."""
    if old == new:
        return new
    for node in reversed(b.nodes):
        if old in node.outputs:
            node.outputs[node.outputs.index(old)] = new
            node.name = new
            return new
    raise ValueError(f"{b.name}: the model's output {old!r} is its input (no layer ran)")


class Residual(Layer):
    """``layers(x) + shortcut(x)``: a skip connection (ResNet's basic block without its last
    activation). ``shortcut`` is the identity unless given (a projection when the shape
    changes); the sum is an ``Add`` node named ``<scope>.add``."""

    kind = "res"

    def __init__(self, *layers: Layer, shortcut: Layer | Sequence[Layer] | None = None,
                 name: str | None = None) -> None:
        super().__init__(name)
        self.body = Sequential(*layers)
        self.shortcut = (Sequential(*shortcut) if isinstance(shortcut, (list, tuple))
                         else shortcut)

    def build(self, net: Net, x: str) -> str:
        scope = net.name_of(self)
        net.enter(scope)
        entry = net.shape
        y = self.body.build(net, x)
        body_shape, net.shape = net.shape, entry
        skip = self.shortcut.build(net, x) if self.shortcut is not None else x
        if net.shape != body_shape:
            raise ValueError(f"{net.name}: {scope}: the block gives {list(body_shape)} and its "
                             f"shortcut {list(net.shape)}; add a shortcut projecting to the "
                             f"block's shape")
        net.leave()
        return net.b.node("Add", [y, skip], name=f"{scope}.add")


# -- weighted layers ----------------------------------------------------------------------------
class Conv(Layer):
    """A 1-D, 2-D or 3-D convolution (by the input's rank): ``Conv(out_channels, kernel_size,
    stride=1, padding=0, groups=1, dilation=1, bias=True)``, in channels inferred."""

    kind = "conv"

    def __init__(self, out_channels: int, kernel_size: int | Sequence[int], stride: int = 1,
                 padding: int | Sequence[int] = 0, groups: int = 1, dilation: int = 1,
                 bias: bool = True, init: str | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.out_channels, self.kernel_size, self.stride = out_channels, kernel_size, stride
        self.padding, self.groups, self.dilation = padding, groups, dilation
        self.bias, self.init = bias, init

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        if len(net.shape) < 2:
            raise ValueError(f"{net.name}: {name}: Conv needs (channels, *spatial) per sample, "
                             f"got {list(net.shape)}")
        _count(net, name, "out_channels", self.out_channels)
        _count(net, name, "groups", self.groups)
        c, spatial = net.shape[0], net.shape[1:]
        n = len(spatial)
        k = _tuple(self.kernel_size, n, f"{name} kernel_size")
        s = _tuple(self.stride, n, f"{name} stride")
        p = _tuple(self.padding, n, f"{name} padding")
        d = _tuple(self.dilation, n, f"{name} dilation")
        for what, values in (("kernel_size", k), ("stride", s), ("dilation", d)):
            for v in values:
                _count(net, name, what, v)
        if c % self.groups or self.out_channels % self.groups:
            raise ValueError(f"{net.name}: {name}: {c} input and {self.out_channels} output "
                             f"channels are not divisible into {self.groups} groups")
        per_group = c // self.groups
        fan_in = per_group * math.prod(k)
        inputs = [x, *net.weight_and_bias(name, (self.out_channels, per_group, *k), fan_in,
                                          self.bias, self.init)]
        net.check(name, (self.out_channels, *((size + 2 * pad - dil * (kk - 1) - 1) // st + 1
                                              for size, kk, st, pad, dil
                                              in zip(spatial, k, s, p, d))))
        attrs: dict[str, Any] = {"kernel_shape": list(k), "strides": list(s),
                                 "pads": list(p) * 2}
        if self.groups != 1:
            attrs["group"] = self.groups
        if any(v != 1 for v in d):
            attrs["dilations"] = list(d)
        return net.b.node("Conv", inputs, name=name, **attrs)


class Linear(Layer):
    """A fully connected layer (``Gemm`` with the weight stored (out, in), as PyTorch does):
    ``Linear(out_features, bias=True)``, in features inferred (flatten first)."""

    kind = "fc"

    def __init__(self, out_features: int, bias: bool = True, init: str | None = None,
                 name: str | None = None) -> None:
        super().__init__(name)
        self.out_features, self.bias, self.init = out_features, bias, init

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        if len(net.shape) != 1:
            raise ValueError(f"{net.name}: {name}: Linear takes (features,) per sample, got "
                             f"{list(net.shape)}; put Flatten() before it")
        _count(net, name, "out_features", self.out_features)
        width = net.shape[0]
        inputs = [x, *net.weight_and_bias(name, (self.out_features, width), width, self.bias,
                                          self.init)]
        net.check(name, (self.out_features,))
        return net.b.node("Gemm", inputs, name=name, transB=1)


class Embedding(Layer):
    """Rows of a (num_embeddings, dim) table looked up by int64 indices (``Gather``);
    weights N(0, 1) as PyTorch draws them. The graph's input is then int64: build it with
    ``input_dtype=np.int64``."""

    kind = "embedding"

    def __init__(self, num_embeddings: int, dim: int, name: str | None = None) -> None:
        super().__init__(name)
        self.num_embeddings, self.dim = num_embeddings, dim

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        table = net.b.initializer(f"{name}.weight", net.rng.standard_normal(
            (self.num_embeddings, self.dim)).astype(net.dtype))
        net.check(name, (*net.shape, self.dim))
        return net.b.node("Gather", [table, x], name=name, axis=0)


class BatchNorm(Layer):
    """Batch normalisation over the channel axis (1-D, 2-D, 3-D alike), written for
    inference as PyTorch exports an eval-mode model: the executor's mode decides
    (``executor.train()`` uses batch statistics and updates ``running_mean``/``running_var``,
    the graph's state, not parameters). ``momentum`` is PyTorch's (0.1: ONNX's 0.9)."""

    kind = "bn"

    def __init__(self, momentum: float = 0.1, eps: float = 1e-5, name: str | None = None
                 ) -> None:
        super().__init__(name)
        self.momentum, self.eps = momentum, eps

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        c = net.shape[0]
        stats = [net.full(f"{name}.{p}", v, (c,)) for p, v in
                 (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0))]
        return net.b.node("BatchNormalization", [x, *stats], name=name,
                          momentum=1.0 - self.momentum, epsilon=self.eps)


class LayerNorm(Layer):
    """Layer normalisation over the last ``dims`` axes (scale ones, bias zeros)."""

    kind = "ln"

    def __init__(self, dims: int = 1, eps: float = 1e-5, name: str | None = None) -> None:
        super().__init__(name)
        self.dims, self.eps = dims, eps

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        if not 1 <= self.dims <= len(net.shape):
            raise ValueError(f"{net.name}: {name}: cannot normalise {self.dims} axes of "
                             f"{list(net.shape)}")
        shape = net.shape[-self.dims:]
        return net.b.node("LayerNormalization", [x, net.full(f"{name}.weight", 1.0, shape),
                                                 net.full(f"{name}.bias", 0.0, shape)],
                          name=name, axis=-self.dims, epsilon=self.eps)


# -- activations and shape-keeping layers -------------------------------------------------------
class _Unary(Layer):
    op_type = ""

    def build(self, net: Net, x: str) -> str:
        return net.b.node(self.op_type, [x], name=net.name_of(self))


class Relu(_Unary):
    kind, op_type = "relu", "Relu"


class Tanh(_Unary):
    kind, op_type = "tanh", "Tanh"


class Sigmoid(_Unary):
    kind, op_type = "sigmoid", "Sigmoid"


class Silu(Layer):
    """SiLU (swish), x * sigmoid(x): ``Sigmoid`` then ``Mul``, as PyTorch exports it."""

    kind = "silu"

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        s = net.b.node("Sigmoid", [x], name=f"{name}.sigmoid")
        return net.b.node("Mul", [x, s], name=name)


class Op(Layer):
    """Any operator that keeps the shape, as a layer: a user's custom operator in a model,
    ``Op("Swish", domain="ai.meta.custom", beta=1.0)`` (attributes as keywords)."""

    kind = "op"

    def __init__(self, op_type: str, domain: str = "", name: str | None = None,
                 **attrs: Any) -> None:
        super().__init__(name)
        self.op_type, self.domain, self.attrs = op_type, domain, attrs

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self) if self.name is not None else self._auto(net)
        return net.b.node(self.op_type, [x], name=name, domain=self.domain, **self.attrs)

    def _auto(self, net: Net) -> str:
        prefix, counts = net._scopes[-1]
        stem = self.op_type.lower()
        counts[stem] = counts.get(stem, 0) + 1
        return net.take(f"{prefix}{stem}{counts[stem]}")


class Gelu(Layer):
    """GELU, x * Phi(x) (exact, with erf): a ``Gelu`` node from opset 20, before that the erf
    expression PyTorch exports (the planned executor fuses it back into one kernel)."""

    kind = "gelu"

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        if net.b.opset.get("", DEFAULT_OPSET) >= 20:
            return net.b.node("Gelu", [x], name=name)
        dtype = net.dtype

        def const(suffix: str, value: float) -> str:
            return net.b.initializer(f"{name}.{suffix}", np.asarray(value, dtype))
        b = net.b
        h = b.node("Div", [x, const("sqrt2", math.sqrt(2.0))], name=f"{name}.div")
        h = b.node("Erf", [h], name=f"{name}.erf")
        h = b.node("Add", [h, const("one", 1.0)], name=f"{name}.add")
        h = b.node("Mul", [x, h], name=f"{name}.mul")
        return b.node("Mul", [h, const("half", 0.5)], name=name)


class Dropout(Layer):
    """Drops each element with probability ``p`` in training (scaling the rest by
    1/(1-p)); the identity in inference. The executor's mode decides."""

    kind = "dropout"

    def __init__(self, p: float = 0.5, name: str | None = None) -> None:
        super().__init__(name)
        if not 0 <= p < 1:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = p

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        ratio = net.b.initializer(f"{name}.ratio", np.asarray(self.p, net.dtype))
        return net.b.node("Dropout", [x, ratio], name=name)


class Flatten(Layer):
    """(C, *spatial) per sample -> (C * prod(spatial),): ``Flatten`` at axis 1."""

    kind = "flatten"

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self) if self.name is not None else self._auto(net)
        net.check(name, (math.prod(net.shape),))
        return net.b.node("Flatten", [x], name=name, axis=1)

    @staticmethod
    def _auto(net: Net) -> str:
        """``flatten`` for the first (models flatten once), then ``flatten2``, ..."""
        prefix, counts = net._scopes[-1]
        counts["flatten"] = counts.get("flatten", 0) + 1
        n = counts["flatten"]
        return net.take(f"{prefix}flatten" if n == 1 else f"{prefix}flatten{n}")


class _Pool(Layer):
    kind = "pool"
    op_type = ""

    def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None
                 = None, padding: int | Sequence[int] = 0, name: str | None = None) -> None:
        super().__init__(name)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def extra(self, padded: bool) -> dict[str, Any]:
        return {}

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        c, spatial = net.shape[0], net.shape[1:]
        n = len(spatial)
        k = _tuple(self.kernel_size, n, f"{name} kernel_size")
        s = _tuple(self.stride if self.stride is not None else k, n, f"{name} stride")
        p = _tuple(self.padding, n, f"{name} padding")
        for what, values in (("kernel_size", k), ("stride", s)):
            for v in values:
                _count(net, name, what, v)
        net.check(name, (c, *((size + 2 * pad - kk) // st + 1
                              for size, kk, st, pad in zip(spatial, k, s, p))))
        attrs: dict[str, Any] = {"kernel_shape": list(k), "strides": list(s)}
        if any(p):
            attrs["pads"] = list(p) * 2
        return net.b.node(self.op_type, [x], name=name, **attrs, **self.extra(any(p)))


class MaxPool(_Pool):
    """Max pooling: ``MaxPool(kernel_size, stride=kernel_size, padding=0)``."""

    op_type = "MaxPool"


class AvgPool(_Pool):
    """Average pooling; padded windows divide by the whole window, as PyTorch's default
    (``count_include_pad=True``) does."""

    op_type = "AveragePool"

    def extra(self, padded: bool) -> dict[str, Any]:
        return {"count_include_pad": 1} if padded else {}


class GlobalAvgPool(Layer):
    """The mean over every spatial axis: (C, *spatial) -> (C, 1, ...) (Flatten after it)."""

    kind = "pool"

    def build(self, net: Net, x: str) -> str:
        name = net.name_of(self)
        net.check(name, (net.shape[0], *(1,) * (len(net.shape) - 1)))
        return net.b.node("GlobalAveragePool", [x], name=name)


__all__ = ["AvgPool", "BatchNorm", "Conv", "Dropout", "Embedding", "Flatten", "Gelu",
           "GlobalAvgPool", "Layer", "LayerNorm", "Linear", "MaxPool", "Net", "Op", "Relu",
           "Residual", "Sequential", "Sigmoid", "Silu", "Tanh"]
