"""Property-based tests (Hypothesis): whatever a user brings, ``meta`` answers with an exit
status that means one thing, at most one error line (a recipe with several problems: a head
line and one line each), never a traceback, and never loses what a finished run left.

Generated: malformed recipes, ``--set`` values, command lines, checkpoint, replay and lock
files, ``.npz`` arrays, image folders and ONNX files. Bounded for CI: a fixed seed
(``derandomize``), a few examples each, no deadline (a run that trains takes a second);
``META_HYPOTHESIS_PROFILE=meta-deep`` searches longer with random seeds.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from meta.cli import main  # noqa: E402

settings.register_profile(
    "meta-ci", derandomize=True, deadline=None, max_examples=12, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture])
# A longer search on demand (META_HYPOTHESIS_PROFILE=meta-deep): random seeds, 200 examples.
settings.register_profile("meta-deep", parent=settings.get_profile("meta-ci"),
                          derandomize=False, max_examples=200)
settings.load_profile(os.environ.get("META_HYPOTHESIS_PROFILE", "meta-ci"))

DATASET = {"name": "synthetic", "train_examples": 48, "test_examples": 16, "input_shape": [6]}
RECIPE = """
    from meta.run.recipe import AtLeast, AtMost
    FIXED = {fixed}
    MUTABLE = {mutable}
    METRICS = {metrics}
