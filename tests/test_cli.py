"""The command line, run in-process on small real MNIST runs."""

from __future__ import annotations

import json
import textwrap

import pytest

from meta.cli import EXIT_ERROR, EXIT_FAIL, EXIT_PASS, main

SMALL = """
    from meta.run.recipe import AtLeast, AtMost
    FIXED = {{"dataset": "mnist", "hidden": [32]}}
    MUTABLE = {{"epochs": 1, "train_samples": 2000, "batch_size": 64, "lr": 0.05,
               "executor": "reference"}}
    METRICS = {{"test_accuracy": AtLeast({bound}), "train_time_s": AtMost(60)}}
"""


def recipe(tmp_path, bound):
    path = tmp_path / "small.py"
    path.write_text(textwrap.dedent(SMALL.format(bound=bound)))
    return str(path)


def test_pass_writes_metrics_and_model(tmp_path, mnist_dir, capsys):
    out = tmp_path / "out"
    code = main(["run", recipe(tmp_path, 0.5), "--output-dir", str(out), "--quiet"])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    assert "small: PASS" in printed and "test_accuracy" in printed
    report = json.loads((out / "metrics.json").read_text())
    assert report["passed"] and report["metrics"]["test_accuracy"] > 0.5
    assert (out / "model.onnx").is_file()


def test_fail_exits_1(tmp_path, mnist_dir, capsys):
    code = main(["run", recipe(tmp_path, 0.999), "--output-dir", str(tmp_path), "--quiet",
                 "--no-export"])
    assert code == EXIT_FAIL
    assert "small: FAIL" in capsys.readouterr().out
    assert not (tmp_path / "model.onnx").exists()


def test_set_overrides_mutable(tmp_path, mnist_dir, capsys):
    code = main(["run", recipe(tmp_path, 0.5), "--set", "train_samples=500", "--set",
                 "executor=native", "--output-dir", str(tmp_path), "--quiet"])
    assert code == EXIT_PASS
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["definitions"]["dataset.train_samples"] == 500
    assert report["definitions"]["executor"] == "native"


@pytest.mark.parametrize("args,message", [
    (["--set", "hidden=8"], "'hidden' is FIXED"),
    (["--set", "epochs=two"], "cannot read 'two' as int"),
    (["--set", "lrr=0.1"], "did you mean 'lr'"),
])
def test_bad_sets_exit_2_with_a_clear_message(tmp_path, capsys, args, message):
    assert main(["run", recipe(tmp_path, 0.5), *args]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("meta: error: ") and message in err and "Traceback" not in err


def test_missing_dataset_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("META_MNIST_DIR", str(tmp_path / "empty"))
    from meta.lv2.datasets import clear_cache

    clear_cache()
    assert main(["run", recipe(tmp_path, 0.5), "--quiet"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "train-images-idx3-ubyte.gz" in err and "META_MNIST_DIR" in err


def test_malformed_set_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        main(["run", recipe(tmp_path, 0.5), "--set", "epochs"])


def test_ops_lists_the_registry(capsys):
    assert main(["ops"]) == EXIT_PASS
    out = capsys.readouterr().out
    assert "Gemm" in out and "Relu" in out and "native, numpy" in out


def test_inspect_prints_operators_roles_and_shapes(capsys):
    """``meta inspect``: inputs and outputs with their shapes, every operator with meta's
    backends for it, and the initializers by role, the selection patterns applied."""
    from pathlib import Path

    model = Path(__file__).parent / "fixtures" / "pytorch" / "mobilenet_dynamo_folded.onnx"
    assert main(["inspect", str(model), "--trainable", "fc.*"]) == EXIT_PASS
    out = capsys.readouterr().out
    assert "input                            float32  [N, 3, 16, 16]" in out, out
    assert "logits                           float32  [N, 10]" in out
    assert "Conv                         ai.onnx        7  numpy, native" in out
    assert "Clip                         ai.onnx        5  numpy" in out
    assert "trainable parameters: 2 tensors, 170 values, 680 bytes" in out
    assert "frozen parameters: 21 tensors" in out
    assert "state (updated in training mode, not by the optimizer): 14 tensors" in out
    assert "constants: 18 tensors" in out


def test_inspect_of_a_missing_file_is_one_line(capsys):
    assert main(["inspect", "/nonexistent/model.onnx"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.strip() == "meta: error: /nonexistent/model.onnx: no such ONNX file", err


def test_version_names_the_distribution_version_and_where_meta_is(capsys, monkeypatch):
    from importlib import metadata
    from pathlib import Path

    import meta

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("meta ") and f"from {Path(meta.__file__).parent} " in line

    def installed(name):  # what pip recorded for the distribution meta-dnn
        assert name == "meta-dnn"
        return "9.8.7"

    monkeypatch.setattr(metadata, "version", installed)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("meta 9.8.7 from ")

    def missing(name):  # a source tree pip did not install: meta.__version__
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith(f"meta {meta.__version__} from ")


def test_shipped_recipes_run_by_name_from_any_folder(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from meta.run.recipe import load_recipe, shipped_recipes

    monkeypatch.chdir(tmp_path)  # an empty folder: no recipes/ here
    shipped = shipped_recipes()
    assert {"mnist_mlp", "mnist_lenet", "onnx_model", "arrays_npz"} <= set(shipped)
    assert load_recipe("mnist_mlp").path == shipped["mnist_mlp"]
    assert load_recipe("mnist_mlp.py").path == shipped["mnist_mlp"]
    # the data and models a shipped recipe names come with it
    data = load_recipe("arrays_npz").definitions.choices["dataset"].values()["path"]
    model = load_recipe("onnx_model").definitions.choices["model"].values()["path"]
    assert Path(data).is_file() and Path(model).is_file()
    # a file of that name here wins, as a script's path does
    (tmp_path / "mnist_mlp.py").write_text(
        "from meta.run.recipe import AtLeast\nFIXED = {}\nMUTABLE = {'epochs': 1}\n"
        "METRICS = {'test_accuracy': AtLeast(0.5)}\n")
    assert load_recipe("mnist_mlp.py").path == Path("mnist_mlp.py")
    assert main(["run", "mnist_mpl"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "unknown recipe 'mnist_mpl' (did you mean 'mnist_mlp'?)" in err
    assert "`meta recipes` lists them" in err


def test_recipes_lists_each_shipped_recipe_on_one_line(capsys):
    from meta.run.recipe import shipped_recipes

    assert main(["recipes"]) == EXIT_PASS
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(shipped_recipes())
    assert lines[0].startswith(f"{len(shipped_recipes())} recipes in ")
    mlp = next(line for line in lines if line.startswith("mnist_mlp "))
    assert mlp.split(None, 1)[1] == ("MNIST with a 784-512-512-10 MLP and SGD with momentum: the "
                                     "walking skeleton's main job.")
    signum = next(line for line in lines if line.startswith("mnist_signum "))
    assert signum.endswith("(signSGD with momentum, Bernstein et al. 2018).")


def test_a_reader_that_leaves_early_ends_the_listing_quietly() -> None:
    """`meta recipes | head -1`: a closed pipe ends the command as other Unix tools end, with
    no traceback."""
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m meta recipes | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
