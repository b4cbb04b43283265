"""One run per output folder, and every output written whole: a second run into a busy folder
is refused before training, a killed run's lock is taken over, a full disk leaves no ``*.tmp``
and never a metrics.json that claims PASS for a run whose outputs are incomplete."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import meta.common.files
from meta.cli import EXIT_ERROR, EXIT_PASS, main
from meta.common.files import OutputError, atomic_write, write_text
from meta.lv2.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from meta.run.run_dir import LOCK, RunDirError, RunLock

RECIPE = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": {"name": "synthetic", "train_examples": 64, "test_examples": 32,
                         "input_shape": [8]}, "hidden": [8]}
    MUTABLE = {"epochs": 2, "batch_size": 16, "lr": 0.1}
    METRICS = {"test_accuracy": AtLeast(0.0)}
"""


def recipe(tmp_path: Path) -> str:
    path = tmp_path / "tiny.py"
    path.write_text(textwrap.dedent(RECIPE))
    return str(path)


def one_error_line(capsys: pytest.CaptureFixture, *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("meta: error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith((".tmp", ".stale")))


class FullDisk:
    """A file whose writes fail with ENOSPC once ``room`` bytes are written."""

    def __init__(self, f: Any, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data: Any) -> int:
        if len(data) > self.room:
            self.f.write(data[: self.room])  # what fits is written: the temp file is not empty
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()


def fill_disk(monkeypatch: pytest.MonkeyPatch, name: str, room: int = 10) -> None:
    """Writes of files named ``name`` (through meta.common.files) hit a full disk."""
    real = meta.common.files._open_temp

    def open_temp(tmp: Path, mode: str, **options: Any) -> Any:
        f = real(tmp, mode, **options)
        return FullDisk(f, room) if tmp.name.startswith(name + ".") else f

    monkeypatch.setattr(meta.common.files, "_open_temp", open_temp)


# -- atomic writes ---------------------------------------------------------------------------
def test_a_full_disk_keeps_the_old_file_and_leaves_no_tmp(tmp_path, monkeypatch):
    target = write_text(tmp_path / "report.json", "old\n")
    fill_disk(monkeypatch, "report.json")
    with pytest.raises(OutputError, match=f"cannot write {target}: No space left on device"):
        write_text(target, "new and longer than ten bytes\n")
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []


def test_any_error_while_writing_removes_the_temp_file(tmp_path):
    with pytest.raises(RuntimeError, match="mid-write"):
        with atomic_write(tmp_path / "a.txt") as f:
            f.write("half")
            raise RuntimeError("mid-write")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a.txt").touch()
    with pytest.raises(OutputError, match="cannot write .*b.txt: .*a.txt is a file, not a folder"):
        write_text(tmp_path / "a.txt" / "b.txt", "x")  # its folder is a file
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_checkpoint_on_a_full_disk_leaves_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.npz"
    position = {"epoch": 0, "step": 0, "batch_in_epoch": 0, "epoch_sums": [0.0] * 3,
                "epoch_elapsed": 0.0, "history": []}
    ckpt = Checkpoint({"w": np.ones(3)}, {"state": ()}, position, {}, {})
    save_checkpoint(path, ckpt)
    fill_disk(monkeypatch, "checkpoint.npz", room=100)
    ckpt.params["w"] = np.zeros(3)
    with pytest.raises(OutputError, match="checkpoint.npz: No space left on device"):
        save_checkpoint(path, ckpt)
    assert load_checkpoint(path).params["w"].tolist() == [1, 1, 1]
    assert leftovers(tmp_path) == []


# -- the lock --------------------------------------------------------------------------------
def test_a_second_run_into_a_busy_folder_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "out"
    holder = RunLock(out)  # another run holds the folder (a live pid: this one)
    before = (out / LOCK).read_text()
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_ERROR
    one_error_line(capsys, f"output folder {out} is in use by another run (pid {os.getpid()}",
                   str(out / LOCK))
    assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing trained, nothing written
    assert (out / LOCK).read_text() == before
    holder.release()
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_PASS
    assert not (out / LOCK).exists() and (out / "metrics.json").is_file()


def test_a_lock_is_held_while_training_and_removed_at_the_end(tmp_path, capsys, monkeypatch):
    out, seen = tmp_path / "out", []
    from meta.run.runner import RecipeRun

    execute = RecipeRun.execute
    monkeypatch.setattr(RecipeRun, "execute",
                        lambda self: seen.append(json.loads((out / LOCK).read_text()))
                        or execute(self))
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_PASS
    assert seen[0]["pid"] == os.getpid() and seen[0]["host"] == socket.gethostname()
    assert not (out / LOCK).exists()


def test_a_killed_runs_lock_is_taken_over_with_a_message(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is free now: the lock's run is gone
    (out / LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                        "started": "earlier"}))
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_PASS
    err = capsys.readouterr().err
    assert f"meta: taking over {out / LOCK}, left by pid {dead.pid}" in err, err
    assert not (out / LOCK).exists() and leftovers(out) == []


def test_a_lock_of_another_host_is_not_taken_over(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "x"}))
    with pytest.raises(RunDirError, match="in use by another run \\(pid 1 on elsewhere"):
        RunLock(tmp_path)


