from __future__ import annotations

import io

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, mlp
from meta.lv2 import ArrayDataset, EpochLog, Event, Optimizer, ShuffleSampler, Trainer, sgd


def blobs(n, seed):
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(99).standard_normal((4, 8)) * 2
    y = rng.integers(0, 4, n)
    return ArrayDataset((centers[y] + rng.standard_normal((n, 8))).astype(np.float32), y)


def make_trainer(events=(), lr=0.05, **kw):
    graph = mlp(input_shape=(8,), hidden=(16,), classes=4, seed=0)
    train, test = blobs(512, 0), blobs(256, 1)
    return Trainer(ReferenceExecutor(graph), Optimizer(sgd(lr, 0.9), graph.parameters), train,
                   ShuffleSampler(len(train), 32, seed=0), test, events, **kw)


class Recorder(Event):
    def __init__(self, name, log, priority=0):
        self.name, self.log, self.priority = name, log, priority

    def on_train_begin(self, trainer):
        self.log.append((self.name, "train_begin"))

    def on_epoch_end(self, trainer, metrics):
        self.log.append((self.name, "epoch_end", metrics["epoch"]))

    def on_train_end(self, trainer):
        self.log.append((self.name, "train_end"))

    def on_error(self, trainer, error):
        self.log.append((self.name, "error", type(error).__name__))


def test_trains_and_reports_metrics_per_epoch():
    out = io.StringIO()
    trainer = make_trainer([EpochLog(out)])
    history = trainer.fit(3)
    assert [m["epoch"] for m in history] == [1, 2, 3]
    assert history[-1]["test_accuracy"] > 0.9
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert trainer.step == 3 * 16
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("epoch") and len(lines) == 4


def test_events_run_by_priority():
    log = []
    make_trainer([Recorder("low", log, 0), Recorder("high", log, 10)]).fit(1)
    assert log == [("high", "train_begin"), ("low", "train_begin"), ("high", "epoch_end", 1),
                   ("low", "epoch_end", 1), ("high", "train_end"), ("low", "train_end")]


def test_events_added_during_a_sum_across_replicas_see_that_epochs_end():
    """As when rank 0 dies and the first surviving worker takes over writing the outputs:
    the writer's events join in the epoch-end sum that noticed the death."""
    log, sums = [], []

    def sum_across(values):
        sums.append(1)
        if len(sums) == 3:  # the training sum of epoch 2
            trainer.add_events([Recorder("late", log, 5)])
        return values

    trainer = make_trainer([Recorder("early", log, 0)], sum_across=sum_across)
    trainer.fit(3)
    assert [e for e in log if e[1] == "epoch_end"] == [
        ("early", "epoch_end", 1), ("late", "epoch_end", 2), ("early", "epoch_end", 2),
        ("late", "epoch_end", 3), ("early", "epoch_end", 3)]


def test_divergence_stops_with_the_step_named():
    log = []
    trainer = make_trainer([Recorder("r", log)], lr=1e6)
    with pytest.raises(FloatingPointError, match=r"loss became (nan|inf) at epoch \d+, step \d+"):
        with np.errstate(all="ignore"):
            trainer.fit(5)
    assert log[-1] == ("r", "error", "FloatingPointError")


def test_sharded_evaluation_sums_to_the_whole():
    trainer = make_trainer()
    whole = trainer.evaluate(trainer.test_data)
    shards = []
    for rank in range(3):
        trainer.eval_shard = (rank, 3)
        shards.append(trainer.evaluate(trainer.test_data))
    # each shard is a mean over its part; recombine with the part sizes
    sizes = [len(p) for p in np.array_split(np.arange(256), 3)]
    acc = sum(s["accuracy"] * n for s, n in zip(shards, sizes)) / 256
    assert acc == pytest.approx(whole["accuracy"])


@pytest.mark.parametrize("method", ["lbfgs", "cg"])
def test_line_search_optimizers_get_a_closure(method):
    """Both line-search methods fit a linear classifier (full batch) through the trainer."""
    from meta.lv2.second_order import LBFGS, ConjugateGradient

    graph = mlp(input_shape=(8,), hidden=(), classes=4, seed=0)
    data = blobs(256, 0)
    optimizer = (LBFGS if method == "lbfgs" else ConjugateGradient)(graph.parameters)
    trainer = Trainer(ReferenceExecutor(graph), optimizer, data,
                      ShuffleSampler(len(data), len(data), seed=0))  # full batch
    history = trainer.fit(10)
    assert optimizer.evaluations > 10  # line searches evaluated the batch more than once
    assert history[-1]["train_loss"] < 0.5 * history[0]["train_loss"]
    assert history[-1]["train_accuracy"] > 0.9


