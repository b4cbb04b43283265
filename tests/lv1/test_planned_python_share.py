"""The share of a step in Python steps (issue 41): a node the plan cannot lower that takes
most of a training step makes the planned executor print one line naming it, measured on the
first steps only; a fully planned graph prints nothing; ``meta inspect --plan`` lists every
node's placement and the Python share."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest

from meta.lv0 import Operator, register, registry
from meta.lv1 import GraphBuilder, PlannedExecutor
from meta.lv1.plan import profile_share, runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

DOMAIN = "my.slow"
SHAPE = (8, 16)


def register_slow(communicates: bool = False) -> None:
    """Register ``my.slow::Slow``: y = 2x in Python, 20 ms per call each way (most of any step
    here); ``communicates``: declared a collective, as tensor parallelism's allreduce is."""
    @register("Slow", domain=DOMAIN)
    class Slow(Operator):
        def forward(self, ctx, x):
            time.sleep(0.02)
            return 2 * x

        def backward(self, ctx, dy):
            time.sleep(0.02)
            return (2 * dy,)

    Slow.communicates = communicates


@pytest.fixture
def slow():
    """``my.slow::Slow`` registered for the test (``register_slow``)."""
    with registry.scratch():
        register_slow()
        yield


def graph(kind: str):
    """x -> Gemm -> Relu -> (the slow user op | Pow by a tensor exponent | nothing) -> loss."""
    rng = np.random.default_rng(0)
    b = GraphBuilder(f"share_{kind}")
    x = b.input("x", np.float32, SHAPE)
    w = b.initializer("W", rng.standard_normal((16, 16)).astype(np.float32))
    h = b.node("Relu", [b.node("Gemm", [x, w], name="fc")], name="relu")
    if kind == "slow":
        h = b.node("Slow", [h], name="user", domain=DOMAIN)
    elif kind == "pow":
        e = b.initializer("e", np.full(SHAPE, 2.0, np.float32))  # a tensor exponent
        h = b.node("Pow", [h, e], name="pow")
    loss = b.node("ReduceSum", [h], name="loss", keepdims=0)
    b.output(loss, np.float32, ())
    return b.build(), loss


def train(executor, loss, steps):
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    for _ in range(steps):
        executor.inference_and_backprop({"x": x}, loss)


def test_a_python_node_taking_most_of_the_step_is_named_once(slow, capsys):
    g, loss = graph("slow")
    ex = PlannedExecutor(g).train()
    train(ex, loss, profile_share.SKIPPED + profile_share.WATCHED + 3)
    assert ex.placement()["user"] == "python"
    lines = [line for line in capsys.readouterr().err.splitlines() if "Python steps take" in line]
    assert len(lines) == 1, lines
    assert "'user' (my.slow::Slow)" in lines[0] or "'user' (Slow)" in lines[0], lines[0]
    share = ex.python_watch.result
    assert share.python_share > 0.5, share
    assert share.top_python(1)[0].node == "user"
    # measured on the first steps only: timing is off again for the rest of the run
    assert not any(p.profile for p, _ in profile_share.programs(ex._last))


def test_pow_by_a_tensor_exponent_is_a_python_step_with_its_share(capsys, monkeypatch):
    from meta.lv1.plan.lowering import fused

    monkeypatch.setattr(fused, "ENABLED", False)  # on, the fused pointwise step runs it
    g, loss = graph("pow")
    ex = PlannedExecutor(g).train()
    train(ex, loss, profile_share.SKIPPED + profile_share.WATCHED)
    assert ex.placement()["pow"].startswith("python"), ex.placement()
    share = ex.python_watch.result
    assert share is not None and [t.node for t in share.top_python()] == ["pow"]
    printed = "Python steps take" in capsys.readouterr().err
    assert printed == (share.python_share > profile_share.THRESHOLD)


def test_a_fully_planned_graph_prints_nothing(capsys):
    g, loss = graph("plain")
    ex = PlannedExecutor(g).train()
    train(ex, loss, profile_share.SKIPPED + profile_share.WATCHED + 1)
    assert not any(p.startswith("python") for p in ex.placement().values()), ex.placement()
    assert ex.python_watch.result.python_share == 0.0
    assert ex.python_watch.result.total_ns > 0
    assert "Python steps take" not in capsys.readouterr().err


