"""The watchdog's parts without MPI: how it tells a live peer from a dead one and from one that
left normally (its marker in the job folder), and how it ends a process (one line on the
lowest survivor, exit 3). The whole, under mpiexec, is tests/e2e/test_no_hang.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from meta.lv3.comm import liveness
from meta.lv3.comm.liveness import EXIT_RANK_DIED, Peer, Watchdog, alive, job_folder, me


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


def test_the_lowest_survivor_names_the_dead_rank_and_every_survivor_exits_3(
        tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    job = str(tmp_path / "job")
    Path(job).mkdir()
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from meta.lv3.comm.liveness import Peer, Watchdog, me
        rank = {{rank}}
        dead = Peer(0, me(0).host, {child.pid}, "")
        other = Peer(1 if rank == 2 else 2, me(0).host, {os.getpid()}, "")
        Watchdog(me(rank), [dead, other], 3, Path({{job!r}})).start()
        time.sleep(20)
        print("not ended")
    """)
    for rank, says in ((2, False), (1, True)):
        done = subprocess.run([sys.executable, "-c", script.format(rank=rank, job=job)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == EXIT_RANK_DIED, done
        line = f"meta: rank 0 (pid {child.pid} on {me(0).host.split()[0]}) died; ending this job"
        assert done.stderr.splitlines() == ([line] if says else []), done
        assert "not ended" not in done.stdout
        assert Path(job).exists() != says  # the one that spoke removed the job folder


def _gone() -> int:
    """The pid of a process that ran and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_gone_peer_with_its_marker_left_and_one_without_died(tmp_path: Path) -> None:
    host = me(0).host
    left, died, running = Peer(1, host, _gone(), ""), Peer(2, host, _gone(), ""), me(3)
    watchdog = Watchdog(me(0), [left, died, running], 4, tmp_path)
    (tmp_path / "left.1").touch()
    assert watchdog.dead() == [died]
    assert watchdog.peers == [died, running]  # one that left is watched no more


def test_the_last_to_leave_removes_the_folder_and_no_rank_then_sees_a_death(
        tmp_path: Path) -> None:
    host, job = me(0).host, tmp_path / "job"
    job.mkdir()
    first, last = Peer(0, host, _gone(), ""), Peer(1, host, os.getpid(), me(1).started)
    early = Watchdog(first._replace(pid=os.getpid()), [last], 2, job)
    early.leave()  # rank 0 leaves first: rank 1 runs on, the folder stays
    assert early.left and (job / "left.0").exists() and job.is_dir()
    late = Watchdog(last, [first], 2, job)
    late.leave()  # rank 1 finds every marker of its host
    assert not job.exists()
    gone = Watchdog(first, [last._replace(pid=_gone())], 2, job)
    assert gone.dead() == [last._replace(pid=gone.peers[0].pid)]  # not left: a death
    gone.left = True
    assert gone.dead() == [] and gone.peers == []  # left, and the folder gone: all left


def test_a_job_folder_whose_ranks_are_all_gone_is_swept(tmp_path: Path) -> None:
    """A job whose ranks were all killed at once (mpiexec's auto-cleanup) left its folder;
    the next job removes it, and no other: one with a live rank, one whose ranks have not
    named themselves yet, its own, and what is not a job folder."""
    def job(name: str, *ranks: tuple[int, str]) -> Path:
        folder = tmp_path / f"{liveness.JOB_PREFIX}{name}"
        folder.mkdir()
        for pid, started in ranks:
            (folder / f"{liveness.PID}{pid}.{started}").touch()
        return folder

    mine = me(0)
    stale = job("stale", (_gone(), ""), (_gone(), "7"))
    reused = job("reused", (mine.pid, "1"))  # this pid, another start time: gone too
    running = job("running", (_gone(), ""), (mine.pid, mine.started))
    starting, own = job("starting"), job("own", (_gone(), ""))
    other = tmp_path / "other"
    other.mkdir()
    liveness.sweep(tmp_path, keep=own)
    assert not stale.exists() and not reused.exists()
    assert running.exists() and starting.exists() and own.exists() and other.exists()


def test_the_job_folder_is_named_after_rank_0_alone() -> None:
    first = me(0)
    assert job_folder(first) == job_folder(Peer(*first))
    assert job_folder(first) != job_folder(first._replace(pid=first.pid + 1))
    assert job_folder(first).name.startswith(liveness.JOB_PREFIX)


def test_a_normal_exit_writes_the_marker_then_finalizes_with_the_watchdog_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_leave`` (at exit) calls ``MPI_Finalize`` itself while the watchdog runs: mpi4py would
    call it once the interpreter has ended, with no Python thread left to see a death."""
    watchdog = Watchdog(me(0), [me(1)], 2, tmp_path).start()
    seen: list[tuple[bool, bool]] = []
    mpi = types.SimpleNamespace(Is_initialized=lambda: True, Is_finalized=lambda: bool(seen),
                                Finalize=lambda: seen.append(
                                    ((tmp_path / "left.0").exists(),
                                     watchdog._thread.is_alive())))
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(rc=types.SimpleNamespace()))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    try:
        liveness._leave(watchdog)
        liveness._leave(watchdog)  # finalized already: not again
    finally:
        watchdog.stop()
    assert seen == [(True, True)]
    sys.modules["mpi4py"].rc.finalize = False  # the user asked mpi4py not to finalize
    seen.clear()
    mpi.Is_finalized = lambda: False
    liveness._leave(watchdog)
    assert seen == []


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
