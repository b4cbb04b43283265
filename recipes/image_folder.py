"""Your own images: one folder per class (``data/digit_images/0``, ``.../1``, ``.../7``: 40
14x14 PNGs each), read with Pillow, a seeded fifth held out for testing.

Run:  meta run recipes/image_folder.py
"""

from pathlib import Path

from meta.recipe import AtLeast

FIXED = {
    "dataset": {"name": "image_folder", "path": str(Path(__file__).parent / "data" /
                                                   "digit_images"), "test_fraction": 0.25},
    "model": {"name": "lenet"},
    "optimizer": "adam",
}

MUTABLE = {
    "epochs": 10,
    "batch_size": 16,
    "lr": 0.002,
    "seed": 0,
}

METRICS = {
    "test_accuracy": AtLeast(0.9),
}
