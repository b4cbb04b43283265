"""Networks written in PyTorch for the benchmarks, each also as meta runs it: the module is
exported with PyTorch's TorchScript exporter and loaded with ``meta.lv1.from_onnx``, so meta
and PyTorch train the same network from the same weights.

- ``mobilenet_v2``: MobileNetV2 for 32x32 images (width 0.5: inverted residual blocks of
  1x1 expand, 3x3 depthwise, 1x1 project, BatchNorm, ReLU6 as Clip), 10 classes;
- ``resnet18``: ResNet-18 for 32x32 images (basic blocks [2, 2, 2, 2], widths 32-256);
- ``transformer``: two ``nn.TransformerEncoderLayer`` (d_model 128, 4 heads, feed-forward
  256, GELU, no dropout) over 32 steps of 64 features, mean-pooled, a linear classifier;
- ``lstm``, ``bilstm``, ``gru``: one recurrent layer (hidden 128; bidirectional for bilstm)
  over 32 steps of 64 features, its outputs mean-pooled over time, a linear classifier;
- ``bert``: a BERT-style encoder over token ids (vocabulary 1000, learned positions, two
  post-LayerNorm ``nn.TransformerEncoderLayer`` of width 128, 4 heads, feed-forward 512,
  GELU), classifying the first token's state into 10 classes; batch 32 x 64 tokens.

Language models built by meta (``meta.lv1.gpt``, ``meta.lv1.lstm_lm``) get PyTorch twins that
take the graph's weights: ``GPT`` (nanoGPT's module: ``scaled_dot_product_attention`` with
``is_causal``, the head tied to the embedding) and ``LSTMLanguageModel`` (``nn.LSTM``, the
gates reordered from ONNX's i, o, f, c to PyTorch's i, f, g, o).

Needs torch; imported only by the benchmark scripts.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from torch import nn

from meta.lv1 import Graph, Node, TensorInfo, from_onnx, gpt, lstm_lm

F = nn.functional
BERT_VOCAB = 1000


def _bn_relu6(channels: int) -> list[nn.Module]:
    return [nn.BatchNorm2d(channels), nn.ReLU6()]


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), *_bn_relu6(hidden)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   *_bn_relu6(hidden), nn.Conv2d(hidden, cout, 1, bias=False),
                   nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    # (expansion, output channels, blocks, first stride) at width 1.0, CIFAR strides
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, width: float = 0.5, classes: int = 10) -> None:
        super().__init__()
        c = int(32 * width)
        layers: list[nn.Module] = [nn.Conv2d(3, c, 3, 1, 1, bias=False), *_bn_relu6(c)]
        for t, out, n, s in self.SETTINGS:
            out = max(8, int(out * width))
            for i in range(n):
                layers.append(InvertedResidual(c, out, s if i == 0 else 1, t))
                c = out
        last = 640
        layers += [nn.Conv2d(c, last, 1, bias=False), *_bn_relu6(last)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        blocks, c = [], width
        for i, out in enumerate((width, 2 * width, 4 * width, 8 * width)):
            for j in range(2):
                blocks.append(BasicBlock(c, out, 2 if i and not j else 1))
                c = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
        return self.fc(torch.flatten(y, 1))


class TransformerClassifier(nn.Module):
    def __init__(self, features: int = 64, d: int = 128, heads: int = 4, ff: int = 256,
                 layers: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(features, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                       batch_first=True) for _ in range(layers))
        self.fc = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.fc(h.mean(dim=1))


class RecurrentClassifier(nn.Module):
    def __init__(self, cell: str, bidirectional: bool = False, features: int = 64,
                 hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](
            features, hidden, batch_first=True, bidirectional=bidirectional)
        self.fc = nn.Linear(hidden * (2 if bidirectional else 1), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0].mean(dim=1))


class BertEncoder(nn.Module):
    """BERT's shape at a small size: token + position embeddings, LayerNorm, post-LN encoder
    layers, a classifier on the first token's state."""

    def __init__(self, vocab: int = BERT_VOCAB, context: int = 64, d: int = 128,
                 heads: int = 4, ff: int = 512, layers: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Parameter(torch.randn(context, d) * 0.02)
        self.norm = nn.LayerNorm(d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                       batch_first=True) for _ in range(layers))
        self.fc = nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.tokens(ids) + self.positions)
        for layer in self.layers:
            h = layer(h)
        return self.fc(h[:, 0])


