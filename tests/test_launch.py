"""``meta launch``'s restart logic, against a stand-in ``mpiexec`` that fails as told (the real
one, killing a rank of a 2-rank run, is tests/e2e/test_launch.py)."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from meta.cli import EXIT_ERROR, main
from meta.run.launch import Launch, describe_exit

FAKE = """#!{python}
import json, os, sys
from pathlib import Path
state = Path({state!r})
calls = json.loads(state.read_text()) if state.exists() else []
calls.append(sys.argv[1:])
state.write_text(json.dumps(calls))
codes, writes = {codes!r}, {writes!r}
attempt = len(calls) - 1
if attempt in writes:  # this attempt got far enough to write a checkpoint
    out = Path(sys.argv[sys.argv.index("--output-dir") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint.npz").write_bytes(b"not read by these tests")
sys.exit(codes[attempt])
"""


def _fake(tmp_path: Path, codes: list[int], writes: tuple[int, ...] = ()) -> tuple[Path, Path]:
    state = tmp_path / "calls.json"
    script = tmp_path / "mpiexec"
    script.write_text(FAKE.format(python=sys.executable, state=str(state), codes=codes,
                                  writes=list(writes)))
    script.chmod(0o755)
    return script, state


def _launch(tmp_path: Path, codes: list[int], writes=(), **options) -> tuple[Launch, list, str]:
    script, state = _fake(tmp_path, codes, writes)
    stream = io.StringIO()
    job = Launch("r.py", ranks=2, output_dir=tmp_path / "out", mpiexec=script, stream=stream,
                 **options)
    code = job.run()
    assert code == job.attempts[-1].returncode
    return job, json.loads(state.read_text()), stream.getvalue()


def test_a_rank_death_restarts_from_the_checkpoint_this_launch_wrote(tmp_path: Path) -> None:
    job, calls, printed = _launch(tmp_path, [9, 0], writes=(0,), max_restarts=3,
                                  run_args=["--quiet", "--set", "lr=0.1"])
    assert job.attempts[-1].returncode == 0 and len(calls) == 2
    first, second = calls
    assert first[:2] == ["-n", "2"] and first[2:6] == [sys.executable, "-m", "meta.cli", "run"]
    assert first[6:] == ["r.py", "--output-dir", str(tmp_path / "out"), "--quiet", "--set",
                         "lr=0.1"]
    assert second == [*first, "--resume"]
    lines = printed.splitlines()
    assert len(lines) == 1, printed
    assert lines[0].startswith("meta launch: attempt 1 of 4 failed after ")
    assert "a rank was killed by SIGKILL (mpiexec exit 9); restarting from " \
           f"{tmp_path / 'out' / 'checkpoint.npz'}" in lines[0]


@pytest.mark.parametrize("code", [0, 1, 2])
def test_pass_a_missed_metric_and_a_user_error_are_final(tmp_path: Path, code: int) -> None:
    job, calls, printed = _launch(tmp_path, [code, 0], max_restarts=3)
    assert len(calls) == 1 and job.attempts[-1].returncode == code and printed == ""


def test_restarts_from_the_start_before_the_first_checkpoint(tmp_path: Path) -> None:
    stale = tmp_path / "out" / "checkpoint.npz"
    stale.parent.mkdir()
    stale.write_bytes(b"another run's")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    job, calls, printed = _launch(tmp_path, [137, 0], max_restarts=1)
    assert "--resume" not in calls[1], calls  # the stale checkpoint is not this launch's
    assert "a rank was killed by SIGKILL (mpiexec exit 137); restarting from the start " \
           "(no checkpoint written yet)" in printed


def test_gives_up_after_max_restarts(tmp_path: Path) -> None:
    job, calls, printed = _launch(tmp_path, [9, 15, 11], writes=(0,), max_restarts=2)
    assert len(calls) == 3 and job.attempts[-1].returncode == 11
    lines = printed.splitlines()
    assert [line.split(" failed")[0] for line in lines] == [
        "meta launch: attempt 1 of 3", "meta launch: attempt 2 of 3",
        "meta launch: attempt 3 of 3"]
    assert "SIGTERM" in lines[1]
    assert lines[2].endswith("no restarts left (--max-restarts 2)")


def test_no_restarts_by_default(tmp_path: Path) -> None:
    job, calls, printed = _launch(tmp_path, [9, 0])
    assert len(calls) == 1 and job.attempts[-1].returncode == 9
    assert "attempt 1 of 1 failed" in printed and "no restarts left" in printed


def test_the_user_s_resume_is_kept_on_every_attempt(tmp_path: Path) -> None:
    _, calls, _ = _launch(tmp_path, [9, 0], max_restarts=1, run_args=["--resume"])
    assert all(call.count("--resume") == 1 for call in calls), calls


def test_exit_descriptions() -> None:
    assert describe_exit(9) == "a rank was killed by SIGKILL (mpiexec exit 9)"
    assert describe_exit(139) == "a rank was killed by SIGSEGV (mpiexec exit 139)"
    assert describe_exit(-15) == "mpiexec was killed by SIGTERM"
    assert describe_exit(3) == "a rank or mpiexec failed (exit 3)"


def test_run_options_are_checked_before_anything_starts(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["launch", "-n", "2", "recipes/mnist_mlp.py", "--no-such-option"])
    assert info.value.code == EXIT_ERROR
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_bad_counts_are_one_line_errors(capsys) -> None:
    assert main(["launch", "-n", "0", "recipes/mnist_mlp.py"]) == EXIT_ERROR
    assert capsys.readouterr().err == "meta: error: launch: -n must be at least 1, got 0\n"
    assert main(["launch", "-n", "2", "--max-restarts", "-1", "r.py"]) == EXIT_ERROR
    assert "--max-restarts must be >= 0" in capsys.readouterr().err


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leftovers(folder: Path, pid: int, host: str | None = None) -> list[Path]:
    """What rank 0 killed by SIGKILL leaves: its lock and atomic_write's temporary files."""
    import socket

    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "run.lock"
    lock.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                "started": "now", "process_start": None}) + "\n")
    tmps = [folder / f"curves.png.{pid}.a1b2c3.tmp", folder / f"checkpoint.npz.{pid}.d4e5f6.tmp"]
    for tmp in tmps:
        tmp.write_bytes(b"half")
    return [lock, *tmps]


