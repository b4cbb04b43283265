from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from meta.lv3 import SingleProcessCommunicator, launched_size, world
from meta.lv3.comm.communicator import RANK_ONLY_VARIABLES, SIZE_VARIABLES
from tests.launch import clean_env


@pytest.fixture
def comm() -> SingleProcessCommunicator:
    return SingleProcessCommunicator()


def test_single_process_identity(comm: SingleProcessCommunicator) -> None:
    assert (comm.rank, comm.size, comm.is_root) == (0, 1, True)
    buf = np.arange(6.0).reshape(2, 3)
    for op in ("sum", "max", "min"):
        assert comm.allreduce(buf, op=op) is buf
    assert comm.bcast(buf) is buf
    np.testing.assert_array_equal(buf, np.arange(6.0).reshape(2, 3))
    comm.barrier()


def test_single_process_allgather_is_a_copy(comm: SingleProcessCommunicator) -> None:
    buf = np.arange(3, dtype=np.float32)
    out = comm.allgather(buf)
    assert out.shape == (1, 3) and out.dtype == np.float32
    assert not np.shares_memory(out, buf)
    np.testing.assert_array_equal(out[0], buf)


def test_single_process_objects(comm: SingleProcessCommunicator) -> None:
    meta = {"epoch": 3}
    assert comm.bcast_obj(meta) is meta
    assert comm.gather_obj(meta) == [meta]
    assert comm.allreduce_obj(2.5) == 2.5
    assert comm.allreduce_obj(2.5, op="max") == 2.5


def test_errors_name_the_problem(comm: SingleProcessCommunicator) -> None:
    with pytest.raises(ValueError, match="'prod'"):
        comm.allreduce(np.zeros(2), op="prod")
    with pytest.raises(ValueError, match="'mean'"):
        comm.allreduce_obj(1, op="mean")
    with pytest.raises(ValueError, match="root 1 .* size-1"):
        comm.bcast(np.zeros(2), root=1)
    with pytest.raises(ValueError, match="root 2"):
        comm.gather_obj(0, root=2)
    with pytest.raises(ValueError, match=r"shape \(3, 2\) and dtype float32 is not C-contiguous"):
        comm.allreduce(np.zeros((3, 4), dtype=np.float32)[:, ::2])
    with pytest.raises(TypeError, match="list"):
        comm.bcast([1.0, 2.0])
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        comm.allreduce(frozen)
    comm.allgather(frozen)  # reading is fine


def test_launched_size() -> None:
    assert launched_size({}) is None
    assert launched_size({"PMI_SIZE": "4", "PMI_RANK": "1"}) == 4
    assert launched_size({"OMPI_COMM_WORLD_SIZE": "2"}) == 2
    assert launched_size({"PMIX_RANK": "0"}) == 0  # a launcher, size unknown: ask MPI


def test_world_without_launcher_is_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SIZE_VARIABLES + RANK_ONLY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    world.cache_clear()
    try:
        assert isinstance(world(), SingleProcessCommunicator)
        assert world() is world()
        monkeypatch.setenv("PMI_SIZE", "1")  # mpiexec -n 1: no MPI needed either
        world.cache_clear()
        assert isinstance(world(), SingleProcessCommunicator)
    finally:
        world.cache_clear()


