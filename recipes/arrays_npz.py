"""Your own arrays (``data/digits14.npz``: 14x14 digits in Keras' x_train / y_train / x_test /
y_test layout), with an event and a metric defined right here.

Run:  meta run recipes/arrays_npz.py

``UpdateNorm`` is an event: every ``every`` steps it writes the size of the parameters' last
update to ``update_norms.csv`` in the output folder (a learning rate that is too high shows
there first). ``WorstClassRecall`` is an acceptable metric: the recall of the class the network
recognises worst, bounded in METRICS like any built-in metric, reported in metrics.json.
"""

from pathlib import Path

import numpy as np

from meta.common.component import Option
from meta.lv2 import Event, Metric, register_event, register_metric
from meta.recipe import AtLeast


@register_event("update_norm")
class UpdateNorm(Event):
    """The L2 norm of each ``every``-th parameter update, written to a CSV file."""

    options = {"every": Option(20, "steps between records", low=1),
               "path": Option("update_norms.csv", "the CSV file (in the output folder)")}

    def __init__(self, every: int, path: str) -> None:
        self.every, self.path, self.before = every, path, None

    def on_step_end(self, trainer, observation):
        params = trainer.optimizer.params
        if self.before is not None and observation["step"] % self.every == 0:
            norm = np.sqrt(sum(float(np.sum((params[k] - v) ** 2))
                               for k, v in self.before.items()))
            with open(Path(trainer.output_dir or ".") / self.path, "a") as f:
                f.write(f"{observation['step']},{norm:.6g}\n")
        self.before = {k: np.array(v) for k, v in params.items()}


@register_metric("worst_class_recall")
class WorstClassRecall(Metric):
    """The lowest per-class recall on the test data."""

    def compute(self, trainer, history):
        def per_class(logits, labels):
            hits = np.bincount(labels[logits.argmax(1) == labels], minlength=10)
            return np.concatenate([hits, np.bincount(labels, minlength=10)])

        sums = trainer.evaluate_with(per_class)
        return float(np.min(sums[:10] / np.maximum(sums[10:], 1)))


FIXED = {
    "dataset": {"name": "arrays", "path": str(Path(__file__).parent / "data" / "digits14.npz")},
    "model": {"name": "mlp", "hidden": [128]},
    "events": [{"name": "update_norm", "every": 20}],
}

MUTABLE = {
    "epochs": 8,
    "batch_size": 32,
    "lr": 0.05,
    "momentum": 0.9,
    "seed": 0,
}

METRICS = {
    "test_accuracy": AtLeast(0.9),
    "worst_class_recall": AtLeast(0.75),
}
