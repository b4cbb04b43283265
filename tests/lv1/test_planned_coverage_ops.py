"""Plan coverage of current models' operators (issue 41 item 2): CumSum, ScatterND, Trilu,
Range, Tile and Expand as plan steps (cpp/plan/scan.cpp, scatter.cpp, mask.cpp, the fused
pointwise kernel), RMSNormalization and RotaryEmbedding (opset 23) decomposed into the nodes
the plan's kernels run. Each: forward and backward equal to the reference executor's, the
feeds made in another process (pickled across, as a data loader's workers send them), the
gradients asked for by an initializer's name and by a feed's, and ``placement()`` saying the
node runs in the plan. Then the ONNX node suite's cases of these operators (slow)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
from pathlib import Path

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

ROOT = Path(__file__).resolve().parents[2]


def _make_feeds(queue, shapes: dict, seed: int) -> None:
    """A worker process: float32 feeds of ``shapes`` into ``queue`` (pickled across)."""
    rng = np.random.default_rng(seed)
    queue.put({n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()})


def feeds_from_another_process(shapes: dict, seed: int = 0) -> dict:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    worker = context.Process(target=_make_feeds, args=(queue, shapes, seed), daemon=True)
    worker.start()
    try:
        feeds = queue.get(timeout=60)
    finally:
        worker.join(timeout=60)
    return feeds


def check(b: GraphBuilder, y: str, shape, feeds: dict, wrt: list[str], node: str,
          extra: dict | None = None) -> str:
    """loss = sum(y * uneven weights); planned == reference for the loss and the gradients of
    ``wrt``; returns ``node``'s placement."""
    w = b.initializer("loss_w", np.random.default_rng(9).uniform(0.5, 1.5, shape)
                      .astype(np.float32))
    b.node("ReduceSum", [b.node("Mul", [y, w], name="weigh")], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    g = b.build()
    feeds = {**feeds, **(extra or {})}
    ref = ReferenceExecutor(g).inference_and_backprop(feeds, "loss", wrt=wrt)
    planned = PlannedExecutor(g)
    out = planned.inference_and_backprop(feeds, "loss", wrt=wrt)
    assert planned.unplanned is None, planned.unplanned
    np.testing.assert_allclose(out[0]["loss"], ref[0]["loss"], rtol=1e-5, atol=1e-5)
    for name in wrt:
        np.testing.assert_allclose(out[1][name], ref[1][name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    place = planned.placement()
    assert not place[node].startswith("python"), place
    return place[node]


def start(name: str, shape, opset: int = 17):
    """A graph whose x = feed + initializer p (both asked a gradient)."""
    b = GraphBuilder(name, opset)
    f = b.input("f", np.float32, shape)
    p = b.initializer("p", np.random.default_rng(5).standard_normal(shape).astype(np.float32))
    return b, b.node("Add", [f, p], name="x"), feeds_from_another_process({"f": shape})


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    shape = (3, 4, 5)
    b, x, feeds = start("cumsum", shape)
    axis = b.initializer("axis", np.array(1, np.int64))
    y = b.node("CumSum", [x, axis], name="op", exclusive=exclusive, reverse=reverse)
    assert check(b, y, shape, feeds, ["f", "p"], "op") == "native"


def test_cumsum_of_a_fed_axis_reads_it_when_run():
    shape = (3, 4, 5)
    b, x, feeds = start("cumsum_fed", shape)
    axis = b.input("axis", np.int32, ())
    y = b.node("CumSum", [x, axis], name="op")
    b.output(y, np.float32, shape)
    g = b.build()
    planned, ref = PlannedExecutor(g), ReferenceExecutor(g)
    for a in (0, 2, -1):
        fed = {**feeds, "axis": np.array(a, np.int32)}
        np.testing.assert_array_equal(planned.inference(fed)[y], ref.inference(fed)[y])
    assert planned.placement()["op"] == "native"


def test_cumsum_float64_gradient_from_two_readers():
    """float64 in the scan kernel; x read by two CumSums, so its gradient's second
    contribution is added in float64 (the builder's own add is float32's)."""
    b = GraphBuilder("cumsum64", 17)
    x = b.input("x", np.float64, (3, 4))
    axis = b.initializer("axis", np.array(1, np.int64))
    y = b.node("Add", [b.node("CumSum", [x, axis], name="op"),
                       b.node("CumSum", [x, axis], name="op2", reverse=1, exclusive=1)])
    w = b.initializer("w", np.random.default_rng(3).uniform(0.5, 1.5, (3, 4)))
    b.node("ReduceSum", [b.node("Mul", [y, w])], name="loss", keepdims=0)
    b.output("loss", np.float64, ())
    g = b.build()
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 4))}
    ref = ReferenceExecutor(g).inference_and_backprop(feeds, "loss", wrt=["x"])
    planned = PlannedExecutor(g)
    out = planned.inference_and_backprop(feeds, "loss", wrt=["x"])
    assert planned.placement()["op"] == planned.placement()["op2"] == "native"
    np.testing.assert_allclose(out[1]["x"], ref[1]["x"], rtol=1e-12)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_data_fed_updates_initializer(reduction):
    shape = (4, 5, 3)
    b = GraphBuilder("scatter", 18)
    data = b.input("data", np.float32, shape)
    idx = b.initializer("idx", np.array([[2, 1], [0, 4], [3, -1], [2, 1]], np.int64))
    upd = b.initializer("upd", np.random.default_rng(1).standard_normal((4, 3))
                        .astype(np.float32))  # (2, 1) twice: the reductions combine both
    y = b.node("ScatterND", [data, idx, upd], name="op", reduction=reduction)
    feeds = feeds_from_another_process({"data": shape})
    assert check(b, y, shape, feeds, ["data", "upd"], "op") == "native"


