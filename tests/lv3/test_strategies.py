"""Strategies, compressors, the timeline and the cost model in one process (size 1 and fakes).

The multi-rank behaviour is checked in ``mpi_checks.py``, under mpiexec -n 2, 3 and 4.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import (
    DEFAULT_CHUNK_BYTES,
    STRATEGIES,
    FlatBuffer,
    Float16,
    Link,
    SingleProcessCommunicator,
    Timeline,
    TopK,
    chrome_trace,
    make_compressor,
    make_strategy,
    strategy_class,
)
from meta.lv3.comm.costmodel import gather_bcast, ring_allreduce


def params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}


def grads(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}


# Sandblaster wraps L-BFGS and steps on rows, not gradients: tests/lv3/sandblaster/;
# model-parallel strategies cut or partition the trainer's graph: their own checks compare
# their steps with one process's (pipeline_checks.py, partitioned_checks.py, hybrid_checks.py).
@pytest.mark.parametrize("name", [name for name in STRATEGIES if name != "sandblaster"
                                  and not strategy_class(name).needs_workload])
def test_every_strategy_equals_the_bare_optimizer_on_one_process(name: str) -> None:
    bare = Optimizer(sgd(0.1, momentum=0.9), params())
    strategy = make_strategy(name, Optimizer(sgd(0.1, momentum=0.9), params()),
                             SingleProcessCommunicator())
    assert strategy.name == name and strategy.role == "worker"
    for step in range(5):
        bare.step(grads(step))
        strategy.step(grads(step))
    strategy.finish()
    for key, value in bare.params.items():
        np.testing.assert_array_equal(strategy.params[key], value)
    assert strategy.bytes_sent == 0 and strategy.timeline.steps == 5
    assert strategy.state is strategy.optimizer.state
    assert strategy.predict_comm_s(Link(1e-6, 1e-9)) == 0.0


def test_params_become_views_of_one_flat_buffer() -> None:
    values = params()
    strategy = make_strategy("allreduce", Optimizer(sgd(0.1), values), chunk_bytes=16)
    assert strategy.params is values
    assert all(np.shares_memory(v, strategy.flat_params.buffer) for v in values.values())
    assert [len(c) for c in strategy.grad_chunks] == [2, 2, 2, 2]


def test_make_strategy_errors_name_the_thing() -> None:
    opt = Optimizer(sgd(0.1), params())
    with pytest.raises(ValueError, match="unknown strategy 'star'"):
        make_strategy("star", opt)
    with pytest.raises(ValueError, match="strategy 'ring': unknown option 'compression'"):
        make_strategy("ring", opt, compression="topk")
    with pytest.raises(ValueError, match="'average_every' must be at least 1, got 0"):
        make_strategy("model_averaging", opt, average_every=0)
    with pytest.raises(ValueError, match="unknown compression 'zip'"):
        make_compressor("zip", 4, np.float32)
    with pytest.raises(RuntimeError, match="Allreduce: rank 0 has no server role"):
        make_strategy("allreduce", Optimizer(sgd(0.1), params())).serve()


def test_recipe_default_chunk_is_the_measured_one() -> None:
    assert STRATEGIES["allreduce"].options["chunk_bytes"].default == DEFAULT_CHUNK_BYTES


@pytest.mark.parametrize("name", ["topk", "sign"])
def test_error_feedback_loses_nothing(name: str) -> None:
    compressor = make_compressor(name, 100, np.float64, topk_ratio=0.05)
    raw, sent = np.zeros(100), np.zeros(100)
    rng = np.random.default_rng(3)
    for _ in range(30):
        grad = rng.normal(size=100)
        payload = compressor.compress(grad)
        assert payload.dtype == np.uint8 and payload.nbytes == compressor.payload_bytes
        raw += grad
        sent += compressor.decompress(payload)
    np.testing.assert_allclose(sent + compressor.residual, raw, atol=1e-12)


def test_payload_sizes() -> None:
    assert Float16(1000, np.float32).payload_bytes == 2000
    assert TopK(1000, np.float32, ratio=0.01).payload_bytes == 10 * 8
    assert make_compressor("sign", 1000, np.float32).payload_bytes == 4 + 125
    assert make_compressor("none", 1000, np.float32) is None
    half = Float16(3, np.float32)
    np.testing.assert_array_equal(half.decompress(half.compress(np.array([1, 2, 3.0], "f4"))),
                                  [1, 2, 3])
    with pytest.raises(ValueError, match="expected a flat gradient of 3 values"):
        half.compress(np.zeros(4, np.float32))


def test_timeline_summary_and_trace(tmp_path) -> None:
    timeline = Timeline()
    for _ in range(3):
        timeline.begin()
        timeline.lap("pack")
        timeline.lap("communicate")
    summary = timeline.summary()
    assert set(summary) == {"compute", "pack", "communicate"} and timeline.steps == 3
    assert abs(sum(s["share"] for s in summary.values()) - 1) < 1e-9
    assert "communicate" in timeline.format_summary()
    path = chrome_trace(timeline, SingleProcessCommunicator(), tmp_path / "t.json")
    events = json.loads(path.read_text())["traceEvents"]
    assert events[0]["ph"] == "M" and len(events) == 1 + 8
    assert all(e["ph"] == "X" and e["pid"] == 0 and e["dur"] >= 0 for e in events[1:])


def test_cost_model_formulas() -> None:
    link = Link(alpha=2e-6, beta=1e-9)
    assert ring_allreduce(link, 4, 4000) == pytest.approx(6 * 2e-6 + 1.5 * 4000 * 1e-9)
    assert gather_bcast(link, 4, 1000) == pytest.approx(5 * (2e-6 + 1e-6))
    assert "alpha 2.00 us" in str(link)


def test_flat_chunks_cover_the_buffer() -> None:
    flat = FlatBuffer({"a": (5,)}, np.float32)
    assert [len(c) for c in flat.chunks(8)] == [2, 2, 1]
    assert len(flat.chunks(1)) == 5 and len(FlatBuffer({}, np.float32).chunks(8)) == 1
    with pytest.raises(ValueError, match="chunk_bytes must be positive"):
        flat.chunks(0)


def test_recipe_keys_of_level_3_are_validated() -> None:
    from meta.run.recipe import AtLeast, RecipeError, make_recipe

    metrics = {"test_accuracy": AtLeast(0.5)}
    ok = make_recipe("r", {"distributed": "model_averaging", "average_every": 4,
                           "timeline": True}, {}, metrics)
    assert ok.definitions.choices["distributed"].values()["average_every"] == 4
    assert ok.definitions.timeline is True
    with pytest.raises(RecipeError) as err:
        make_recipe("r", {"distributed": "ring", "compression": "topk", "chunk_bytes": -1}, {},
                    metrics)
    message = str(err.value)
    for expected in ("'compression' is an option of distributed 'allreduce', not of the "
                     "chosen distributed 'ring'", "option 'chunk_bytes' must be at least 1"):
        assert expected in message, message
    with pytest.raises(RecipeError) as err:
        make_recipe("r", {"compression": "topk", "topk_ratio": 1.5}, {}, metrics)
    assert "option 'topk_ratio' must be at most 1" in str(err.value)


def test_the_phase_report_keeps_communication_a_part_of_the_step() -> None:
    """What finish lapped after training (a model-averaging run's final average) once took
    the last evaluation for communication and spread it over the steps: 21.5 ms of
    communication in an 11.1 ms step (issue 45). After end_steps it is reported apart, the
    steps' phases add up to the step, and overlapped transfers are not added to it."""
    import time

    timeline = Timeline()
    for _ in range(4):
        timeline.begin()
        timeline.lap("update")
        began = timeline.now()
        timeline.lap("communicate")
        timeline.background("allreduce (overlapped)", began)
    time.sleep(0.05)  # the last epoch's evaluation
    timeline.end_steps()
    timeline.lap("communicate")  # finish's average
    summary = timeline.summary()
    assert summary["communicate"]["total_s"] < 0.01, summary
    text = timeline.format_summary()
    step_row = next(line for line in text.splitlines() if line.startswith("step "))
    step_ms = float(step_row.split()[2].removesuffix("ms"))
    comm_ms = summary["communicate"]["per_step_s"] * 1e3
    assert comm_ms <= step_ms and step_row.endswith("100.0%"), text
    assert "overlapped with the phases above (not added to the step): allreduce" in text
    assert "after the last step (finish; not per step): communicate" in text


def test_strategy_train_ends_the_steps_before_finish() -> None:
    """Strategy.train: the time between the last step and finish is no phase's."""
    import time

    from meta.lv3.data_parallel.allreduce import Allreduce

    class Lapping(Allreduce):
        def finish(self) -> None:
            self.timeline.lap("communicate")

    class Trainer:
        test_data = None

        def __init__(self, strategy) -> None:
            self.strategy = strategy

        def fit(self, epochs):
            self.strategy.step({"w": np.array([1.0])})
            time.sleep(0.05)  # evaluation after the last step
            return [{}]

    strategy = Lapping(Optimizer(sgd(0.1), {"w": np.array([1.0])}))
    strategy.train(Trainer(strategy), 1)
    assert "communicate" not in strategy.timeline.summary()
    assert strategy.timeline.after_events[0][0] == "communicate"
    assert strategy.timeline.after_events[0][2] - strategy.timeline.after_events[0][1] < 2e7
