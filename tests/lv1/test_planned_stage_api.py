"""The stage interface (``forward_saving`` / ``backward_seeded``) on the reference and planned
executors: a graph cut in two and run stage by stage gives the whole graph's gradients; a
backward seeded on non-scalar outputs is a vector-Jacobian product; gradients asked for by
initializer name and by feed; a handle whose saved activations were overwritten is refused."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, gpt, mlp
from meta.lv1.plan.executor import PlannedExecutor
from meta.lv1.plan.runtime import available
from meta.lv1.partition import partition

pytestmark = pytest.mark.skipif(not available(), reason="meta._plan (oneDNN) not built")

EXECUTORS = (ReferenceExecutor, PlannedExecutor)


def _pickled(x):
    return pickle.loads(pickle.dumps(x))


def _mlp_case():
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((4, 1, 28, 28)).astype(np.float32),
             "labels": rng.integers(0, 10, 4)}
    return mlp(hidden=[16, 16], seed=0), partition(mlp(hidden=[16, 16], seed=0), 2,
                                                   cuts=["relu0"]), feeds


def _gpt_case():
    g = gpt((8,), classes=11, layers=2, heads=2, width=8, seed=0)
    rng = np.random.default_rng(1)
    feeds = {"input": rng.integers(0, 11, (3, 8)), "labels": rng.integers(0, 11, (3, 8))}
    return g, partition(g, 2, cuts=["h0.mlp.residual"], tied=True), feeds


def _staged(cls, graph, part, feeds):
    """Stage 0 forward, stage 1 forward + backward, stage 0 backward from stage 1's input
    gradients; the parameters' gradients of both stages added (a tied one is in both)."""
    s0, s1 = part.stages
    e0 = cls(part.stage_graph(graph, 0)).train()
    e1 = cls(part.stage_graph(graph, 1)).train()
    out0, saved0 = e0.forward_saving(_pickled({t: feeds[t] for t in s0.feeds}), s0.sends)
    given = _pickled({**{t: out0[t] for t in s1.receives}, **{t: feeds[t] for t in s1.feeds}})
    out1, saved1 = e1.forward_saving(given, ["loss"], wrt=s1.receives)
    g1 = e1.backward_seeded(saved1, {"loss": np.ones((), np.float32)})
    g1 = {k: v.copy() for k, v in g1.items()}
    g0 = e0.backward_seeded(saved0, {t: g1[t] for t in s1.receives})
    grads = {}
    for g, ex in ((g0, e0), (g1, e1)):
        for name in ex.graph.parameters:
            grads[name] = grads[name] + g[name] if name in grads else g[name].copy()
    return float(out1["loss"]), grads


@pytest.mark.parametrize("case", [_mlp_case, _gpt_case], ids=["mlp", "gpt"])
def test_two_stages_give_the_whole_graphs_gradients(case):
    graph, part, feeds = case()
    whole = {}
    for cls in EXECUTORS:
        values, grads = cls(graph).train().inference_and_backprop(feeds)
        whole[cls] = float(values["loss"]), {k: v.copy() for k, v in grads.items()}
    for cls in EXECUTORS:
        loss, grads = _staged(cls, graph, part, feeds)
        assert loss == pytest.approx(whole[cls][0], abs=1e-6)
        assert set(grads) == set(graph.parameters)
        for name, g in grads.items():
            np.testing.assert_allclose(g, whole[cls][1][name], rtol=0, atol=1e-6,
                                       err_msg=f"{cls.__name__} {name}")
            np.testing.assert_allclose(g, whole[ReferenceExecutor][1][name], rtol=0, atol=1e-6,
                                       err_msg=f"{cls.__name__} {name} vs reference")


def test_seeded_non_scalar_outputs_are_a_vector_jacobian_product():
    graph, _, feeds = _mlp_case()
    rng = np.random.default_rng(2)
    seed = rng.standard_normal((4, 10)).astype(np.float32)
    got = {}
    for cls in EXECUTORS:
        ex = cls(graph).train()
        out, saved = ex.forward_saving(feeds, ["logits", "loss"])
        assert out["logits"].shape == (4, 10)
        g_logits = {k: v.copy() for k, v in ex.backward_seeded(saved, {"logits": seed}).items()}
        _, saved = ex.forward_saving(feeds, ["logits", "loss"])
        g_loss = {k: v.copy() for k, v in ex.backward_seeded(saved, {"loss": 1.0}).items()}
        _, saved = ex.forward_saving(feeds, ["logits", "loss"])
        g_both = ex.backward_seeded(saved, {"logits": seed, "loss": np.float32(1.0)})
        for name in graph.parameters:  # several seeded outputs add
            np.testing.assert_allclose(g_both[name], g_logits[name] + g_loss[name],
                                       rtol=1e-5, atol=1e-6)  # float32 sums reordered
        got[cls] = g_logits
    # the VJP by hand: logits = relu1 @ W2 + b2, so d(sum(seed * logits))/d b2 = seed summed
    np.testing.assert_allclose(got[PlannedExecutor]["fc2.bias"], seed.sum(0), atol=1e-5)
    for name in graph.parameters:
        np.testing.assert_allclose(got[PlannedExecutor][name], got[ReferenceExecutor][name],
                                   rtol=1e-5, atol=1e-6, err_msg=name)  # other kernels


def test_gradients_by_initializer_name_and_by_feed():
    graph, _, feeds = _mlp_case()
    rng = np.random.default_rng(3)
    seed = rng.standard_normal((4, 10)).astype(np.float32)
    got = {}
    for cls in EXECUTORS:
        ex = cls(graph).train()
        _, saved = ex.forward_saving(_pickled(feeds), ["logits"], wrt=["fc0.weight", "input"])
        got[cls] = ex.backward_seeded(saved, {"logits": seed})
        assert got[cls]["input"].shape == feeds["input"].shape
        assert got[cls]["fc0.weight"].shape == graph.initializers["fc0.weight"].shape
        assert np.abs(got[cls]["input"]).max() > 0
    for name in ("fc0.weight", "input"):
        np.testing.assert_allclose(got[PlannedExecutor][name], got[ReferenceExecutor][name],
                                   rtol=1e-5, atol=1e-6, err_msg=name)  # other kernels


def test_a_handle_is_used_once_and_not_after_another_forward():
    graph, _, feeds = _mlp_case()
    ex = PlannedExecutor(graph).train()
    _, first = ex.forward_saving(feeds, ["loss"])
    _, second = ex.forward_saving(feeds, ["loss"])
    with pytest.raises(ValueError, match="overwritten"):
        ex.backward_seeded(first, {"loss": 1.0})
    ex.backward_seeded(second, {"loss": 1.0})
    with pytest.raises(ValueError, match="already ran"):
        ex.backward_seeded(second, {"loss": 1.0})
    _, third = ex.forward_saving(feeds, ["logits"])
    with pytest.raises(ValueError, match="shape"):
        ex.backward_seeded(third, {"logits": np.ones((3, 10), np.float32)})
    with pytest.raises(ValueError, match="not outputs"):
        ex.backward_seeded(third, {"loss": 1.0})