def test_inspect_plan_lists_placements_and_the_python_share(slow, tmp_path, capsys):
    from meta.cli import EXIT_PASS, main
    from meta.lv1 import to_onnx

    g, _ = graph("slow")
    path = tmp_path / "slow.onnx"
    onnx.save(to_onnx(g), path)
    assert main(["inspect", "--plan", str(path)]) == EXIT_PASS
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1]
            and line.split()[0] in ("fc", "relu", "user", "loss")}
    assert set(rows) == {"fc", "relu", "user", "loss"}, out
    assert "python" in rows["user"] and "python" not in rows["fc"], out
    assert "Python steps:" in out, out
    share = float(out.split("Python steps:")[1].split("%")[0])
    assert share > 50, out


def test_the_profile_table_gives_the_python_share(slow):
    g, loss = graph("slow")
    ex = PlannedExecutor(g, profile=True).train()
    train(ex, loss, 2)
    table = ex.profile_table()
    assert table.python_share > 0.5 and table.python_nodes[0][0] == "user", table
    assert "Python steps: " in str(table) and "'user'" in str(table), str(table)
    # profiling on: the watch leaves timing on
    train(ex, loss, profile_share.SKIPPED + profile_share.WATCHED)
    assert all(p.profile for p, _ in profile_share.programs(ex._last) if len(p))


SLOW_RECIPE = '''
import time

from meta.lv0 import Operator, register
from meta.recipe import AtLeast


@register("Slow", domain="my.slow")
class Slow(Operator):
    def forward(self, ctx, x):
        time.sleep(0.005)
        return 2 * x

    def backward(self, ctx, dy):
        time.sleep(0.005)
        return (2 * dy,)


FIXED = {{"dataset": {{"name": "mnist", "train_samples": 640}},
         "model": {{"name": "onnx", "path": {path!r}}}}}
MUTABLE = {{"epochs": 1, "batch_size": 64, "lr": 0.05, "executor": "planned"}}
METRICS = {{"test_accuracy": AtLeast(0.0)}}
'''


def test_meta_run_prints_one_line_when_python_steps_take_the_step(tmp_path, mnist_dir, capsys):
    """``meta run`` on a model whose user operator (Python, 10 ms a step) takes most of the
    step: one line naming it, among 10 training steps."""
    from meta.cli import EXIT_PASS, main
    from meta.lv1 import to_onnx

    b = GraphBuilder("slow_mnist")
    x = b.input("input", np.float32, ("N", 1, 28, 28))
    w = b.initializer("W", np.zeros((784, 10), np.float32))
    h = b.node("Gemm", [b.node("Flatten", [x], name="flat"), w], name="fc")
    b.output(b.node("Slow", [h], name="slow", domain=DOMAIN), np.float32, ("N", 10))
    model = tmp_path / "slow.onnx"
    onnx.save(to_onnx(b.build()), model)
    recipe = tmp_path / "slow_recipe.py"
    recipe.write_text(SLOW_RECIPE.format(path=str(model)))
    with registry.scratch():
        code = main(["run", str(recipe), "--output-dir", str(tmp_path / "out"), "--quiet",
                     "--no-export"])
    err = capsys.readouterr().err
    assert code == EXIT_PASS, err
    lines = [line for line in err.splitlines() if "Python steps take" in line]
    assert len(lines) == 1 and "'slow'" in lines[0], err


def test_a_collective_is_placed_as_communication_not_python(capsys):
    """An operator that declares ``communicates`` (tensor parallelism's allreduce, which waits
    for the other ranks) is placed "communication": its wait is not called Python time, so
    the executor prints no Python-share line for it and announces no Python step."""
    with registry.scratch():
        register_slow(communicates=True)
        g, loss = graph("slow")
        ex = PlannedExecutor(g).train()
        train(ex, loss, 5)
    assert ex.placement()["user"] == "communication"
    share = ex.python_watch.result
    assert share is not None and share.python_share < profile_share.THRESHOLD, share
    assert "Python" not in capsys.readouterr().err
