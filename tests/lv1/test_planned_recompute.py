"""Activation recomputation on the planned executor (``recompute="blocks"`` or node-name
patterns): the same loss and gradients as the unsegmented plan (identical bits, except the
token embedding the head is tied to: its two segments' parts are added in another order,
within 1e-6), training steps that follow the optimizer's updates, less arena plus kept
memory, the option reached as recipes reach it, and one line where it cannot apply."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import gpt, mlp
from meta.lv1.executor import EXECUTORS
from meta.lv1.plan.executor import PlannedExecutor
from meta.lv1.plan.recompute import residual_joins, segment_cuts
from meta.lv1.plan.runtime import available
from meta.lv2.optimizers import Optimizer, adam

pytestmark = pytest.mark.skipif(not available(), reason="meta._plan (oneDNN) not built")

TIED = "wte"  # the head reads the token embedding: two segments add to its gradient


def _gpt(**kw):
    return gpt((16,), classes=11, layers=2, heads=2, width=16, seed=0, **kw)


def _batch(seed=1, n=3):
    rng = np.random.default_rng(seed)
    return {"input": rng.integers(0, 11, (n, 16)), "labels": rng.integers(0, 11, (n, 16))}


def _assert_same(got, want):
    assert set(got) == set(want)
    for name in want:
        if name == TIED:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6)
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_blocks_are_the_residual_blocks():
    g = _gpt()
    cuts, how = segment_cuts(g, "blocks")
    assert cuts == ["h0.attn.residual", "h0.mlp.residual", "h1.attn.residual",
                    "h1.mlp.residual"], how
    assert [g.nodes[i].name for i in residual_joins(g)] == cuts  # not the mask's Add


def test_gradients_and_loss_equal_the_unsegmented_plans_and_memory_falls():
    g = _gpt()
    whole = PlannedExecutor(g).train()
    segmented = PlannedExecutor(g, recompute="blocks").train()
    feeds = _batch()
    want_values, want = whole.inference_and_backprop(feeds, outputs=["logits"])
    want = {k: v.copy() for k, v in want.items()}
    for _ in range(2):  # the second step runs the plans compiled by the first
        values, got = segmented.inference_and_backprop(feeds, outputs=["logits"])
        assert values["loss"] == want_values["loss"]
        np.testing.assert_array_equal(values["logits"], want_values["logits"])
        _assert_same(got, want)
    segments = segmented.segments()
    assert len(segments.executors) == 5
    assert segmented.peak_intermediate_bytes == segments.arena.nbytes + segments.kept_bytes
    assert segmented.peak_intermediate_bytes < whole._last.arena_bytes
    assert all(ex._last.arena is segments.arena for ex in segments.executors)
    assert "recompute: 5 segments" in segmented.plan_summary()


def test_training_steps_follow_the_updates():
    """Adam steps on two copies of the graph: the segments see every update (their graphs
    follow the whole graph's arrays and version)."""
    graphs = [_gpt(), _gpt()]
    executors = [PlannedExecutor(graphs[0]).train(),
                 PlannedExecutor(graphs[1], recompute="blocks").train()]
    optimizers = [Optimizer(adam(0.01), g.parameters) for g in graphs]
    for step in range(3):
        feeds = _batch(seed=step)
        losses = []
        for ex, opt in zip(executors, optimizers):
            values, grads = ex.inference_and_backprop(feeds)
            opt.step(grads)
            losses.append(float(values["loss"]))
        assert losses[1] == pytest.approx(losses[0], abs=1e-6)
    for name, p in graphs[0].parameters.items():
        np.testing.assert_allclose(graphs[1].parameters[name], p, rtol=0, atol=1e-5)
    # evaluation after the updates (the whole graph's inference plan) agrees too
    ids = _batch(seed=9)
    for ex in executors:
        ex.eval()
    a, b = (ex.inference(ids, ["logits"])["logits"] for ex in executors)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_patterns_name_the_segment_ends():
    g = _gpt()
    ex = PlannedExecutor(g, recompute="h*.mlp.residual", profile=True).train()
    _, got = ex.inference_and_backprop(_batch())
    assert len(ex.segments().executors) == 3
    assert "MatMul" in str(ex.profile_table())  # the segments' steps, recorded
    _, want = PlannedExecutor(g).train().inference_and_backprop(_batch())
    _assert_same(got, want)


def test_the_option_as_recipes_set_it():
    assert "recompute" in PlannedExecutor.options
    ex = EXECUTORS["planned"].build(_gpt(), recompute="blocks")
    assert ex.recompute == "blocks"
    ex = EXECUTORS["planned"].build(_gpt(), recompute="h0.mlp.residual, h1.mlp.residual")
    assert ex.recompute == ("h0.mlp.residual", "h1.mlp.residual")
    assert EXECUTORS["planned"].build(_gpt()).recompute is None


def test_a_graph_without_blocks_is_cut_into_sqrt_n_runs():
    g = mlp(hidden=[16, 16], seed=0)
    cuts, how = segment_cuts(g, "blocks")
    assert "no residual block" in how and len(cuts) >= 1
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((4, 1, 28, 28)).astype(np.float32),
             "labels": rng.integers(0, 10, 4)}
    _, want = PlannedExecutor(g).train().inference_and_backprop(feeds)
    _, got = PlannedExecutor(g, recompute="blocks").train().inference_and_backprop(feeds)
    _assert_same(got, want)