def test_out_of_restarts_leaves_no_lock_or_temporary_file(tmp_path: Path) -> None:
    """Issue 44: the killed ranks' run.lock and curves.png.*.tmp were left behind."""
    script, _ = _fake(tmp_path, [9, 9])
    left = _leftovers(tmp_path / "out", _dead_pid())
    keep = tmp_path / "out" / "notes.tmp"  # not atomic_write's: not ours to remove
    keep.write_text("mine")
    stream = io.StringIO()
    job = Launch("r.py", ranks=2, output_dir=tmp_path / "out", mpiexec=script, stream=stream,
                 max_restarts=1)
    assert job.run() == 9
    assert not any(p.exists() for p in left) and keep.exists()
    last = stream.getvalue().splitlines()[-1]
    assert last.endswith("no restarts left (--max-restarts 1); removed what the killed ranks "
                         "left: checkpoint.npz.*.tmp, curves.png.*.tmp, run.lock"), last


def test_a_live_run_s_lock_and_files_are_not_touched(tmp_path: Path) -> None:
    script, _ = _fake(tmp_path, [9, 9])
    left = _leftovers(tmp_path / "out", os.getpid())  # a live holder: another run writing
    other = _leftovers(tmp_path / "other", _dead_pid(), host="elsewhere")  # another host's
    for folder in ("out", "other"):
        job = Launch("r.py", ranks=2, output_dir=tmp_path / folder, mpiexec=script,
                     stream=io.StringIO())
        assert job.run() == 9
    assert all(p.exists() for p in left + other)


DYING = """#!{python}
import os, signal, subprocess, sys, time
rank = subprocess.Popen([{python!r}, "-c", "import time; time.sleep(60)"],
                        env={{**os.environ, "PMI_RANK": "1"}})
time.sleep(1.5)  # the launcher reads the ranks' pids meanwhile
rank.kill()
rank.wait()
print("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES")
print(f"=   PID {{rank.pid}} RUNNING AT vm")
print("=   EXIT CODE: 9", flush=True)
print("rank 1", rank.pid, file=sys.stderr)
sys.exit(9)
"""


def test_the_dead_rank_is_named_from_mpich_s_pid(tmp_path: Path, capfd) -> None:
    """MPICH kills the other ranks at once and names the dead one by pid only: the launcher
    names its rank in its one line (issue 44), and passes mpiexec's lines on."""
    script = tmp_path / "mpiexec"
    script.write_text(DYING.format(python=sys.executable))
    script.chmod(0o755)
    stream = io.StringIO()
    job = Launch("r.py", ranks=2, output_dir=tmp_path / "out", mpiexec=script, stream=stream)
    assert job.run() == 9
    pid = int(capfd.readouterr().err.split("rank 1 ")[1].split()[0])
    assert f"attempt 1 of 1 failed: rank 1 (pid {pid}) died first; a rank was killed by " \
           f"SIGKILL (mpiexec exit 9)" in stream.getvalue()


def test_the_dead_rank_is_named_from_open_mpi_s_report(tmp_path: Path, capfd) -> None:
    script = tmp_path / "mpiexec"
    script.write_text(f"#!{sys.executable}\nimport sys\n"
                      "print('prterun noticed that process rank 2 with PID 4722 on node vm "
                      "exited on')\nprint('signal 9 (Killed).')\nsys.exit(137)\n")
    script.chmod(0o755)
    stream = io.StringIO()
    job = Launch("r.py", ranks=3, output_dir=tmp_path / "out", mpiexec=script, stream=stream)
    assert job.run() == 137
    assert "failed: rank 2 (pid 4722) died first; a rank was killed by SIGKILL (mpiexec exit " \
           "137)" in stream.getvalue()
    assert "prterun noticed that process rank 2" in capfd.readouterr().out  # passed on


def test_a_signal_to_the_launcher_exits_128_plus_it_and_says_where_the_checkpoint_is(
        tmp_path: Path) -> None:
    """Forwarded to mpiexec; the launcher's status is 128 + the signal under any MPI (Open
    MPI's mpirun exits 1 and drops the ranks' line), and its line names the checkpoint."""
    import signal
    import threading

    script = tmp_path / "mpiexec"
    out = tmp_path / "out"
    script.write_text(f"#!{sys.executable}\nimport pathlib, time\n"
                      f"p = pathlib.Path({str(out)!r}); p.mkdir(parents=True, exist_ok=True)\n"
                      "(p / 'checkpoint.npz').write_bytes(b'x')\nprint('ready', flush=True)\n"
                      "time.sleep(30)\n")
    script.chmod(0o755)
    stream = io.StringIO()
    job = Launch("r.py", ranks=2, output_dir=out, mpiexec=script, stream=stream)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    begin = time.monotonic()
    try:
        assert job.run() == 143
    finally:
        timer.cancel()
    assert time.monotonic() - begin < 10
    assert stream.getvalue() == (f"meta launch: stopped by SIGTERM; checkpoint "
                                 f"{out / 'checkpoint.npz'} (continue with --resume)\n")
