"""The PyTorch executor's table: ONNX operator -> a function of torch tensors (imports torch).

Only ``meta.lv1.torch_executor`` imports this module, when a ``TorchExecutor`` is built, so
``import meta`` never loads PyTorch. An entry is ``KERNELS[op_type] = Kernel(fn, since,
takes)``: ``fn(call, *inputs)`` returns the node's outputs (a tensor or a tuple), ``since`` is
the lowest opset implementation it follows (an older one, such as Softmax-1's flattening, runs
on the host through meta's own operator), and ``takes(op, node)`` refuses a configuration it
does not cover (MaxPool's Indices output, a Dropout ``seed``). At run time a kernel may return
``NotImplemented`` for inputs it leaves to meta (integer division, a 1-sample batch norm).
``call`` carries the meta operator (``call.op``: the node's attributes with their ONNX
defaults), the executor's mode and whether the node writes the graph's state.

Semantics follow meta's numpy operators (ops/): the same padding geometry (``ops._window``),
ReLU/clip/max-pool gradients at ties, BatchNormalization's state update with the unbiased
variance, and outputs in the input's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from meta.ops import _window

Tensor = torch.Tensor


@dataclass
class Kernel:
    fn: Callable[..., Any]
    since: int = 1  # the lowest registered opset implementation this kernel follows
    takes: Callable[[Any, Any], bool] | None = None  # (op, node) -> whether it runs here


KERNELS: dict[str, Kernel] = {}


def kernel(*op_types: str, since: int = 1, takes: Callable[[Any, Any], bool] | None = None
           ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op_type in op_types:
            KERNELS[op_type] = Kernel(fn, since, takes)
        return fn

    return decorate


def outputs(node: Any) -> int:
    """How many outputs a node asks for (trailing empty names do not count)."""
    names = list(node.outputs)
    while names and not names[-1]:
        names.pop()
    return len(names)


def ints(t: Any) -> list[int]:
    """A shape-like tensor (or array) as Python ints."""
    return [int(v) for v in (t.tolist() if isinstance(t, Tensor) else np.asarray(t).tolist())]


def floating(*ts: Any) -> bool:
    return all(t is None or (isinstance(t, Tensor) and t.is_floating_point()) for t in ts)


# -- elementwise ---------------------------------------------------------------------------

_BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul}


@kernel("Add", "Sub", "Mul", since=7)
def binary(c, a, b):
    if a.dtype != b.dtype:
        return NotImplemented  # not valid ONNX; meta's numpy promotion decides
    return _BINARY[c.node.op_type](a, b)


@kernel("Div", since=7)
def div(c, a, b):
    if not floating(a, b) or a.dtype != b.dtype:
        return NotImplemented  # integer division truncates toward 0: meta's operator
    return a / b


@kernel("Pow", since=7)
def power(c, a, b):
    if not floating(a):
        return NotImplemented
    y = torch.pow(a, b)
    return y if y.dtype == a.dtype else y.to(a.dtype)


_UNARY = {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Neg": torch.neg,
          "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt, "Abs": torch.abs,
          "Erf": torch.erf, "Reciprocal": torch.reciprocal, "Softplus": F.softplus}


@kernel(*_UNARY)
def unary(c, x):
    if not floating(x) and c.node.op_type not in ("Relu", "Neg", "Abs"):
        return NotImplemented
    return _UNARY[c.node.op_type](x)


@kernel("LeakyRelu")
def leaky_relu(c, x):
    return F.leaky_relu(x, c.op.slope)  # alpha as the float32 a file stores, as meta's op


@kernel("Elu")
def elu(c, x):
    return F.elu(x, float(c.op.alpha))


@kernel("Gelu", since=20)
def gelu(c, x):
    return F.gelu(x, approximate=str(c.op.approximate))


@kernel("Clip", since=11)
def clip(c, x, lo=None, hi=None):
    if lo is None and hi is None:
        return x
    return torch.clamp(x, lo, hi)


@kernel("Identity")
def identity(c, x):
    return x


# -- softmax and losses --------------------------------------------------------------------

def _softmax(c, x, fn):
    axis = int(c.op.axis)
    if c.op.since >= 13:
        return fn(x, dim=axis)
    axis = axis + x.ndim if axis < 0 else axis  # opsets 1-12: coerced to 2-D at axis
    flat = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return fn(flat, dim=1).reshape(x.shape)


@kernel("Softmax")
def softmax(c, x):
    return _softmax(c, x, F.softmax)


@kernel("LogSoftmax")
def log_softmax(c, x):
    return _softmax(c, x, F.log_softmax)


def _nll(c, logp, labels, weights):
    if weights is not None and weights.requires_grad:
        return NotImplemented  # torch's loss has no gradient for class weights; meta's has
    ignore = -100 if c.op.ignore_index is None else int(c.op.ignore_index)
    return F.nll_loss(logp, labels.long(), weight=weights, ignore_index=ignore,
                      reduction=str(c.op.reduction))


@kernel("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy(c, scores, labels, weights=None):
    logp = F.log_softmax(scores, dim=1)
    loss = _nll(c, logp, labels, weights)
    return NotImplemented if loss is NotImplemented else (loss, logp)


@kernel("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood(c, logp, labels, weights=None):
    return _nll(c, logp, labels, weights)


# -- dense and convolution ---------------------------------------------------------------

@kernel("Gemm", since=7)
def gemm(c, a, b, bias=None):
    op = c.op
    alpha, beta = float(op.alpha), float(op.beta)
    a = a.t() if op.transA else a
    if op.transB and alpha == 1.0 and beta == 1.0 and (bias is None or bias.ndim == 1):
        return F.linear(a, b, bias)  # one fused call: the MLP and LeNet layers
    y = a @ (b.t() if op.transB else b)
    if alpha != 1.0:
        y = y * alpha
    if bias is not None and beta != 0.0:
        y = y + (bias if beta == 1.0 else bias * beta)
    return y


@kernel("MatMul")
def matmul(c, a, b):
    return torch.matmul(a, b)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _pad(x: Tensor, win: _window.Window, value: float = 0.0) -> Tensor:
    """``x`` padded as meta pads it: begin, end and ceil_mode's extra room."""
    widths: list[int] = []
    for b, e, extra in reversed(list(zip(win.pads_begin, win.pads_end, win.extra_end))):
        widths += [b, e + extra]
    return F.pad(x, widths, value=value) if any(widths) else x