def test_world_does_not_import_mpi4py() -> None:
    code = (
        "import sys; from meta.lv3 import world; c = world(); "
        "print(type(c).__name__, 'mpi4py' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), timeout=60, check=True).stdout
    assert out.split() == ["SingleProcessCommunicator", "False"]


# Surviving a dead rank (meta.lv3.comm.survival): the logic, without an MPI that has ULFM. A fake
# mpi4py module and communicator play rank 0 of 3 whose peer, world rank 1, dies in a call.
class FakeMPI:
    ERR_PROC_FAILED, ERR_PROC_FAILED_PENDING, ERR_REVOKED, ERR_IN_STATUS, ERR_OTHER = range(5)
    IN_PLACE, SUM, MAX, MIN, REQUEST_NULL = object(), "sum", "max", "min", "null"

    class Exception(Exception):  # noqa: A001, N818 - mpi4py's name, which is_failure checks
        def __init__(self, error_class: int) -> None:
            super().__init__(error_class)
            self.error_class = error_class

        def Get_error_class(self) -> int:  # noqa: N802 - mpi4py's name
            return self.error_class

    class Status:
        pass

    class COMM_WORLD:  # noqa: N801
        @staticmethod
        def Get_size() -> int:  # noqa: N802
            return 3


class FakeComm:
    """World ranks ``ranks``; this process is world rank ``me`` (default: the first). The
    first collective after ``fail`` is set raises ``ERR_PROC_FAILED`` (leaving garbage in its
    buffer); the agreement then says "failed" and ``Shrink`` drops world rank ``dies``.
    Collectives sum ``size`` equal contributions."""

    def __init__(self, ranks: list[int], fail: bool = False, dies: int = 1,
                 me: int | None = None) -> None:
        self.ranks, self.fail, self.failed, self.revoked = ranks, fail, False, False
        self.dies, self.me = dies, ranks[0] if me is None else me

    def Get_rank(self) -> int:  # noqa: N802
        return self.ranks.index(self.me)

    def Get_size(self) -> int:  # noqa: N802
        return len(self.ranks)

    def Allreduce(self, _, buf: np.ndarray, op: str) -> None:  # noqa: N802
        if self.fail:
            self.fail, self.failed = False, True
            buf[...] = -99
            raise FakeMPI.Exception(FakeMPI.ERR_PROC_FAILED)
        buf *= len(self.ranks)

    def bcast(self, obj, root: int = 0):
        return (obj, root)

    def Is_revoked(self) -> bool:  # noqa: N802
        return self.revoked

    def Revoke(self) -> None:  # noqa: N802
        self.revoked = True

    def Ack_failed(self) -> None:  # noqa: N802
        pass

    def Agree(self, flag: int) -> int:  # noqa: N802
        return flag and not self.failed

    def Shrink(self) -> FakeComm:  # noqa: N802
        return FakeComm([r for r in self.ranks if r != self.dies], dies=self.dies, me=self.me)


@pytest.fixture
def fake_mpi(monkeypatch: pytest.MonkeyPatch) -> type[FakeMPI]:
    from meta.lv3.comm import communicator, survival

    monkeypatch.setattr(communicator, "_import_mpi", lambda: FakeMPI)
    monkeypatch.setattr(survival, "_import_mpi", lambda: FakeMPI)
    monkeypatch.setattr(survival, "world_ranks", lambda comm: list(comm.ranks))
    return FakeMPI


def test_a_collective_that_loses_a_rank_is_repeated_on_the_survivors(fake_mpi) -> None:
    from meta.lv3.comm.survival import SurvivingCommunicator

    comm = SurvivingCommunicator(FakeComm([0, 1, 2]))
    shrinks = []
    comm.on_shrink.append(lambda c: shrinks.append((c.rank, c.size)))
    assert comm.allreduce(np.ones(2)).tolist() == [3.0, 3.0]  # no failure: as MPI
    comm.comm.fail = True
    revoked = comm.comm
    out = comm.allreduce(np.ones(2))
    assert out.tolist() == [2.0, 2.0]  # the inputs, not the garbage, summed over 2 survivors
    assert revoked.revoked and (comm.rank, comm.size, comm.lost) == (0, 2, [1])
    assert shrinks == [(0, 2)] and comm.members == [0, 2]


def test_a_broadcast_root_keeps_its_identity_across_a_shrink(fake_mpi) -> None:
    from meta.lv3.comm.survival import LostRankError, SurvivingCommunicator

    comm = SurvivingCommunicator(FakeComm([0, 1, 2]))
    comm._shrink()
    assert comm.bcast_obj("x", root=1) == ("x", 1)  # world rank 2 is now rank 1
    members = [0, 1, 2]
    with pytest.raises(LostRankError, match="lost root rank 1 of 3 during a broadcast"):
        comm._root(1, members)


@pytest.mark.parametrize("me,takes_over", [(1, True), (2, False)])
def test_the_first_survivor_takes_over_the_outputs_when_rank_0_dies(fake_mpi, me, takes_over):
    from meta.lv3.comm.survival import SurvivingCommunicator, hand_over_outputs

    comm = SurvivingCommunicator(FakeComm([0, 1, 2], fail=True, dies=0, me=me))
    taken = []
    hand_over_outputs(comm, taken.append)
    assert comm.allreduce(np.ones(1)).tolist() == [2.0]  # survived: rank 0 is a worker
    assert comm.lost == [0] and comm.members == [1, 2]
    assert taken == ([0] if takes_over else [])  # the dead writer's world rank, once


def test_a_death_that_is_not_the_writers_hands_nothing_over(fake_mpi) -> None:
    from meta.lv3.comm.survival import SurvivingCommunicator, hand_over_outputs

    comm = SurvivingCommunicator(FakeComm([0, 1, 2], fail=True, dies=2, me=1))
    taken = []
    hand_over_outputs(comm, taken.append)
    comm.allreduce(np.ones(1))
    assert comm.lost == [2] and taken == []


def test_other_mpi_errors_are_not_survived(fake_mpi) -> None:
    from meta.lv3.comm.survival import SurvivingCommunicator, is_failure

    comm = SurvivingCommunicator(FakeComm([0, 1, 2]))

    def broken(*_):
        raise FakeMPI.Exception(FakeMPI.ERR_OTHER)

    comm.comm.Allreduce = broken
    with pytest.raises(FakeMPI.Exception):
        comm.allreduce(np.ones(1))
    assert comm.size == 3 and not comm.comm.revoked
    assert is_failure(FakeMPI.Exception(FakeMPI.ERR_REVOKED))
    assert not is_failure(ValueError("a bug"))


def test_without_ulfm_nothing_changes(comm: SingleProcessCommunicator) -> None:
    from meta.lv3.comm.survival import surviving, ulfm_on

    assert not ulfm_on({}) and not ulfm_on({"OMPI_MCA_mpi_ft_enable": "0"})
    assert surviving(comm) is comm


def test_roster_reports_a_dead_worker() -> None:
    from meta.lv3.parameter_server.shard_server import DIED, FINISHED, Roster

    roster = Roster([0, 1, 2])
    roster.mark(0, FINISHED, steps=250, pushes=250)
    roster.mark(1, DIED, steps=137, pushes=137, at=8.14)
    roster.mark(2, FINISHED, steps=250, pushes=250)
    other = Roster([0, 1, 2])  # a second server saw worker 1 finish: DIED wins the merge
    other.mark(1, FINISHED, steps=140, pushes=140)
    np.maximum(roster.info, other.info, out=roster.info)
    assert roster.died() == [1] and roster.survivors(servers=[3]) == [0, 2, 3]
    assert roster.departures(steps_per_epoch=125) == [
        "lost worker rank 1: its process died after 140 steps (epoch 2), 8.1 s into training; "
        "140 of its updates were applied; the other workers trained on without the rest of "
        "its shard of data"]
    assert roster.death_metrics(125) == {
        "workers_died": 1.0, "lost_rank_1_step": 140.0, "lost_rank_1_epoch": 2.0,
        "lost_rank_1_after_s": 8.14, "lost_rank_1_updates_applied": 140.0}
    assert Roster([0, 1]).death_metrics(125) == {}  # nothing to report when none died


def test_a_server_drops_only_dead_workers(fake_mpi, monkeypatch: pytest.MonkeyPatch) -> None:
    from meta.lv3.comm.survival import LostRankError
    from meta.lv3.parameter_server import shard_server
    from meta.lv3.parameter_server.shard_server import DIED, Roster

    # an inactive request as MPI hands it out (the comm below stands in for the MPI one)
    monkeypatch.setattr(SingleProcessCommunicator, "null_request",
                        lambda self: FakeMPI.REQUEST_NULL)
    roster, active = Roster([0, 1, 2]), {0, 1, 2}
    receives, sends = ["r0", "r1", "r2"], [None, "s1", None]
    failure = FakeMPI.Exception(FakeMPI.ERR_PROC_FAILED)
    with pytest.raises(ValueError, match="a bug"):  # not a death: raised as it is
        roster.drop_dead(ValueError("a bug"), None, active, [receives], [0, 0, 0], 0.0)
    monkeypatch.setattr(shard_server, "failed_ranks", lambda comm: [1])
    roster.drop_dead(failure, SingleProcessCommunicator(), active, [receives, sends],
                     [5, 7, 6], 0.0, steps_per_update=2)
    assert active == {0, 2} and receives == ["r0", "null", "r2"]
    assert sends == [None, "null", None]
    assert roster.status(1) == DIED and roster.info[1, Roster.STEPS] == 14
    with pytest.raises(FakeMPI.Exception):  # the error was not about an active worker
        roster.drop_dead(failure, SingleProcessCommunicator(), active, [receives], [0] * 3, 0.0)
    monkeypatch.setattr(shard_server, "failed_ranks", lambda comm: [0, 1])
    roster.drop_dead(failure, SingleProcessCommunicator(), active, [receives], [3, 0, 0], 0.0)
    assert active == {2} and roster.died() == [0, 1]  # rank 0 is a worker like the others
    monkeypatch.setattr(shard_server, "failed_ranks", lambda comm: [3])
    with pytest.raises(LostRankError, match="^lost server rank 3 of 1 .* the run cannot go on"):
        roster.drop_dead(failure, SingleProcessCommunicator(), active, [receives], [0] * 3, 0.0)
    monkeypatch.setattr(shard_server, "failed_ranks", lambda comm: [0, 1, 2])
    with pytest.raises(LostRankError, match=r"^every worker of the run died \(ranks 0, 1, 2\)"):
        roster.drop_dead(failure, SingleProcessCommunicator(), active, [receives], [0] * 3, 0.0)


def test_evaluation_is_resharded_when_a_replica_dies_in_its_sum() -> None:
    from meta.lv2 import ArrayDataset, ShuffleSampler, Trainer

    class Perfect:  # an executor whose logits always pick the label
        def train(self, mode: bool = True) -> None:
            pass

        def inference(self, feeds, outputs=None):
            labels = feeds["labels"]
            return {"logits": np.eye(3)[labels], "loss": np.float64(0.5)}

    data = ArrayDataset(np.zeros((10, 1)), np.arange(10) % 3)
    sums = []

    def sum_across(values: np.ndarray) -> np.ndarray:
        sums.append(values[2])
        if len(sums) == 1:  # the second of 2 replicas died in this sum: this one is alone
            trainer.eval_shard = (0, 1)
            return values * 0
        return values

    trainer = Trainer(Perfect(), None, data, ShuffleSampler(10, 5), data,
                      sum_across=sum_across, eval_shard=(0, 2))
    assert trainer.evaluate(data) == {"loss": 0.5, "accuracy": 1.0}
    assert sums == [5.0, 10.0]  # its shard, then the whole test set


def test_no_two_protocols_share_a_message_tag() -> None:
    from meta.lv3.comm import tags

    owners: dict[int, str] = {}
    for name, block in tags.BLOCKS.items():
        if name in tags.SHARED_ON_PURPOSE:
            continue
        for tag in block:
            assert tag not in owners, f"tag {tag} is {owners[tag]}'s and {name}'s"
            assert 0 <= tag <= 32767, f"{name}'s tag {tag} is beyond what MPI guarantees"
            owners[tag] = name
    assert owners[tags.HIERARCHY[0]] == "hierarchy" and owners[41] == "sandblaster"


def test_one_polling_loop_with_an_idle_policy_and_a_deadline() -> None:
    import time

    from meta.lv3.comm.polling import poll, poll_until

    calls: list[int] = []
    state = {"left": 3}

    def done() -> bool:
        state["left"] -= 1
        return state["left"] < 0

    def idle() -> bool:  # work done: no sleep between tests
        calls.append(1)
        return True

    assert poll_until(done, idle) and len(calls) == 3
    start = time.monotonic()
    assert not poll_until(lambda: False, deadline=start + 0.01)
    assert 0.01 <= time.monotonic() - start < 1.0
    comm = SingleProcessCommunicator()
    assert poll(comm, [None, comm.iallreduce(np.ones(2))]) is None  # size 1: done at once
    with pytest.raises(ValueError, match="until must be 'all' or 'any'"):
        poll(comm, [], until="some")