def test_scatter_nd_raises_on_an_index_out_of_range():
    b = GraphBuilder("scatter_bad", 18)
    data = b.input("data", np.float32, (4, 2))
    idx = b.input("idx", np.int64, (1, 1))
    upd = b.initializer("upd", np.ones((1, 2), np.float32))
    y = b.node("ScatterND", [data, idx, upd], name="op")
    b.output(y, np.float32, (4, 2))
    planned = PlannedExecutor(b.build())
    data = np.zeros((4, 2), np.float32)
    planned.inference({"data": data, "idx": np.array([[3]], np.int64)})
    assert planned.placement()["op"] == "native"
    with pytest.raises(IndexError, match="out of bounds"):
        planned.inference({"data": data, "idx": np.array([[4]], np.int64)})


@pytest.mark.parametrize("upper,k", [(0, 0), (1, 1), (0, -2), (1, None)])
def test_trilu(upper, k):
    shape = (2, 4, 6)
    b, x, feeds = start("trilu", shape, 17)
    inputs = [x] if k is None else [x, b.initializer("k", np.array(k, np.int64))]
    y = b.node("Trilu", inputs, name="op", upper=upper)
    assert check(b, y, shape, feeds, ["f", "p"], "op") == "native"


def test_tile():
    shape = (2, 3, 4)
    b, x, feeds = start("tile", shape)
    y = b.node("Tile", [x, b.initializer("reps", np.array([2, 1, 3], np.int64))], name="op")
    assert check(b, y, (4, 3, 12), feeds, ["f", "p"], "op") == "native"


def test_tile_with_fed_repeats_checks_them_when_run():
    b = GraphBuilder("tile_fed", 17)
    x = b.input("x", np.float32, (2, 3))
    reps = b.input("reps", np.int64, (2,))
    y = b.node("Tile", [x, reps], name="op")
    b.output(y, np.float32, (4, 3))
    planned = PlannedExecutor(b.build())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = planned.inference({"x": x, "reps": np.array([2, 1], np.int64)})[y]
    np.testing.assert_array_equal(got, np.tile(x, (2, 1)))
    with pytest.raises(RuntimeError, match="Tile's repeats"):  # same shapes, other repeats
        planned.inference({"x": x, "reps": np.array([1, 2], np.int64)})


