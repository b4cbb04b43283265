"""Writes the small datasets the bring-your-own recipes read, from MNIST (``$META_MNIST_DIR`` or
meta's download cache):

* ``digits14.npz``: 3000 training and 600 test digits, downsampled to 14x14 (2x2 means), uint8,
  in Keras' layout (``x_train``, ``y_train``, ``x_test``, ``y_test``), for
  ``recipes/arrays_npz.py``;
* ``digit_images/<digit>/<n>.png``: 40 images each of the digits 0, 1 and 7 (14x14 grayscale
  PNGs, a folder per class), for ``recipes/image_folder.py``.

Run from the repository root: ``python recipes/data/make_data.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from meta.lv2 import mnist

HERE = Path(__file__).parent


def small(images: np.ndarray) -> np.ndarray:
    """(N, 1, 28, 28) pixels in [0, 1] -> (N, 1, 14, 14) uint8, 2x2 means."""
    n = len(images)
    means = images.reshape(n, 1, 14, 2, 14, 2).mean(axis=(3, 5))
    return np.round(means * 255).astype(np.uint8)


def main() -> None:
    train, test = mnist("train", normalize=False), mnist("test", normalize=False)
    x_train, y_train = small(train.inputs[:3000]), train.labels[:3000].astype(np.uint8)
    x_test, y_test = small(test.inputs[:600]), test.labels[:600].astype(np.uint8)
    np.savez_compressed(HERE / "digits14.npz", x_train=x_train, y_train=y_train,
                        x_test=x_test, y_test=y_test)
    for digit in (0, 1, 7):
        folder = HERE / "digit_images" / str(digit)
        folder.mkdir(parents=True, exist_ok=True)
        for i, image in enumerate(x_train[y_train == digit][:40]):
            Image.fromarray(image[0], mode="L").save(folder / f"{i:02d}.png", optimize=True)
    print(f"wrote {HERE / 'digits14.npz'} and {HERE / 'digit_images'}")


if __name__ == "__main__":
    main()
