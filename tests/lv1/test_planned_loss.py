"""SoftmaxCrossEntropyLoss in the planned executor (``meta.lv1.plan.lowering.loss``, one fused
C++ step each way): the loss, the log-probabilities and the gradients of the scores and of the
class weights are the numpy operator's, for (N, C) and (N, C, d...) scores, every reduction,
an ignore_index and class weights; a language model's loss no longer leaves the kernels."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor, gpt
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

IGNORE = -100


def close(ours, theirs, what, tol=2e-5):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    scale = max(1e-3, float(np.abs(theirs).max(initial=0)))
    err = float(np.abs(ours - theirs).max(initial=0))
    assert err <= tol * scale, f"{what}: max abs error {err:.3g} (scale {scale:.3g})"


def constant(b: GraphBuilder, name: str, value: np.ndarray) -> str:
    return b.node("Constant", [], name=name, value=value)


def loss_graph(shape, reduction="mean", ignore_index=None, weights=False, logp=False,
               trained_weights=False):
    """scores (an input) -> loss; "none" is summed with fixed random factors (so each element's
    gradient differs); ``logp``: the log-probabilities are also fetched and read downstream."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("loss", 17)
    x = b.input("x", np.float32, shape)
    labels = b.input("labels", np.int64, shape[:1] + shape[2:])
    ins = [x, labels]
    if weights:
        w = rng.uniform(0.2, 2.0, shape[1]).astype(np.float32)
        ins.append(b.initializer("w", w) if trained_weights else constant(b, "w", w))
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    outs = ["ce", "logp"] if logp else ["ce"]
    res = b.node("SoftmaxCrossEntropyLoss", ins, name="ce", outputs=outs, **attrs)
    ce = res[0] if logp else res
    if reduction == "none":
        f = constant(b, "f", rng.standard_normal(shape[:1] + shape[2:]).astype(np.float32))
        ce = b.node("ReduceSum", [b.node("Mul", [ce, f], name="scaled")], name="total",
                    keepdims=0)
    if logp:
        v = constant(b, "v", rng.standard_normal(shape).astype(np.float32) * 0.1)
        side = b.node("ReduceSum", [b.node("Mul", [res[1], v], name="lv")], name="side",
                      keepdims=0)
        ce = b.node("Add", [ce, side], name="both")
    b.node("Identity", [ce], name="loss")
    b.output("loss", np.float32, ())
    if logp:
        b.output(res[1], np.float32, shape)
    return b.build()


def feeds_for(shape, ignore_index=None, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, shape[1], shape[:1] + shape[2:])
    if ignore_index is not None:
        labels[rng.random(labels.shape) < 0.3] = ignore_index
    return {"x": (rng.standard_normal(shape) * 2).astype(np.float32), "labels": labels}


def both(graph, feeds, outputs=None, wrt=("x",)):
    ref = ReferenceExecutor(graph).train().inference_and_backprop(feeds, outputs=outputs,
                                                                  wrt=list(wrt))
    planned = PlannedExecutor(graph).train()
    ours = planned.inference_and_backprop(feeds, outputs=outputs, wrt=list(wrt))
    return ref, ours, planned


# (70, 300): a vocabulary-sized (N, C) row, past kVectorClasses (exp_vec and lane sums)
@pytest.mark.parametrize("shape", [(6, 5), (3, 7, 9), (2, 4, 3, 70), (70, 300)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, IGNORE, 2])
@pytest.mark.parametrize("weights", [False, True])
def test_loss_and_gradient_match_the_operator(shape, reduction, ignore_index, weights):
    graph = loss_graph(shape, reduction, ignore_index, weights)
    feeds = feeds_for(shape, ignore_index)
    (rv, rg), (ov, og), planned = both(graph, feeds)
    assert planned.placement()["ce"] == "native"
    close(ov["loss"], rv["loss"], "loss")
    close(og["x"], rg["x"], "d scores")


