"""The ``dbn`` model component: a deep belief network, pre-trained before fine-tuning.

Building it gives the classifier graph with the RBMs as initialised; ``prepare`` (called by the
runner once the ranks agree that every input loaded, since pre-training may be collective)
pre-trains them layer by layer as the chosen strategy arranges (``meta.lv3.pretraining``) and
writes them into the graph. The visible units are binary: the data must lie in [0, 1]
(``normalize: False`` on the image datasets), which ``check`` makes sure of before any rank
starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from meta.common.component import Option
from meta.lv1.graph import Graph
from meta.lv1.models import MODELS
from meta.lv2.datasets import Dataset, DatasetError
from meta.lv2.dbn import DBN, pretrain_dbn, print_progress


@dataclass
class PretrainedDBN:
    graph: Graph
    hidden: tuple[int, ...]
    seed: int
    settings: dict[str, Any]

    def check(self, train: Dataset) -> None:
        """Refuse a training set whose inputs leave [0, 1] (the visible units are binary), naming
        its range."""
        inputs = getattr(train, "inputs", None)
        if inputs is None:
            return
        lo, hi = float(np.min(inputs)), float(np.max(inputs))
        if lo < 0 or hi > 1:
            raise DatasetError(f"model 'dbn' has binary visible units and needs inputs in "
                               f"[0, 1]; the dataset gives [{lo:.3g}, {hi:.3g}] (set "
                               f"normalize: False)")

    def prepare(self, run: Any) -> dict[str, float]:
        """Greedy pre-training (Algorithm 2) into the graph's first layers; a resumed run has
        its weights from the checkpoint already."""
        if run.resumed:
            return {}
        plan = run.pretraining_plan()
        if run.comm.is_root and plan.description:
            print(f"meta: pre-training {plan.description}", file=run.stream, flush=True)
        s = self.settings
        dbn = pretrain_dbn(
            run.trainer.train_data, self.hidden, seed=self.seed, epochs=s["pretrain_epochs"],
            lr=s["pretrain_lr"], k=s["cd_k"], batch_size=s["pretrain_batch_size"],
            persistent=s["persistent_cd"], replica=plan.shard, average=plan.average,
            connect=plan.connect,
            progress=print_progress(run.stream) if run.comm.is_root else None)
        dbn.assign(self.graph.parameters)
        return {"pretrain_time_s": dbn.time_s}


def dbn_model(input_shape: Sequence[int], classes: int, seed: int, dtype: Any,
              hidden: tuple[int, ...], **settings: Any) -> PretrainedDBN:
    """784-500-500-10 style: CD-k pre-trained RBMs, then fine-tuned by backpropagation."""
    dbn = DBN.untrained(input_shape, hidden, seed=seed)
    return PretrainedDBN(dbn.to_graph(classes=classes, seed=seed), tuple(hidden), seed, settings)


MODELS.add("dbn", dbn_model, {
    "hidden": Option((500, 500), "RBM widths", type=tuple[int, ...], low=1),
    "pretrain_epochs": Option(1, "contrastive-divergence epochs per RBM", low=0),
    "pretrain_lr": Option(0.1, "RBM learning rate", above=0.0),
    "cd_k": Option(1, "Gibbs steps per CD update", low=1),
    "pretrain_batch_size": Option(100, "examples per CD update (per rank)", low=1),
    "persistent_cd": Option(False, "persistent CD instead of CD-k"),
})
