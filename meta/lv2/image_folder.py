"""The ``image_folder`` dataset: one subfolder of images per class (torchvision's ImageFolder).

Classes are the subfolders' names in sorted order (label 0 is the first); images are read with
Pillow (which matplotlib already brings), converted to ``mode`` ("L": one channel, "RGB":
three), resized to ``size`` when given (else every image must have the first one's size), and
scaled to [0, 1] as (C, H, W) float32, standardized with ``normalize``. The test split is
``test_path`` (the same class folders), or a seeded ``test_fraction`` of ``path``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meta.common.component import Option
from meta.lv2.dataset_registry import register_dataset
from meta.lv2.datasets import ArrayDataset, DatasetError

EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


def read_folder(root: Path, mode: str, size: tuple[int, ...],
                classes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images, labels, class names) of ``root``'s class subfolders."""
    from PIL import Image, UnidentifiedImageError

    if not root.is_dir():
        raise DatasetError(f"dataset 'image_folder': no folder {str(root)!r}")
    found = sorted(p.name for p in root.iterdir() if p.is_dir())
    given = classes is not None  # the test folder may lack a class the training one has
    classes = classes or found
    if not classes:
        raise DatasetError(f"dataset 'image_folder': {root} has no class subfolders")
    extra = sorted(set(found) - set(classes))
    if extra:
        raise DatasetError(f"dataset 'image_folder': {root} has classes {extra} that the "
                           f"training folder does not have")
    images, labels = [], []
    for label, name in enumerate(classes):
        files = [f for f in sorted((root / name).iterdir() if (root / name).is_dir() else [])
                 if f.suffix.lower() in EXTENSIONS]
        if not files and not given:  # a training class without images: the model would get
            raise DatasetError(f"dataset 'image_folder': class folder {root / name} has no "
                               f"images ({', '.join(sorted(EXTENSIONS))}); add some or "
                               f"remove it")
        for file in files:
            try:
                with Image.open(file) as img:
                    img = img.convert(mode)
                    if size:
                        img = img.resize((size[1], size[0]))
                    array = np.asarray(img, np.float32) / 255.0
            except (OSError, UnidentifiedImageError) as err:
                raise DatasetError(f"dataset 'image_folder': {file} cannot be read ({err})") \
                    from err
            array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
            if images and array.shape != images[0].shape:
                raise DatasetError(f"dataset 'image_folder': {file} is {list(array.shape)}, "
                                   f"the first image {list(images[0].shape)}; set 'size'")
            images.append(array)
            labels.append(label)
    if not images:
        raise DatasetError(f"dataset 'image_folder': no images under {root}")
    return np.stack(images), np.array(labels, np.int64), classes


@register_dataset(
    "image_folder",
    path=Option(doc="a folder with one subfolder of images per class", type=str, path=True),
    test_path=Option("", "the test split's folder (default: hold out test_fraction)",
                     path=True),
    test_fraction=Option(0.2, "share held out for testing without test_path", low=0.0,
                         below=1.0),
    mode=Option("L", "L: grayscale, RGB: colour", choices=("L", "RGB")),
    size=Option((), "(height, width) to resize to; () keeps the images' size",
                type=tuple[int, ...], low=1),
    normalize=Option(True, "standardize with the training split's mean and deviation"),
)
def image_folder(seed: int, path: str, test_path: str, test_fraction: float, mode: str,
                 size: tuple[int, ...], normalize: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """Images in class subfolders."""
    if size and len(size) != 2:
        raise DatasetError(f"dataset 'image_folder': size must be (height, width), got {size}")
    x, y, classes = read_folder(Path(path).expanduser(), mode, size)
    if test_path:
        tx, ty, _ = read_folder(Path(test_path).expanduser(), mode, size or x.shape[2:], classes)
    else:
        order = np.random.default_rng(seed).permutation(len(x))
        cut = len(x) - max(1, round(test_fraction * len(x)))
        if not 0 < cut < len(x):
            raise DatasetError(f"dataset 'image_folder': {path} has {len(x)} images, too few "
                               f"to hold out test_fraction={test_fraction}")
        x, y, tx, ty = x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]
    if normalize:
        mean, std = float(x.mean()), float(x.std()) or 1.0
        x, tx = (x - mean) / std, (tx - mean) / std
    return ArrayDataset(x, y), ArrayDataset(tx, ty)
