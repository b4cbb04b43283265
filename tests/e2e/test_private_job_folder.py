"""The liveness watchdog's job folder against another local user (issue 44): they pre-create
every name the job could use in the temporary folder (this user's ``meta-UID`` folder, as a
symbolic link or as their own open folder; job folders with links and forged markers in them),
and the job neither writes outside its own private folder nor hangs: a killed rank still ends
it within 10 s, named in one line. The attacker is an unprivileged uid (nobody's, 65534) in a
forked child; the test needs root to become them."""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.launch import clean_env, find_mpiexec, run_command

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

ATTACKER = 65534  # nobody
JOB = """
    import os, signal, time
    from meta.lv3 import world
    from meta.lv3.comm import liveness
    comm = world()
    comm.barrier()
    print(f"rank {comm.rank} pid {os.getpid()} job folder {liveness._WATCHING[0].job}",
          flush=True)
    comm.barrier()
    if comm.rank == 1:
        time.sleep(0.5)
        print(f"killed at {time.time()}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    comm.barrier()  # never returns under -disable-auto-cleanup, but for the watchdog
    print("not ended", flush=True)
"""


def _as_attacker(work) -> None:  # noqa: ANN001 - a callable of no arguments
    """Run ``work`` as the unprivileged attacker, in a forked child; fail if it failed."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(ATTACKER)
            os.setuid(ATTACKER)
            work()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the attacker's setup failed"


def _plant(root: Path, lair: Path, how: str) -> None:
    """As the attacker: this user's private folder name taken (``how``), and job folders with a
    marker linked to where the attacker wants a file and forged markers, in both places."""
    os.umask(0)
    lair.mkdir(mode=0o777)
    mine = root / "meta-0"  # the victim's (root's) private folder name
    if how == "link":
        mine.symlink_to(lair)
    else:
        mine.mkdir(mode=0o777)
    for where in (root, lair, mine):
        for suffix in ("", "aaaaaaaa", "00000000", "________"):
            job = where / f"meta-job-{suffix}"
            if job.exists():
                continue
            job.mkdir(mode=0o777)
            for rank in range(3):
                (job / f"left.{rank}").symlink_to(lair / f"planted.{rank}")
            (job / "left.1.forged").write_text("forged")
            (job / "pid.1.1").write_text("forged")


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` (links not followed): its owner and size."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            seen[os.path.relpath(os.path.join(dirpath, name), folder)] = (st.st_uid, st.st_size)
    return seen


@pytest.mark.parametrize("how", ["link", "folder"])
def test_another_users_folders_links_and_markers_neither_receive_files_nor_hang_the_job(
        how: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("becoming another user (the attacker) needs root")
    # like /tmp: open to all, sticky; not under pytest's tmp_path, which nobody cannot enter
    root = Path(tempfile.mkdtemp(prefix="meta-attack-", dir="/tmp"))
    try:
        root.chmod(0o1777)
        lair = root / "lair"
        _as_attacker(lambda: _plant(root, lair, how))
        before = _snapshot(root)
        script = root / "job.py"
        script.write_text(textwrap.dedent(JOB))
        # each rank under a shell that ignores Hydra's SIGUSR1 (as tests/e2e/test_no_hang.py's
        # wrapped_job): else Hydra itself ends the survivor, and no hang could be seen
        shell = f"trap '' USR1; '{sys.executable}' '{script}'; code=$?; exit $code"
        out = run_command([str(find_mpiexec()), "-disable-auto-cleanup", "-n", "2",
                           "sh", "-c", shell],
                          clean_env({"TMPDIR": str(root), "OMP_NUM_THREADS": "1"}),
                          timeout=60, expect_rc=None)
        ended = time.time()
        assert "not ended" not in out and "Traceback" not in out, out
        (killed,) = re.findall(r"killed at ([0-9.]+)", out)
        assert ended - float(killed) < 10, out
        pids = re.findall(r"rank 1 pid (\d+)", out)
        assert f"meta: rank 1 (pid {pids[0]} on " in out and " died; ending this job" in out, out
        mine = root / "meta-0"
        assert f"meta: warning: {mine} " in out, out  # the taken name, said in one line
        (folder,) = set(re.findall(r"job folder (\S*?meta-job-[a-z0-9_]{8})", out))
        assert Path(folder).parent == root, out  # its own, by mkdtemp: not the attacker's
        assert not Path(folder).exists(), out  # removed by the rank that spoke
        for pid in re.findall(r"pid (\d+) job folder", out):  # no rank outlived mpiexec
            assert not Path(f"/proc/{pid}").exists() or \
                Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", out
        after = _snapshot(root)
        after.pop("job.py", None)
        assert after == before, out  # nothing written, removed or changed in what they made
        assert not any(name.startswith("planted") for name in os.listdir(lair)), out
        assert stat.S_IMODE(os.lstat(root).st_mode) == 0o1777
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
