"""The key/value cache (``meta.lv2.kv_cache``): the tokens recomputing picks at temperature 0,
within the context and past it (where the window slides), the same draws at temperature 1,
the logits of the executor; graphs that are not meta's GPT refused, naming why."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, gpt, lstm_lm
from meta.lv1.graph import Node
from meta.lv2.generate import generate
from meta.lv2.kv_cache import CacheError, GPTCache


def _model(context: int = 24):
    """A GPT whose weights are scaled up from their initial 0.02, so its scores differ by more
    than rounding and a wrong cache changes the tokens."""
    g = gpt((context,), classes=17, layers=2, heads=2, width=16, seed=3)
    for name, value in g.initializers.items():
        if value.dtype.kind == "f" and name != "attn.scale" and ".ln" not in name \
                and not name.startswith("ln_f"):
            g.initializers[name] = (value * 25).astype(value.dtype)
    return g


@pytest.mark.parametrize("length", [10, 60])  # within the context of 24, and past it
def test_equal_tokens_at_temperature_0(length):
    ex = ReferenceExecutor(_model())
    expected = generate(ex, [1, 2, 3], length, temperature=0.0)
    cached = generate(ex, [1, 2, 3], length, temperature=0.0, cache=True)
    np.testing.assert_array_equal(cached, expected)
    assert len(set(expected[3:].tolist())) > 2  # not one token repeated: a real check


def test_equal_draws_at_temperature_1_and_a_long_prompt():
    ex = ReferenceExecutor(_model())
    prompt = np.arange(30) % 17  # longer than the context: the latest 24 are read
    for top_k in (0, 4):
        a = generate(ex, prompt, 20, 1.0, top_k, np.random.default_rng(7))
        b = generate(ex, prompt, 20, 1.0, top_k, np.random.default_rng(7), cache=True)
        np.testing.assert_array_equal(a, b)


def test_the_logits_are_the_executors():
    g = _model()
    ex, cache = ReferenceExecutor(g), GPTCache(g)
    ids = [4, 0, 16, 9, 9]
    full = ex.inference({"input": np.array([ids + [0] * 19])}, ["logits"])["logits"][0]
    np.testing.assert_allclose(cache.prefill(ids[:2]), full[:, 1], rtol=1e-5, atol=1e-5)
    for t in range(2, 5):
        np.testing.assert_allclose(cache.step(ids[t]), full[:, t], rtol=1e-5, atol=1e-5)
    assert cache.filled == 5


def test_other_graphs_are_refused_naming_why():
    with pytest.raises(CacheError, match="no initializer 'wte'"):
        GPTCache(lstm_lm((8,), classes=5, hidden=4, embedding=3))
    g = gpt((8,), classes=5, layers=1, heads=1, width=4)
    g.replace("h0.mlp.gelu", Node("Relu", ["h0.mlp.fc"], ["h0.mlp.gelu"], "h0.mlp.gelu"))
    with pytest.raises(CacheError, match="the node writing h0.mlp.gelu is Relu, gpt's Gelu"):
        GPTCache(g)
    with pytest.raises(CacheError, match="prefill takes 1 to 8 ids, got 9"):
        GPTCache(gpt((8,), classes=5, layers=1, heads=1, width=4)).prefill(range(9))


def test_past_the_context_the_cache_alone_recomputes_the_same_tokens():
    from meta.lv2.kv_cache import generate_cached

    g = _model()
    expected = generate(ReferenceExecutor(g), [5], 40, temperature=0.0)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(generate_cached(GPTCache(g), [5], 40, 0.0, 0, rng), expected)
