"""Level 2: datasets, samplers, optimizers and the trainer with its events."""

from meta.lv2.checkpoint import CheckpointError, CheckpointEvent, load_checkpoint, save_checkpoint
from meta.lv2.cifar import cifar10
from meta.lv2.datasets import (
    ArrayDataset,
    Dataset,
    DatasetError,
    fashion_mnist,
    mnist,
    synthetic,
)
from meta.lv2.events import (
    CSVLog,
    EarlyStopping,
    EpochLog,
    Event,
    JSONLinesLog,
    PlotMetrics,
    ProgressBar,
    TimeBudget,
)
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
    masked,
    partition,
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
from meta.lv2.dataset_registry import DATASETS, build_dataset, register_dataset  # isort: skip
from meta.lv2 import array_files, dbn_model, image_folder  # noqa: F401,E402  (register)
from meta.lv2.events import EVENTS, register_event  # noqa: E402
from meta.lv2.metrics import METRICS, Metric, register_metric  # noqa: E402
from meta.lv2.optimizers import OPTIMIZERS, build_optimizer, register_optimizer  # noqa: E402

__all__ = [
    "DATASETS",
    "EVENTS",
    "METRICS",
    "OPTIMIZERS",
    "Metric",
    "build_dataset",
    "build_optimizer",
    "register_dataset",
    "register_event",
    "register_metric",
    "register_optimizer",
    "CSVLog",
    "CheckpointError",
    "CheckpointEvent",
    "EarlyStopping",
    "JSONLinesLog",
    "PlotMetrics",
    "TimeBudget",
    "cifar10",
    "load_checkpoint",
    "save_checkpoint",
    "synthetic",
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
    "masked",
    "mnist",
    "partition",
    "read_idx",
    "scale",
    "sgd",
    "trace",
    "write_idx",
]
