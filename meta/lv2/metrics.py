"""Acceptable metrics as components (Deep500's metric classes): measured on a finished run.

A recipe bounds a metric in METRICS by name: the run's own measurements (``test_accuracy``,
``train_time_s``, ...) or a ``Metric`` registered here or in the recipe file, whose options
ride on the bound (``"top_k_accuracy": AtLeast(0.99, k=5)``). ``compute`` sees the trainer
after training (its executor in eval mode, the test data, ``evaluate_with`` for a pass over
this replica's shard summed across replicas) and the per-epoch history.

>>> @register_metric("best_epoch")
... class BestEpoch(Metric):
...     '''The epoch with the highest test accuracy.'''
...     def compute(self, trainer, history):
...         return float(max(history, key=lambda m: m["test_accuracy"])["epoch"])
>>> "best_epoch" in METRICS
True
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from meta.common.component import Option, Registry

METRICS = Registry("metric")


def register_metric(name: str | None = None, **options: Option):
    """Make a Metric subclass boundable by name in METRICS."""
    return METRICS.register(name, **options)


class Metric:
    """A number a finished run is judged on; subclasses declare ``options`` and ``compute``."""

    options: ClassVar[dict[str, Option]] = {}

    def __init__(self, **options: Any) -> None:
        for key, value in options.items():
            setattr(self, key, value)

    def compute(self, trainer: Any, history: list[dict[str, Any]]) -> float:
        raise NotImplementedError(f"{type(self).__name__}.compute")


@register_metric("top_k_accuracy")
class TopKAccuracy(Metric):
    """Share of test examples whose label is among the k highest logits."""

    options = {"k": Option(5, "how many of the highest logits count", low=1)}

    def compute(self, trainer: Any, history: list[dict[str, Any]]) -> float:
        def hits(logits: np.ndarray, labels: np.ndarray) -> list[float]:
            top = np.argpartition(-logits, min(self.k, logits.shape[1]) - 1, axis=1)[:, :self.k]
            return [float(np.count_nonzero(top == labels[:, None])), float(len(labels))]

        found, count = trainer.evaluate_with(hits)
        return found / count


@register_metric("class_recall")
class ClassRecall(Metric):
    """Share of the test examples of one class that are predicted as that class."""

    options = {"label": Option(0, "the class", low=0)}

    def compute(self, trainer: Any, history: list[dict[str, Any]]) -> float:
        def recall(logits: np.ndarray, labels: np.ndarray) -> list[float]:
            mine = labels == self.label
            return [float(np.count_nonzero(logits[mine].argmax(1) == self.label)),
                    float(np.count_nonzero(mine))]

        found, count = trainer.evaluate_with(recall)
        return found / count if count else math.nan


@register_metric("time_to_accuracy")
class TimeToAccuracy(Metric):
    """Seconds of training until the test accuracy first reached ``target`` (inf: never)."""

    options = {"target": Option(0.97, "the test accuracy to reach", low=0.0, high=1.0)}

    def compute(self, trainer: Any, history: list[dict[str, Any]]) -> float:
        elapsed = 0.0
        for epoch in history:
            elapsed += float(epoch.get("epoch_time_s", 0.0))
            if epoch.get("test_accuracy", -1.0) >= self.target:
                return elapsed
        return math.inf


def _final_loss(history: list[dict[str, Any]]) -> float:
    """The last epoch's validation (test) loss, in nats per target."""
    if not history or "test_loss" not in history[-1]:
        return math.nan
    return float(history[-1]["test_loss"])


@register_metric("perplexity")
class Perplexity(Metric):
    """exp(validation loss per token): the number of equally likely tokens the model's
    uncertainty amounts to (a language model's usual figure; the vocabulary size at chance)."""

    def compute(self, trainer: Any, history: list[dict[str, Any]]) -> float:
        return math.exp(_final_loss(history))


@register_metric("bits_per_character")
class BitsPerCharacter(Metric):
    """Validation loss per character in bits: nats per token / ln 2, divided by the
    validation targets' characters per token where a token is not one character (BPE
    subwords, bytes of non-ASCII text; ``meta.lv2.text.characters_per_token``), so runs with
    different tokenizers compare."""

    def compute(self, trainer: Any, history: list[dict[str, Any]]) -> float:
        from meta.lv2.text import characters_per_token

        data = getattr(trainer, "test_data", None)
        per_token = getattr(getattr(data, "vocabulary", None), "kind", "char") != "char"
        ratio = characters_per_token(data) if per_token else 1.0
        return _final_loss(history) / math.log(2) / ratio