def test_nc_rows_are_the_replaced_loops_to_the_bit():
    """(N, C) scores: std::exp summed in class order, as the loop the kernel replaced, not the
    vectorised exp_vec that (N, C, d...) uses. Both are within about 1 ulp of float64, but a
    ReLU classifier's trajectory is not continuous in the last bit: with exp_vec the BatchNorm
    precision test's CNN crossed a kink at step 5 and ended 3.6e-4 from PyTorch float32 instead
    of 1.4e-6. Checked bit for bit against the C library's expf/logf, which the kernel calls."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    for f in (libm.expf, libm.logf):
        f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
    f32 = np.float32
    shape = (70, 10)  # two of the kernel's tasks of 64 rows
    graph = loss_graph(shape, "mean")
    feeds = feeds_for(shape, seed=6)
    planned = PlannedExecutor(graph).train()
    values, grads = planned.inference_and_backprop(feeds, wrt=["x"])
    assert planned.placement()["ce"] == "native"
    x, labels = feeds["x"], feeds["labels"]
    k = f32(1) / f32(shape[0])  # d(loss)/d(each row's loss)
    expected = np.empty(shape, np.float32)
    for i, row in enumerate(x):
        top, z = row.max(), f32(0)
        for v in row:
            z = f32(z + f32(libm.expf(f32(v - top))))
        logp = row - f32(top + f32(libm.logf(z)))
        expected[i] = [f32(f32(libm.expf(v)) * k) for v in logp]
        expected[i, labels[i]] -= k
    assert np.array_equal(grads["x"], expected), \
        f"d scores differ from the loop's by up to {np.abs(grads['x'] - expected).max():.3g}"


def test_the_mean_divides_by_the_counted_weight():
    """ignore_index and weights: the mean is the weighted sum over the counted elements'
    total weight (numbers by hand)."""
    b = GraphBuilder("loss", 17)
    x = b.input("x", np.float32, (3, 2))
    labels = b.input("labels", np.int64, (3,))
    w = constant(b, "w", np.array([1.0, 3.0], np.float32))
    b.node("SoftmaxCrossEntropyLoss", [x, labels, w], name="loss", reduction="mean",
           ignore_index=IGNORE)
    b.output("loss", np.float32, ())
    feeds = {"x": np.zeros((3, 2), np.float32), "labels": np.array([0, 1, IGNORE])}
    out = PlannedExecutor(b.build()).inference(feeds, ["loss"])["loss"]
    # each counted element's loss is w * log 2; mean over weight 1 + 3: log 2
    np.testing.assert_allclose(out, np.log(2.0), rtol=1e-6)


@pytest.mark.parametrize("shape", [(4, 6), (2, 5, 7)])
def test_fetched_log_probabilities_and_their_gradient(shape):
    graph = loss_graph(shape, "mean", IGNORE, weights=True, logp=True)
    feeds = feeds_for(shape, IGNORE, seed=3)
    (rv, rg), (ov, og), planned = both(graph, feeds, outputs=["logp"])
    assert planned.placement()["ce"] == "native"
    close(ov["logp"], rv["logp"], "logp")
    close(ov["loss"], rv["loss"], "loss")
    close(og["x"], rg["x"], "d scores")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_trained_class_weights_get_the_operators_gradient(reduction):
    shape = (3, 4, 5)
    graph = loss_graph(shape, reduction, IGNORE, weights=True, trained_weights=True)
    feeds = feeds_for(shape, IGNORE, seed=4)
    (rv, rg), (ov, og), planned = both(graph, feeds)
    assert planned.placement()["ce"] == "native"
    close(og["w"], rg["w"], "d weights")
    close(og["x"], rg["x"], "d scores")


def test_gradient_by_central_differences():
    """(N, C, T) with ignored tokens and weights: the planned forward's own loss, perturbed."""
    shape = (2, 3, 4)
    graph = loss_graph(shape, "mean", IGNORE, weights=True)
    feeds = feeds_for(shape, IGNORE, seed=5)
    planned = PlannedExecutor(graph).train()
    _, grads = planned.inference_and_backprop(feeds, wrt=["x"])
    evaluate = PlannedExecutor(graph)
    x = feeds["x"].astype(np.float64)
    eps = 1e-2
    numeric = np.zeros_like(x)
    for i in np.ndindex(*shape):
        for sign in (1, -1):
            y = x.copy()
            y[i] += sign * eps
            value = evaluate.inference({"x": y.astype(np.float32), "labels": feeds["labels"]},
                                       ["loss"])["loss"]
            numeric[i] += sign * float(value) / (2 * eps)
    close(grads["x"], numeric, "d scores", tol=2e-3)


def test_a_label_out_of_range_names_the_node():
    """The plan, once built (tracing checks the first batch's labels), checks them itself."""
    graph = loss_graph((4, 3), "mean")
    feeds = feeds_for((4, 3))
    planned = PlannedExecutor(graph).train()
    planned.inference_and_backprop(feeds, wrt=["x"])
    feeds["labels"][2] = 3
    with pytest.raises(IndexError, match=r"node 'ce'.*\[0, 2\].*got 3"):
        planned.inference_and_backprop(feeds, wrt=["x"])


def test_int32_labels():
    b = GraphBuilder("loss", 17)
    x = b.input("x", np.float32, (5, 4))
    labels = b.input("labels", np.int32, (5,))
    b.node("SoftmaxCrossEntropyLoss", [x, labels], name="loss", reduction="sum")
    b.output("loss", np.float32, ())
    graph = b.build()
    feeds = feeds_for((5, 4))
    feeds["labels"] = feeds["labels"].astype(np.int32)
    (rv, rg), (ov, og), planned = both(graph, feeds)
    assert planned.placement()["loss"] == "native"
    close(ov["loss"], rv["loss"], "loss")
    close(og["x"], rg["x"], "d scores")


def test_gpt_loss_is_a_kernel_and_matches_the_reference():
    """The language models' loss ((N, vocab, T), padding ignored) was a Python step."""
    graph = gpt((16,), classes=11, layers=1, heads=2, width=8, seed=1)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 11, (3, 16))
    labels[:, -3:] = IGNORE
    feeds = {"input": rng.integers(0, 11, (3, 16)), "labels": labels}
    ref_values, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(feeds)
    planned = PlannedExecutor(graph).train()
    values, grads = planned.inference_and_backprop(feeds)
    assert planned.placement()["loss"] == "native"
    close(values["loss"], ref_values["loss"], "loss")
    for name, g in ref_grads.items():
        close(grads[name], g, name)
