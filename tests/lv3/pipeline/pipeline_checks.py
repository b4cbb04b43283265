"""Pipeline checks written once: in-process at size 1 (one stage), under MPI on every rank
(one stage per rank):

    mpiexec -n 4 python tests/lv3/pipeline/pipeline_checks.py [check_name ...]

Each rank compares its stage's gradients, and everyone's loss and logits, with the whole graph
run on one process (every rank can: the graphs are small), in float64.
"""

from __future__ import annotations

import itertools
import sys
from typing import Callable

import numpy as np

from meta.lv1 import Graph, ReferenceExecutor, mlp
from meta.lv1.builder import GraphBuilder
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import Communicator
from meta.lv1.partition import partition
from meta.lv3.pipeline.schedule import SCHEDULES, bubble_estimate
from meta.lv3.pipeline.stage import PipelineExecutor
from meta.lv3.pipeline.strategy import Pipeline
from tests import checks

TOLERANCE = 1e-6  # the acceptance bound; float64 lands near 1e-15


def small_mlp() -> Graph:
    """784 would be slow to check 32 times: a 16-input MLP with 9 nodes (room for 4 stages)."""
    return mlp(input_shape=(1, 4, 4), hidden=(12, 10, 8), classes=5, seed=3, dtype=np.float64)


def skip_net() -> Graph:
    """An MLP whose first hidden layer is added back before the logits: with a cut after each
    ReLU, that activation crosses every cut (relayed through the middle stages) and its
    gradient sums the skip's and the chain's."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("skip")
    x = b.input("input", np.float64, ("N", 6))
    labels = b.input("labels", np.int64, ("N",))
    h = x
    hidden = []
    for i, (n_in, n_out) in enumerate([(6, 8), (8, 8), (8, 8)]):
        w = b.initializer(f"fc{i}.weight", rng.normal(0, 0.5, (n_out, n_in)))
        bias = b.initializer(f"fc{i}.bias", rng.normal(0, 0.1, n_out))
        h = b.node("Relu", [b.node("Gemm", [h, w, bias], name=f"fc{i}", transB=1)],
                   name=f"relu{i}")
        hidden.append(h)
    h = b.node("Add", [hidden[0], h], name="skip")
    w = b.initializer("out.weight", rng.normal(0, 0.5, (4, 8)))
    logits = b.node("Gemm", [h, w], name="logits", transB=1)
    loss = b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss", reduction="mean")
    b.output(logits, np.float64, ("N", 4))
    b.output(loss, np.float64, ())
    return b.build()


def _batch(graph: Graph, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    info = {t.name: t for t in graph.inputs}
    shape = tuple(d for d in info["input"].shape[1:])
    classes = next(t.shape[1] for t in graph.outputs if t.name == "logits")
    return {"input": rng.normal(size=(n, *shape)),
            "labels": rng.integers(0, classes, n).astype(np.int64)}


def _pipe(graph: Graph, comm: Communicator, m: int, schedule: str,
          cuts: tuple[str, ...] = ()) -> PipelineExecutor:
    part = partition(graph, comm.size, cuts, balance="params")
    return PipelineExecutor(graph, part, comm, ReferenceExecutor, _batch(graph, 3), m,
                            schedule).train(True)


def _assert_step_matches(comm: Communicator, graph: Graph, cuts: tuple[str, ...] = (),
                         batches: tuple[int, ...] = (11,)) -> None:
    reference = ReferenceExecutor(graph).train(True)
    for n, m, name in itertools.product(batches, range(1, 9), SCHEDULES):
        feeds = _batch(graph, n, seed=m)
        want_values, want = reference.inference_and_backprop(feeds, outputs=["logits"])
        pipe = _pipe(graph, comm, m, name, cuts)
        values, grads = pipe.inference_and_backprop(feeds, outputs=["logits"])
        where = f"rank {comm.rank}: batch {n}, {m} micro-batches, {name}"
        assert sorted(grads) == sorted(pipe.stage_graph.parameters), where
        for p, g in grads.items():
            np.testing.assert_allclose(g, want[p], rtol=0, atol=TOLERANCE, err_msg=f"{where}: {p}")
        for k in ("loss", "logits"):
            np.testing.assert_allclose(values[k], want_values[k], rtol=0, atol=TOLERANCE,
                                       err_msg=f"{where}: {k}")
        evaluated = pipe.inference(feeds, ["logits", "loss"])
        np.testing.assert_allclose(evaluated["logits"], want_values["logits"], atol=TOLERANCE)
        np.testing.assert_allclose(evaluated["loss"], want_values["loss"], atol=TOLERANCE)
        expected = min(m, n) if name == "gpipe" else min(comm.size - comm.rank, m, n)
        assert pipe.stats.peak_in_flight in (0, expected), (where, pipe.stats)


def check_mlp_gradients_match_single_process(comm: Communicator) -> None:
    """2 and 4 stages (the job's size), 1 to 8 micro-batches, both schedules, balanced cuts."""
    _assert_step_matches(comm, small_mlp(), batches=(11, 5))


def check_skip_connection_gradients_match(comm: Communicator) -> None:
    """A tensor relayed through the middle stages; cuts named by the user."""
    cuts = ("relu0", "relu1", "relu2")[: comm.size - 1]
    _assert_step_matches(comm, skip_net(), cuts)
    if comm.size == 4:
        part = partition(skip_net(), 4, cuts)
        assert [s.sends for s in part.stages] == [["relu0"], ["relu0", "relu1"],
                                                  ["relu0", "relu2"], []], part.describe()


def check_sgd_steps_match_single_process(comm: Communicator) -> None:
    """Three SGD steps through the strategy, then every rank holds the single-process weights
    (each stage broadcast its own: ``gather_model``)."""
    graph, alone = small_mlp(), small_mlp()
    pipe = _pipe(graph, comm, 3, "1f1b")
    strategy = Pipeline(Optimizer(sgd(0.1, momentum=0.9), pipe.stage_graph.parameters), pipe)
    single = Optimizer(sgd(0.1, momentum=0.9), alone.parameters)
    executor = ReferenceExecutor(alone).train(True)
    for step in range(4):
        feeds = _batch(graph, 9, seed=100 + step)
        strategy.step(pipe.inference_and_backprop(feeds)[1])
        single.step(executor.inference_and_backprop(feeds)[1])
    strategy.finish()
    for name, value in alone.parameters.items():
        np.testing.assert_allclose(graph.initializers[name], value, rtol=0, atol=1e-12,
                                   err_msg=f"rank {comm.rank}: {name}")
    report = strategy.report()
    assert report["pipeline_stages"] == comm.size and report["micro_batches"] == 3, report
    assert 0.0 <= report["bubble_measured"] < 1.0, report
    assert report["bubble_predicted"] == bubble_estimate(comm.size, 3)
    assert report["step_predicted_ms"] > 0 and report["step_measured_ms"] > 0, report
    stage = comm.rank
    assert report[f"stage{stage}_parameter_bytes"] == pipe.stage_graph.parameters.nbytes()
    # stage 0 may store nothing but the batch (fc0 saves its input): the last keeps the softmax
    assert report[f"stage{stage}_activation_peak_bytes"] >= (stage == comm.size - 1), report
    assert report[f"stage{stage}_micro_batches_stored"] == min(comm.size - stage, 3), report
    if comm.is_root:
        assert "bubble" in strategy.report_text() or comm.size == 1


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__: f
    for f in (
        check_mlp_gradients_match_single_process,
        check_skip_connection_gradients_match,
        check_sgd_steps_match_single_process,
    )
}


def main(argv: list[str]) -> int:
    return checks.main(CHECKS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