"""


def _recipe(folder: Path, fixed: Any = None, mutable: Any = None, metrics: str = "",
            name: str = "prop") -> Path:
    fixed = {"dataset": DATASET, "model": {"name": "mlp", "hidden": [4]}, "epochs": 1} \
        if fixed is None else fixed
    mutable = {"batch_size": 16, "lr": 0.1, "seed": 0} if mutable is None else mutable
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(RECIPE).format(
        fixed=repr(fixed), mutable=repr(mutable),
        metrics=metrics or '{"test_accuracy": AtLeast(0.0)}'))
    return path


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """``meta ARGV`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse and --set usage errors
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _well_behaved(code: int, err: str, allowed: tuple[int, ...] = (0, 1, 2)) -> None:
    """The contract: a status that means one thing, no traceback, on exit 2 one error line
    (a recipe's several problems: its head line and one "  - " line each)."""
    assert code in allowed, (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        lines = [line for line in err.split("\n") if line.strip()]
        errors = [line for line in lines if line.startswith("meta: error")]
        assert len(errors) == 1, err
        assert all(line.startswith(("meta: error", "  - ", "meta: warning", "meta: taking"))
                   for line in lines), err


def _folder() -> contextlib.AbstractContextManager[str]:
    return tempfile.TemporaryDirectory(prefix="meta-prop-")


# -- recipes, --set values, command lines --------------------------------------------------
KEYS = ["dataset", "model", "optimizer", "executor", "distributed", "events", "epochs",
        "batch_size", "lr", "momentum", "seed", "eval_batch_size", "timeline", "hidden",
        "optimizer.lr", "model.hidden", "weight_decay", "lrr", "", "FIXED", "dataset.name"]
leaves = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                   st.sampled_from(["mnist", "mlp", "sgd", "adam", "reference", "downpour",
                                    "synthetic", "nope"]))
values = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS + ["name"]), inner,
                                                 max_size=3)), max_leaves=6)
sections = st.dictionaries(st.sampled_from(KEYS), values, max_size=4)


@given(fixed=sections, mutable=sections, metric=st.sampled_from([
    '{"test_accuracy": AtLeast(0.0)}', '{}', '[]', '{"accuracy": AtLeast(1)}',
    '{"test_accuracy": 0.5}', '{"top_k_accuracy": AtLeast(0.1, k=0)}', 'None']))
def test_malformed_recipes(fixed: dict, mutable: dict, metric: str) -> None:
    with _folder() as tmp:
        fixed = {"dataset": DATASET, "epochs": 1, **fixed}  # nothing slow if it is valid
        fixed.pop("epochs") if "epochs" in mutable else None
        mutable.pop("dataset", None)
        path = _recipe(Path(tmp), fixed, mutable, metric)
        code, _, err = _cli(["run", str(path), "--output-dir", f"{tmp}/out", "--quiet",
                             "--no-export"])
        _well_behaved(code, err)


@given(pairs=st.lists(st.tuples(
    st.sampled_from(["lr", "momentum", "seed", "batch_size", "optimizer.lr", "lr ", "epochs",
                     "optimizer", "model.hidden", "nope", "", "events"]),
    st.sampled_from(["=", "", "=="]),
    st.one_of(st.text(max_size=6), st.sampled_from(["nan", "inf", "-1", "0", "1e400", "0.1",
                                                    "[1,2]", "adam", "16", "1e-3"]))),
    min_size=1, max_size=3))
def test_set_values(pairs: list[tuple[str, str, str]]) -> None:
    with _folder() as tmp:
        path = _recipe(Path(tmp))
        argv = ["run", str(path), "--output-dir", f"{tmp}/out", "--quiet", "--no-export"]
        for key, sep, value in pairs:
            argv += ["--set", f"{key}{sep}{value}"]
        code, _, err = _cli(argv)
        _well_behaved(code, err)


TOKENS = ["--set", "lr=0.1", "lr", "--checkpoint-every", "-5", "3", "x", "--resume",
          "--output-dir", "--repeat", "-1", "--quiet", "--no-export", "--debug", "--bogus",
          "=", "", "--set=lr=0.2"]


@given(command=st.sampled_from(["run", "inspect", "replay", "check-op", "components",
                                "nope"]),
       tokens=st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=5)), max_size=5),
       with_recipe=st.booleans())
def test_command_lines(command: str, tokens: list[str], with_recipe: bool) -> None:
    with _folder() as tmp:
        recipe = str(_recipe(Path(tmp)))
        argv = [command, *([recipe] if with_recipe else []), *tokens]
        if command == "run":
            argv += ["--output-dir", f"{tmp}/out", "--quiet", "--no-export"]
        if command == "replay":
            argv = [command, *tokens, tmp]  # a folder without replay.json at the least
        code, _, err = _cli(argv)
        _well_behaved(code, err)


# -- files a run reads: checkpoint, replay, lock -----------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One finished run (its recipe and output folder), copied by each example."""
    root = tmp_path_factory.mktemp("finished")
    path = _recipe(root)
    out = root / "out"
    code, _, err = _cli(["run", str(path), "--output-dir", str(out), "--quiet", "--no-export"])
    assert code == 0, err
    return path, out


def _copy(out: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(out, to)
    return to


def _kept(before: str, out: Path) -> bool:
    """The finished run's metrics.json is there, or moved aside, unchanged."""
    return any(p.is_file() and p.read_text() == before
               for p in (out / "metrics.json", out / "metrics.previous.json"))


def _mutate_bytes(data: bytes, how: str, at: int, byte: int) -> bytes:
    at = at % max(len(data), 1)
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([byte]) + data[at + 1:]
    if how == "empty":
        return b""
    return data + bytes([byte]) * 16


@given(how=st.sampled_from(["truncate", "flip", "empty", "append"]),
       at=st.integers(0, 10**6), byte=st.integers(0, 255))
def test_corrupt_checkpoints(finished: tuple[Path, Path], how: str, at: int,
                             byte: int) -> None:
    recipe, out = finished
    with _folder() as tmp:
        copy = _copy(out, Path(tmp) / "out")
        before = (copy / "metrics.json").read_text()
        ckpt = copy / "checkpoint.npz"
        ckpt.write_bytes(_mutate_bytes(ckpt.read_bytes(), how, at, byte))
        code, _, err = _cli(["run", str(recipe), "--output-dir", str(copy), "--quiet",
                             "--no-export", "--resume", "--set", "seed=0"])
        _well_behaved(code, err)
        assert _kept(before, copy)


EDITS: dict[str, Callable[[dict, dict, Any], None]] = {
    "drop-field": lambda doc, arrays, v: doc.pop(sorted(doc)[v % len(doc)]),
    "drop-array": lambda doc, arrays, v: arrays.pop(sorted(arrays)[v % len(arrays)]),
    "dtype": lambda doc, arrays, v: arrays.update(
        {k: a.astype([np.float64, np.float16, np.int32][v % 3]) for k, a in arrays.items()}),
    "shape": lambda doc, arrays, v: arrays.update(
        {k: a.reshape(-1)[: max(1, a.size - v % 3)] for k, a in arrays.items()}),
    "position": lambda doc, arrays, v: doc["position"].update(
        epoch=[-1, 7, "x", None][v % 4], step=[-3, "y", 10**9, None][v % 4]),
    "format": lambda doc, arrays, v: doc.update(format=[1, 3, "2", None][v % 4]),
}


@given(edit=st.sampled_from(sorted(EDITS)), value=st.integers(0, 100))
def test_edited_checkpoints(finished: tuple[Path, Path], edit: str, value: int) -> None:
    recipe, out = finished
    with _folder() as tmp:
        copy = _copy(out, Path(tmp) / "out")
        before = (copy / "metrics.json").read_text()
        with np.load(copy / "checkpoint.npz") as data:
            arrays = {k: data[k] for k in data.files}
        doc = json.loads(arrays.pop("__meta__").tobytes())
        EDITS[edit](doc, arrays, value)
        arrays["__meta__"] = np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8)
        with open(copy / "checkpoint.npz", "wb") as f:
            np.savez(f, **arrays)
        code, _, err = _cli(["run", str(recipe), "--output-dir", str(copy), "--quiet",
                             "--no-export", "--resume", "--set", "seed=0"])
        _well_behaved(code, err, allowed=(0, 1, 2))
        assert _kept(before, copy)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 200), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)
REPLAY_FIELDS = ["format", "strategy", "resumed", "recipe_file", "mutable", "definitions",
                 "threads", "ranks", "workers", "order", "final_sha256"]


@given(record=st.one_of(json_values, st.fixed_dictionaries(
    {k: json_values for k in REPLAY_FIELDS if k != "order"},
    optional={"order": st.lists(st.integers(-1, 100), max_size=4)})),
    raw=st.one_of(st.none(), st.binary(max_size=20)))
def test_edited_replay_files(record: Any, raw: bytes | None) -> None:
    with _folder() as tmp:
        path = Path(tmp) / "replay.json"
        path.write_bytes(raw if raw is not None else json.dumps(record).encode())
        code, _, err = _cli(["replay", tmp])
        _well_behaved(code, err, allowed=(2,))


@given(content=st.one_of(st.binary(max_size=40), json_values.map(lambda v: json.dumps(v)
                                                                  .encode())))
def test_corrupt_lock_files(content: bytes) -> None:
    with _folder() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        (out / "run.lock").write_bytes(content)
        (out / "metrics.json").write_text('{"passed": true}')
        path = _recipe(Path(tmp))
        code, _, err = _cli(["run", str(path), "--output-dir", str(out), "--quiet",
                             "--no-export"])
        _well_behaved(code, err, allowed=(0, 1, 2))
        assert code != 2 or "lock file" in err or "in use by another run" in err, err
        if code == 2:
            assert (out / "run.lock").read_bytes() == content  # another run's: untouched
        assert _kept('{"passed": true}', out) or code in (0, 1)


# -- data and models -------------------------------------------------------------------------
DTYPES = [np.float32, np.float64, np.int64, np.uint8, np.bool_, np.int8, np.complex64,
          np.str_]


@given(n_x=st.integers(0, 30), n_y=st.integers(0, 30), features=st.integers(0, 4),
       x_dtype=st.sampled_from(DTYPES), y_dtype=st.sampled_from(DTYPES),
       y_extra_dim=st.booleans(), layout=st.sampled_from(["xy", "keras", "odd"]),
       fraction=st.booleans())
def test_npz_arrays(n_x: int, n_y: int, features: int, x_dtype: Any, y_dtype: Any,
                    y_extra_dim: bool, layout: str, fraction: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, (n_x, *([features] if features else []))).astype(x_dtype)
    y = rng.integers(0, 3, (n_y, 2) if y_extra_dim else n_y).astype(y_dtype)
    if fraction and np.issubdtype(y.dtype, np.floating) and y.size:
        y.flat[0] = 0.5
    with _folder() as tmp:
        path = Path(tmp) / "data.npz"
        arrays = {"xy": {"x": x, "y": y}, "odd": {"inputs": x, "labelz": y},
                  "keras": {"x_train": x, "y_train": y, "x_test": x[:5], "y_test": y[:5]}}
        np.savez(path, **arrays[layout])
        fixed = {"dataset": {"name": "arrays", "path": str(path)},
                 "model": {"name": "mlp", "hidden": [4]}, "epochs": 1}
        recipe = _recipe(Path(tmp), fixed)
        code, _, err = _cli(["run", str(recipe), "--output-dir", f"{tmp}/out", "--quiet",
                             "--no-export"])
        _well_behaved(code, err)


@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=3),
       sizes=st.lists(st.sampled_from([(4, 4), (5, 4), (4, 4)]), min_size=1, max_size=3),
       junk=st.sampled_from(["", "notes.txt", "broken.png"]), mode=st.sampled_from(["L", "RGB"]))
def test_image_folders(counts: list[int], sizes: list[tuple[int, int]], junk: str,
                       mode: str) -> None:
    from PIL import Image

    with _folder() as tmp:
        root = Path(tmp) / "images"
        root.mkdir()
        for c, count in enumerate(counts):
            (root / f"class{c}").mkdir()
            for i in range(count):
                size = sizes[(c + i) % len(sizes)]
                Image.fromarray(np.full(size, 30 * i, np.uint8)).save(root / f"class{c}" /
                                                                      f"{i}.png")
        if junk:
            (root / "class0" / junk).write_bytes(b"not an image")
        fixed = {"dataset": {"name": "image_folder", "path": str(root), "mode": mode},
                 "model": {"name": "mlp", "hidden": [4]}, "epochs": 1}
        recipe = _recipe(Path(tmp), fixed, {"batch_size": 2, "lr": 0.1})
        code, _, err = _cli(["run", str(recipe), "--output-dir", f"{tmp}/out", "--quiet",
                             "--no-export"])
        _well_behaved(code, err)


def _onnx_bytes(batch: Any, features: Any, classes: Any, out_rank: int, op: str) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((6, 10), np.float32) * 0.01, "w")
    node = helper.make_node(op, ["x", "w"] if op == "MatMul" else ["x"], ["logits"])
    out_shape = [batch, classes][:out_rank] if out_rank else None
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_shape)],
        [w] if op == "MatMul" else [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]) \
        .SerializeToString()


@given(batch=st.sampled_from([1, 2, 16, "N", None]), features=st.sampled_from([6, 5, "F"]),
       classes=st.sampled_from([10, 3, "C"]), out_rank=st.sampled_from([0, 1, 2]),
       op=st.sampled_from(["MatMul", "Relu", "Identity"]),
       damage=st.sampled_from(["none", "truncate", "garbage"]), at=st.integers(0, 10**4))
def test_onnx_files(batch: Any, features: Any, classes: Any, out_rank: int, op: str,
                    damage: str, at: int) -> None:
    data = _onnx_bytes(batch, features, classes, out_rank, op)
    if damage == "truncate":
        data = data[: at % len(data)]
    elif damage == "garbage":
        data = bytes((b + at) % 256 for b in data[:64])
    with _folder() as tmp:
        model = Path(tmp) / "model.onnx"
        model.write_bytes(data)
        fixed = {"dataset": DATASET, "model": {"name": "onnx", "path": str(model)}, "epochs": 1}
        recipe = _recipe(Path(tmp), fixed)
        code, _, err = _cli(["run", str(recipe), "--output-dir", f"{tmp}/out", "--quiet",
                             "--no-export"])
        _well_behaved(code, err)
        code, _, err = _cli(["inspect", str(model)])
        _well_behaved(code, err, allowed=(0, 2))


# -- the planner's machine file ----------------------------------------------------------------
def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 10**12),
                    st.sampled_from([0, 0.0, -1.0, 1e-300, 1e300]), st.text(max_size=4),
                    st.booleans())
MACHINE_KEYS = ["nodes", "ranks_per_node", "cores", "flops", "memory_gib", "memory_bytes",
                "copy_beta", "shared_read_beta", "progress", "name", "speed"]


@given(top=st.dictionaries(st.sampled_from(MACHINE_KEYS), numbers, max_size=4),
       links=st.dictionaries(st.sampled_from(["intra", "inter", "polled"]),
                             st.dictionaries(st.sampled_from(["alpha", "beta", "gamma"]),
                                             numbers, max_size=2), max_size=2),
       ranks=st.sampled_from([1, 2, 7, 4096, 10**9]))
@settings(max_examples=8)
def test_machine_files(top: dict[str, Any], links: dict[str, dict[str, Any]],
                       ranks: int) -> None:
    """``meta plan --machine FILE``: a plan (exit 0) or one line and exit 2, never a
    traceback, and bounded in time at any P."""
    import time

    text = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items())
    for table, keys in links.items():
        text += f"[{table}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in keys.items())
    with _folder() as tmp:
        machine = Path(tmp) / "machine.toml"
        machine.write_text(text)
        start = time.perf_counter()
        code, out, err = _cli(["plan", str(_recipe(Path(tmp))), "--ranks", str(ranks),
                               "--machine", str(machine), "--top", "3"])
        assert time.perf_counter() - start < 30, text
        assert code in (0, 2) and "Traceback" not in err, (text, err)
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and err.startswith("meta plan: "), \
                (text, err)
        else:
            assert "samples/s" in out and "nan" not in out.split("samples/s", 1)[1], (text, out)


# -- text corpora for language models (issue 44) -------------------------------------------
CORPORA = ["to be or not to be ", "ab\n", "\u00e9\u20ac\U0001f600 "]


@given(corpus=st.one_of(st.sampled_from(CORPORA), st.text(max_size=60), st.binary(max_size=40)),
       repeat=st.sampled_from([20, 0, 1, 3]), context=st.sampled_from([4, 0, 1, 8, 64]),
       vocabulary=st.sampled_from(["char", "byte", "words"]),
       validation=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
       prompt=st.one_of(st.none(), st.sampled_from(["to", "Z", "\U0001f600", ""]),
                        st.text(max_size=4)), files=st.sampled_from([1, 2, 0]))
@settings(max_examples=10)
def test_text_corpora(corpus: str | bytes, repeat: int, context: int, vocabulary: str,
                      validation: float, prompt: str | None, files: int) -> None:
    """The ``text`` dataset on generated corpora (empty, one character, any Unicode, bytes
    that are not UTF-8, a missing file) with a language model and ``sample_text`` prompts in
    or out of its vocabulary: a run or one line and exit 2, before any epoch when the input
    is wrong, never a traceback."""
    with _folder() as tmp:
        paths = []
        for i in range(files):
            path = Path(tmp) / f"corpus{i}.txt"
            if isinstance(corpus, bytes):
                path.write_bytes(corpus * repeat)
            else:
                path.write_text(corpus * repeat, encoding="utf-8")
            paths.append(str(path))
        fixed = {"dataset": {"name": "text", "files": paths or [f"{tmp}/missing.txt"],
                             "context": context, "vocabulary": vocabulary,
                             "validation": validation},
                 "model": {"name": "lstm_lm", "hidden": 4, "embedding": 2}, "epochs": 1}
        if prompt is not None:
            fixed["events"] = [{"name": "sample_text", "prompt": prompt, "length": 2}]
        recipe = _recipe(Path(tmp), fixed, {"batch_size": 8, "lr": 0.01, "seed": 0},
                         '{"test_loss": AtMost(1e9)}')
        code, out, err = _cli(["run", str(recipe), "--output-dir", f"{tmp}/out", "--quiet",
                               "--no-export"])
        _well_behaved(code, err)
        if code == 2:  # found before any step: nothing trained, no checkpoint
            assert " at epoch " not in err and "error.log" not in err, err
            assert not Path(f"{tmp}/out/checkpoint.npz").exists(), err
