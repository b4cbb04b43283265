"""What a bf16 plan's step keeps, and where (issue 42: the GPT step's added memory in bf16 at
most 0.65x float32's). The float32 values a bf16 plan keeps only as their bf16 holders have
no bytes (storage "none", no array); the MLP's first product writes its output in bf16 only
and Gelu reads it there, as autocast does; a bf16 plan's backward products compute the
weight's gradient before the input's, so the layer's saved bf16 input is free before the
input's gradient is written; the arena packs values of equal size by lifetime when that is
smaller than by birth; the attention's products read bf16 copies of P and dS in the arena
(no product converts an operand into the resident staging buffer); and the LayerNorm and
Gelu backwards write over what only they read."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import PlannedExecutor, gpt
from meta.lv1.plan import memory, precision, runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def plan_of(mode: str, n: int = 4, t: int = 32):
    rng = np.random.default_rng(0)
    feeds = {"input": rng.integers(0, 65, (n, t)), "labels": rng.integers(0, 65, (n, t))}
    ex = PlannedExecutor(gpt((t,), seed=0), precision=mode).train()
    ex.inference_and_backprop(feeds, "loss")
    return ex._last


def test_values_kept_in_bf16_only_have_no_bytes(native):
    plan = plan_of("bf16")
    only = plan.objects[precision.ONLY]
    assert {"h0.ln1", "h0.mlp.fc", "h0.mlp.gelu", "h0.mlp.gelu@grad"} <= only
    for name in only:
        v = plan.values[name]
        assert v.storage == "none" and v.array is None, name
        assert name not in plan.offsets
    touched = {n for s in plan.order for n in (*s.reads, *s.writes)}
    assert not touched & only
    # the float32 plan declares nothing without bytes
    assert all(v.storage != "none" for v in plan_of("f32").values.values())


def test_gelu_reads_the_products_bf16_output(native):
    plan = plan_of("bf16")
    holders = plan.objects[precision.COPIES]
    fc = next(s for s in plan.order if s.node == "h0.mlp.fc.matmul" and s.phase == "forward"
              and s.name.startswith("matmul"))
    gelu = next(s for s in plan.order if s.node == "h0.mlp.gelu" and s.phase == "forward")
    assert fc.writes == (holders["h0.mlp.fc"],) and gelu.reads == (holders["h0.mlp.fc"],)
    assert plan.values[holders["h0.mlp.fc"]].dtype == precision.BF16


def backward_products(plan, node: str) -> list[str]:
    """What each backward product of ``node`` writes, in plan order."""
    return [s.writes[0] for s in plan.order
            if s.node == node and s.phase == "backward" and s.name.startswith("matmul")]


def test_bf16_products_compute_the_weights_gradient_first(native):
    written = backward_products(plan_of("bf16"), "h0.mlp.proj.matmul")
    assert written[0] == "h0.mlp.proj.weight@grad" and len(written) == 2
    # the float32 plan keeps its order: the input's gradient first
    assert backward_products(plan_of("f32"), "h0.mlp.proj.matmul")[1] \
        == "h0.mlp.proj.weight@grad"


def test_the_arena_packs_the_longest_lived_first_when_smaller():
    # largest first: c, d at 0; a (alive with c) above c; b (alive with d and a) above a
    sizes = {"a": 64, "b": 64, "c": 128, "d": 128}
    spans = {"a": (2, 4), "b": (1, 2), "c": (3, 4), "d": (0, 1)}
    offsets, total = memory.assign_offsets(sizes, spans)
    assert total == 192  # longest-lived first: a at 0, c above it, d at 0, b above d
    assert offsets == {"a": 0, "c": 64, "d": 0, "b": 128}


def test_the_arena_packs_equal_sizes_by_lifetime_when_smaller():
    # by birth: b, c, then a over b's bytes; d (alive with c and a) finds no gap below c
    sizes = {"a": 128, "b": 128, "c": 128, "d": 64}
    spans = {"a": (4, 4), "b": (1, 1), "c": (1, 2), "d": (2, 4)}
    offsets, total = memory.assign_offsets(sizes, spans)
    assert total == 256  # by lifetime: c, a, b, then d above a (birth order's: 320)
    for x in sizes:
        for y in sizes:
            alive = not (spans[x][1] < spans[y][0] or spans[y][1] < spans[x][0])
            if x < y and alive:
                assert offsets[x] + sizes[x] <= offsets[y] or offsets[y] + sizes[y] \
                    <= offsets[x], (x, y)



def test_the_attention_backward_reads_its_dy_as_one_bf16_copy_of_the_plan(native):
    """Both attention products reading dY read the plan's one bf16 copy of it (a conversion
    step in the arena, free after the backward), not a float32 dY each product converts into
    the process-wide staging buffer (1 MiB resident at the GPT's sequence 256)."""
    plan = plan_of("bf16")
    step = next(s for s in plan.order if s.name == "attention backward")
    dy = step.reads[0]
    assert plan.values[dy].dtype == precision.BF16, dy
    convert = next(s for s in plan.order if s.writes == (dy,))
    assert convert.name == "to bf16" and convert.phase == "backward"
    # the float32 plan reads the float32 dY itself
    f32 = plan_of("f32")
    step = next(s for s in f32.order if s.name == "attention backward")
    assert f32.values[step.reads[0]].dtype == np.float32


def test_the_attention_products_read_bf16_probabilities_from_the_arena(native, monkeypatch):
    """No product of a bf16 plan converts a float32 operand itself (into the process-wide
    staging buffer, resident for the process: 1 MiB at the GPT's sequence 256): the
    attention's softmax and its backward write their output's bf16 copy into the arena, which
    P . V, P^T . dY and dS's products read."""
    from meta import _plan
    real, converts = _plan.matmul, []

    def spy(*args, **kwargs):
        a, b, bf16 = args[4], args[5], kwargs.get("bf16", args[12] if len(args) > 12 else False)
        halves = [x.dtype == precision.BF16 for x in (a, b)]
        if (bf16 or any(halves)) and not all(halves):
            converts.append((a.shape, b.shape))
        return real(*args, **kwargs)

    monkeypatch.setattr(_plan, "matmul", spy)
    plan = plan_of("bf16")
    assert not converts
    for name in ("attention", "attention backward"):
        step = next(s for s in plan.order if s.name == name)
        assert any(plan.values[n].dtype == precision.BF16 and n in plan.offsets
                   for n in step.writes), name


def test_layernorm_and_gelu_backwards_write_over_what_only_they_read(native):
    """The last LayerNorm's backward writes d(x) over its dy (oneDNN computes it in place),
    and a bf16 plan's Gelu backward writes dx = dy * gelu'(x) over gelu'(x): no third
    activation-sized buffer alive in either step (each was where the bf16 GPT step's arena
    peaked at sequence 256)."""
    for mode in ("f32", "bf16"):
        plan = plan_of(mode)
        step = next(s for s in plan.order if s.node == "ln_f" and s.phase == "backward")
        dy, dx = step.reads[1], step.writes[0]
        assert memory.root(plan.values, dx) == dy, (mode, dx, dy)
    gelu = next(s for s in plan.order if s.node == "h0.mlp.gelu" and s.phase == "backward")
    derivative = gelu.reads[1]
    assert "derivative" in derivative and plan.values[derivative].dtype == precision.BF16
    assert memory.root(plan.values, gelu.writes[0]) == derivative
