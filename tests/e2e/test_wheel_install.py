"""The wheel, installed into a fresh virtual environment, runs the README's main job by name
from an empty folder: ``meta run mnist_mlp`` PASSes with no source tree anywhere on the path,
and the ONNX file it writes predicts as meta does (onnx's reference evaluator). This is the
main job's single-process end-to-end test (``test_mnist_mlp.py`` runs it under mpiexec).

What a user installs is what is tested: the wheel comes from the real build backend
(scikit-build-core, ``pip wheel``) and is installed by ``pip`` into a new ``venv``; the command
is the console script that install wrote; the recipe is the one the wheel carries
(``meta/recipes``); the operator library is the wheel's ``meta.ops``. Two things come from this
environment instead of being built or downloaded again, each for its cost alone:

- the compiled modules (``meta._native``, ``meta._plan``) are copied from this environment's meta:
  they are built from the same ``cpp/`` by the same backend, and building them again takes 12.5
  minutes on the 2-core machine (the wheel here is built with ``wheel.cmake=false``);
- the dependencies (numpy, onnx, oneDNN, ...) are this environment's, reached through a path file:
  installing them would download every one of them. oneDNN's libraries are linked where the
  wheel's RUNPATH (``$ORIGIN/../../..``, the environment's ``lib``) looks for them, as pip
  installing ``onednn-cpu-gomp`` would put them.

The full wheel (with its C++ build), installed with its dependencies from PyPI, ran the same
command by hand and PASSed (97.84 %; README, "Install").
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from meta.lv2 import mnist
from tests.e2e.recipe_checks import assert_export_predicts_like_meta
from tests.launch import clean_env, run_command

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("scikit_build_core") is None,
                       reason="needs scikit-build-core (pip install -e '.[test]')"),
]


def _build_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-C", "wheel.cmake=false", "-C", f"build-dir={out / 'build'}",
                    "-w", str(out), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=600)
    (wheel,) = out.glob("*.whl")
    return wheel


def _fresh_environment(where: Path) -> Path:
    """A new venv whose own site-packages has nothing of meta; this environment's dependencies
    come after it on the path (a ``.pth`` line: their own ``.pth`` files, such as an editable
    install's hook, are not run from there, so no other meta is reachable)."""
    venv.create(where, with_pip=True, symlinks=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    libs = Path(sys.prefix) / "lib"
    for lib in libs.glob("libdnnl.so*"):  # where the onednn-cpu-gomp wheel installs them
        (where / "lib" / lib.name).symlink_to(lib)
    return site


def _copy_compiled_modules(site: Path) -> None:
    for name in ("meta._native", "meta._plan"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            shutil.copy2(spec.origin, site / "meta" / Path(spec.origin).name)


def test_a_fresh_environment_runs_mnist_mlp_by_name_from_an_empty_folder(tmp_path, mnist_dir):
    wheel = _build_wheel(tmp_path / "dist")
    env_dir = tmp_path / "fresh-venv"
    site = _fresh_environment(env_dir)
    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                    "--no-index", "--quiet", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    _copy_compiled_modules(site)

    env = clean_env({"PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"})
    env.pop("PYTHONPATH", None)  # nothing of the source tree
    env.pop("VIRTUAL_ENV", None)
    empty = tmp_path / "empty"
    empty.mkdir()

    where = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                            "import meta, meta.ops, meta._plan; print(meta.__file__)"],
                           cwd=empty, env=env, check=True, capture_output=True, text=True)
    assert Path(where.stdout.strip()).is_relative_to(site / "meta"), where.stdout

    out = run_command([str(env_dir / "bin" / "meta"), "run", "mnist_mlp", "--quiet"], env,
                      timeout=600, cwd=empty)
    assert "mnist_mlp: PASS" in out, out
    report = json.loads((empty / "runs" / "mnist_mlp" / "metrics.json").read_text())
    assert report["metrics"]["test_accuracy"] >= 0.975
    assert_export_predicts_like_meta(empty / "runs" / "mnist_mlp", mnist("test"), images=2000)
