"""Every message tag meta sends, in one table.

MPI matches a receive by (communicator, source, tag), so two protocols may share a number only if
they never have messages in flight on one communicator at once. Rather than rely on that, each
protocol has its own block below and no number is in two blocks; the one deliberate exception is
the pipeline's micro-batch range, which covers the small numbers and travels only on the
pipeline's stage communicator (``pipeline.stage``), where no other protocol sends a message.
The shard-server protocol is one protocol, spoken by ``downpour``, ``hierarchical_ps`` and
``hybrid_downpour`` alike. ``tests/lv3/comm/test_communicator.py`` checks the blocks are disjoint.
"""

from __future__ import annotations

LINK_PROBE = 7  # costmodel.measure_link's ping-pong
# planner.async_pattern's workers and server: EXCHANGE (answered at once), PUSH, FETCH
ASYNC_PATTERN = (8, 9, 10)
# parameter_server.central's asynchronous server (and parameter_server.rma):
# GRADS, PARAMS, DONE, ORDER, ROSTER
ASYNC_SERVER = (11, 12, 13, 14, 15)
RING = 21  # data_parallel.averaging's ring
# parameter_server.shard_server: PUSH, FETCH, PARAMS, DONE, GO, EXIT, VERDICT
SHARD_SERVER = (31, 32, 33, 34, 35, 36, 37)
# sandblaster: CMD, REPLY, ROWS, TASK, RESULT, PUSH, FETCH, PARAMS, STOP, GATHERED
SANDBLASTER = tuple(range(41, 51))
# parameter_server.hierarchical's aggregators: UP (gradients), DOWN (parameters). They were
# 41 and 42, Sandblaster's CMD and REPLY: harmless (never in one run) but a trap.
HIERARCHY = (51, 52)
GROUP_CREATE = 77  # polling.group_comm's MPI_Comm_create_group
# pipeline.stage: micro-batch i's forward 2i, its backward 2i + 1; then PROBE and VALUES
PIPELINE_MICRO_BATCHES = range(0, 32000)
PIPELINE = (32765, 32766)  # MPI guarantees tags up to 32767

BLOCKS: dict[str, tuple[int, ...] | range] = {
    "link_probe": (LINK_PROBE,), "async_pattern": ASYNC_PATTERN, "async_server": ASYNC_SERVER,
    "ring": (RING,), "shard_server": SHARD_SERVER, "sandblaster": SANDBLASTER,
    "hierarchy": HIERARCHY, "group_create": (GROUP_CREATE,), "pipeline": PIPELINE,
    "pipeline_micro_batches": PIPELINE_MICRO_BATCHES,
}
SHARED_ON_PURPOSE = ("pipeline_micro_batches",)  # see the module's docstring
