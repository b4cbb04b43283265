"""The language models' other planned kernels: the token embedding (Gather of table rows by
ids, its backward a scatter-add in token order), MatMul + bias Add as one product (with its
activation where the backward allows), and a residual sum handing its gradient over without a
copy. Each against the reference executor."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor, gpt
from meta.lv1.plan import runtime

from .test_planned_attention import close

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def embedding_model(vocab=7, width=5, relu=False):
    """ids -> table rows -> (x W + b [-> Relu]) + rows -> sum of squares."""
    b = GraphBuilder("embedding", 17)
    ids = b.input("input", np.int64, (4, 6))
    rng = np.random.default_rng(0)
    table = b.initializer("table", rng.standard_normal((vocab, width)).astype(np.float32))
    rows = b.node("Gather", [table, ids], name="embed")
    h = b.node("MatMul", [rows, b.initializer(
        "w", rng.standard_normal((width, width)).astype(np.float32))], name="linear.matmul")
    h = b.node("Add", [h, b.initializer("bias", rng.standard_normal(width).astype(
        np.float32))], name="linear")
    if relu:
        h = b.node("Relu", [h], name="relu")
    h = b.node("Add", [rows, h], name="residual")
    loss = b.node("ReduceSum", [b.node("Mul", [h, h], name="square")], name="loss",
                  keepdims=0)
    b.output(loss, np.float32, ())
    return b.build()


@pytest.mark.parametrize("relu", [False, True])
def test_embedding_and_linear_match_the_reference(relu):
    """Repeated and negative ids (Gather counts -1 as the last row) sum into the table's
    gradient."""
    graph = embedding_model(relu=relu)
    ids = np.random.default_rng(1).integers(-7, 7, (4, 6))
    ids[0, :3] = 2
    ref = ReferenceExecutor(graph).train().inference_and_backprop({"input": ids})
    planned = PlannedExecutor(graph).train()
    ours = planned.inference_and_backprop({"input": ids})
    placement = planned.placement()
    assert placement["embed"] == "native" and placement["linear"] == "fused into linear.matmul"
    if relu:
        assert placement["relu"] == "fused into linear.matmul"
    close(ours[0]["loss"], ref[0]["loss"], "loss")
    for name in ("table", "w", "bias"):
        close(ours[1][name], ref[1][name], name)


def test_an_id_out_of_range_fails_naming_the_node():
    graph = embedding_model()
    planned = PlannedExecutor(graph).train()
    planned.inference_and_backprop({"input": np.zeros((4, 6), np.int64)})
    with pytest.raises(IndexError, match="'embed'"):
        planned.inference_and_backprop({"input": np.full((4, 6), 7, np.int64)})


def test_gpt_step_has_no_python_embedding_and_no_bias_pass():
    graph = gpt((8,), classes=9, layers=1, heads=2, width=8)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.integers(0, 9, (2, 8)), "labels": rng.integers(0, 9, (2, 8))}
    planned = PlannedExecutor(graph).train()
    planned.inference_and_backprop(feeds)
    placement = planned.placement()
    assert placement["tok_emb"] == "native"
    assert all(placement[f"h0.{n}"] == f"fused into h0.{n}.matmul" for n in
               ("attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc", "mlp.proj"))
    steps = [s.name for s in planned._last.records["backward"]]
    # dy of each residual sum is copied only into the stream (which LayerNorm's gradient adds
    # to); the branches and the token embedding take dy's bytes: 2 copies, not 5
    assert steps.count("copy") == 2, steps