def test_the_lock_of_a_rank_mpi_reported_dead_is_inherited_with_its_temporary_files(tmp_path):
    """The first surviving worker takes over the outputs of a dead rank 0 on another host:
    its lock, and the temporary file it was writing when it was killed."""
    (tmp_path / LOCK).write_text(json.dumps({"pid": 4242, "host": "elsewhere", "started": "x"}))
    (tmp_path / "metrics.csv.4242.a1b2c3.tmp").write_text("epoch,tra")
    (tmp_path / "metrics.csv").write_text("epoch\n1\n")
    lock = RunLock(tmp_path, holder_died=True)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert leftovers(tmp_path) == [] and (tmp_path / "metrics.csv").exists()
    lock.release()
    assert not (tmp_path / LOCK).exists()


def test_a_new_run_removes_the_previous_metrics_json(tmp_path, capsys):
    """metrics.json exists only once a run completed: a run that then fails leaves none."""
    out = tmp_path / "out"
    write_text(out / "metrics.json", json.dumps({"passed": True}))
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet",
                 "--set", "lr=1e30"]) == EXIT_ERROR  # the loss becomes NaN
    assert not (out / "metrics.json").exists() and not (out / LOCK).exists()


# -- outputs on a full disk ------------------------------------------------------------------
def test_model_onnx_on_a_full_disk_fails_the_run_and_metrics_json_says_so(tmp_path, capsys,
                                                                           monkeypatch):
    out = tmp_path / "out"
    fill_disk(monkeypatch, "model.onnx")
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_ERROR
    one_error_line(capsys, f"cannot write {out / 'model.onnx'}: No space left on device",
                   f"{out / 'metrics.json'} records the run as not passed")
    report = json.loads((out / "metrics.json").read_text())
    assert report["passed"] is False and "model.onnx" in report["not_written"][0]
    assert not (out / "model.onnx").exists() and leftovers(out) == []
    assert not (out / LOCK).exists()


@pytest.mark.parametrize("name", ["curves.png", "metrics.csv", "metrics.jsonl",
                                  "checkpoint.npz"])
def test_an_output_failing_during_training_exits_2_naming_it(tmp_path, capsys, monkeypatch,
                                                              name):
    out = tmp_path / "out"
    fill_disk(monkeypatch, name, room=0)
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_ERROR
    one_error_line(capsys, f"cannot write {out / name}: No space left on device")
    assert not (out / "metrics.json").exists() and leftovers(out) == []


def test_metrics_json_is_written_last(tmp_path, capsys, monkeypatch):
    out, order = tmp_path / "out", []
    real = os.replace
    monkeypatch.setattr(meta.common.files.os, "replace",
                        lambda a, b: order.append(Path(b).name) or real(a, b))
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_PASS
    assert order[-2:] == ["model.onnx", "metrics.json"], order
    assert {"metrics.csv", "metrics.jsonl", "curves.png", "checkpoint.npz"} <= set(order)
    assert leftovers(out) == []


def test_a_resumed_run_rewrites_its_logs_from_the_checkpoint(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_PASS
    (out / "metrics.jsonl").write_text((out / "metrics.jsonl").read_text() + '{"epoch": 9}\n')
    assert main(["run", recipe(tmp_path), "--output-dir", str(out), "--quiet", "--resume",
                 "--set", "epochs=3"]) == EXIT_PASS
    epochs = [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").open()]
    assert epochs == [1, 2, 3]
    assert (out / "metrics.csv").read_text().count("\n") == 4  # header and three epochs