def test_expand_over_two_runs_of_axes():
    """(1, 3, 1, 4) -> (2, 3, 5, 4): two separate runs of broadcast axes (not one run, which
    the GQA kernel takes): the broadcast copy, backward its sum."""
    b = GraphBuilder("expand", 17)
    f = b.input("f", np.float32, (1, 3, 1, 4))
    p = b.initializer("p", np.random.default_rng(5).standard_normal((1, 3, 1, 4))
                      .astype(np.float32))
    x = b.node("Add", [f, p], name="x")
    y = b.node("Expand", [x, b.initializer("to", np.array([2, 3, 5, 4], np.int64))],
               name="op")
    feeds = feeds_from_another_process({"f": (1, 3, 1, 4)})
    assert check(b, y, (2, 3, 5, 4), feeds, ["f", "p"], "op") == "native"


def test_a_bool_mask_expanded_over_heads():
    b = GraphBuilder("mask_expand", 17)
    m = b.input("m", np.bool_, (1, 1, 4, 4))
    y = b.node("Expand", [m, b.initializer("to", np.array([2, 3, 4, 4], np.int64))],
               name="op")
    b.output(y, np.bool_, (2, 3, 4, 4))
    planned = PlannedExecutor(b.build())
    mask = np.tril(np.ones((4, 4), bool)).reshape(1, 1, 4, 4)
    got = planned.inference({"m": mask})[y]
    np.testing.assert_array_equal(got, np.broadcast_to(mask, (2, 3, 4, 4)))
    assert planned.placement()["op"] == "native"


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_range_of_fed_scalars(dtype):
    b = GraphBuilder("range", 17)
    names = [b.input(n, dtype, ()) for n in ("start", "limit", "delta")]
    y = b.node("Range", names, name="op")
    b.output(y, dtype, None)
    planned = PlannedExecutor(b.build())
    fed = {n: np.array(v, dtype) for n, v in zip(names, (3, 10, 2))}
    got = planned.inference(fed)[y]
    np.testing.assert_array_equal(got, ReferenceExecutor(b.build()).inference(fed)[y])
    assert got.dtype == dtype and planned.placement()["op"] == "native"
    with pytest.raises(RuntimeError, match="Range gives 2 elements where the plan traced 4"):
        planned.inference({**fed, "limit": np.array(7, dtype), "start": np.array(4, dtype)})


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization(axis):
    shape = (2, 3, 8)
    b = GraphBuilder("rms", 23)
    x = b.input("x", np.float32, shape)
    scale = b.initializer("scale", np.random.default_rng(2).uniform(0.5, 1.5, shape[axis:])
                          .astype(np.float32))
    y = b.node("RMSNormalization", [x, scale], name="op", axis=axis, epsilon=1e-5)
    feeds = feeds_from_another_process({"x": shape})
    assert check(b, y, shape, feeds, ["x", "scale"], "op").startswith("decomposed")


@pytest.mark.parametrize("interleaved,rotary_dim,fed_ids,rank",
                         [(0, 0, True, 4), (1, 0, True, 4), (0, 4, False, 4),
                          (1, 4, True, 3)])
def test_rotary_embedding(interleaved, rotary_dim, fed_ids, rank):
    bsz, heads, seq, d = 2, 3, 5, 8
    half = (rotary_dim or d) // 2
    shape = (bsz, heads, seq, d) if rank == 4 else (bsz, seq, heads * d)
    b = GraphBuilder("rope", 23)
    x = b.input("x", np.float32, shape)
    rng = np.random.default_rng(4)
    cos = b.initializer("cos", rng.standard_normal((16, half)).astype(np.float32))
    sin = b.input("sin", np.float32, (16, half))
    ids = b.input("ids", np.int64, (bsz, seq)) if fed_ids else \
        b.initializer("ids", rng.integers(0, 16, (bsz, seq)))
    y = b.node("RotaryEmbedding", [x, cos, sin, ids], name="op", interleaved=interleaved,
               rotary_embedding_dim=rotary_dim, **({"num_heads": heads} if rank == 3 else {}))
    feeds = feeds_from_another_process({"x": shape, "sin": (16, half)})
    extra = {"ids": rng.integers(0, 16, (bsz, seq))} if fed_ids else {}
    assert check(b, y, shape, feeds, ["x", "cos", "sin"], "op", extra) \
        .startswith("decomposed")


