"""The language-model builders (GPT-style decoder, LSTM) and generation from them."""

from __future__ import annotations

import io

import numpy as np
import pytest

from meta.lv1 import MODELS, PlannedExecutor, ReferenceExecutor, gpt, lstm_lm
from meta.lv2 import ArrayDataset
from meta.lv2.datasets import IGNORE_INDEX
from meta.lv2.generate import SampleText, generate, sample_next
from meta.lv2.text import Vocabulary

V, T = 7, 8


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, V, (3, T))
    y = rng.integers(0, V, (3, T))
    y[1, 5:] = IGNORE_INDEX  # padding
    return x, y


def _small(build):
    if build is gpt:
        return gpt((T,), V, layers=2, heads=2, width=8)
    return lstm_lm((T,), V, hidden=6, embedding=4)


def test_gpt_options_are_declared_and_the_head_is_tied():
    assert set(MODELS["gpt"].options) >= {"layers", "heads", "width", "dropout", "vocab_size"}
    assert set(MODELS["lstm_lm"].options) >= {"hidden", "embedding", "vocab_size"}
    g = gpt((T,), V, layers=1, heads=2, width=8)
    vocab_sized = [k for k, v in g.parameters.items() if V in v.shape]
    assert vocab_sized == ["wte"]  # the head reads wte through a Transpose: one parameter
    assert not any("mask" in k for k in g.parameters)  # the causal mask is not learned
    with pytest.raises(ValueError, match="width 10 is not a multiple of heads 4"):
        gpt((T,), V, heads=4, width=10)
    with pytest.raises(ValueError, match=r"1-D blocks of token ids, got examples of shape"):
        gpt((1, 28, 28), V)


def _loss(graph, x, y):
    return float(ReferenceExecutor(graph).inference({"input": x, "labels": y}, ["loss"])["loss"])


def test_the_tied_weight_gets_both_gradients():
    g = gpt((T,), V, layers=1, heads=2, width=8, seed=1)
    x, y = _batch()
    x %= V - 1
    unused = V - 1  # a row only the head reads
    _, grads = ReferenceExecutor(g).inference_and_backprop({"input": x, "labels": y}, "loss")
    wte = g.initializers["wte"]
    for row in (int(x[0, 0]), unused):
        eps, old = 1e-2, wte[row, 3]
        wte[row, 3] = old + eps
        up = _loss(g, x, y)
        wte[row, 3] = old - eps
        down = _loss(g, x, y)
        wte[row, 3] = old
        assert grads["wte"][row, 3] == pytest.approx((up - down) / (2 * eps), rel=0.05,
                                                     abs=1e-4)
    assert abs(grads["wte"][unused]).sum() > 0


@pytest.mark.parametrize("build", [gpt, lstm_lm])
def test_predictions_at_a_position_never_read_later_tokens(build):
    g = _small(build)
    x, _ = _batch()
    ex = ReferenceExecutor(g)
    before = ex.inference({"input": x}, ["logits"])["logits"]
    assert before.shape == (3, V, T)
    x2 = x.copy()
    x2[:, 5] = (x2[:, 5] + 1) % V
    after = ex.inference({"input": x2}, ["logits"])["logits"]
    np.testing.assert_allclose(after[:, :, :5], before[:, :, :5], atol=1e-6)
    assert not np.allclose(after[:, :, 5:], before[:, :, 5:])


@pytest.mark.parametrize("build", [gpt, lstm_lm])
def test_the_loss_skips_padding_over_n_c_t(build):
    """SoftmaxCrossEntropyLoss over (N, C, T) with ignore_index: the mean over the kept
    tokens, and its gradient zero at padded positions."""
    g = _small(build)
    x, y = _batch()
    out, grads = ReferenceExecutor(g).inference_and_backprop({"input": x, "labels": y}, "loss",
                                                             ["logits"])
    logits = out["logits"].astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    kept = y != IGNORE_INDEX
    nll = -np.take_along_axis(logp, np.where(kept, y, 0)[:, None], 1)[:, 0]
    assert float(out["loss"]) == pytest.approx(nll[kept].mean(), rel=1e-5)
    y2 = y.copy()
    y2[1, 5:] = (y2[0, 5:] + 1) % V  # what padding hides must not matter...
    y2[1, 5:] = IGNORE_INDEX
    assert _loss(g, x, y2) == pytest.approx(float(out["loss"]), rel=1e-6)


