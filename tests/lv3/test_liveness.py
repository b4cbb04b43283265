"""The watchdog's parts without MPI: how it tells a live peer from a dead one, and how it ends
a process (one line on the lowest survivor, exit 3). The whole, under mpiexec, is
tests/e2e/test_no_hang.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from meta.lv3.comm.liveness import EXIT_RANK_DIED, Peer, alive, me


def test_a_running_process_is_alive() -> None:
    assert alive(me(0))


def test_a_reaped_process_a_zombie_and_a_reused_pid_are_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    peer = Peer(1, me(1).host, child.pid, "")
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not alive(peer)
    child.wait()
    assert not alive(peer)
    assert not alive(me(0)._replace(started="1"))  # this pid, another process's start time


def test_the_lowest_survivor_names_the_dead_rank_and_every_survivor_exits_3() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    script = textwrap.dedent(f"""
        import time
        from meta.lv3.comm.liveness import Peer, Watchdog, me
        rank = {{rank}}
        dead = Peer(0, me(0).host, {child.pid}, "")
        other = Peer(1 if rank == 2 else 2, me(0).host, {os.getpid()}, "")
        Watchdog(me(rank), [dead, other], 3).start()
        time.sleep(20)
        print("not ended")
    """)
    for rank, says in ((1, True), (2, False)):
        done = subprocess.run([sys.executable, "-c", script.format(rank=rank)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == EXIT_RANK_DIED, done
        line = f"meta: rank 0 (pid {child.pid} on {me(0).host.split()[0]}) died; ending this job"
        assert done.stderr.splitlines() == ([line] if says else []), done
        assert "not ended" not in done.stdout


class _World:
    def __init__(self, rank: int) -> None:
        self.rank, self.size, self.comm = rank, 4, None


@pytest.mark.parametrize("rank,survivable,code,ends", [
    (0, False, 0, 3), (2, False, 1, 3), (2, False, 2, 2), (0, True, 0, 0), (0, True, 1, 1)])
def test_under_ulfm_a_death_fails_a_run_that_cannot_survive_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, rank: int,
        survivable: bool, code: int, ends: int) -> None:
    """Rank 1 of 4 died and this rank finished with ``code``: a run that asked for no
    surviving communicator (a pipeline, allreduce) ends with exit 3 instead of 0 or 1 (Open
    MPI's mpiexec --with-ft ulfm exits with the survivors' status), the lowest survivor saying
    so; a survivable run keeps its verdict; an error keeps its code."""
    from meta.lv3.comm import survival

    def exit_now(status: int) -> None:
        raise SystemExit(status)

    monkeypatch.setattr(survival, "ulfm_on", lambda: True)
    monkeypatch.setattr(survival, "_import_mpi", lambda: type("MPI", (), {"COMM_WORLD": None}))
    monkeypatch.setattr(survival, "MPICommunicator", lambda comm: _World(rank))
    monkeypatch.setattr(survival, "failed_ranks", lambda comm: [1])
    monkeypatch.setattr(survival, "_SURVIVABLE", [survivable])
    monkeypatch.setattr(survival.os, "_exit", exit_now)
    with pytest.raises(SystemExit) as ended:
        survival.end_without_finalize_after_a_death(code)
    assert ended.value.code == ends
    said = capsys.readouterr().err.splitlines()
    assert said == (["meta: error: rank 1 of 4 died during a run that cannot go on without it; "
                     f"{survival.RESTART_HINT}"] if ends == 3 and rank == 0 else [])
