"""A bf16 plan keeps a transformer's MLP in bf16 as PyTorch's CPU autocast does (issue 42):
the first product writes its output in bf16 only, Gelu reads it there and writes its output
and derivative in bf16, an identity Dropout between Gelu and the second product (PyTorch's
encoder layers export one, ratio 0) passes the bf16 holder on, as a view, and its gradient
stays bf16 through it; the products' bias gradients sum the bf16 dy the products read. The
float32 plan of the same graph holds nothing in bf16, and the gradients stay within 2e-2."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor
from meta.lv1.plan import precision, runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

N, T, D, H = 4, 16, 32, 64


def mlp_graph(dropout: str = "Dropout"):
    """loss = sum(f * (Dropout(Gelu(x W1 + b1)) W2 + b2)): a transformer's MLP, its Dropout
    at ratio 0 in training (``dropout="Identity"``: an Identity in its place)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("mlp", 20)
    x = b.input("x", np.float32, (N, T, D))
    w1 = b.initializer("w1", (rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32))
    b1 = b.initializer("b1", (rng.standard_normal(H) * 0.1).astype(np.float32))
    w2 = b.initializer("w2", (rng.standard_normal((H, D)) / np.sqrt(H)).astype(np.float32))
    b2 = b.initializer("b2", (rng.standard_normal(D) * 0.1).astype(np.float32))
    f = b.node("Constant", [], name="f",
               value=rng.standard_normal((N, T, D)).astype(np.float32))
    h = b.node("Add", [b.node("MatMul", [x, w1], name="fc"), b1], name="fc_bias")
    g = b.node("Gelu", [h], name="gelu")
    if dropout == "Dropout":
        ratio = b.node("Constant", [], name="ratio", value=np.float32(0.0))
        train = b.node("Constant", [], name="train", value=np.bool_(True))
        g = b.node("Dropout", [g, ratio, train], name="dropout")
    else:
        g = b.node("Identity", [g], name="dropout")
    y = b.node("Add", [b.node("MatMul", [g, w2], name="proj"), b2], name="proj_bias")
    b.node("ReduceSum", [b.node("Mul", [y, f], name="weighted")], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    return b.build()


def run(mode: str, dropout: str = "Dropout"):
    ex = PlannedExecutor(mlp_graph(dropout), precision=mode).train()
    x = np.random.default_rng(1).standard_normal((N, T, D)).astype(np.float32)
    values, grads = ex.inference_and_backprop({"x": x}, "loss")
    return ex._last, float(values["loss"]), {k: g.copy() for k, g in grads.items()}


def relative(ours, theirs) -> float:
    return float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))


@pytest.mark.parametrize("dropout", ["Dropout", "Identity"])
def test_the_mlp_stays_bf16_through_an_identity_dropout(native, dropout):
    plan32, loss32, g32 = run("f32", dropout)
    plan, loss, g16 = run("bf16", dropout)
    assert not any(v.dtype == precision.BF16 for v in plan32.values.values())
    only = plan.objects[precision.ONLY]
    # fc's output, Gelu's output and their gradients: bf16 only, no float32 bytes at all
    for name in ("fc_bias", "gelu", "dropout@grad", "fc_bias@grad"):
        assert name in only, name
        assert plan.values[name].storage == "none" and plan.values[name].array is None
    # the Dropout's output and Gelu's gradient are views of those: no bytes either
    for name in ("dropout", "gelu@grad"):
        assert plan.values[name].storage == "none" and plan.values[name].array is None
    steps = {s.name: s for s in plan.order}
    gelu = next(s for s in plan.order if s.node == "gelu" and s.phase == "forward")
    assert all(plan.values[v].dtype == precision.BF16 for v in (*gelu.reads, *gelu.writes))
    # the second product reads a bf16 view of Gelu's holder: nothing converts Gelu's output
    converted = {s.reads[0] for s in plan.order if s.name == "to bf16"}
    assert not converted & {"gelu", "dropout"}
    proj = next(s for s in plan.order if s.node == "proj" and s.phase == "forward"
                and s.name.startswith("matmul"))
    held = plan.values[proj.reads[0]]
    assert held.dtype == precision.BF16 and held.storage == "view"
    # the backward: proj's dx into Dropout's bf16 gradient, Gelu's backward reads it as bf16
    back = next(s for s in plan.order if s.node == "gelu" and s.phase == "backward")
    assert all(plan.values[v].dtype == precision.BF16 for v in back.reads)
    assert "Gelu" in steps
    assert abs(loss - loss32) < 2e-2 * max(1.0, abs(loss32))
    for name, g in g32.items():
        assert relative(g16[name], g) < 2e-2, name


def test_bias_gradients_sum_the_bf16_dy_the_products_read(native):
    plan, _, g16 = run("bf16")
    biases = [s for s in plan.order if s.name == "bias gradient"]
    assert len(biases) == 2
    for s in biases:
        assert plan.values[s.reads[0]].dtype == precision.BF16, s.reads
    plan32, _, g32 = run("f32")
    for s in (s for s in plan32.order if s.name == "bias gradient"):
        assert plan32.values[s.reads[0]].dtype == np.float32
    for name in ("b1", "b2"):
        assert relative(g16[name], g32[name]) < 2e-2, name


def test_a_step_reading_a_view_of_a_bf16_only_value_is_refused(native):
    """A view of a value kept in bf16 only has no bytes either: reading it is refused."""
    plan, _, _ = run("bf16")
    assert plan.values["dropout"].storage == "none"  # the view of Gelu's float32 output

    class Pb:
        values = plan.values
        steps = [type("S", (), {"name": "copy", "node": "x", "reads": ("dropout",),
                                "writes": ()})()]

    ctx = type("Ctx", (), {"pb": Pb, "objects": {}})()
    with pytest.raises(AssertionError, match="reads 'dropout'"):
        precision.check_unwritten(ctx)


def test_the_bf16_gelu_rounds_as_the_float32_one_then_to_nearest_even():
    """The bf16 Gelu forward (its 16-lane roundings) writes y and gelu'(x) as the float32
    kernel's values rounded to nearest even, element for element, the tail past the last 16
    included; a NaN stays a NaN, infinities stay themselves."""
    from meta import _plan
    n = 16 * 5 + 7
    x = (np.random.default_rng(1).standard_normal(n) * 4).astype(np.float32)
    x[:4] = [np.inf, -np.inf, np.nan, 0.0]
    y, d = np.empty_like(x), np.empty_like(x)
    y16, d16 = np.empty(n, precision.BF16), np.empty(n, precision.BF16)
    _plan.gelu(n, x, None, y, False, d).run()
    _plan.gelu(n, x, None, y16, False, d16).run()
    for half, full in ((y16, y), (d16, d)):
        finite = ~np.isnan(full)
        assert np.array_equal(half[finite].view(np.uint16),
                              full[finite].astype(precision.BF16).view(np.uint16))
        assert np.isnan(half[~finite].astype(np.float32)).all()
    # a bf16 input: the same values as its float32 widening gives
    x16 = x.astype(precision.BF16)
    _plan.gelu(n, x16, None, y16, False, d16).run()
    _plan.gelu(n, x16.astype(np.float32), None, y, False, d).run()
    finite = ~np.isnan(y)
    assert np.array_equal(y16[finite].view(np.uint16),
                          y[finite].astype(precision.BF16).view(np.uint16))
