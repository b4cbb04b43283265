"""Training under the state model: optimizers see exactly the trainable parameters, state is
checkpointed, a strategy-wrapped optimizer trains the graph through the public API."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, resnet20
from meta.lv2 import (
    ArrayDataset,
    Optimizer,
    ShuffleSampler,
    Trainer,
    add_decayed_weights,
    chain,
    masked,
    partition,
    scale,
    sgd,
)
from meta.lv2.checkpoint import capture, load_checkpoint, restore, save_checkpoint
from meta.lv3 import Allreduce


def images(n=48, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    centres = np.random.default_rng(7).standard_normal((10, 3, 8, 8))
    return ArrayDataset((centres[y] + rng.standard_normal((n, 3, 8, 8))).astype(np.float32), y)


def small_resnet(seed=0):
    return resnet20(input_shape=(3, 8, 8), width=2, seed=seed)


def trainer_for(graph, optimizer, steps_data=48):
    train = images(steps_data)
    return Trainer(ReferenceExecutor(graph), optimizer, train,
                   ShuffleSampler(len(train), 16, seed=1), images(32, 1))


def test_running_statistics_move_in_training_and_stay_out_of_the_optimizer():
    graph = small_resnet()
    optimizer = Optimizer(sgd(0.05, 0.9, weight_decay=1e-3), graph.parameters)
    assert not set(graph.state) & set(optimizer.params)
    velocity = optimizer.state[1]  # chain(decay, trace, lr): the velocity per parameter
    assert set(velocity) == set(graph.parameters)  # no momentum buffer for a statistic
    trainer_for(graph, optimizer).fit(1)
    assert np.abs(graph.state["bn0.running_mean"]).max() > 1e-3
    assert not np.allclose(graph.state["bn0.running_var"], 1.0)


def test_an_optimizer_over_some_parameters_trains_only_those():
    """Fine-tuning the classifier alone under the Trainer: the rest is bit-identical."""
    graph = small_resnet()
    before = {k: v.copy() for k, v in graph.parameters.items()}
    last = {k: graph.parameters[k] for k in ("logits.weight", "logits.bias")}
    trainer_for(graph, Optimizer(sgd(0.1), last)).fit(1)
    for name, value in graph.parameters.items():
        changed = not np.array_equal(value, before[name])
        assert changed == (name in last), name


def test_frozen_parameters_get_no_gradient_and_do_not_move():
    graph = small_resnet()
    graph.train_only("logits.*")
    frozen = {k: v.copy() for k, v in graph.frozen.items()}
    stats = graph.state["bn0.running_mean"].copy()
    trainer_for(graph, Optimizer(sgd(0.1, 0.9), graph.parameters)).fit(1)
    assert all(np.array_equal(graph.initializers[k], v) for k, v in frozen.items())
    assert not np.array_equal(graph.state["bn0.running_mean"], stats)  # BN still in train mode


def test_a_strategy_wrapped_optimizer_trains_the_graph_itself():
    graph = small_resnet()
    initial = graph.initializers["logits.weight"].copy()
    strategy = Allreduce(Optimizer(sgd(0.1, 0.9), graph.parameters))
    # The strategy's flat buffer now holds the graph's parameters: nobody re-points anything.
    assert np.shares_memory(graph.initializers["logits.weight"], strategy.flat_params.buffer)
    trainer = trainer_for(graph, strategy)
    trainer.fit(1)
    assert not np.array_equal(graph.initializers["logits.weight"], initial)
    values = trainer.executor.inference({"input": images(4).inputs}, ["logits"])
    assert np.isfinite(values["logits"]).all()


def test_checkpoints_hold_the_state_and_restore_it(tmp_path):
    graph = small_resnet()
    trainer = trainer_for(graph, Optimizer(sgd(0.05, 0.9), graph.parameters))
    trainer.fit(1)
    path = save_checkpoint(tmp_path / "c.npz", capture(trainer))
    saved = load_checkpoint(path)
    assert set(saved.state) == set(graph.state) and not set(saved.state) & set(saved.params)
    other = small_resnet()
    fresh = trainer_for(other, Optimizer(sgd(0.05, 0.9), other.parameters))
    restore(fresh, saved)
    for name, value in graph.state.items():
        np.testing.assert_array_equal(other.state[name], value)


def test_masked_transform_applies_to_the_names_it_accepts():
    params = {"fc.weight": np.ones(2), "fc.bias": np.ones(2)}
    opt = Optimizer(chain(masked(add_decayed_weights(0.5), lambda k: k.endswith(".weight")),
                          scale(-1.0)), params)
    opt.step({"fc.weight": np.zeros(2), "fc.bias": np.zeros(2)})
    assert params["fc.weight"].tolist() == [0.5, 0.5] and params["fc.bias"].tolist() == [1, 1]


def test_partition_gives_each_group_its_own_rule():
    params = {"body.w": np.ones(1), "head.w": np.ones(1)}
    rule = partition({"body": sgd(0.1), "head": sgd(1.0)}, lambda k: k.split(".")[0])
    Optimizer(rule, params).step({"body.w": np.ones(1), "head.w": np.ones(1)})
    assert params["body.w"].tolist() == [0.9] and params["head.w"].tolist() == [0.0]
    with pytest.raises(KeyError, match="label 'tail'"):
        Optimizer(rule, {"tail.w": np.ones(1)})