@pytest.mark.parametrize("kw, spec, said", [
    ({}, "nothing*", "give one segment"),
    ({"dropout": 0.1}, "blocks", "draws random numbers"),
])
def test_where_it_cannot_cut_it_says_so_and_runs_unsegmented(capsys, kw, spec, said):
    g = _gpt(**kw)
    ex = PlannedExecutor(g, recompute=spec).eval()  # eval: dropout off, both deterministic
    _, got = ex.inference_and_backprop(_batch())
    err = capsys.readouterr().err
    assert said in err and "run without recomputation" in err
    assert ex.segments() is None
    _, want = PlannedExecutor(g).eval().inference_and_backprop(_batch())
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


class _Hook:
    """A strategy's gradient hook as the allreduce uses it: arrays to write into, buckets."""

    def __init__(self, seed=0.5, bucket_bytes=1 << 12):
        self.seed, self.bucket_bytes, self.ready_names = seed, bucket_bytes, []

    def layout(self, names):
        self.arrays = {n: np.zeros_like(_gpt().initializers[n]) for n in names}
        return self.arrays

    def use(self, names):
        pass

    def ready(self, names):
        self.ready_names += names


def test_a_gradient_hook_gets_every_bucket_once():
    g = _gpt()
    hooks = [_Hook(), _Hook()]
    _, want = PlannedExecutor(g).train().inference_and_backprop(_batch(), hook=hooks[0])
    _, got = PlannedExecutor(g, recompute="blocks").train().inference_and_backprop(
        _batch(), hook=hooks[1])
    assert sorted(hooks[1].ready_names) == sorted(g.parameters)
    assert all(got[n] is hooks[1].arrays[n] for n in g.parameters)
    _assert_same(got, want)


def test_a_larger_batch_grows_the_shared_arena_and_rebinds_the_plans():
    g = _gpt()
    whole = PlannedExecutor(g).train()
    segmented = PlannedExecutor(g, recompute="blocks").train()
    sizes = []
    for n in (2, 3, 2):  # the second batch's plans need more: the first ones are rebound
        feeds = _batch(seed=n, n=n)
        _, want = whole.inference_and_backprop(feeds)
        want = {k: v.copy() for k, v in want.items()}
        _, got = segmented.inference_and_backprop(feeds)
        _assert_same(got, want)
        sizes.append(segmented.segments().arena.nbytes)
    assert sizes[0] < sizes[1] == sizes[2]
