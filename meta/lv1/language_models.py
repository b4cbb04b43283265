"""Language-model builders: a GPT-style decoder and an LSTM, both next-token predictors.

The contract differs from the classifiers' in the shapes only: ``input`` is (N, T) int64 token
ids, ``labels`` (N, T) int64 next tokens (``IGNORE_INDEX`` marks padding the loss skips), and
``logits`` is (N, vocab, T) -- the class axis second, as ONNX's ``SoftmaxCrossEntropyLoss``
reads it, so the trainer's ``logits.argmax(1)`` is the predicted token at every position. The
loss is the mean cross-entropy per (unpadded) token, in nats.

``gpt`` follows nanoGPT (Radford et al. 2019): token and learned position embeddings,
pre-LayerNorm blocks of causal multi-head attention and a GELU MLP, a final LayerNorm and an
output head tied to the token embedding: the head reads ``wte`` through a Transpose node, so
it is one parameter whose gradient sums both uses. The causal mask is an additive constant
(0 on and below the diagonal, -1e9 above) held by a Constant node, so no optimizer sees it.
Weights are normal(0, 0.02), the residual projections scaled by 1/sqrt(2 * layers), as GPT-2.

>>> from meta.lv1 import ReferenceExecutor
>>> g = gpt((16,), classes=11, layers=1, heads=2, width=8)
>>> ids = np.zeros((2, 16), np.int64)
>>> ReferenceExecutor(g).inference({"input": ids}, ["logits"])["logits"].shape
(2, 11, 16)
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np

from meta.common.component import Option
from meta.lv1.builder import GraphBuilder
from meta.lv1.graph import Graph
from meta.lv1.models import MODELS

IGNORE_INDEX = -100  # PyTorch's default: a target the loss skips (padding)
OPSET = 20  # Gelu


def _context(input_shape: Sequence[int], what: str) -> int:
    if len(input_shape) != 1:
        raise ValueError(f"{what}: examples must be 1-D blocks of token ids, got examples of "
                         f"shape {list(input_shape)}")
    return int(input_shape[0])


def _head(b: GraphBuilder, h: str, vocab: int, context: int, labels: str,
          dtype: Any) -> None:
    """(N, T, vocab) scores -> ``logits`` (N, vocab, T) and the per-token ``loss``."""
    logits = b.node("Transpose", [h], name="logits", perm=[0, 2, 1])
    loss = b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss", reduction="mean",
                  ignore_index=IGNORE_INDEX)
    b.output(logits, dtype, ("N", vocab, context))
    b.output(loss, dtype, ())


def gpt(input_shape: Sequence[int] = (64,), classes: int = 65, seed: int = 0,
        dtype: Any = np.float32, layers: int = 2, heads: int = 4, width: int = 128,
        dropout: float = 0.0, vocab_size: int = 0, vocab: int | None = None) -> Graph:
    """A GPT-style decoder over blocks of ``input_shape[0]`` tokens (the context) and a
    vocabulary of ``vocab_size`` tokens (0: ``classes``, one more than the largest target;
    ``vocab``: its former name, as the text dataset's ``vocab_size`` now names it too)."""
    context, vocab = _context(input_shape, "gpt"), _vocab(vocab_size, vocab, "gpt") or classes
    if width % heads:
        raise ValueError(f"gpt: width {width} is not a multiple of heads {heads}")
    fdtype = np.float32 if np.issubdtype(np.dtype(dtype), np.integer) else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    b = GraphBuilder("gpt", OPSET)
    head_dim = width // heads

    def normal(name: str, shape: tuple[int, ...], std: float = 0.02) -> str:
        return b.initializer(name, (rng.standard_normal(shape) * std).astype(fdtype))

    def const(name: str, value: Any, dt: Any = np.int64) -> str:
        return b.initializer(name, np.asarray(value, dt))

    def linear(name: str, x: str, fan_in: int, fan_out: int, std: float = 0.02) -> str:
        w = normal(f"{name}.weight", (fan_in, fan_out), std)
        y = b.node("MatMul", [x, w], name=f"{name}.matmul")
        bias = b.initializer(f"{name}.bias", np.zeros(fan_out, fdtype))
        return b.node("Add", [y, bias], name=name)

    def layernorm(name: str, x: str) -> str:
        return b.node("LayerNormalization",
                      [x, b.initializer(f"{name}.weight", np.ones(width, fdtype)),
                       b.initializer(f"{name}.bias", np.zeros(width, fdtype))],
                      name=name, axis=-1, epsilon=1e-5)

    def drop(name: str, x: str) -> str:
        if not dropout:
            return x
        return b.node("Dropout", [x, b.initializer(f"{name}.ratio",
                                                   np.asarray(dropout, fdtype))], name=name)

    ids = b.input("input", np.int64, ("N", context))
    labels = b.input("labels", np.int64, ("N", context))
    wte = normal("wte", (vocab, width))
    x = b.node("Gather", [wte, ids], name="tok_emb")
    x = b.node("Add", [x, normal("wpe", (context, width))], name="emb")
    x = drop("emb.dropout", x)
    mask = np.triu(np.full((context, context), -1e9, fdtype), 1)
    mask_out = b.node("Constant", [], name="causal_mask", value=mask)
    scale = const("attn.scale", 1.0 / math.sqrt(head_dim), fdtype)
    split_heads = const("attn.split_heads", [0, 0, heads, head_dim])
    merge_heads = const("attn.merge_heads", [0, 0, width])
    proj_std = 0.02 / math.sqrt(2 * layers)
    for i in range(layers):
        p = f"h{i}"
        h = layernorm(f"{p}.ln1", x)
        q, k, v = (b.node("Reshape", [linear(f"{p}.attn.{n}", h, width, width), split_heads],
                          name=f"{p}.attn.{n}.heads") for n in "qkv")
        q = b.node("Transpose", [q], name=f"{p}.attn.q.t", perm=[0, 2, 1, 3])  # N H T d
        k = b.node("Transpose", [k], name=f"{p}.attn.k.t", perm=[0, 2, 3, 1])  # N H d T
        v = b.node("Transpose", [v], name=f"{p}.attn.v.t", perm=[0, 2, 1, 3])  # N H T d
        s = b.node("MatMul", [q, k], name=f"{p}.attn.scores")
        s = b.node("Mul", [s, scale], name=f"{p}.attn.scaled")
        s = b.node("Add", [s, mask_out], name=f"{p}.attn.masked")
        a = b.node("Softmax", [s], name=f"{p}.attn.softmax", axis=-1)
        a = drop(f"{p}.attn.dropout", a)
        y = b.node("MatMul", [a, v], name=f"{p}.attn.mix")
        y = b.node("Transpose", [y], name=f"{p}.attn.y.t", perm=[0, 2, 1, 3])
        y = b.node("Reshape", [y, merge_heads], name=f"{p}.attn.merged")
        y = drop(f"{p}.attn.resid_dropout", linear(f"{p}.attn.proj", y, width, width, proj_std))
        x = b.node("Add", [x, y], name=f"{p}.attn.residual")
        h = layernorm(f"{p}.ln2", x)
        h = b.node("Gelu", [linear(f"{p}.mlp.fc", h, width, 4 * width)], name=f"{p}.mlp.gelu")
        h = drop(f"{p}.mlp.dropout", linear(f"{p}.mlp.proj", h, 4 * width, width, proj_std))
        x = b.node("Add", [x, h], name=f"{p}.mlp.residual")
    x = layernorm("ln_f", x)
    head = b.node("Transpose", [wte], name="lm_head.tied", perm=[1, 0])  # one parameter
    _head(b, b.node("MatMul", [x, head], name="lm_head"), vocab, context, labels, fdtype)
    return b.build()


def lstm_lm(input_shape: Sequence[int] = (64,), classes: int = 65, seed: int = 0,
            dtype: Any = np.float32, hidden: int = 256, embedding: int = 64,
            vocab_size: int = 0, vocab: int | None = None) -> Graph:
    """An LSTM language model: token embedding, one ONNX LSTM over the block, and a linear
    head at every step. Weights uniform in +-1/sqrt(hidden) (PyTorch's nn.LSTM), the forget
    gate's bias 1, the embedding normal(0, 1) as nn.Embedding. ``vocab_size`` as ``gpt``'s."""
    context = _context(input_shape, "lstm_lm")
    vocab = _vocab(vocab_size, vocab, "lstm_lm") or classes
    fdtype = np.float32 if np.issubdtype(np.dtype(dtype), np.integer) else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    bound = 1 / math.sqrt(hidden)
    b = GraphBuilder("lstm_lm", OPSET)

    def uniform(name: str, shape: tuple[int, ...]) -> str:
        return b.initializer(name, rng.uniform(-bound, bound, shape).astype(fdtype))

    ids = b.input("input", np.int64, ("N", context))
    labels = b.input("labels", np.int64, ("N", context))
    emb = b.initializer("embedding", rng.standard_normal((vocab, embedding)).astype(fdtype))
    x = b.node("Gather", [emb, ids], name="tok_emb")  # N T E
    x = b.node("Transpose", [x], name="time_major", perm=[1, 0, 2])  # T N E
    bias = rng.uniform(-bound, bound, (1, 8 * hidden)).astype(fdtype)
    bias[0, 2 * hidden:3 * hidden] += 1.0  # ONNX gate order i, o, f, c: the forget gate
    y = b.node("LSTM", [x, uniform("lstm.W", (1, 4 * hidden, embedding)),
                        uniform("lstm.R", (1, 4 * hidden, hidden)),
                        b.initializer("lstm.B", bias)],
               name="lstm", outputs=["lstm.Y", "lstm.Y_h", "lstm.Y_c"], hidden_size=hidden)[0]
    y = b.node("Squeeze", [y, b.initializer("lstm.dirs", np.array([1]))], name="lstm.y")
    y = b.node("Transpose", [y], name="batch_major", perm=[1, 0, 2])  # N T H
    w = uniform("head.weight", (hidden, vocab))
    h = b.node("Add", [b.node("MatMul", [y, w], name="head.matmul"),
                       b.initializer("head.bias", np.zeros(vocab, fdtype))], name="head")
    _head(b, h, vocab, context, labels, fdtype)
    return b.build()


def _vocab(vocab_size: int, vocab: int | None, model: str) -> int:
    """``vocab_size``, or ``vocab`` (its former name) with a DeprecationWarning."""
    if vocab is None:
        return vocab_size
    warnings.warn(f"{model}: 'vocab' is now 'vocab_size' (the text dataset's name for it); "
                  f"the old name will be removed", DeprecationWarning, stacklevel=3)
    return vocab


_VOCAB = Option(0, "vocabulary size (0: one more than the largest target token)", low=0,
                aliases=("vocab",))
MODELS.add("gpt", gpt, {
    "layers": Option(2, "transformer blocks", low=1),
    "heads": Option(4, "attention heads per block (width must be a multiple)", low=1),
    "width": Option(128, "embedding width", low=1),
    "dropout": Option(0.0, "dropout after the embeddings, attention and MLP", low=0.0,
                      high=0.99),
    "vocab_size": _VOCAB,
}, doc="GPT-style decoder: token ids (N, context) -> next-token logits (N, vocab, context)")
MODELS.add("lstm_lm", lstm_lm, {
    "hidden": Option(256, "LSTM hidden units", low=1),
    "embedding": Option(64, "token embedding width", low=1),
    "vocab_size": _VOCAB,
}, doc="LSTM language model: token ids (N, context) -> next-token logits (N, vocab, context)")