@kernel("Conv")
def conv(c, x, w, bias=None):
    rank = x.ndim - 2
    if rank not in _CONV or not floating(x, w):
        return NotImplemented
    op = c.op
    kernel_shape = op.kernel_shape or w.shape[2:]
    win = _window.geometry("Conv", x.shape[2:], kernel_shape, op.strides, op.dilations,
                           op.pads, op.auto_pad)
    symmetric = win.pads_begin == win.pads_end
    x = x if symmetric else _pad(x, win)
    return _CONV[rank](x, w, bias, stride=win.strides,
                       padding=win.pads_begin if symmetric else 0, dilation=win.dilations,
                       groups=int(op.group))


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


@kernel("MaxPool", takes=lambda op, node: outputs(node) == 1)
def max_pool(c, x):
    rank = x.ndim - 2
    if rank not in _MAX_POOL or not floating(x) or c.op.kernel_shape is None:
        return NotImplemented
    op = c.op
    win = _window.geometry("MaxPool", x.shape[2:], op.kernel_shape, op.strides, op.dilations,
                           op.pads, op.auto_pad, op.ceil_mode)
    # Padding with -inf, as meta does, covers asymmetric pads and ceil_mode alike; the first
    # maximum of a window wins ties, as in meta's MaxPool.
    return _MAX_POOL[rank](_pad(x, win, -math.inf), win.kernel, win.strides, 0, win.dilations)


@kernel("AveragePool")
def average_pool(c, x):
    rank = x.ndim - 2
    op = c.op
    if rank not in _AVG_POOL or not floating(x) or op.kernel_shape is None \
            or any(d != 1 for d in (op.dilations or ())):
        return NotImplemented
    win = _window.geometry("AveragePool", x.shape[2:], op.kernel_shape, op.strides, None,
                           op.pads, op.auto_pad, op.ceil_mode)
    pool = _AVG_POOL[rank]
    if not any(win.pads_begin + win.pads_end + win.extra_end):
        return pool(x, win.kernel, win.strides)
    # meta's divisor: the input elements in the window, plus explicit padding when
    # count_include_pad, never ceil_mode's extra room; a pooled mask counts them.
    counted = torch.zeros(win.padded_shape, dtype=x.dtype, device=x.device)
    if op.count_include_pad:
        inside = [slice(0, i + b + e) for i, b, e in
                  zip(win.in_shape, win.pads_begin, win.pads_end)]
    else:
        inside = [slice(b, b + i) for b, i in zip(win.pads_begin, win.in_shape)]
    counted[tuple(inside)] = 1
    divisor = pool(counted[None], win.kernel, win.strides)[0]
    return pool(_pad(x, win), win.kernel, win.strides) / divisor


@kernel("GlobalAveragePool")
def global_average_pool(c, x):
    return x.mean(dim=tuple(range(2, x.ndim)), keepdim=True)


# -- normalization and dropout -------------------------------------------------------------

def _per_channel(op, node) -> bool:
    return getattr(op, "spatial", 1) == 1  # spatial=0 (opsets 6-8): meta's operator