@pytest.mark.parametrize("causal,mask", [(1, None), (0, "bool"), (1, "float")])
def test_attention_grouped_query(causal, mask):
    """4 query heads on 2 K/V heads; a fed bool mask with a row hiding every key (the
    operator gives it zero weights, and zero gradients, not NaN)."""
    bsz, hq, hk, seq, e = 2, 4, 2, 5, 8
    b = GraphBuilder("attention", 23)
    q = b.input("q", np.float32, (bsz, hq, seq, e))
    k = b.initializer("k", np.random.default_rng(6).standard_normal((bsz, hk, seq, e))
                      .astype(np.float32))
    v = b.input("v", np.float32, (bsz, hk, seq, e))
    inputs, extra = [q, k, v], {}
    if mask == "bool":
        inputs.append(b.input("m", np.bool_, (seq, seq)))
        allowed = np.random.default_rng(7).uniform(size=(seq, seq)) < 0.6
        allowed[2] = False
        extra["m"] = allowed
    elif mask == "float":
        inputs.append(b.input("m", np.float32, (bsz, 1, seq, seq)))
    y = b.node("Attention", inputs, name="op", is_causal=causal)
    feeds = feeds_from_another_process({"q": (bsz, hq, seq, e), "v": (bsz, hk, seq, e),
                                        **({"m": (bsz, 1, seq, seq)} if mask == "float"
                                           else {})})
    wrt = ["q", "k", "v", *(["m"] if mask == "float" else [])]
    assert check(b, y, (bsz, hq, seq, e), feeds, wrt, "op", extra).startswith("decomposed")


def test_attention_3d_inputs():
    bsz, seq, hq, hk, e = 2, 4, 4, 1, 6
    b = GraphBuilder("attention3d", 23)
    q = b.input("q", np.float32, (bsz, seq, hq * e))
    k = b.input("k", np.float32, (bsz, seq, hk * e))
    v = b.initializer("v", np.random.default_rng(8).standard_normal((bsz, seq, hk * e))
                      .astype(np.float32))
    y = b.node("Attention", [q, k, v], name="op", q_num_heads=hq, kv_num_heads=hk,
               scale=0.3)
    feeds = feeds_from_another_process({"q": (bsz, seq, hq * e), "k": (bsz, seq, hk * e)})
    assert check(b, y, (bsz, seq, hq * e), feeds, ["q", "k", "v"], "op") \
        .startswith("decomposed")


def test_isnan_where_after_a_softmax():
    """PyTorch's scaled_dot_product_attention export: Where(IsNaN(p), 0, p) after the
    softmax (a fully masked row) in one fused step, gradients through the Where."""
    shape = (3, 4, 5)
    b, x, feeds = start("isnan", shape)
    p = b.node("Softmax", [x], axis=-1)
    zero = b.initializer("zero", np.array(0, np.float32))
    y = b.node("Where", [b.node("IsNaN", [p], name="op"), zero, p], name="where")
    assert check(b, y, shape, feeds, ["f", "p"], "op") == "native"  # the Where fused into it


def test_rotary_function_body_split_with_an_empty_part_and_a_whole_slice():
    """RotaryEmbedding's ONNX function body (all features rotated): Split into [D, 0] (the
    part kept back is empty) and a Slice of the caches that cuts nothing (a view)."""
    shape = (2, 3, 8)
    b, x, feeds = start("split_empty", shape, 18)
    sizes = b.initializer("sizes", np.array([8, 0], np.int64))
    rot, rest = b.node("Split", [x, sizes], 2, name="op", axis=-1)
    whole = b.node("Slice", [rot, b.initializer("s0", np.array([0], np.int64)),
                             b.initializer("s1", np.array([8], np.int64)),
                             b.initializer("s2", np.array([-1], np.int64))], name="whole")
    y = b.node("Concat", [whole, rest], name="join", axis=-1)
    assert check(b, y, shape, feeds, ["f", "p"], "op") == "onednn"


