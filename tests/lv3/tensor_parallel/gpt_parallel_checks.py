"""The GPT under tensor and pipeline parallelism, checks written once: in-process at size 1
(one partition, one stage), under MPI on every rank:

    mpiexec -n 2 python tests/lv3/tensor_parallel/gpt_parallel_checks.py [check_name ...]

Each rank compares the loss, the logits and the gradients of the parameters it holds with
the whole GPT run on one process (float64, the same weights and batch), and the weights after
a few optimizer steps; the ``planned`` checks do so in float32 with every stage and part on
the planned executor (compiled plans; the collectives steps of them, in place, the backward's
overlapped with the weight gradients), within 1e-5.
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from meta.lv1 import Graph, ReferenceExecutor
from meta.lv1.plan.executor import PlannedExecutor
from meta.lv1.language_models import gpt
from meta.lv2.optimizers import (GradientTransformation, Optimizer, adam, chain,
                                 clip_by_global_norm)
from meta.lv3 import Communicator
from meta.lv1.partition import partition
from meta.lv3.pipeline.stage import PipelineExecutor
from meta.lv3.pipeline.strategy import Pipeline
from meta.lv3.tensor_parallel.ops import bind, groups
from meta.lv3.tensor_parallel.plan import plan, probe
from meta.lv3.tensor_parallel.strategy import Partitioned, PartitionedExecutor
from tests import checks

TOLERANCE = 1e-10  # float64: the parts sum in another order than one process's products
PLANNED_TOLERANCE = 1e-5  # float32 on the planned executor (issue 41's bound)
VOCAB, CONTEXT = 11, 8


def small_gpt(layers: int = 2, dtype: type = np.float64) -> Graph:
    """Width 16, 4 heads of 4 (2 per rank at -n 2), a context of 8, a vocabulary of 11."""
    return gpt((CONTEXT,), classes=VOCAB, seed=3, dtype=dtype, layers=layers, heads=4,
               width=16)


def batch(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input": rng.integers(0, VOCAB, (n, CONTEXT)).astype(np.int64),
            "labels": rng.integers(0, VOCAB, (n, CONTEXT)).astype(np.int64)}


def _close(got: np.ndarray, want: np.ndarray, what: str, atol: float = TOLERANCE) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=what)


def partitioned(graph: Graph, comm: Communicator, kind: type = ReferenceExecutor,
                sequence: bool = False) -> PartitionedExecutor:
    shapes = probe(graph, batch(2))
    key = bind(comm)
    mine = plan(graph, shapes, comm.rank, comm.size, key, sequence=sequence)
    return PartitionedExecutor(graph, mine, kind(mine.local_graph(graph)).train(True),
                               groups(key), shapes)


def _matches_one_process(part: PartitionedExecutor, graph: Graph, where: str,
                         atol: float = TOLERANCE, steps: int = 1) -> None:
    """``steps`` training steps of ``part`` on one batch of 5: the loss, logits and this
    rank's gradients as one reference process's; then evaluated (loss and logits) and
    unlabelled (logits, as generation asks) alike."""
    feeds = batch(5, seed=1)
    want_values, want = ReferenceExecutor(graph).train(True).inference_and_backprop(
        feeds, outputs=["logits"])
    for _ in range(steps):  # the second step runs a compiled plan again
        values, grads = part.inference_and_backprop(feeds, outputs=["logits"])
    assert sorted(grads) == sorted(part.local_graph.parameters), where
    rank = part.plan.rank
    for name, g in grads.items():
        _close(g, part.plan.shards[name][rank].take(want[name]), f"{where}: {name}", atol)
    for k in ("loss", "logits"):
        _close(values[k], want_values[k], f"{where}: {k}", atol)
    evaluated = part.eval().inference(feeds, ["loss", "logits"])
    for k in ("loss", "logits"):
        _close(evaluated[k], want_values[k], f"{where}: evaluated {k}", atol)
    unlabelled = part.inference({"input": feeds["input"]}, ["logits"])["logits"]
    _close(unlabelled, want_values["logits"], f"{where}: unlabelled", atol)
    part.train(True)


def check_tensor_parallel_gpt_matches_single_process(comm: Communicator) -> None:
    """Megatron's split of every block: Q, K, V and the MLP's first layer column-parallel
    (2 heads a rank), the attention projection and the MLP's second layer row-parallel; one
    allreduce forward and one backward per attention and per MLP; loss, logits and this rank's
    gradients as one process's."""
    graph = small_gpt()
    part = partitioned(graph, comm)
    where = f"rank {comm.rank}/{comm.size}"
    _matches_one_process(part, graph, where)
    layers = part.plan.layers
    if comm.size == 1:
        assert part.plan.collectives == [] and part.bytes_sent == 0
        return
    for i in range(2):
        kinds = {n: layers[f"h{i}.{n}"].kind for n in
                 ("attn.q.matmul", "attn.k.matmul", "attn.v.matmul", "attn.proj.matmul",
                  "mlp.fc.matmul", "mlp.proj.matmul", "attn.softmax", "mlp.gelu")}
        assert kinds == {"attn.q.matmul": "column", "attn.k.matmul": "column",
                         "attn.v.matmul": "column", "attn.proj.matmul": "row",
                         "mlp.fc.matmul": "column", "mlp.proj.matmul": "row",
                         "attn.softmax": "split", "mlp.gelu": "split"}, kinds
    phases = [(c.tensor, c.phase) for c in part.plan.collectives]
    assert phases == [("h0.ln1", "backward"), ("h0.attn.proj.matmul", "forward"),
                      ("h0.ln2", "backward"), ("h0.mlp.proj.matmul", "forward"),
                      ("h1.ln1", "backward"), ("h1.attn.proj.matmul", "forward"),
                      ("h1.ln2", "backward"), ("h1.mlp.proj.matmul", "forward")], phases
    assert part.bytes_sent == part.plan.step_bytes(5), (part.bytes_sent, phases)
    held = part.local_graph.initializers
    assert held["h0.attn.q.weight"].shape == (16, 16 // comm.size), where
    assert held["wte"].shape == (VOCAB, 16), where  # the tied embedding and head: whole


def clipped_adam() -> GradientTransformation:
    """Adam after a clip by global norm that binds at every step (the norms here are ~1): the
    norm must be the whole model's on every rank, each parameter counted once."""
    return chain(clip_by_global_norm(1e-3), adam(0.01))


def _adam_steps_match(comm: Communicator, strategy_of: Callable) -> None:
    """3 steps of Adam, then of clipped Adam, through ``strategy_of(graph, transform) ->
    (strategy, its executor)``; after ``finish`` every rank's whole graph holds one process's
    trained weights."""
    for transform in (lambda: adam(0.01), clipped_adam):
        graph, alone = small_gpt(), small_gpt()
        strategy, executor = strategy_of(graph, transform())
        single = Optimizer(transform(), alone.parameters)
        reference = ReferenceExecutor(alone).train(True)
        for step in range(3):
            feeds = batch(6, seed=100 + step)
            strategy.step(executor.inference_and_backprop(feeds)[1])
            single.step(reference.inference_and_backprop(feeds)[1])
        strategy.finish()
        for name, value in alone.parameters.items():
            np.testing.assert_allclose(graph.initializers[name], value, rtol=0, atol=1e-9,
                                       err_msg=f"rank {comm.rank}: {name} ({transform.__name__})")


def check_tensor_parallel_adam_steps_match(comm: Communicator) -> None:
    """Each rank's Adam on its shards, then the shards gathered: one process's weights."""
    def make(graph: Graph, transform: GradientTransformation) -> tuple:
        part = partitioned(graph, comm)
        return Partitioned(Optimizer(transform, part.local_graph.parameters), part), part

    _adam_steps_match(comm, make)


def pipelined(graph: Graph, comm: Communicator, micro_batches: int = 3,
              kind: type = ReferenceExecutor, schedule: str = "1f1b") -> PipelineExecutor:
    cuts = ("h0.mlp.residual",) if comm.size == 2 else ()
    part = partition(graph, comm.size, cuts, tied=True)
    return PipelineExecutor(graph, part, comm, kind, batch(3), micro_batches,
                            schedule).train(True)


def check_pipelined_gpt_matches_single_process(comm: Communicator) -> None:
    """Blocks cut between the stages, 3 micro-batches: the tied embedding is held by the
    first and the last stage (the head) and its gradient is the sum of both uses."""
    graph = small_gpt()
    feeds = batch(7, seed=2)
    want_values, want = ReferenceExecutor(graph).train(True).inference_and_backprop(
        feeds, outputs=["logits"])
    pipe = pipelined(graph, comm)
    values, grads = pipe.inference_and_backprop(feeds, outputs=["logits"])
    where = f"rank {comm.rank}/{comm.size}"
    assert sorted(grads) == sorted(pipe.stage_graph.parameters), where
    for name, g in grads.items():
        _close(g, want[name], f"{where}: {name}")
    for k in ("loss", "logits"):
        _close(values[k], want_values[k], f"{where}: {k}")
    unlabelled = pipe.eval().inference({"input": feeds["input"]}, ["logits"])["logits"]
    _close(unlabelled, want_values["logits"], f"{where}: generation's logits")
    if comm.size == 2:
        assert pipe.partition.tied == {"wte": [0, 1]}, pipe.partition.tied
        assert "causal_mask" not in pipe.stage.sends + pipe.stage.receives, where
        assert "wte" in grads and "lm_head.tied" in pipe.partition.stages[1].nodes, where


def check_pipelined_adam_steps_keep_the_tied_copies_equal(comm: Communicator) -> None:
    """Clipped Adam (not elementwise: the clip's norm is summed over the stages, ``wte``
    counted once, and the first stage's copy of a tied weight is broadcast after each
    update): after 3 steps every stage's copy of ``wte`` is the same, and with or without
    clipping the weights are one process's."""
    graph = small_gpt()
    pipe = pipelined(graph, comm)
    strategy = Pipeline(Optimizer(clipped_adam(), pipe.stage_graph.parameters), pipe)
    for step in range(3):
        strategy.step(pipe.inference_and_backprop(batch(6, seed=100 + step))[1])
    copies = comm.allgather(np.ascontiguousarray(graph.initializers["wte"]).ravel()[None])
    for other in copies[1:]:
        np.testing.assert_array_equal(other, copies[0])

    def make(graph: Graph, transform: GradientTransformation) -> tuple:
        pipe = pipelined(graph, comm)
        return Pipeline(Optimizer(transform, pipe.stage_graph.parameters), pipe), pipe

    _adam_steps_match(comm, make)


def check_planned_tensor_parallel_gpt_matches_single_process(comm: Communicator) -> None:
    """Float32, each rank's part a compiled plan (the allreduces steps inside it, the
    backward's overlapped with the weight gradients): two steps' loss, logits and this rank's
    gradients within 1e-5 of one reference process."""
    graph = small_gpt(dtype=np.float32)
    feeds = batch(5, seed=1)
    want_values, want = ReferenceExecutor(graph).train(True).inference_and_backprop(
        feeds, outputs=["logits"])
    part = partitioned(graph, comm, PlannedExecutor)
    for _ in range(2):  # the second step runs the compiled plan again
        values, grads = part.inference_and_backprop(feeds, outputs=["logits"])
    where = f"rank {comm.rank}/{comm.size} (planned)"
    placement = part.placement()
    assert placement["h0.attn.scores"] != "python", placement  # the blocks run in the plan
    if comm.size > 1:
        assert placement["h0.attn.proj.matmul/allreduce"] == "communication", placement
        _check_overlapped(part.executor._last.records["backward"], where)
    assert sorted(grads) == sorted(part.local_graph.parameters), where
    for name, g in grads.items():
        _close(g, part.plan.shards[name][comm.rank].take(want[name]), f"{where}: {name}",
               PLANNED_TOLERANCE)
    for k in ("loss", "logits"):
        _close(values[k], want_values[k], f"{where}: {k}", PLANNED_TOLERANCE)


def check_sequence_parallel_gpt_matches_single_process(comm: Communicator) -> None:
    """Sequence parallelism: the embeddings, LayerNorms, residual adds, head and loss on
    each rank's rows (5 rows: 3 and 2 at -n 2), a reduce-scatter and an all-gather in place
    of each allreduce, the replicated parameters' gradients summed after the backward: loss,
    logits (gathered when asked for) and this rank's gradients as one process's, the
    bytes sent those of the plan."""
    graph = small_gpt()
    part = partitioned(graph, comm, sequence=True)
    where = f"rank {comm.rank}/{comm.size} (sequence parallel)"
    _matches_one_process(part, graph, where)
    if comm.size == 1:
        assert part.plan.partial_gradients == [], where
        return
    layers = part.plan.layers
    assert {layers[n].kind for n in ("tok_emb", "h0.ln1", "h0.attn.residual", "ln_f",
                                     "lm_head", "loss")} == {"rows"}, layers
    kinds = [(c.tensor, c.phase, c.kind) for c in part.plan.collectives[:4]]
    assert kinds == [("h0.ln1", "forward", "allgather"), ("h0.ln1", "backward", "reduce_scatter"),
                     ("h0.attn.proj.matmul", "forward", "reduce_scatter"),
                     ("h0.attn.proj.matmul", "backward", "allgather")], kinds
    assert {"wte", "wpe", "h0.ln1.weight", "ln_f.bias", "h0.attn.proj.bias"} <= set(
        part.plan.partial_gradients), part.plan.partial_gradients
    assert part.bytes_sent == part.plan.step_bytes(5), where


def check_sequence_parallel_adam_steps_match(comm: Communicator) -> None:
    """Adam through the strategy under sequence parallelism: every rank updates the
    replicated parameters with the summed gradients, so the gathered model is one
    process's (clipped too: the replicated parameters counted once in the norm)."""
    def make(graph: Graph, transform: GradientTransformation) -> tuple:
        part = partitioned(graph, comm, sequence=True)
        return Partitioned(Optimizer(transform, part.local_graph.parameters), part), part

    _adam_steps_match(comm, make)


def check_planned_sequence_parallel_gpt_matches_single_process(comm: Communicator) -> None:
    """Float32 on the planned executor with sequence parallelism (the row collectives steps
    of the plan, each backward reduce-scatter started before and waited after the weight
    gradients of the column layers it feeds): two steps within 1e-5 of one process."""
    graph = small_gpt(dtype=np.float32)
    part = partitioned(graph, comm, PlannedExecutor, sequence=True)
    where = f"rank {comm.rank}/{comm.size} (planned, sequence parallel)"
    part.inference_and_backprop(batch(5, seed=1), outputs=["logits"])
    if comm.size > 1:
        names = [(s.name, s.node) for s in part.executor._last.records["backward"]]
        for block in ("h0", "h1"):
            for gather, layers in ((f"{block}.ln1/copy", ("attn.q", "attn.k", "attn.v")),
                                   (f"{block}.ln2/copy", ("mlp.fc",))):
                start = names.index((f"{gather} reduce_scatter start", gather))
                wait = names.index((f"{gather} reduce_scatter wait", gather))
                between = {node for _, node in names[start + 1:wait]}
                assert {f"{block}.{x}.matmul" for x in layers} <= between, (where, between)
    _matches_one_process(part, graph, where, PLANNED_TOLERANCE)  # the plan run again


def _check_overlapped(steps: list, where: str) -> None:
    """Every backward allreduce of the plan started before, and waited after, the weight
    gradients of the column-parallel layers that read its copy (``tensor_parallel.lowering``,
    ``lv1.plan.overlap``), with no Python copy of a gradient around it."""
    names = [(s.name, s.node) for s in steps]
    for block in ("h0", "h1"):
        for copy, layers in ((f"{block}.ln1/copy", ("attn.q", "attn.k", "attn.v")),
                             (f"{block}.ln2/copy", ("mlp.fc",))):
            start = names.index((f"{copy} allreduce start", copy))
            wait = names.index((f"{copy} allreduce wait", copy))
            between = {node for _, node in names[start + 1:wait]}
            assert {f"{block}.{x}.matmul" for x in layers} <= between, (where, copy, between)
    assert not any("copy" in name and "allreduce" not in name for name, _ in names), \
        (where, names)


def check_planned_pipelined_gpt_matches_single_process(comm: Communicator) -> None:
    """Float32, every stage a compiled plan, 4 micro-batches under GPipe (all 4 in flight:
    4 slot executors on the first stage) and 1F1B: loss, logits and the stage's gradients
    (the tied embedding's summed) within 1e-5 of one reference process, twice each."""
    graph = small_gpt(dtype=np.float32)
    feeds = batch(8, seed=2)
    want_values, want = ReferenceExecutor(graph).train(True).inference_and_backprop(
        feeds, outputs=["logits"])
    for schedule in ("gpipe", "1f1b"):
        pipe = pipelined(graph, comm, 4, PlannedExecutor, schedule)
        for _ in range(2):
            values, grads = pipe.inference_and_backprop(feeds, outputs=["logits"])
        where = f"rank {comm.rank}/{comm.size} (planned, {schedule})"
        assert all(isinstance(ex, PlannedExecutor) and ex.unplanned is None
                   for ex in pipe.slots), where
        held = 4 if schedule == "gpipe" else min(4, comm.size - comm.rank)  # 1F1B: p - s
        assert len(pipe.slots) == held, (where, len(pipe.slots))
        assert sorted(grads) == sorted(pipe.stage_graph.parameters), where
        for name, g in grads.items():
            _close(g, want[name], f"{where}: {name}", PLANNED_TOLERANCE)
        for k in ("loss", "logits"):
            _close(values[k], want_values[k], f"{where}: {k}", PLANNED_TOLERANCE)


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__: f
    for f in (
        check_tensor_parallel_gpt_matches_single_process,
        check_tensor_parallel_adam_steps_match,
        check_pipelined_gpt_matches_single_process,
        check_pipelined_adam_steps_keep_the_tied_copies_equal,
        check_planned_tensor_parallel_gpt_matches_single_process,
        check_planned_pipelined_gpt_matches_single_process,
        check_sequence_parallel_gpt_matches_single_process,
        check_sequence_parallel_adam_steps_match,
        check_planned_sequence_parallel_gpt_matches_single_process,
    )
}


def main(argv: list[str]) -> int:
    return checks.main(CHECKS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
