"""The ``arrays`` dataset: the user's own examples in ``.npz`` / ``.npy`` files.

Accepted layouts, checked and named in any error:

* one ``.npz`` with ``x_train``, ``y_train``, ``x_test``, ``y_test`` (Keras' layout);
* one ``.npz`` with ``x`` and ``y`` (or ``inputs`` and ``labels``), split into train and test by
  ``test_fraction`` (a seeded shuffle), or with a second such file as ``test_path``;
* an inputs ``.npy`` with its ``labels`` ``.npy`` (and the same pair for the test split).

Integer inputs are pixels or ids, as ``integers`` says: pixels are scaled to [0, 1] (and with
``normalize`` standardized with the training split's mean and deviation); ids (token ids for an
embedding, category ids) stay int64 and are never rescaled, so a token model trains on the ids
it was given. ``auto`` takes ``uint8`` for pixels and any other integer type for ids. Labels are
one class per example (N,) or, for a model that predicts at every position (a language model,
a tagger), one per position (N, T, ...), where ``IGNORE_INDEX`` (-100) marks padding the loss
skips.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meta.common.component import Option
from meta.lv2.dataset_registry import register_dataset
from meta.lv2.datasets import IGNORE_INDEX, ArrayDataset, DatasetError

INTEGERS = ("auto", "pixels", "ids")
PAIRS = (("x", "y"), ("inputs", "labels"))


def _load(path: str, labels: str = "") -> dict[str, np.ndarray]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise DatasetError(f"dataset 'arrays': no file {str(file)!r}")
    try:
        if file.suffix == ".npy":
            if not labels:
                raise DatasetError(f"dataset 'arrays': {file} holds inputs only; name the labels "
                                   f"file with the option 'labels'")
            return {"x": np.load(file, allow_pickle=False),
                    "y": np.load(Path(labels).expanduser(), allow_pickle=False)}
        with np.load(file, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as err:
        raise DatasetError(f"dataset 'arrays': {file} cannot be read ({err})") from err


def _checked(x: np.ndarray, y: np.ndarray, path: str, names: tuple[str, str]
             ) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels that pair up: as many of each, labels whole class indices (a float
    label such as 0.5 is refused, never truncated to 0), one per example or one per position
    of each example, named by file and array."""
    x, y = np.asarray(x), np.asarray(y)
    where = f"dataset 'arrays': {path}"
    if x.ndim == 0 or y.ndim == 0 or (y.ndim > 1 and y.shape[1:] != x.shape[1:y.ndim]):
        raise DatasetError(f"{where}: {names[0]!r} must be examples along the first axis and "
                           f"{names[1]!r} one label per example (N,) or one per position "
                           f"(N, T, ...) of the examples' first axes, got shapes "
                           f"{list(x.shape)} and {list(y.shape)}")
    if len(x) == 0:
        raise DatasetError(f"{where}: {names[0]!r} holds no examples")
    if len(x) != len(y):
        raise DatasetError(f"{where}: {names[0]!r} has {len(x)} examples, {names[1]!r} "
                           f"{len(y)} labels; they must be as many")
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)
            or y.dtype == np.bool_):
        raise DatasetError(f"{where}: {names[1]!r} holds {y.dtype}, not class indices")
    if np.issubdtype(y.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if len(bad):
            raise DatasetError(f"{where}: {names[1]!r} holds {float(y[bad[0]]):g} at index "
                               f"{bad[0]} ({len(bad)} label(s) not whole numbers); labels are "
                               f"class indices 0, 1, 2, ...")
    real = y[y != IGNORE_INDEX] if y.ndim > 1 else y  # per position: -100 marks padding
    if real.size and real.min() < 0:
        raise DatasetError(f"{where}: {names[1]!r} holds {real.min().item()!r}; labels are class "
                           f"indices 0, 1, 2, ..."
                           f"{f' ({IGNORE_INDEX} for padding)' if y.ndim > 1 else ''}")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise DatasetError(f"{where}: {names[0]!r} holds {x.dtype}, not numbers")
    return x, y


def _pair(arrays: dict[str, np.ndarray], path: str) -> tuple[np.ndarray, np.ndarray]:
    for x, y in PAIRS:
        if x in arrays and y in arrays:
            return _checked(arrays[x], arrays[y], path, (x, y))
    raise DatasetError(f"dataset 'arrays': {path} has {sorted(arrays)}; expected x_train, "
                       f"y_train, x_test, y_test, or x and y (inputs and labels)")


@register_dataset(
    "arrays",
    path=Option(doc="an .npz file (or an .npy of inputs, with 'labels')", type=str,
                path=True),
    labels=Option("", "the labels .npy, when 'path' is an .npy of inputs", path=True),
    test_path=Option("", "the test split's file (default: split 'path')", path=True),
    test_labels=Option("", "the test labels .npy, when 'test_path' is an .npy",
                       path=True),
    test_fraction=Option(0.2, "share held out for testing when no test split is given",
                         low=0.0, below=1.0),
    normalize=Option(True, "standardize inputs that are not ids with the training split's "
                           "mean and deviation"),
    integers=Option("auto", "integer inputs are pixels (scaled to [0, 1]) or ids (token ids: "
                            "kept int64); auto: uint8 pixels, other integers ids",
                    choices=INTEGERS),
)
def arrays(seed: int, path: str, labels: str, test_path: str, test_labels: str,
           test_fraction: float, normalize: bool,
           integers: str = "auto") -> tuple[ArrayDataset, ArrayDataset]:
    """Your own arrays from .npz / .npy files."""
    data = _load(path, labels)
    if {"x_train", "y_train", "x_test", "y_test"} <= data.keys():
        train, test = (_checked(data[f"x_{s}"], data[f"y_{s}"], path, (f"x_{s}", f"y_{s}"))
                       for s in ("train", "test"))
    elif test_path:
        train, test = _pair(data, path), _pair(_load(test_path, test_labels), test_path)
    else:
        x, y = _pair(data, path)
        order = np.random.default_rng(seed).permutation(len(x))
        cut = len(x) - max(1, round(test_fraction * len(x))) if test_fraction else len(x)
        if not 0 < cut < len(x):
            raise DatasetError(f"dataset 'arrays': {path} has {len(x)} examples, too few to hold "
                               f"out test_fraction={test_fraction}")
        train, test = (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])
    inputs = [np.asarray(a) for a in (train[0], test[0])]
    integer = all(np.issubdtype(a.dtype, np.integer) for a in inputs)
    if integer and (integers == "ids" or (integers == "auto" and inputs[0].dtype != np.uint8)):
        # token ids index an embedding: as float32 they would be refused by its Gather, and
        # scaling or standardizing them would change which rows they name
        return (ArrayDataset(inputs[0].astype(np.int64), np.asarray(train[1]).astype(np.int64)),
                ArrayDataset(inputs[1].astype(np.int64), np.asarray(test[1]).astype(np.int64)))
    if integer:
        inputs = [a.astype(np.float32) / 255.0 for a in inputs]
    inputs = [a.astype(np.float32) for a in inputs]
    if normalize:
        mean, std = float(inputs[0].mean()), float(inputs[0].std()) or 1.0
        inputs = [(a - mean) / std for a in inputs]
    return (ArrayDataset(inputs[0], np.asarray(train[1]).astype(np.int64)),
            ArrayDataset(inputs[1], np.asarray(test[1]).astype(np.int64)))
