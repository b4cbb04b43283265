"""Partitioned-layer checks written once: in-process at size 1 (one partition), under MPI on
every rank (one partition per rank):

    mpiexec -n 2 python tests/lv3/tensor_parallel/partitioned_checks.py [check_name ...]

Each rank compares the gradients of the parameters it holds (its shard of each split weight)
and everyone's loss and logits with the whole graph run on one process, in float64.
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from meta.lv1 import Graph, NativeExecutor, ReferenceExecutor, mlp
from meta.lv1.builder import GraphBuilder
from meta.lv1.plan.executor import PlannedExecutor
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import Communicator
from meta.lv3.tensor_parallel.ops import bind, groups
from meta.lv3.tensor_parallel.plan import plan, probe
from meta.lv3.tensor_parallel.strategy import Partitioned, PartitionedExecutor, measured_costs
from tests import checks

TOLERANCE = 1e-6  # the acceptance bound; float64 lands near 1e-15


def small_mlp() -> Graph:
    """Four layers (column, row, column, row) with widths that do not divide by 2 or 4."""
    return mlp(input_shape=(1, 3, 3), hidden=(11, 7, 9), classes=5, seed=3, dtype=np.float64)


def small_cnn(groups: int = 1, width: int = 8) -> Graph:
    """conv3x3 (column) -> relu -> max pool -> conv3x3 ``groups`` (row, or grouped: local)
    -> relu -> flatten -> fc (row after a grouped conv, else column) -> relu -> logits."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("cnn")
    x = b.input("input", np.float64, ("N", 2, 8, 8))
    labels = b.input("labels", np.int64, ("N",))

    def param(name: str, *shape: int) -> str:
        return b.initializer(name, rng.normal(0, 0.4, shape))

    h = b.node("Conv", [x, param("conv1.weight", width, 2, 3, 3), param("conv1.bias", width)],
               name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = b.node("MaxPool", [b.node("Relu", [h], name="relu1")], name="pool", kernel_shape=[2, 2],
               strides=[2, 2])
    h = b.node("Conv", [h, param("conv2.weight", width, width // groups, 3, 3),
                        param("conv2.bias", width)], name="conv2", kernel_shape=[3, 3],
               group=groups)
    h = b.node("Flatten", [b.node("Relu", [h], name="relu2")], name="flatten", axis=1)
    h = b.node("Gemm", [h, param("fc.weight", 6, width * 4), param("fc.bias", 6)], name="fc",
               transB=1)
    h = b.node("Relu", [h], name="relu3")
    logits = b.node("Gemm", [h, param("logits.weight", 4, 6), param("logits.bias", 4)],
                    name="logits", transB=1)
    loss = b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss", reduction="mean")
    b.output(logits, np.float64, ("N", 4))
    b.output(loss, np.float64, ())
    return b.build()


def batch(graph: Graph, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = next(t.shape[1:] for t in graph.inputs if t.name == "input")
    classes = next(t.shape[1] for t in graph.outputs if t.name == "logits")
    return {"input": rng.normal(size=(n, *shape)),
            "labels": rng.integers(0, classes, n).astype(np.int64)}


def partitioned(graph: Graph, comm: Communicator, kind: type = ReferenceExecutor
                ) -> PartitionedExecutor:
    """This rank's part of ``graph`` over ``comm``, in training mode."""
    shapes = probe(graph, batch(graph, 2))
    key = bind(comm)
    mine = plan(graph, shapes, comm.rank, comm.size, key)
    return PartitionedExecutor(graph, mine, kind(mine.local_graph(graph)).train(True),
                               groups(key), shapes)


def assert_step_matches(comm: Communicator, graph: Graph, kind: type = ReferenceExecutor
                        ) -> PartitionedExecutor:
    """One step's values and this rank's gradients against the whole graph on one process."""
    reference = ReferenceExecutor(graph).train(True)
    feeds = batch(graph, 7, seed=1)
    want_values, want = reference.inference_and_backprop(feeds, outputs=["logits"])
    part = partitioned(graph, comm, kind)
    values, grads = part.inference_and_backprop(feeds, outputs=["logits"])
    where = f"rank {comm.rank}/{comm.size}, {graph.name}"
    assert sorted(grads) == sorted(part.local_graph.parameters), where
    for name, g in grads.items():
        shard = part.plan.shards[name][comm.rank]
        np.testing.assert_allclose(g, shard.take(want[name]), rtol=0, atol=TOLERANCE,
                                   err_msg=f"{where}: {name}")
    for k in ("loss", "logits"):
        np.testing.assert_allclose(values[k], want_values[k], rtol=0, atol=TOLERANCE,
                                   err_msg=f"{where}: {k}")
    evaluated = part.eval().inference(feeds, ["logits"])["logits"]
    np.testing.assert_allclose(evaluated, want_values["logits"], rtol=0, atol=TOLERANCE)
    return part


def check_mlp_gradients_match_single_process(comm: Communicator) -> None:
    """Column, row, column, row: one allreduce forward per pair, one backward for the second
    column layer (its input depends on parameters), uneven splits."""
    part = assert_step_matches(comm, small_mlp())
    kinds = {n: layer.kind for n, layer in part.plan.layers.items() if n.startswith(("fc",
                                                                                     "logits"))}
    if comm.size > 1:
        assert kinds == {"fc0": "column", "fc1": "row", "fc2": "column", "logits": "row"}, kinds
        phases = [(c.tensor, c.phase) for c in part.plan.collectives]
        assert phases == [("fc1", "forward"), ("relu1", "backward"), ("logits", "forward")], \
            phases
        assert part.bytes_sent == part.plan.step_bytes(7), (part.bytes_sent, phases)
    else:
        assert set(kinds.values()) == {"replicated"} and part.bytes_sent == 0, kinds


def check_native_executor_gradients_match(comm: Communicator) -> None:
    assert_step_matches(comm, small_mlp(), NativeExecutor)


def check_planned_executor_gradients_match(comm: Communicator) -> None:
    """Each rank's part a compiled plan, the collectives steps of it (in place; the backward's
    overlapped: ``tensor_parallel.lowering``), with the MLP's and the CNNs' convolutions, a
    pool and a Flatten between them; bytes counted as the operators count them."""
    for graph in (small_mlp(), small_cnn(), small_cnn(groups=4)):
        part = assert_step_matches(comm, graph, PlannedExecutor)
        assert part.executor.unplanned is None, part.executor.unplanned
        before = part.bytes_sent  # the first step's included the forward of the compile
        part.train(True).inference_and_backprop(batch(graph, 7, seed=2), outputs=["logits"])
        sent = part.bytes_sent - before
        assert sent == part.plan.step_bytes(7), (graph.name, sent)
        if comm.size > 1:
            names = [s.name for s in part.executor._last.records["backward"]]
            starts = [n for n in names if n.endswith("allreduce start")]
            assert len(starts) == sum(c.phase == "backward" for c in part.plan.collectives), \
                (graph.name, names)


def check_convolution_gradients_match(comm: Communicator) -> None:
    """Channels split (conv1 column, conv2 row), then fc column and logits row."""
    part = assert_step_matches(comm, small_cnn())
    if comm.size > 1:
        kinds = [part.plan.layers[n].kind for n in ("conv1", "pool", "conv2", "fc", "logits")]
        assert kinds == ["column", "split", "row", "column", "row"], kinds


def check_grouped_layer_needs_no_communication(comm: Communicator) -> None:
    """A grouped conv whose groups fall on the ranks runs locally: the only allreduce left is
    the row-parallel fc's (6 values per example); the fully connected conv2 sends its output,
    then fc (column-parallel) the gradient of its input and logits its output: 32 + 32 + 4."""
    grouped = assert_step_matches(comm, small_cnn(groups=4))
    dense = assert_step_matches(comm, small_cnn(groups=1))
    if comm.size > 1:
        kinds = [grouped.plan.layers[n].kind for n in ("conv1", "conv2", "flatten", "fc")]
        assert kinds == ["column", "grouped", "split", "row"], kinds
        assert [c.tensor for c in grouped.plan.collectives] == ["fc"]
        sent = (grouped.bytes_sent, dense.bytes_sent)
        assert sent == (7 * 6 * 8, 7 * (32 + 32 + 4) * 8), sent


def check_sgd_steps_match_single_process(comm: Communicator) -> None:
    """Three SGD steps through the strategy, then every rank holds the single-process weights
    (each rank broadcast its shards: ``gather_model``)."""
    graph, alone = small_mlp(), small_mlp()
    costs = measured_costs(graph, comm, ReferenceExecutor, batch(graph, 9), "loss")
    part = partitioned(graph, comm)
    strategy = Partitioned(Optimizer(sgd(0.1, momentum=0.9), part.local_graph.parameters), part,
                           costs, 9)
    single = Optimizer(sgd(0.1, momentum=0.9), alone.parameters)
    executor = ReferenceExecutor(alone).train(True)
    for step in range(3):
        feeds = batch(graph, 9, seed=100 + step)
        strategy.step(part.inference_and_backprop(feeds)[1])
        single.step(executor.inference_and_backprop(feeds)[1])
    strategy.finish()
    for name, value in alone.parameters.items():
        np.testing.assert_allclose(graph.initializers[name], value, rtol=0, atol=1e-12,
                                   err_msg=f"rank {comm.rank}: {name}")
    report = strategy.report()
    assert report["partitions"] == comm.size, report
    held = sum(report[f"rank{r}_parameter_bytes"] for r in range(comm.size))
    assert held == report["parameter_bytes"], report  # every value on exactly one rank...
    if comm.size > 1:  # ...but the replicated ones, of which there are none here
        assert report["rank0_parameter_bytes"] < report["parameter_bytes"], report
    assert report["step_measured_ms"] > 0 and report["step_predicted_ms"] > 0, report
    assert 0 < report["compute_predicted_ms"] and 0 < report["single_process_step_ms"], report
    assert report["bytes_sent_per_step"] == report["bytes_per_step_predicted"], report
    if comm.is_root:
        assert "meta: partitioned step" in strategy.report_text()


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__: f
    for f in (
        check_mlp_gradients_match_single_process,
        check_native_executor_gradients_match,
        check_planned_executor_gradients_match,
        check_convolution_gradients_match,
        check_grouped_layer_needs_no_communication,
        check_sgd_steps_match_single_process,
    )
}


def main(argv: list[str]) -> int:
    return checks.main(CHECKS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
