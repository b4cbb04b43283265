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
from meta.lv3.comm.liveness import EXIT_RANK_DIED, Peer, Watchdog, alive, me, write_token


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
        Watchdog(me(rank), [dead, other], 3, Path({{job!r}}), "t").start()
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
    watchdog = Watchdog(me(0), [left, died, running], 4, tmp_path, "token")
    write_token(tmp_path / "left.1", "token")
    (tmp_path / "left.2").write_text("forged")  # a marker without the job's token: no marker
    assert watchdog.dead() == [died]
    assert watchdog.peers == [died, running]  # one that left is watched no more


def test_the_last_to_leave_removes_the_folder_and_no_rank_then_sees_a_death(
        tmp_path: Path) -> None:
    host, job = me(0).host, tmp_path / "job"
    job.mkdir()
    first, last = Peer(0, host, _gone(), ""), Peer(1, host, os.getpid(), me(1).started)
    early = Watchdog(first._replace(pid=os.getpid()), [last], 2, job, "t")
    early.leave()  # rank 0 leaves first: rank 1 runs on, the folder stays
    assert early.left and (job / "left.0").exists() and job.is_dir()
    late = Watchdog(last, [first], 2, job, "t")
    late.leave()  # rank 1 finds every marker of its host
    assert not job.exists()
    gone = Watchdog(first, [last._replace(pid=_gone())], 2, job, "t")
    assert gone.dead() == [last._replace(pid=gone.peers[0].pid)]  # not left: a death
    gone.left = True
    assert gone.dead() == [] and gone.peers == []  # left, and the folder gone: all left


def test_a_job_folder_whose_ranks_are_all_gone_is_swept(tmp_path: Path) -> None:
    """A job whose ranks were all killed at once (mpiexec's auto-cleanup) left its folder;
    the next job removes it, and no other: one with a live rank, one whose ranks have not
    named themselves yet, its own, and what is not a job folder."""
    def job(name: str, *ranks: tuple[int, str]) -> Path:
        folder = tmp_path / f"{liveness.JOB_PREFIX}{name}"
        folder.mkdir(mode=0o700)
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


def test_a_normal_exit_writes_the_marker_then_finalizes_with_the_watchdog_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_leave`` (at exit) calls ``MPI_Finalize`` itself while the watchdog runs: mpi4py would
    call it once the interpreter has ended, with no Python thread left to see a death."""
    watchdog = Watchdog(me(0), [me(1)], 2, tmp_path, "t").start()
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


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder of this test's own (``tempfile.gettempdir()`` answers it)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_job_folder_is_private_unpredictable_and_in_this_users_folder(
        temporary: Path) -> None:
    first, token, warning = liveness.make_job_folder()
    second, other, _ = liveness.make_job_folder()
    mine = temporary / f"meta-{os.geteuid()}"
    assert warning is None and first.parent == second.parent == mine
    assert first != second and token != other and len(token) == 32
    for folder in (mine, first):
        assert liveness.not_private(folder) is None
        assert folder.stat().st_mode & 0o777 == 0o700


def test_a_private_folder_name_taken_by_a_link_or_an_open_folder_is_not_used(
        temporary: Path) -> None:
    mine = temporary / f"meta-{os.geteuid()}"
    elsewhere = temporary / "elsewhere"
    elsewhere.mkdir()
    mine.symlink_to(elsewhere)
    job, _, warning = liveness.make_job_folder()
    assert job.parent == temporary and not list(elsewhere.iterdir())
    assert warning == f"{mine} is a symbolic link: job folders go to {temporary} instead"
    mine.unlink()
    mine.mkdir(mode=0o700)
    mine.chmod(0o777)
    assert liveness.not_private(mine) == "is open to other users (mode 777)"
    assert liveness.make_job_folder()[0].parent == temporary


def test_a_marker_is_never_written_through_a_link_nor_read_through_one(tmp_path: Path) -> None:
    target = tmp_path / "target"
    (tmp_path / "left.0").symlink_to(target)
    with pytest.raises(OSError):
        write_token(tmp_path / "left.0", "t")
    assert not target.exists()
    write_token(target, "t")
    assert liveness.holds(target, "t") and not liveness.holds(tmp_path / "left.0", "t")
    with pytest.raises(FileExistsError):  # never a file that exists
        write_token(target, "t")
    assert not liveness.holds(target, "u") and not liveness.holds(tmp_path / "none", "t")


def test_a_link_or_another_users_job_folder_is_never_swept(tmp_path: Path) -> None:
    stale = tmp_path / "stale"
    stale.mkdir(mode=0o700)
    (stale / f"{liveness.PID}{_gone()}.").touch()
    (tmp_path / f"{liveness.JOB_PREFIX}link").symlink_to(stale)
    liveness.sweep(tmp_path, keep=tmp_path / "own")
    assert stale.exists() and (tmp_path / f"{liveness.JOB_PREFIX}link").is_symlink()


class _Gather:
    """``comm.comm`` of a rank 0 whose peer (rank 1) runs on this host: its answers."""

    def __init__(self, peer_offer: object = None) -> None:
        self.peer_offer, self.calls = peer_offer, 0

    def allgather(self, obj: object) -> list[object]:
        self.calls += 1
        return [obj, tuple(me(1))] if self.calls == 1 else [obj, self.peer_offer]


def test_no_usable_temporary_folder_is_one_warning_not_a_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import tempfile

    def none() -> str:
        raise FileNotFoundError(2, "No usable temporary directory found in ['/nowhere']")

    monkeypatch.setattr(tempfile, "gettempdir", none)
    comm = types.SimpleNamespace(rank=0, size=2, comm=_Gather())
    assert liveness.watch_peers(comm) is None and comm.comm.calls == 2  # took part in both
    host = me(0).host.split()[0]
    assert capsys.readouterr().err.splitlines() == [
        f"meta: warning: no liveness watch on the ranks of host {host}: cannot make a private "
        "job folder (No usable temporary directory found in ['/nowhere']); set TMPDIR to a "
        "writable folder"]


def test_a_rank_refuses_a_job_folder_that_is_not_its_users_own(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Rank 1 is handed rank 0's folder: it checks it before it writes there."""
    offered = tmp_path / "job"
    offered.mkdir(mode=0o755)
    comm = types.SimpleNamespace(rank=1, size=2, comm=None)

    class Gather(_Gather):
        def allgather(self, obj: object) -> list[object]:
            self.calls += 1
            return [tuple(me(0)), obj] if self.calls == 1 else [(str(offered), "t"), obj]

    comm.comm = Gather()
    assert liveness.watch_peers(comm) is None and not list(offered.iterdir())
    assert capsys.readouterr().err.splitlines() == [
        f"meta: warning: no liveness watch on rank 1: job folder {offered} is open to other "
        "users (mode 755)"]