@pytest.mark.parametrize("build", [gpt, lstm_lm])
def test_planned_matches_reference(build):
    g = _small(build)
    x, y = _batch(2)
    ref_out, ref = ReferenceExecutor(g).inference_and_backprop({"input": x, "labels": y},
                                                               "loss", ["logits"])
    ex = PlannedExecutor(g)
    ex.train(True)
    out, grads = ex.inference_and_backprop({"input": x, "labels": y}, "loss", ["logits"])
    np.testing.assert_allclose(out["logits"], ref_out["logits"], rtol=1e-4, atol=1e-5)
    for name, g_ref in ref.items():
        np.testing.assert_allclose(grads[name], g_ref, rtol=1e-3, atol=1e-5, err_msg=name)


def test_pytorch_executor_runs_a_gpt():
    pytest.importorskip("torch")
    from meta.lv1 import TorchExecutor

    g = _small(gpt)
    x, y = _batch(3)
    ref_out, ref = ReferenceExecutor(g).inference_and_backprop({"input": x, "labels": y},
                                                               "loss")
    out, grads = TorchExecutor(g).inference_and_backprop({"input": x, "labels": y}, "loss")
    assert float(out["loss"]) == pytest.approx(float(ref_out["loss"]), rel=1e-4)
    np.testing.assert_allclose(grads["wte"], ref["wte"], rtol=1e-3, atol=1e-5)


def test_sampling_follows_temperature_and_top_k():
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 3.0, 2.9, -1.0])
    assert sample_next(logits, 0.0, 0, rng) == 1  # temperature 0: the most likely
    drawn = {sample_next(logits, 5.0, 2, rng) for _ in range(200)}
    assert drawn == {1, 2}  # only the two most likely, both reached at a high temperature
    assert len({sample_next(logits, 5.0, 0, rng) for _ in range(300)}) == 4


def test_generate_continues_a_prompt_and_restores_the_mode():
    ex = ReferenceExecutor(gpt((T,), V, layers=1, heads=1, width=4))
    ex.train(True)
    a = generate(ex, [1, 2, 3], 12, temperature=1.0, rng=np.random.default_rng(5))
    b = generate(ex, [1, 2, 3], 12, temperature=1.0, rng=np.random.default_rng(5))
    assert a.shape == (15,) and list(a[:3]) == [1, 2, 3] and a.max() < V
    np.testing.assert_array_equal(a, b)  # seeded; past the context the window slides
    assert ex.training is True


def test_the_sample_event_prints_decoded_text():
    vocab = Vocabulary.from_text("abcdefg")
    x, y = _batch()

    class Trainer:  # what the event reads of a trainer
        executor = ReferenceExecutor(gpt((T,), V, layers=1, heads=1, width=4))
        train_data = ArrayDataset(x, y, vocab)
        history: list = [{}]
        names = {"input": "input", "logits": "logits"}
        eval_shard = (0, 1)

    out = io.StringIO()
    event = SampleText(prompt="ab", length=10, stream=out)
    event.on_epoch_end(Trainer(), {"epoch": 1})
    assert "--- sample after epoch 1 ---\nab" in out.getvalue()
    assert len(event.samples[0]) == 12 and set(event.samples[0]) <= set("abcdefg")
    Trainer.train_data = ArrayDataset(x, y)
    with pytest.raises(ValueError, match="no vocabulary to decode"):
        event.on_epoch_end(Trainer(), {"epoch": 2})
