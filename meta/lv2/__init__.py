"""Level 2: datasets, samplers, optimizers and the trainer with its events."""

from meta.lv2.datasets import (
    ArrayDataset,
    Dataset,
    DatasetError,
    fashion_mnist,
    mnist,
)
from meta.lv2.events import EpochLog, Event, ProgressBar
from meta.lv2.idx import IDXError, read_idx, write_idx
from meta.lv2.optimizers import (
    GradientTransformation,
    Optimizer,
    adadelta,
    adagrad,
    adam,
    adamw,
    add_decayed_weights,
    chain,
    clip_by_global_norm,
    cosine_decay,
    rmsprop,
    scale,
    sgd,
    step_table,
    trace,
    warmup,
)
from meta.lv2.sampler import SequentialSampler, ShuffleSampler
from meta.lv2.second_order import LBFGS, ConjugateGradient
from meta.lv2.trainer import Trainer

__all__ = [
    "LBFGS",
    "ArrayDataset",
    "ConjugateGradient",
    "adadelta",
    "adagrad",
    "adam",
    "adamw",
    "add_decayed_weights",
    "clip_by_global_norm",
    "cosine_decay",
    "rmsprop",
    "step_table",
    "warmup",
    "Dataset",
    "DatasetError",
    "EpochLog",
    "Event",
    "GradientTransformation",
    "IDXError",
    "Optimizer",
    "ProgressBar",
    "SequentialSampler",
    "ShuffleSampler",
    "Trainer",
    "chain",
    "fashion_mnist",
    "mnist",
    "read_idx",
    "scale",
    "sgd",
    "trace",
    "write_idx",
]
