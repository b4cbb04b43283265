from __future__ import annotations

import re

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, mlp
from meta.lv2 import ArrayDataset, Event, Optimizer, ShuffleSampler, Trainer, adam, sgd
from meta.lv2.checkpoint import (
    CheckpointError,
    CheckpointEvent,
    capture,
    flatten_tree,
    load_checkpoint,
    restore,
    save_checkpoint,
    unflatten_tree,
)
from meta.lv2.second_order import LBFGS


def data(n=200, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (np.random.default_rng(9).standard_normal((3, 6))[y] + rng.standard_normal((n, 6)))
    return ArrayDataset(x.astype(np.float32), y)


def make_trainer(events=(), optimizer=None):
    graph = mlp(input_shape=(6,), hidden=(8,), classes=3, seed=0)
    opt = (optimizer or (lambda p: Optimizer(adam(0.01), p)))(graph.parameters)
    train = data()
    return Trainer(ReferenceExecutor(graph), opt, train, ShuffleSampler(len(train), 16, seed=3),
                   data(60, 1), events)


class Crash(Event):
    def __init__(self, at_step):
        self.at_step = at_step

    def on_step_end(self, trainer, observation):
        if observation["step"] == self.at_step:
            raise KeyboardInterrupt("simulated crash")


def test_tree_round_trip():
    tree = ({"m": {"w": np.arange(3.0)}, "t": 4}, [np.ones((2, 2), np.float32), None, "x"], ())
    arrays = {}
    back = unflatten_tree(flatten_tree(tree, arrays), arrays)
    assert back[0]["t"] == 4 and back[1][1] is None and back[1][2] == "x" and back[2] == ()
    np.testing.assert_array_equal(back[0]["m"]["w"], np.arange(3.0))
    assert back[1][0].dtype == np.float32


@pytest.mark.parametrize("make_optimizer", [None, lambda p: LBFGS(p)], ids=["adam", "lbfgs"])
def test_resume_mid_epoch_is_bit_identical(tmp_path, make_optimizer):
    reference = make_trainer(optimizer=make_optimizer)
    reference.fit(3)

    path = tmp_path / "ckpt.npz"
    crashed = make_trainer([CheckpointEvent(path, every_steps=5), Crash(at_step=23)],
                           optimizer=make_optimizer)
    with pytest.raises(KeyboardInterrupt):
        crashed.fit(3)
    ckpt = load_checkpoint(path)
    assert ckpt.position["step"] == 20 and ckpt.position["batch_in_epoch"] == 20 - 13

    resumed = make_trainer(optimizer=make_optimizer)
    restore(resumed, ckpt)
    resumed.fit(3)
    for name, value in reference.executor.graph.parameters.items():
        np.testing.assert_array_equal(resumed.executor.graph.parameters[name], value, name)
    losses = [m["train_loss"] for m in reference.history]
    assert [m["train_loss"] for m in resumed.history] == losses


class StopWhileEvaluating(Event):
    """What StopOnSignal does after a SIGTERM during the end-of-epoch evaluation: a checkpoint
    between evaluation batches, then stop."""

    def __init__(self, path, epoch):
        self.path, self.epoch, self.batches = path, epoch, 0

    def on_eval_batch(self, trainer):
        self.batches += 1
        if len(trainer.history) + 1 == self.epoch:
            save_checkpoint(self.path, capture(trainer))
            raise KeyboardInterrupt("SIGTERM while evaluating")


def test_a_checkpoint_taken_while_evaluating_resumes_bit_identical(tmp_path):
    """Issue 44: the evaluation checks the stop flag between its batches (a SIGTERM during it
    took 7.5-19.6 s); the checkpoint it takes resumes after the epoch's last step, with that
    epoch's evaluation, not the whole epoch again."""
    reference, stop = make_trainer(), StopWhileEvaluating(tmp_path / "ckpt.npz", epoch=2)
    stopped, resumed = make_trainer([stop]), make_trainer()
    for trainer in (reference, stopped, resumed):
        trainer.eval_batch_size = 16  # 4 evaluation batches an epoch
    reference.fit(3)
    with pytest.raises(KeyboardInterrupt):
        stopped.fit(3)
    assert stop.batches == 4 + 1  # epoch 1's evaluation, then the first batch of epoch 2's
    ckpt = load_checkpoint(stop.path)
    assert ckpt.position["step"] == 26 and ckpt.position["batch_in_epoch"] == 13
    assert len(ckpt.position["history"]) == 1
    restore(resumed, ckpt)
    resumed.fit(3)
    for name, value in reference.executor.graph.parameters.items():
        np.testing.assert_array_equal(resumed.executor.graph.parameters[name], value, name)
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        assert [m[key] for m in resumed.history] == [m[key] for m in reference.history], key
    assert resumed.step == reference.step == 39


def test_writes_are_atomic_and_errors_are_clear(tmp_path):
    trainer = make_trainer()
    path = save_checkpoint(tmp_path / "c.npz", capture(trainer))
    assert path.exists() and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="bad.npz: not a readable meta checkpoint"):
        load_checkpoint(tmp_path / "bad.npz")
    other = Trainer(ReferenceExecutor(mlp(input_shape=(6,), hidden=(4,), classes=3)),
                    Optimizer(adam(0.01), {}), data(), ShuffleSampler(200, 16))
    with pytest.raises(CheckpointError, match="'fc0.weight' has shape \\(8, 6\\)"):
        restore(other, load_checkpoint(path))