# -- the ONNX node suite's cases --------------------------------------------------------------
COVERED = {"CumSum", "ScatterND", "Trilu", "Range", "Tile", "Expand", "RMSNormalization",
           "RotaryEmbedding", "Sum", "Attention", "IsNaN", "IsInf"}
# (the _expanded cases run the operators' function bodies, not these operators)
PATTERNS = {"attention": r"^test_attention_(?!.*_expanded$)",
            "others": r"^test_(cumsum|scatternd|tril|triu|range|tile|expand|rms_normalization|"
                      r"rotary_embedding|sum|isnan|isinf)(_|$)(?!.*_expanded$)"}


def attention_left(node, values) -> bool:
    """An Attention node the decomposition leaves to the operator (patterns._attention says
    why): nonpad_kv_seqlen, windows (opsets 24, 25), a softmax precision other than float32,
    a mask shorter than the keys (past ones included)."""
    ins = list(node.inputs) + [""] * 7
    mask, k, past = ins[3], ins[1], ins[4]
    keys = values[k].shape[-2] + (values[past].shape[2] if past else 0)  # 3-D or 4-D K
    return bool(ins[6]) or any("window" in a for a in node.attrs) \
        or node.attrs.get("softmax_precision") not in (None, 1) \
        or bool(mask) and values[mask].shape[-1] != keys


@pytest.mark.slow  # 9 s and 48 s on the loaded shared machine: each case planned twice
@pytest.mark.parametrize("which", sorted(PATTERNS))
def test_the_node_suite_cases_pass_with_the_op_in_the_plan(which, monkeypatch):
    spec = importlib.util.spec_from_file_location("onnx_node_suite",
                                                  ROOT / "tools" / "onnx_node_suite.py")
    suite = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = suite
    spec.loader.exec_module(suite)
    from meta.lv1.plan import executor

    python: dict[str, str] = {}  # "op/node" -> why it ran the operator's code
    lowered: set[str] = set()  # op types seen in the plan
    for method in ("inference", "inference_and_backprop"):
        original = getattr(executor.PlannedExecutor, method)

        def recording(self, *args, _original=original, **kwargs):
            result = _original(self, *args, **kwargs)
            place, values = self.placement(), getattr(self._last, "values", None)
            for n in self.graph.nodes if values is not None else ():  # None: not planned
                where = place.get(n.name, "")
                if n.op_type not in COVERED or not where:
                    continue
                if not where.startswith("python"):
                    lowered.add(n.op_type)
                elif values[n.inputs[0]].dtype == np.float32 and not (
                        n.op_type == "Expand" and n.inputs[1] in
                                       {i.name for i in self.graph.inputs}) \
                        and not (n.op_type == "Attention" and attention_left(n, values)):
                    python[f"{n.op_type}/{n.name}"] = where  # float32: must be planned
            return result
        monkeypatch.setattr(executor.PlannedExecutor, method, recording)
    report = suite.planned_report(PATTERNS[which])
    assert not report["failed"], report["failed"]
    assert len(report["passed"]) > 40 and len(report["graded"]) > 30, \
        {k: len(v) for k, v in report.items()}
    # (the suite's Expand cases feed their shape: Expand is checked above, not here)
    assert (COVERED - {"Attention", "Expand"} if which == "others" else {"Attention"}) \
        <= lowered, lowered
    assert not python, python


def test_inspect_gives_a_decomposed_node_the_time_of_its_parts():
    """`meta inspect --plan`: an opset-23 node the plan rewrote into parts (named
    "<node>/<Op>_<i>") is shown with their time, not an empty column."""
    from meta.lv1.plan.inspect_plan import node_time
    from meta.lv1.plan.profile_share import NodeTime

    times = {"rms/Mul_0": NodeTime("rms/Mul_0", "Mul", "onednn", 3),
             "rms/ReduceMean_1": NodeTime("rms/ReduceMean_1", "ReduceMean", "native", 4),
             "rmsx": NodeTime("rmsx", "Add", "native", 100)}
    assert node_time(times, "rms").ns == 7
    assert node_time(times, "rmsx").ns == 100
    assert node_time(times, "other") is None