# name -> (module factory, input shape of one example, batch); ``TOKEN_INPUTS`` take int64 ids
TORCH_MODELS = {
    "mobilenet_v2": (lambda: MobileNetV2(), (3, 32, 32), 32),
    "resnet18": (lambda: ResNet18(), (3, 32, 32), 32),
    "transformer": (lambda: TransformerClassifier(), (32, 64), 32),
    "lstm": (lambda: RecurrentClassifier("lstm"), (32, 64), 32),
    "bilstm": (lambda: RecurrentClassifier("lstm", bidirectional=True), (32, 64), 32),
    "gru": (lambda: RecurrentClassifier("gru"), (32, 64), 32),
    "bert": (lambda: BertEncoder(), (64,), 32),
}
TOKEN_INPUTS = {"bert": BERT_VOCAB}  # model -> vocabulary size


class GPT(nn.Module):
    """nanoGPT's decoder holding the weights of ``meta.lv1.gpt``'s graph (copies: the two
    frameworks then train apart from the same start)."""

    def __init__(self, graph: Graph, heads: int) -> None:
        super().__init__()
        w = {k: torch.from_numpy(v.copy()) for k, v in graph.parameters.items()}
        self.p = nn.ParameterDict({k.replace(".", "_"): nn.Parameter(v) for k, v in w.items()})
        self.heads = heads
        self.layers = sum(1 for k in w if k.endswith(".ln1.weight"))

    def _w(self, name: str) -> torch.Tensor:
        return self.p[name.replace(".", "_")]

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self._w(f"{name}.bias"), x.flatten(0, -2),
                           self._w(f"{name}.weight")).view(*x.shape[:-1], -1)

    def _ln(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self._w(f"{name}.weight"), self._w(f"{name}.bias"))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n, t = ids.shape
        x = F.embedding(ids, self._w("wte")) + self._w("wpe")[:t]
        for i in range(self.layers):
            h = self._ln(f"h{i}.ln1", x)
            q, k, v = (self._linear(f"h{i}.attn.{c}", h).view(n, t, self.heads, -1)
                       .transpose(1, 2) for c in "qkv")
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self._linear(f"h{i}.attn.proj", y.transpose(1, 2).reshape(n, t, -1))
            h = F.gelu(self._linear(f"h{i}.mlp.fc", self._ln(f"h{i}.ln2", x)))
            x = x + self._linear(f"h{i}.mlp.proj", h)
        return self._ln("ln_f", x) @ self._w("wte").t()  # (N, T, vocab)


class LSTMLanguageModel(nn.Module):
    """``meta.lv1.lstm_lm``'s graph as ``nn.Embedding``, ``nn.LSTM`` and ``nn.Linear``."""

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        w = graph.parameters
        emb = w["embedding"]
        hidden = w["lstm.R"].shape[-1]
        self.embedding = nn.Embedding(*emb.shape)
        self.lstm = nn.LSTM(emb.shape[1], hidden, batch_first=True)
        self.head = nn.Linear(hidden, w["head.weight"].shape[1])
        order = np.concatenate([np.arange(g * hidden, (g + 1) * hidden) for g in (0, 2, 3, 1)])
        with torch.no_grad():  # ONNX gates i, o, f, c -> PyTorch's i, f, g, o
            self.embedding.weight.copy_(torch.from_numpy(emb))
            self.lstm.weight_ih_l0.copy_(torch.from_numpy(w["lstm.W"][0][order]))
            self.lstm.weight_hh_l0.copy_(torch.from_numpy(w["lstm.R"][0][order]))
            b = w["lstm.B"][0]
            self.lstm.bias_ih_l0.copy_(torch.from_numpy(b[:4 * hidden][order]))
            self.lstm.bias_hh_l0.copy_(torch.from_numpy(b[4 * hidden:][order]))
            self.head.weight.copy_(torch.from_numpy(w["head.weight"].T.copy()))
            self.head.bias.copy_(torch.from_numpy(w["head.bias"]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embedding(ids))[0])  # (N, T, vocab)