def test_the_trainer_asks_only_its_updater():
    """Every update, row step, state sync and sum goes through the updater the trainer uses;
    one it is handed later (``use``) brings its executor and gets its timeline."""
    from meta.lv2 import Updater

    calls = []

    class Rows(Updater):
        evaluates_rows = True

        def step_rows(self, indices):
            calls.append(("rows", len(indices)))
            return 0.5, len(indices)

        def sync_state(self, executor):
            calls.append(("sync",))

        def sum_across(self, values):
            calls.append(("sum",))
            return values

    trainer = make_trainer()
    before = trainer.executor

    class Timeline:
        pass

    timeline = Timeline()
    updater = Rows(trainer.optimizer, timeline=timeline)
    trainer.use(updater)
    assert trainer.updater is updater and trainer.optimizer is updater.optimizer
    assert trainer.executor is before and before.timeline is timeline
    history = trainer.fit(1)
    assert calls[:16] == [("rows", 32)] * 16 and history[0]["train_accuracy"] == 1.0
    assert calls[16:] == [("sum",), ("sync",), ("sum",)]  # the epoch's sums, then evaluation
    other = make_trainer().executor
    trainer.use(Updater(trainer.optimizer, executor=other))
    assert trainer.executor is other
    with pytest.raises(ValueError, match="sum_across belongs to the updater"):
        Trainer(other, Updater(trainer.optimizer), trainer.train_data, trainer.sampler,
                sum_across=lambda s: s)
    with pytest.raises(TypeError, match="steps on a batch's gradients"):
        Updater(trainer.optimizer).step_rows(np.arange(2))


# -- fit's error handling (issue 27, item 7) ---------------------------------------------------
class Failing(Event):
    """Raises in ``hook``; records its on_error and finalize calls."""

    def __init__(self, name, log, hook=None, priority=0):
        self.name, self.log, self.hook, self.priority = name, log, hook, priority

    def on_step_end(self, trainer, observation):
        if self.hook == "on_step_end" and observation["step"] == 2:
            raise ValueError(f"{self.name} broke")

    def on_error(self, trainer, error):
        self.log.append((self.name, "error", type(error).__name__))
        if self.hook == "on_error":
            raise RuntimeError(f"{self.name}'s on_error broke")

    def finalize(self, trainer):
        self.log.append((self.name, "finalize"))
        if self.hook == "finalize":
            raise OSError(f"{self.name} cannot close")


def test_each_on_error_runs_even_when_one_raises_and_the_first_error_is_kept():
    from meta.run.errors import user_error

    log = []
    events = [Failing("breaks", log, "on_step_end", 30), Failing("bad-handler", log,
                                                                 "on_error", 20),
              Failing("quiet", log, None, 10)]
    with pytest.raises(ValueError, match="breaks broke") as info:
        make_trainer(events).fit(1)
    assert log == [("breaks", "error", "ValueError"), ("bad-handler", "error", "ValueError"),
                   ("quiet", "error", "ValueError"), ("breaks", "finalize"),
                   ("bad-handler", "finalize"), ("quiet", "finalize")]
    assert info.value.__notes__ == ["also: event 'bad-handler' raised RuntimeError in on_error "
                                    "at epoch 1, step 2: bad-handler's on_error broke"]
    assert str(user_error(info.value)) == ("event 'breaks' (events) raised ValueError in "
                                           "on_step_end at epoch 1, step 2: breaks broke")


def test_finalize_runs_after_success_and_a_failing_one_is_reported_not_raised():
    log = []
    trainer = make_trainer([Failing("closer", log, "finalize", 5), Failing("other", log)])
    assert len(trainer.fit(1)) == 1
    assert log == [("closer", "finalize"), ("other", "finalize")]
    assert trainer.finalize_failures == ["event 'closer' raised OSError in finalize at epoch 2, "
                                         "step 16: closer cannot close"]


def test_event_priorities_have_names_in_the_order_they_run():
    from meta.lv2.checkpoint import CheckpointEvent
    from meta.lv2.events import (PRIORITY_EDITOR, PRIORITY_READER, PRIORITY_SAVER,
                                 PRIORITY_WRITER, EarlyStopping, EpochLog)

    assert PRIORITY_EDITOR > PRIORITY_WRITER > PRIORITY_READER > PRIORITY_SAVER
    assert EpochLog.priority == PRIORITY_WRITER and EarlyStopping.priority == PRIORITY_READER
    assert CheckpointEvent.priority == PRIORITY_SAVER
