"""The operator interface every Level 0 operator implements, in Python or C++."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import numpy as np

Array = np.ndarray


class Context:
    """What forward keeps for backward (PyTorch's ``ctx``, Chainer's ``retain_inputs``).

    Forward stores only what backward needs: ``ctx.save(y=y)``, read back as ``ctx.y``.
    ``ctx.needs(i)`` tells backward whether input ``i`` wants a gradient at all (the executor
    says no for data inputs), so it can skip that work. ``ctx.training`` is the executor's mode
    (Chainer's ``config.train``, PyTorch's ``module.train()``): ``True`` or ``False`` overrides
    what the node itself says (BatchNormalization's ``training_mode``, Dropout's input), ``None``
    runs the node as written.
    """

    def __init__(self, needs_input_grad: Sequence[bool] | None = None,
                 training: bool | None = None) -> None:
        self.needs_input_grad = needs_input_grad
        self.training = training

    def mode(self, as_written: bool) -> bool:
        """Whether the op runs in training mode: the executor's mode, else the node's own."""
        return as_written if self.training is None else self.training

    def save(self, **tensors: Any) -> None:
        """Keep ``tensors`` for backward, read back as attributes (``ctx.save(y=y)``; ``ctx.y``).

        >>> ctx = Context()
        >>> ctx.save(y=2.0)
        >>> ctx.y
        2.0
        """
        self.__dict__.update(tensors)

    def needs(self, index: int) -> bool:
        """Whether input ``index`` wants a gradient (all do unless the executor said which)."""
        grads = self.needs_input_grad
        return grads is None or (index < len(grads) and grads[index])


class InferenceContext(Context):
    """A context that keeps nothing: inference holds no activations for backward."""

    def save(self, **tensors: Any) -> None:
        """Keep nothing: no backward follows an inference forward."""


class Operator:
    """Base class of all operators.

    Subclasses declare their ONNX attributes with spec defaults in ``attributes``; an instance is
    one node's configuration (``Gemm(transB=1)``), read as ``self.transB``. They implement:

    * ``forward(ctx, *inputs)`` returning an array or a tuple of arrays (one per output);
    * ``backward(ctx, *grad_outputs)`` returning one entry per input: the gradient, or ``None``
      for inputs that have none (indices, shapes) or that are absent (optional inputs not given
      may be returned as trailing ``None``). A grad_output is ``None``
      when nothing downstream needs that output.

    What a graph's initializers are follows from two declarations (see
    ``meta.lv1.roles``): ``no_grad_inputs`` (no gradient: indices, shapes, Dropout's ratio)
    and ``constant_inputs`` (differentiable, but settings rather than learned values: Clip's
    bounds) — an initializer feeding only such inputs is a constant — and ``state_inputs``, the
    inputs the op updates in training mode (BatchNorm's running statistics) through
    ``update_state``. ``learnable_inputs`` names the inputs that hold learned values (Conv's W
    and B, Gemm's B and C, an embedding Gather's data, a normalization's scale and bias): an
    initializer reaching one, directly or through ops that only transform initializers (a
    Transpose, a Reshape, a Concat), is a parameter. ``None`` (the default) means every
    differentiable input that is not a setting; ``()`` means none (Div's divisor).

    Example::

        class Square(Operator):
            op_type = "Square"
            def forward(self, ctx, x):
                ctx.save(x=x)
                return x * x
            def backward(self, ctx, dy):
                return (2 * ctx.x * dy,)
    """

    op_type: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    since: ClassVar[int] = 1
    backend: ClassVar[str] = "numpy"
    attributes: ClassVar[dict[str, Any]] = {}
    no_grad_inputs: ClassVar[tuple[int, ...]] = ()
    constant_inputs: ClassVar[tuple[int, ...]] = ()
    state_inputs: ClassVar[tuple[int, ...]] = ()
    learnable_inputs: ClassVar[tuple[int, ...] | None] = None
    communicates: ClassVar[bool] = False
    """Whether the operator's work is a collective over ranks (tensor parallelism's
    allreduce): the planned executor still runs it as a Python step, but places it as
    ``"communication"``, so its wait for the other ranks is not reported as Python time."""

    def __init__(self, **attrs: Any) -> None:
        unknown = sorted(set(attrs) - set(self.attributes))
        if unknown:
            known = ", ".join(sorted(self.attributes)) or "none"
            raise TypeError(
                f"{self.op_type}: unknown attribute(s) {', '.join(unknown)} (known: {known})"
            )
        for name, default in self.attributes.items():
            setattr(self, name, attrs.get(name, default))

    @property
    def attrs(self) -> dict[str, Any]:
        """The node's attributes, each given value or its ONNX default.

        >>> from meta.ops.leaky_relu import LeakyRelu
        >>> LeakyRelu(alpha=0.1).attrs
        {'alpha': 0.1}
        """
        return {name: getattr(self, name) for name in self.attributes}

    def forward(self, ctx: Context, *inputs: Array | None) -> Array | tuple[Array, ...]:
        """The node's outputs from its inputs (ONNX semantics): an array, or a tuple of one
        array per output. Keeps in ``ctx`` (``ctx.save``) only what ``backward`` needs; an
        optional input not given is ``None``. Executors call ``apply``, which always returns a
        tuple."""
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, ctx: Context, *grad_outputs: Array | None) -> Sequence[Array | None]:
        """One entry per input given one gradient per output (``None`` for an output nothing
        downstream uses): the gradient with the input's shape, or ``None`` for an input that
        has none (indices, shapes) or that was not given. The base class raises: the operator
        is not differentiable."""
        raise NotImplementedError(f"{self.op_type} is not differentiable")

    def update_state(self, ctx: Context, *state: Array) -> tuple[Array, ...] | None:
        """The new values of the ``state_inputs`` (given their current values, in order) after
        a forward that ran in training mode; ``None`` when that forward changed nothing."""
        return None

    @classmethod
    def inference_form(cls, attrs: dict[str, Any], inputs: list[str],
                       outputs: list[str]) -> tuple[dict[str, Any], list[str], list[str]]:
        """How a node of this op is written for inference (ONNX export for deployment): the
        same by default; BatchNormalization drops ``training_mode`` and its running outputs."""
        return attrs, inputs, outputs

    def apply(self, ctx: Context, *inputs: Array | None) -> tuple[Array, ...]:
        """Run forward and always return a tuple of outputs.

        >>> from meta.ops.relu import Relu
        >>> Relu().apply(Context(), np.array([-1.0, 2.0]))
        (array([0., 2.]),)
        """
        if not isinstance(ctx, InferenceContext):  # what check_backward compares against
            ctx.input_shapes = tuple(getattr(x, "shape", None) for x in inputs)  # arrays
        out = self.forward(ctx, *inputs)
        return out if isinstance(out, tuple) else (out,)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        return f"{type(self).__name__}({args})"


class BackwardError(TypeError):
    """An operator's backward returned something other than one gradient (or None) per
    input, each of its input's shape (names the node, the operator and what it returned)."""


def _shown(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join("None" if g is None else f"shape {getattr(g, 'shape', '?')}"
                          for g in value)
        return f"{len(value)} value(s) ({inner})" if value else repr(value)
    return f"a {type(value).__name__}"


def check_backward(grads: Any, ctx: Context, node: Any) -> Sequence[Array | None]:
    """``grads``, an operator's backward result for ``node`` (anything with ``inputs``,
    ``op_type`` and ``describe()``), if it is one gradient or None per input (trailing
    entries past the inputs may be None; inputs that need no gradient may be left out), each
    of its input's shape; else a BackwardError naming the node and what backward returned.

    >>> ctx = Context([True]); ctx.input_shapes = ((2,),)
    >>> class Node: inputs, op_type = ["x"], "Square"; describe = lambda self: "node 'sq'"
    >>> check_backward(None, ctx, Node())
    Traceback (most recent call last):
    ...
    meta.lv0.operator.BackwardError: node 'sq': the backward of operator Square returned None; \
it must return a sequence with one gradient (or None) per input: 1 input(s) here ('x')
    """
    inputs = list(node.inputs)
    problem = ""
    if not isinstance(grads, (tuple, list)):
        problem = "a sequence with one gradient (or None) per input"
    elif any(g is not None for g in grads[len(inputs):]):
        problem = "no more gradients than inputs (trailing None allowed)"
    elif any(ctx.needs(i) for i in range(len(grads), len(inputs))):
        problem = "a gradient (or None) for every input that needs one"
    if problem:
        names = ", ".join(repr(x) for x in inputs)
        raise BackwardError(f"{node.describe()}: the backward of operator {node.op_type} "
                            f"returned {_shown(grads)}; it must return {problem}: "
                            f"{len(inputs)} input(s) here ({names})")
    shapes = getattr(ctx, "input_shapes", None)
    if shapes is not None:
        for i, (g, shape) in enumerate(zip(grads, shapes)):
            got = getattr(g, "shape", () if np.isscalar(g) else None)
            if got is not None and shape is not None and ctx.needs(i) and got != shape:
                raise BackwardError(f"{node.describe()}: the backward of operator "
                                    f"{node.op_type} returned a gradient of shape {got} for "
                                    f"input {i} ({inputs[i]!r}) of shape {shape}; each "
                                    f"gradient must have its input's shape")
    return grads