# Language models built by meta: name -> (graph builder, batch, PyTorch twin of the graph).
# The LSTM rows are the ones the recurrent kernels move: "lstm_lm" (and any added beside it).
LANGUAGE_MODELS = {
    "gpt": (lambda: gpt((128,), classes=65, layers=2, heads=4, width=128, seed=0), 16,
            lambda g: GPT(g, heads=4)),
    "lstm_lm": (lambda: lstm_lm((64,), classes=65, hidden=256, embedding=64, seed=0), 32,
                LSTMLanguageModel),
    # issue 41's size: embedding 128, LSTM 256, vocabulary 512, batch 16 x 64
    "lstm_lm512": (lambda: lstm_lm((64,), classes=512, hidden=256, embedding=128, seed=0), 16,
                   LSTMLanguageModel),
}


SEQUENCE_MODELS = ("transformer", "bert", "gpt", "lstm_lm", "lstm_lm512")


def set_sequence(length: int) -> None:
    """Every sequence model over ``length`` steps (tokens) instead of its default."""
    TORCH_MODELS["transformer"] = (lambda: TransformerClassifier(), (length, 64), 32)
    TORCH_MODELS["bert"] = (lambda: BertEncoder(context=length), (length,), 32)
    LANGUAGE_MODELS["gpt"] = (
        lambda: gpt((length,), classes=65, layers=2, heads=4, width=128, seed=0), 16,
        lambda g: GPT(g, heads=4))
    LANGUAGE_MODELS["lstm_lm"] = (
        lambda: lstm_lm((length,), classes=65, hidden=256, embedding=64, seed=0), 32,
        LSTMLanguageModel)
    LANGUAGE_MODELS["lstm_lm512"] = (
        lambda: lstm_lm((length,), classes=512, hidden=256, embedding=128, seed=0), 16,
        LSTMLanguageModel)


def exported(model: nn.Module, example: np.ndarray) -> Graph:
    """``model`` as meta loads its TorchScript export (training form: BatchNorm updates its
    statistics), with a mean cross-entropy loss on the logits."""
    return with_loss(export_bytes(model, example))


def export_bytes(model: nn.Module, example: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    model.train()
    with warnings.catch_warnings():  # the exporter's notes on num_batches_tracked
        warnings.simplefilter("ignore")
        _export(model, example, buffer)
    return buffer.getvalue()


def with_loss(model: bytes | str) -> Graph:
    """An exported model (bytes or a file) with a mean cross-entropy loss on its logits."""
    graph = from_onnx(model)
    graph.inputs.append(TensorInfo("labels", np.int64, ("N",)))
    graph.insert(Node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], "loss",
                      attrs={"reduction": "mean"}))
    graph.outputs.append(TensorInfo("loss", np.float32, ()))
    return graph


def _export(model: nn.Module, example: np.ndarray, buffer: io.BytesIO) -> None:
    torch.onnx.export(model, (torch.from_numpy(example),), buffer, dynamo=False,
                      opset_version=17, input_names=["input"], output_names=["logits"],
                      training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False,
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})


def module(name: str, seed: int = 0) -> nn.Module:
    """The PyTorch module, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return TORCH_MODELS[name][0]()


def example(name: str) -> np.ndarray:
    """A batch of zeros of ``name``'s input: float32, or int64 token ids."""
    _, shape, batch = TORCH_MODELS[name]
    return np.zeros((batch, *shape), np.int64 if name in TOKEN_INPUTS else np.float32)


def build(name: str, seed: int = 0) -> tuple[nn.Module, Graph]:
    """The PyTorch module and meta's graph of it, with the same (seeded) weights."""
    net = module(name, seed)
    return net, exported(net, example(name))
