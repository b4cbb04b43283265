"""Datasets as recipes name them: ``build(seed, **options) -> (train, test)``.

Every dataset also takes the options the registry owns (``build_dataset``): ``train_samples``
(train on the first n examples) and ``augmentation`` (random crop, flip, cutout, drawn from the
sampler's generator). A user's dataset is one decorated function returning two
``ArrayDataset``s (or ``((x, y), (x, y))`` pairs of arrays); see ``register_dataset``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from meta.common.component import Component, Option, Registry
from meta.lv2.cifar import cifar10
from meta.lv2.datasets import (
    IGNORE_INDEX,
    ArrayDataset,
    Dataset,
    DatasetError,
    fashion_mnist,
    mnist,
    synthetic,
)
from meta.lv2.transforms import Compose, Cutout, HorizontalFlip, RandomCrop

AUGMENTATIONS: dict[str, Callable[[], Any]] = {
    "crop": lambda: RandomCrop(4), "flip": HorizontalFlip, "cutout": lambda: Cutout(8)}

DATASETS = Registry("dataset", context=("seed",), common={
    "train_samples": Option(0, "train on the first n examples (0: all)", low=0),
    "augmentation": Option((), "any of crop, flip, cutout, applied to training batches",
                           type=tuple[str, ...], choices=("crop", "flip", "cutout")),
})
NORMALIZE = {"normalize": Option(True, "standardize the pixels (False: keep them in [0, 1])")}


def register_dataset(name: str | None = None, **options: Option) -> Callable[[Any], Any]:
    """Make ``factory(seed, **options) -> (train, test)`` selectable by name in recipes.

    >>> @register_dataset("tiny_blobs", size=Option(64, "examples per split", low=2))
    ... def tiny_blobs(seed, size):
    ...     rng = np.random.default_rng(seed)
    ...     y = rng.integers(0, 2, (2, size))
    ...     return [(rng.standard_normal((size, 3)) + 2 * y[i, :, None], y[i]) for i in (0, 1)]
    >>> train, test, _ = build_dataset(DATASETS["tiny_blobs"], {"size": 8}, seed=0)
    >>> len(train), train.inputs.dtype
    (8, dtype('float32'))
    """
    return DATASETS.register(name, **options)


def _splits(build: Callable[..., Dataset]) -> Callable[..., tuple[Dataset, Dataset]]:
    def both(seed: int, normalize: bool = True) -> tuple[Dataset, Dataset]:
        return build("train", normalize=normalize), build("test", normalize=normalize)
    both.__doc__ = build.__doc__
    return both


for _name, _build in (("mnist", mnist), ("fashion-mnist", fashion_mnist), ("cifar10", cifar10)):
    DATASETS.add(_name, _splits(_build), NORMALIZE, doc=f"{_name}, downloaded and md5-checked "
                 "on first use (or read from $META_*_DIR)")


@register_dataset("synthetic",
                  train_examples=Option(20000, "training examples", low=1),
                  test_examples=Option(2000, "test examples", low=1),
                  input_shape=Option((1, 28, 28), "shape of one example", low=1))
def synthetic_splits(seed: int, train_examples: int, test_examples: int,
                     input_shape: tuple[int, ...]) -> tuple[Dataset, Dataset]:
    """Gaussian blobs around one centre per class (10 classes): instant, learnable."""
    return (synthetic(train_examples, input_shape, 10, seed=0, split=0),
            synthetic(test_examples, input_shape, 10, seed=0, split=1))


def as_dataset(data: Any, what: str) -> ArrayDataset:
    """An ArrayDataset from a dataset or an (inputs, labels) pair: integer inputs (token ids,
    or pixels the model may take as floats: the runner casts them to the model's input dtype)
    as int64, any other inputs as float32; int64 labels, one per example (N,) or one per
    position (N, T, ...), where ``IGNORE_INDEX`` marks padding."""
    if isinstance(data, ArrayDataset):
        inputs, labels = data.inputs, data.labels
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        inputs, labels = (np.asarray(a) for a in data)
    else:
        raise DatasetError(f"{what}: expected an ArrayDataset or an (inputs, labels) pair, got "
                           f"{type(data).__name__}")
    if not np.issubdtype(labels.dtype, np.integer) or labels.ndim == 0:
        raise DatasetError(f"{what}: labels must be an integer array, one class per example "
                           f"(N,) or per position (N, T, ...), got {labels.dtype} "
                           f"{list(labels.shape)}")
    if len(labels) and labels.min() < 0:
        real = labels[labels != IGNORE_INDEX] if labels.ndim > 1 else labels
        if real.size and real.min() < 0:
            raise DatasetError(f"{what}: labels must be class indices >= 0"
                               f"{f' (or {IGNORE_INDEX} for padding)' if labels.ndim > 1 else ''}"
                               f", found {real.min()}")
    integer = np.issubdtype(inputs.dtype, np.integer)
    try:
        return ArrayDataset(inputs.astype(np.int64 if integer else np.float32, copy=False),
                            labels.astype(np.int64, copy=False),
                            getattr(data, "vocabulary", None))
    except ValueError as err:
        raise DatasetError(f"{what}: {err}") from err


def as_model_input(data: ArrayDataset, dtype: Any) -> ArrayDataset:
    """``data`` with its inputs in ``dtype``, the model's declared input type: integer pixels
    become floats for an image model, token ids stay integers for a language model."""
    if dtype is None or data.inputs.dtype == np.dtype(dtype):
        return data
    if np.issubdtype(np.dtype(dtype), np.integer) and \
            not np.issubdtype(data.inputs.dtype, np.integer):
        return data  # floats for a model taking ids: the checks before training say so
    return ArrayDataset(data.inputs.astype(dtype), data.labels, data.vocabulary)


def model_dtype(data: ArrayDataset) -> Any:
    """The floating dtype a model is built in for ``data``: float32 for integer inputs."""
    return np.float32 if np.issubdtype(data.inputs.dtype, np.integer) else data.inputs.dtype


def build_dataset(component: Component, options: dict[str, Any],
                  seed: int) -> tuple[ArrayDataset, ArrayDataset, Compose | None]:
    """(train, test, training augmentation or None) for the dataset a recipe names."""
    values = component.resolve(options)
    train_samples, augmentation = values.pop("train_samples"), values.pop("augmentation")
    made = component.factory(seed, **values)
    if not isinstance(made, (tuple, list)) or len(made) != 2:
        raise DatasetError(f"dataset {component.name!r} must return (train, test), got "
                           f"{type(made).__name__}")
    train, test = (as_dataset(d, f"dataset {component.name!r} {split}")
                   for d, split in zip(made, ("train", "test")))
    for split, data in (("training", train), ("test", test)):  # samplers need one at least
        if len(data) == 0:
            raise DatasetError(f"dataset {component.name!r} returned no {split} examples")
    if train.inputs.shape[1:] != test.inputs.shape[1:]:
        raise DatasetError(f"dataset {component.name!r}: train examples are "
                           f"{list(train.inputs.shape[1:])}, test examples "
                           f"{list(test.inputs.shape[1:])}")
    if train_samples:
        train = ArrayDataset(train.inputs[:train_samples], train.labels[:train_samples],
                             train.vocabulary)
    transform = Compose(*(AUGMENTATIONS[a]() for a in augmentation)) if augmentation else None
    return train, test, transform


def classes(*datasets: ArrayDataset) -> int:
    """The number of classes: one more than the largest label (padding's is negative)."""
    return int(max(int(d.labels.max(initial=0)) for d in datasets)) + 1
