from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from meta.lv3 import SingleProcessCommunicator, launched_size, world
from meta.lv3.communicator import RANK_ONLY_VARIABLES, SIZE_VARIABLES
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