@kernel("BatchNormalization", since=6, takes=_per_channel)
def batch_normalization(c, x, scale, bias, mean, var):
    op = c.op
    training = c.mode(bool(op.training_mode))
    count = x.numel() // x.shape[1] if x.ndim >= 2 else 0
    eps, m = float(op.epsilon), float(op.momentum)
    n_out = outputs(c.node)
    if not floating(x) or x.ndim < 2 or (training and count < 2):
        return NotImplemented
    if not training:
        y = F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)
        return (y, mean, var, mean, var)[:max(n_out, 1)]
    if n_out <= 1 and not c.writes_state:
        return F.batch_norm(x, None, None, scale, bias, True, 0.0, eps)
    if n_out <= 1 and c.writes_state == (3, 4) and mean.is_contiguous() and var.is_contiguous():
        # The running statistics updated in place (the graph's own arrays on the CPU), as
        # PyTorch updates its buffers: momentum 1 - m, the unbiased batch variance.
        return F.batch_norm(x, mean, var, scale, bias, True, 1.0 - m, eps)
    axes = (0, *range(2, x.ndim))
    shape = (1, -1, *(1,) * (x.ndim - 2))
    batch_mean = x.mean(dim=axes)
    batch_var = x.var(dim=axes, unbiased=False)
    y = (x - batch_mean.reshape(shape)) * torch.rsqrt(batch_var.reshape(shape) + eps)
    y = y * scale.reshape(shape) + bias.reshape(shape)
    # the spec's running outputs keep the biased variance; computed before the state moves
    running_mean = mean * m + batch_mean * (1 - m)
    running_var = var * m + batch_var * (1 - m)
    if c.writes_state:
        with torch.no_grad():
            unbiased = batch_var * (count / (count - 1))
            for index, stat, new in ((3, mean, batch_mean), (4, var, unbiased)):
                if index in c.writes_state:
                    stat.copy_(stat * m + new.detach() * (1 - m))
    return (y, running_mean, running_var, batch_mean, batch_var)[:max(n_out, 1)]


def _dropout_takes(op, node) -> bool:
    return getattr(op, "seed", None) is None  # a seeded mask is onnx.reference's: meta's op


@kernel("Dropout", since=6, takes=_dropout_takes)
def dropout(c, x, ratio=None, training_mode=None):
    op = c.op
    if op.since >= 12:
        ratio = 0.5 if ratio is None else float(ratio)
        as_written = bool(training_mode) if training_mode is not None else False
    else:
        ratio = float(np.float32(op.ratio))  # an attribute: float32, as meta's operator
        as_written = op.as_written()
    training = c.mode(as_written)
    mask_dtype = x.dtype if op.since < 10 else torch.bool
    if not training or ratio == 0:
        if outputs(c.node) < 2:
            return x
        return x, torch.ones(x.shape, dtype=mask_dtype, device=x.device)
    if not 0 <= ratio < 1:
        return NotImplemented  # meta's operator names the bad ratio
    keep = torch.rand(x.shape, device=x.device) >= ratio
    y = x * keep * (1.0 / (1.0 - ratio))
    return y.to(x.dtype), keep.to(mask_dtype)


# -- shapes and indexing -----------------------------------------------------------------

@kernel("Flatten")
def flatten(c, x):
    axis = int(c.op.axis)
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@kernel("Reshape", since=5)
def reshape(c, x, shape):
    dims = ints(shape)
    if not c.op.allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@kernel("Transpose")
def transpose(c, x):
    perm = c.op.perm
    return x.permute(*(perm if perm is not None else reversed(range(x.ndim))))


@kernel("Concat", since=4)
def concat(c, *xs):
    xs = [x for x in xs if x is not None]
    if len({x.dtype for x in xs}) != 1:
        return NotImplemented
    return torch.cat(xs, dim=int(c.op.axis))


@kernel("Gather")
def gather(c, x, indices):
    axis = int(c.op.axis)
    axis = axis + x.ndim if axis < 0 else axis
    idx = indices.long()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    picked = torch.index_select(x, axis, idx.reshape(-1))
    return picked.reshape((*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]))


@kernel("Shape")
def shape(c, x):
    rank = len(x.shape)
    start = int(getattr(c.op, "start", 0) or 0)
    end = getattr(c.op, "end", None)
    end = rank if end is None else int(end)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return torch.tensor(list(x.shape[start:end]), dtype=torch.int64, device=c.device)


def _axes(axes: Any, rank: int) -> list[int]:
    return sorted(a + rank if a < 0 else a for a in ints(axes))


@kernel("Unsqueeze", since=13)
def unsqueeze(c, x, axes):
    rank = x.ndim + len(ints(axes))
    y = x
    for a in _axes(axes, rank):
        y = y.unsqueeze(a)
    return y


@kernel("Squeeze", since=13)
def squeeze(c, x, axes=None):
    if axes is None:
        return x.reshape([n for n in x.shape if n != 1])
    drop = set(_axes(axes, x.ndim))
    if any(x.shape[a] != 1 for a in drop):
        return NotImplemented  # meta's operator names the axis
    return x.reshape([n for i, n in enumerate(x.shape) if i not in drop])
