"""A run's output folder: one run at a time (a lock file), outputs written whole, metrics.json
last, and the one-line messages for mistakes that show up only while training.

``meta run`` takes ``RunLock`` on rank 0 before it loads anything: a second run into a busy
folder is refused at once, naming the run that holds it. The lock file holds the holder's pid,
host and start time and is removed when the run ends; one left by a run that was killed
(SIGKILL, a lost node) is taken over, with a message, when its pid is gone from this host, or
when MPI reported its rank dead (``holder_died``: the surviving rank that writes the outputs in
its place takes it over, from any host).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from meta.common.files import OutputError, atomic_write, write_text

LOCK = "run.lock"
METRICS_JSON = "metrics.json"
PREVIOUS_METRICS = "metrics.previous.json"  # the last finished run's, moved aside
STARTED = time.time()  # a checkpoint older than this process was not written by this run


class RunDirError(Exception):
    """The output folder cannot be used: busy with another run, or not writable."""


def output_folder(recipe_name: str, output_dir: str | os.PathLike | None) -> Path:
    """``output_dir``, or ``runs/<recipe name>`` by default."""
    return Path(output_dir) if output_dir is not None else Path("runs") / recipe_name


def _process_start(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return start is None or _process_start(pid) in (None, start)


class RunLock:
    """``folder/run.lock``, created exclusively (``O_EXCL``), for as long as a run writes into
    ``folder``; ``release()`` removes it. Taking it moves a previous run's metrics.json
    aside to metrics.previous.json (that file exists only once a run has completed, and a run
    that then fails must not lose what the finished one measured). A lock file that is not a
    lock meta wrote (unreadable, not its JSON) is an error naming it, never "a run starting
    now" forever.

    >>> import tempfile; folder = Path(tempfile.mkdtemp())
    >>> lock = RunLock(folder)
    >>> try:
    ...     RunLock(folder)
    ... except RunDirError as err:
    ...     print(err)
    output folder ... is in use by another run (pid ...); wait for it, ...
    >>> lock.release(); RunLock(folder).release()
    """

    def __init__(self, folder: str | os.PathLike, stream: TextIO | None = None,
                 holder_died: bool = False) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK
        self.record = {"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "process_start": _process_start(os.getpid()),
                       "command": " ".join(sys.argv)}
        self.held, self.made = False, []  # made: the folders taking the lock created
        for _ in range(3):  # a stale lock taken over by another run meanwhile: look again
            if self._create():
                break
            holder = self._holder()
            if not (holder_died and holder) and not self._stale(holder):
                raise RunDirError(self._busy(holder))
            if self._take_over(holder):
                print(f"meta: taking over {self.path}, left by pid {holder['pid']} on "
                      f"{holder['host']} (started {holder.get('started', '?')}), which is no "
                      f"longer running", file=stream or sys.stderr, flush=True)
                self._remove_leftovers(holder)
        else:
            raise RunDirError(self._busy(self._holder()))
        with suppress(FileNotFoundError):
            os.replace(self.folder / METRICS_JSON, self.folder / PREVIOUS_METRICS)

    def _create(self) -> bool:
        try:
            self.made = self.made or [d for d in (self.folder, *self.folder.parents)
                                      if not d.exists()]
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as err:
            if isinstance(err, FileExistsError) and self.folder.is_dir():
                return False  # the lock exists
            blocker = next((p for p in (self.folder, *self.folder.parents) if p.is_file()),
                           None)
            what = f"cannot be written ({err.strerror or err})" if blocker is None else \
                "is a file" if blocker == self.folder else f"cannot be created: {blocker} is a file"
            raise RunDirError(f"output folder {self.folder} {what}; choose another with "
                              f"--output-dir") from err
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.record) + "\n")
        self.held = True
        return True

    def _holder(self) -> dict[str, Any]:
        """The lock's record; {} while it is gone or being written (the writer fills it right
        after creating it). A file that still is not a record after WRITE_S is a
        RunDirError naming it."""
        deadline = time.monotonic() + self.WRITE_S
        while True:
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                return {}
            except (OSError, ValueError) as err:  # a folder, unreadable, not text
                raise RunDirError(self._corrupt(f"cannot be read ({err})")) from err
            try:
                holder = json.loads(text)
            except ValueError:
                holder = None
            if isinstance(holder, dict) and isinstance(holder.get("pid"), int) and \
                    not isinstance(holder["pid"], bool):
                return holder
            if time.monotonic() > deadline:
                shown = text[:40] + ("..." if len(text) > 40 else "")
                raise RunDirError(self._corrupt(f"is not a lock meta wrote ({len(text)} bytes: "
                                                f"{shown!r})"))
            time.sleep(0.05)

    WRITE_S = 0.5  # how long a lock may stay empty while its run writes it

    def _corrupt(self, what: str) -> str:
        return (f"lock file {self.path} {what}; if no run is writing into {self.folder}, "
                f"delete {self.path}")

    def _stale(self, holder: dict[str, Any]) -> bool:
        """Whether the holder is a process of this host that is no longer running."""
        return bool(holder) and holder.get("host") == self.record["host"] and \
            not _alive(int(holder["pid"]), holder.get("process_start"))

    def _busy(self, holder: dict[str, Any]) -> str:
        who = (f"pid {holder['pid']} on {holder.get('host', '?')}, started "
               f"{holder.get('started', '?')}") if holder else "a run starting now"
        return (f"output folder {self.folder} is in use by another run ({who}); wait for it, "
                f"choose another --output-dir, or delete {self.path} if that run is gone")

    def _take_over(self, holder: dict[str, Any]) -> bool:
        """Move the stale lock aside; if what was moved is not the stale lock read before
        (another run took it over meanwhile), put it back. True when the way is free."""
        aside = self.path.with_name(f"{LOCK}.{os.getpid()}.stale")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            moved = json.loads(aside.read_text())
        except (OSError, ValueError):
            moved = None
        if moved != holder:
            with suppress(OSError):
                os.link(aside, self.path)
        aside.unlink()
        return moved == holder

    def _remove_leftovers(self, holder: dict[str, Any]) -> None:
        """The temporary files of a holder killed while writing (``atomic_write`` names them
        after the writer's pid): the folder is this run's now, and no one else writes there."""
        for tmp in self.folder.glob(f"*.{int(holder['pid'])}.*.tmp"):
            with suppress(OSError):
                tmp.unlink()

    def release(self) -> None:
        """Remove the lock file if this run holds it (idempotent), and the folders taking it
        created if nothing was written into them (a run that failed before training)."""
        if self.held:
            self.held = False
            with suppress(OSError, ValueError):
                if json.loads(self.path.read_text()).get("pid") == self.record["pid"]:
                    self.path.unlink()
            with suppress(OSError):  # stops at the first folder that is not empty
                for folder in self.made:
                    folder.rmdir()


def clear_killed_run(folder: str | os.PathLike, since: float) -> list[Path]:
    """What a run killed outright left in ``folder`` (every rank SIGKILLed: no ``finally``
    ran): its lock, when the holder is a process of this host that is gone, and the temporary
    files of ``atomic_write`` (``NAME.PID.HEX.tmp``) modified since ``since`` whose writer is
    gone. Nothing is touched while a live process holds the lock. ``meta launch`` calls it
    when it gives up, so a spent restart budget leaves no ``run.lock`` or ``curves.png.*.tmp``.
    Returns what was removed."""
    folder, removed = Path(folder), []
    lock = folder / LOCK
    try:
        holder = json.loads(lock.read_text())
    except FileNotFoundError:
        holder = None
    except (OSError, ValueError):
        return []  # not a lock meta wrote: its message names it at the next run
    if holder is not None:
        if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int) or \
                holder.get("host") != socket.gethostname() or \
                _alive(holder["pid"], holder.get("process_start")):
            return []
        with suppress(OSError):
            lock.unlink()
            removed.append(lock)
    for tmp in folder.glob("*.*.*.tmp"):
        pid = tmp.name.rsplit(".", 3)[-3]
        try:
            if pid.isdigit() and not _alive(int(pid), None) and \
                    tmp.stat().st_mtime >= since - 1.0:
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            continue
    return removed


def write_outputs(run: Any, outcome: Any) -> None:
    """Rank 0's final outputs: a language model's tokenizer.json (also in model.onnx's
    metadata), model.onnx (unless ``--no-export``), replay.json (an
    asynchronous run's update order), then metrics.json, last.
    metrics.json says ``"passed": false`` when another output could not be written; that
    failure is then raised (an OutputError naming the file), so the run ends with exit 2."""
    from meta.lv1 import to_onnx
    from meta.lv2.tokenizers import add_to_model, save_tokenizer
    from meta.run.replay_record import REPLAY_JSON, record

    out, failed = run.output_dir, []
    tokenizer = getattr(run.trainer.train_data, "vocabulary", None)  # a language model's
    if tokenizer is not None:  # saved so that sampling needs no corpus (meta sample)
        try:
            save_tokenizer(tokenizer, out)
        except OutputError as err:
            failed.append(err)
    if run.export_onnx:
        model = to_onnx(run.trainer.executor.graph, outputs=[run.trainer.names["logits"]])
        if tokenizer is not None:
            add_to_model(model, tokenizer)
        try:
            with atomic_write(out / "model.onnx", "wb") as f:
                f.write(model.SerializeToString())
        except OutputError as err:
            failed.append(err)
    replay = record(run)  # an asynchronous run's update order, for meta replay
    if replay is not None:
        try:
            write_text(out / REPLAY_JSON, json.dumps(replay) + "\n")
        except OutputError as err:
            failed.append(err)
    report = {"recipe": run.recipe.name, "passed": outcome.passed and not failed,
              "metrics": outcome.metrics, "definitions": run.recipe.definitions.as_dict(),
              "history": outcome.history, **({"not_written": [str(e) for e in failed]}
                                             if failed else {})}
    unfinished = getattr(run, "unfinished", None)
    if unfinished is not None:  # a metric that raised: the run is not passed, and says why
        from meta.run.errors import user_error

        report["not_measured"] = str(user_error(unfinished) or unfinished)
    write_text(out / METRICS_JSON, json.dumps(report, indent=2, default=list) + "\n")
    if failed:
        raise OutputError(failed[0].path, failed[0].__cause__ or failed[0],
                          f"; {out / METRICS_JSON} records the run as not passed")
    if run.export_onnx:
        print(f"meta: saved {out / 'model.onnx'} and {out / METRICS_JSON}", file=run.stream,
              flush=True)


def _checkpoint_note(run: Any) -> str:
    """The last checkpoint this run wrote or resumed from, with its position."""
    from meta.lv2.checkpoint import META_KEY

    path = run.output_dir / "checkpoint.npz"
    try:
        if run.resumed or path.stat().st_mtime >= STARTED:
            with np.load(path) as data:
                position = json.loads(data[META_KEY].tobytes())["position"]
            return (f"the last good checkpoint is {path} (epoch {position['epoch'] + 1}, "
                    f"step {position['step']})")
    except (OSError, ValueError, KeyError):
        pass
    return "no checkpoint was written before it (--checkpoint-every STEPS writes them " \
        "within an epoch)"


def _learning_rate_note(run: Any) -> str:
    from meta.lv2.optimizers import learning_rate

    values = run.recipe.definitions.choices["optimizer"].values()
    if "lr" not in values:
        return "the optimizer has no learning rate option"
    try:
        lr = learning_rate(values, run.trainer.steps_per_epoch, run.recipe.definitions.epochs)
    except (KeyError, ValueError, TypeError):
        lr = values["lr"]
    if callable(lr):
        return (f"learning rate {lr(run.trainer.step):g} at that step (optimizer.lr "
                f"{values['lr']:g}, lr_schedule {values.get('lr_schedule')}, warmup_epochs "
                f"{values.get('warmup_epochs')})")
    return f"learning rate {values['lr']:g} (optimizer.lr)"


def training_error(run: Any, err: BaseException) -> str | None:
    """The one-line message for a mistake that shows up only while training (a loss that
    became NaN or infinite, an operator's bad backward, an output that cannot be written);
    None for other errors, which are bugs and keep their traceback."""
    from meta.common.component import ComponentError
    from meta.lv0 import BackwardError

    if isinstance(err, FloatingPointError) and run is not None:
        return (f"{err}; {_learning_rate_note(run)}; {_checkpoint_note(run)}; try a smaller "
                f"learning rate, gradient clipping (optimizer.grad_clip) or check the data")
    if isinstance(err, (BackwardError, OutputError, FloatingPointError, ComponentError)):
        return str(err)  # ComponentError: a component's option refused where it is used
    return None
