"""A bf16 plan keeps a CNN's activations in bf16 between its convolutions (issue 42), as
PyTorch's CPU autocast does: a convolution reads each activation's one bf16 copy (forward
and weights' gradient) and its output gradient's one copy (both backward products), never
converting a float32 tensor inside its step where the plan holds it in bf16 already; a
training BatchNorm reads the convolution's bf16 output (forward and backward), writes its
output (+ReLU) in bf16 where only convolutions read it and hands back its input's gradient
in bf16, and takes in a block's end, relu(bn(x) + r), so the residual stream is bf16 too;
statistics and sums stay float32 (double). The float32 plan is unchanged."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from meta.lv1 import PlannedExecutor, resnet20
from meta.lv1.plan import precision, runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)


def relative(ours, theirs) -> float:
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    return float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))


def train_step(mode: str, seed: int = 0):
    graph = resnet20((3, 8, 8), width=16, seed=0)
    rng = np.random.default_rng(seed)
    feeds = {"input": rng.standard_normal((8, 3, 8, 8), dtype=np.float32),
             "labels": rng.integers(0, 10, 8)}
    ex = PlannedExecutor(graph, precision=mode).train()
    values, grads = ex.inference_and_backprop(feeds, "loss")
    return graph, ex, float(values["loss"]), {k: np.array(g, copy=True) for k, g in grads.items()}


def conv_steps(plan):
    return [s for s in plan.order if s.name in ("conv", "conv backward data",
                                                "conv backward weights")]


def test_bf16_resnet_keeps_activations_between_convolutions_in_bf16(native):
    graph, ex, loss16, g16 = train_step("bf16")
    _, ex32, loss32, g32 = train_step("f32")
    plan = ex._last
    values, only = plan.values, plan.objects[precision.ONLY]
    convs = [n for n in graph.nodes if n.op_type == "Conv"]
    norms = [n for n in graph.nodes if n.op_type == "BatchNormalization"]
    # every convolution's product reads its activation operands in bf16: its input (forward
    # and dW) and its output gradient (dX and dW), none converted inside the step
    steps = conv_steps(plan)
    assert len([s for s in steps if s.name == "conv"]) == len(convs)
    for s in steps:
        activations = [s.reads[0]] if s.name != "conv backward weights" else s.reads[:2]
        for name in activations:
            assert values[name].dtype == precision.BF16, (s.name, s.node, name)
    # each convolution writes its output in bf16 only (its one reader, a training BatchNorm,
    # reads bf16), and the BatchNorm hands back that output's gradient in bf16
    for node in convs:
        y = node.outputs[0]
        assert y in only, y
        assert plan.objects[precision.COPIES][f"{y}@grad"] != f"{y}@grad"
        assert f"{y}@grad" in only
    # a BatchNorm(+ReLU) read only by convolutions and residual additions a BatchNorm takes
    # in (relu(bn(x) + r): a block's end) writes bf16, so the residual stream is bf16 too;
    # one the pooling reads writes float32
    adds = [n for n in graph.nodes if n.op_type == "Add"]
    assert adds and all(plan.placement[n.name].startswith("fused into") for n in adds)
    kinds = set()
    for node in norms:
        fused = [n for n in graph.nodes if plan.placement.get(n.name) == f"fused into {node.name}"]
        out = fused[-1].outputs[0] if fused else node.outputs[0]
        readers = [n for n in graph.nodes if out in n.inputs]
        by_bf16 = all(n.op_type == "Conv" or n in adds for n in readers)
        assert (out in only) == by_bf16, (node.name, out, [n.op_type for n in readers])
        kinds.add(by_bf16)
    assert kinds == {True, False}
    # one conversion per tensor
    converted = [s.reads[0] for s in plan.order if s.name == "to bf16"]
    assert len(converted) == len(set(converted))
    # no step reads a float32 value the plan keeps only in bf16 (the compiler checks it too)
    assert not any(only.intersection(s.reads) for s in plan.order)
    # loss and the classifier's gradient near float32's (the ReLUs' kinks move the earlier
    # layers' gradients in any bf16 run: tests/lv1/test_bf16_gradients.py bounds them)
    assert abs(loss16 - loss32) < 2e-2 * abs(loss32), (loss16, loss32)
    for name in ("logits.weight", "logits.bias"):
        if name in g32:
            assert 0 < relative(g16[name], g32[name]) < 5e-2, name
    # the float32 plan holds nothing in bf16 and converts nothing
    plan32 = ex32._last
    assert not any(v.dtype == precision.BF16 for v in plan32.values.values())
    assert not any(s.name == "to bf16" for s in plan32.order)


def test_conv_reads_a_bf16_array_where_it_lies_as_it_reads_a_converted_one(native):
    """A bf16 convolution given bf16 arrays (input, output gradient) computes bit for bit
    what it computes converting float32 ones (both round to nearest even), and writes a bf16
    output, with ``bf16_output``, equal to its float32 one rounded."""
    rt = runtime.module()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16, 10, 10)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((4, 32, 10, 10)).astype(np.float32)
    args = ([4, 16, 10, 10], [32, 16, 3, 3], False, [1, 1], [1, 1], [1, 1], [1, 1], 1, [], True,
            True, True, "nhwc", True)
    k32, k16 = rt.Conv(*args), rt.Conv(*args, True)
    assert k16.bf16_output and not k32.bf16_output
    assert k32.src_layout == k16.src_layout == "nhwc"
    xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # channels-last bytes
    dyh = np.ascontiguousarray(dy.transpose(0, 2, 3, 1))

    def run(k, xa, dya, y):
        def buf(which):
            n = k.weights_bytes(which)
            return np.zeros(-(-n // 4), np.float32) if n else None
        wf, wb, dwb = buf("forward"), buf("backward_data"), buf("diff_weights")
        dx, dw = np.zeros_like(xh), np.zeros_like(w)
        steps = [k.reorder_weights("forward", w, wf)] if wf is not None else []
        steps.append(k.forward(xa, w, None, y, [], wf))
        if wb is not None:
            steps.append(k.reorder_weights("backward_data", w, wb))
        steps.append(k.backward_data(dya, w, dx, wb))
        steps += list(k.backward_weights(xa, dya, dw, None, dwb))
        for s in steps:
            s.run()
        return dx, dw

    y32 = np.zeros_like(dyh)
    dx32, dw32 = run(k32, xh, dyh, y32)
    y16 = np.zeros(dyh.shape, ml_dtypes.bfloat16)
    dx16, dw16 = run(k16, bf16(xh), bf16(dyh), y16)
    np.testing.assert_array_equal(dx16, dx32)
    np.testing.assert_array_equal(dw16, dw32)
    np.testing.assert_array_equal(y16, bf16(y32))


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("layout", ["nhwc", "plain"])
def test_batchnorm_reads_and_writes_bf16_as_float32_rounded(native, relu, layout):
    """Training BatchNorm on bf16 arrays: the forward equals the float32 loops' on the same
    (bf16-valued) input, rounded once to bf16; the backward from a bf16 input and gradient,
    written in bf16, equals the float32 one's rounded, within a unit of bf16; the statistics
    and d(scale), d(bias) are float32's to float32 rounding."""
    rt = runtime.module()
    rng = np.random.default_rng(1)
    dims = [4, 24, 6, 6]
    shape = (4, 6, 6, 24) if layout == "nhwc" else tuple(dims)
    x = np.asarray(bf16(rng.standard_normal(shape) * 3 + 1), np.float32)  # bf16 values
    dy = np.asarray(bf16(rng.standard_normal(shape)), np.float32)
    scale = rng.standard_normal(24).astype(np.float32)
    shift = rng.standard_normal(24).astype(np.float32)
    mean, var = np.zeros(24, np.float32), np.ones(24, np.float32)

    def run(xa, dya, out_type, dx_type):
        k = rt.BatchNorm(dims, layout, 1e-5, 0.9, True, relu)
        y = np.zeros(shape, out_type)
        dx = np.zeros(shape, dx_type)
        ds, db = np.zeros(24, np.float32), np.zeros(24, np.float32)
        m, v = mean.copy(), var.copy()
        for s in (k.forward(xa, scale, shift, m, v, y), k.update(m, v),
                  k.backward(xa, dya, scale, dx, ds, db, shift)):
            s.run()
        return y, dx, ds, db, m, v

    y32, dx32, ds32, db32, m32, v32 = run(x, dy, np.float32, np.float32)
    y16, dx16, ds16, db16, m16, v16 = run(bf16(x), bf16(dy), ml_dtypes.bfloat16,
                                          ml_dtypes.bfloat16)
    assert y16.dtype == dx16.dtype == ml_dtypes.bfloat16
    ulp = 2.0 ** -7  # bf16's relative spacing
    y16f, y32r = np.asarray(y16, np.float32), np.asarray(bf16(y32), np.float32)
    assert np.all(np.abs(y16f - y32r) <= ulp * np.abs(y32) + 1e-6)
    assert np.all(np.abs(np.asarray(dx16, np.float32) - dx32) <= ulp * np.abs(dx32) + 1e-6)
    for ours, theirs in ((ds16, ds32), (db16, db32), (m16, m32), (v16, v32)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    # a bf16 input read as is, the output and the gradient float32: the float32 loops' figures
    y_mixed, dx_mixed, *_ = run(bf16(x), dy, np.float32, np.float32)
    np.testing.assert_allclose(y_mixed, y32, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx_mixed, dx32, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("accumulate", [False, True])
def test_batchnorm_with_a_residual_is_relu_of_bn_plus_r_and_hands_r_its_gradient(native,
                                                                                 accumulate):
    """relu(bn(x) + r) in one pass (a ResNet block's end), bf16 in and out: the output equals
    numpy's float64 formula on the same values within bf16's rounding; the backward masks dy
    by y > 0, writes that masked dy as r's gradient (added to what is there with
    ``accumulate``) and computes dx, d(scale), d(bias) from it as a BatchNorm without ReLU
    given the masked dy does."""
    rt = runtime.module()
    rng = np.random.default_rng(2)
    dims, shape = [4, 32, 5, 5], (4, 5, 5, 32)  # channels-last
    x = np.asarray(bf16(rng.standard_normal(shape) * 2 - 1), np.float32)
    r = np.asarray(bf16(rng.standard_normal(shape)), np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    scale = rng.standard_normal(32).astype(np.float32)
    shift = rng.standard_normal(32).astype(np.float32)
    k = rt.BatchNorm(dims, "nhwc", 1e-5, 0.9, True, True)
    y = np.zeros(shape, ml_dtypes.bfloat16)
    dx = np.zeros(shape, ml_dtypes.bfloat16)
    before = rng.standard_normal(shape).astype(np.float32)
    dr = before.copy()
    ds, db = np.zeros(32, np.float32), np.zeros(32, np.float32)
    mean, var = np.zeros(32, np.float32), np.ones(32, np.float32)
    x16, r16 = bf16(x), bf16(r)  # alive while the steps run (they keep raw pointers)
    k.forward(x16, scale, shift, mean, var, y, r16).run()
    k.backward(x16, dy, scale, dx, ds, db, shift, y, dr, accumulate).run()
    x64 = x.astype(np.float64)
    m, v = x64.mean((0, 1, 2)), x64.var((0, 1, 2))
    xhat = (x64 - m) / np.sqrt(v + 1e-5)
    want = np.maximum(xhat * scale + shift + r, 0)
    y32 = np.asarray(y, np.float32)
    assert np.all(np.abs(y32 - want) <= 2 ** -7 * np.abs(want) + 1e-5)
    g = np.where(y32 > 0, dy, 0)  # masked by the bf16 output the plan keeps
    np.testing.assert_allclose(dr, g + before if accumulate else g, rtol=1e-6, atol=1e-6)
    # dx from the masked dy: a BatchNorm without ReLU on float32 arrays
    plain = rt.BatchNorm(dims, "nhwc", 1e-5, 0.9, True, False)
    y2, dx2 = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    ds2, db2 = np.zeros(32, np.float32), np.zeros(32, np.float32)
    plain.forward(x, scale, shift, mean.copy(), var.copy(), y2).run()
    g32 = g.astype(np.float32)
    plain.backward(x, g32, scale, dx2, ds2, db2, shift).run()
    assert np.all(np.abs(np.asarray(dx, np.float32) - dx2) <= 2 ** -7 * np.abs(dx2) + 1e-5)
    np.testing.assert_allclose(ds, ds2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, db2, rtol=1e-5, atol=1e-5)


def conv_weight_gradient(x, dy, kernel, strides, pads) -> np.ndarray:
    """dW of a convolution (no groups, no dilation) in float64, from NCHW arrays."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    (kh, kw), (sh, sw), (ph, pw) = kernel, strides, pads
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = dy.shape[2:]
    dw = np.zeros((dy.shape[1], x.shape[1], kh, kw))
    for i in range(kh):
        for j in range(kw):
            window = xp[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw]
            dw[:, :, i, j] = np.einsum("nchw,nohw->oc", window, dy)
    return dw


@pytest.mark.parametrize("image,kernel,stride,pad", [
    (4, (3, 3), 1, 1),  # ResNet-18's last stage (CIFAR size): 4x4 outputs
    (8, (3, 3), 2, 1),  # its stride-2 entry
    (8, (1, 1), 2, 0),  # its shortcut
    (16, (3, 3), 2, 1),  # the stride-2 entry of the stage before: 8x8 outputs, strided
    (5, (3, 2), 1, 0),  # a kernel neither 3x3 nor 1x1, windows clipped by no padding
])
def test_small_output_weight_gradient_is_im2col_and_a_product(native, monkeypatch, image,
                                                              kernel, stride, pad):
    """A bf16 convolution with at most 16 output positions (64 when strided) computes dW as
    im2col + one matrix product (``gemm_dw``), written straight into the plain gradient: it
    equals the float64 gradient of the same bf16 operands to float32 accumulation, and the
    direct kernel's (``META_CONV_GEMM_DW=0``); float32 operands fall back to the direct
    kernel."""
    rt = runtime.module()
    rng = np.random.default_rng(1)
    n, ci, co = 3, 24, 40
    x = bf16(rng.standard_normal((n, ci, image, image)))
    w = rng.standard_normal((co, ci, *kernel)).astype(np.float32)
    args = ([n, ci, image, image], [co, ci, *kernel], False, [stride] * 2, [pad] * 2, [pad] * 2,
            [1, 1], 1, [], True, False, True, "nhwc", True)
    k = rt.Conv(*args)
    monkeypatch.setenv("META_CONV_GEMM_DW", "0")
    direct = rt.Conv(*args)
    assert k.gemm_dw and not direct.gemm_dw and "im2col + matmul" in k.info
    oh, ow = k.dst_dims[2:]
    dy = bf16(rng.standard_normal((n, co, oh, ow)))
    xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    dyh = np.ascontiguousarray(dy.transpose(0, 2, 3, 1))

    def dw_of(kernel_, xa, dya):
        size = kernel_.dw_workspace_bytes()
        work = np.full(-(-size // 4), np.nan, np.float32) if size else None
        dw = np.full(w.shape, np.nan, np.float32)
        for s in kernel_.backward_weights(xa, dya, dw, None, work):
            s.run()
        return dw

    want = conv_weight_gradient(x, dy, kernel, (stride, stride), (pad, pad))
    ours, theirs = dw_of(k, xh, dyh), dw_of(direct, xh, dyh)
    assert relative(ours, want) < 1e-6
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # float32 operands: the direct kernel converts them; the same gradient
    f32 = dw_of(k, xh.astype(np.float32), dyh.astype(np.float32))
    np.testing.assert_array_equal(f32, theirs)


def test_weight_gradient_over_larger_outputs_keeps_the_direct_kernel(native):
    """Over 16 output positions at stride 1 (8x8) the direct kernel is as fast as the product
    (cpp/plan/conv.cpp): no im2col; nor in a float32 plan."""
    rt = runtime.module()
    args = ([2, 16, 8, 8], [16, 16, 3, 3], False, [1, 1], [1, 1], [1, 1], [1, 1], 1, [], True,
            True, True, "nhwc")
    assert not rt.Conv(*args, True).gemm_dw
    small = list(args)
    small[0] = [2, 16, 4, 4]
    assert rt.Conv(*small, True).gemm_dw and not rt.Conv(*small, False).gemm_dw


def test_backward_data_weights_are_reordered_from_the_forward_bf16_copy(native):
    """A bf16 plan's backward-data weights are reordered from the forward's bf16 copy, not
    from the float32 weights again (half the bytes read): the same bits, as the kernel
    reorders them; a float32 plan reorders from the weights."""
    rt = runtime.module()
    w = np.random.default_rng(2).standard_normal((64, 32, 3, 3)).astype(np.float32)
    k = rt.Conv([4, 32, 4, 4], [64, 32, 3, 3], False, [1, 1], [1, 1], [1, 1], [1, 1], 1, [],
                True, True, True, "nhwc", True)
    assert k.weights_bytes("forward") and k.weights_bytes("backward_data")

    def buf(which):
        return np.full(-(-k.weights_bytes(which) // 4), np.nan, np.float32)
    wf, wb, wb2 = buf("forward"), buf("backward_data"), buf("backward_data")
    k.reorder_weights("forward", w, wf).run()
    k.reorder_weights("backward_data", w, wb).run()
    k.reorder_weights_from("forward", wf, "backward_data", wb2).run()
    np.testing.assert_array_equal(wb2.view(np.uint32), wb.view(np.uint32))

    for mode in ("bf16", "f32"):
        _, ex, _, _ = train_step(mode)
        plan = ex._last
        steps = [s for s in plan.order if s.name == "conv weights -> backward_data layout"]
        assert steps
        from_forward = ["@forward#" in s.reads[0] for s in steps]
        assert all(from_forward) if mode == "bf16" else not any(from_forward), mode