def test_divergence_keeps_the_last_good_checkpoint(tmp_path):
    path = tmp_path / "ckpt.npz"
    trainer = make_trainer([CheckpointEvent(path, every_steps=1)],
                           optimizer=lambda p: Optimizer(sgd(1e6, momentum=0.9), p))
    with pytest.raises(FloatingPointError, match=r"at epoch 1, step (\d+)") as info:
        with np.errstate(all="ignore"):
            trainer.fit(3)
    bad_step = int(re.search(r"step (\d+)", str(info.value)).group(1))
    ckpt = load_checkpoint(path)
    assert ckpt.position["step"] == bad_step - 1  # written before the step that diverged
    assert all(np.isfinite(v).all() for v in ckpt.params.values())


@pytest.mark.parametrize("executor", ["reference", "planned"])
def test_resume_mid_epoch_with_batchnorm_state_is_bit_identical(tmp_path, executor):
    """A network with running statistics (a small ResNet-20, SGD with momentum, on the
    reference and the planned executor): resumed mid-epoch from a checkpoint, it ends with
    the parameters, the statistics and the losses of an uninterrupted run, bit for bit."""
    from meta.lv1 import EXECUTORS, resnet20

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 96)
    x = (rng.standard_normal((3, 3, 8, 8))[y] + rng.standard_normal((96, 3, 8, 8)))
    train = ArrayDataset(x.astype(np.float32), y)

    def trainer(events=()):
        graph = resnet20((3, 8, 8), classes=3, width=4, seed=1)
        return Trainer(EXECUTORS[executor](graph), Optimizer(sgd(0.05, momentum=0.9),
                                                             graph.parameters),
                       train, ShuffleSampler(len(train), 16, seed=3), None, events)

    reference = trainer()
    reference.fit(2)
    path = tmp_path / "ckpt.npz"
    crashed = trainer([CheckpointEvent(path, every_steps=4), Crash(at_step=9)])
    with pytest.raises(KeyboardInterrupt):
        crashed.fit(2)
    resumed = trainer()
    restore(resumed, load_checkpoint(path))
    resumed.fit(2)
    graph, other = reference.executor.graph, resumed.executor.graph
    assert graph.state, "the network has running statistics"
    for name in [*graph.parameters, *graph.state]:
        np.testing.assert_array_equal(other.initializers[name], graph.initializers[name], name)
    assert [m["train_loss"] for m in resumed.history] == \
        [m["train_loss"] for m in reference.history]
