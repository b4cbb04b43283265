"""PyTorch's optimizers as Level 2 optimizers: the same steps as meta's rules, schedules,
clipping, strategies' flat buffers, checkpoints and recipe options. Skipped without PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'meta[torch]')")

from meta.common.component import ComponentError  # noqa: E402
from meta.lv1 import ReferenceExecutor, mlp  # noqa: E402
from meta.lv2 import OPTIMIZERS, TorchOptimizer, build_optimizer  # noqa: E402
from meta.lv2.checkpoint import flatten_tree, unflatten_tree  # noqa: E402
from meta.lv3.data_parallel.allreduce import Allreduce  # noqa: E402


def _params(seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 5)).astype(dtype),
            "b": rng.standard_normal(5).astype(dtype)}


def _grads(rng, params):
    return {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in params.items()}


CASES = [
    ("sgd", "torch_sgd", {"lr": 0.1, "momentum": 0.0}, 1e-7),
    ("sgd", "torch_sgd", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-2}, 1e-6),
    ("sgd", "torch_sgd", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, 1e-6),
    ("adam", "torch_adam", {"lr": 0.01}, 1e-5),
    ("adam", "torch_adam", {"lr": 0.01, "weight_decay": 1e-2}, 1e-5),
    ("adamw", "torch_adamw", {"lr": 0.01, "weight_decay": 0.1}, 1e-5),
    # meta adds eps inside the square root, PyTorch outside: equal as eps -> 0 (with the
    # default 1e-8 they part by up to 1e-3 on a gradient ~1e-4)
    ("rmsprop", "torch_rmsprop", {"lr": 0.01, "decay": 0.99, "alpha": 0.99, "eps": 1e-14},
     1e-5),
    ("adagrad", "torch_adagrad", {"lr": 0.1, "eps": 1e-10}, 1e-5),
    ("sgd", "torch_sgd", {"lr": 0.1, "momentum": 0.9, "lr_schedule": "step",
                          "lr_decay_epochs": [1], "warmup_epochs": 1}, 1e-6),
    ("sgd", "torch_sgd", {"lr": 0.1, "momentum": 0.9, "grad_clip": 1.0}, 1e-6),
]


@pytest.mark.parametrize("ours, theirs, options, tol", CASES,
                         ids=[f"{c[1]}-{'-'.join(c[2])}" for c in CASES])
def test_torch_optimizers_take_meta_steps(ours, theirs, options, tol):
    """8 steps from the same parameters and gradients (schedules and clipping included)."""
    meta_options = {k: v for k, v in options.items() if k in OPTIMIZERS[ours].options}
    torch_options = {k: v for k, v in options.items() if k in OPTIMIZERS[theirs].options}
    a, b = _pair(ours, theirs, meta_options, torch_options)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=tol, atol=tol, err_msg=name)
    assert not np.allclose(a["w"], _params()["w"])  # they moved


def _pair(ours, theirs, meta_options, torch_options, steps_per_epoch=4, epochs=2):
    """meta's ``ours`` and PyTorch's ``theirs`` built from recipe options over equal
    parameters, stepped with the same gradients; returns both parameter dicts."""
    a, b = _params(), _params()
    opt_a = build_optimizer(OPTIMIZERS[ours], meta_options, a, steps_per_epoch, epochs)
    opt_b = build_optimizer(OPTIMIZERS[theirs], torch_options, b, steps_per_epoch, epochs)
    rng = np.random.default_rng(1)
    for _ in range(steps_per_epoch * epochs):
        grads = _grads(rng, a)
        opt_a.step(grads)
        opt_b.step(grads)
    return a, b


def test_training_a_network_with_meta_executor_and_torch_sgd():
    """The parameters are the graph's arrays: torch.optim steps them in place."""
    graphs = mlp(hidden=[16], seed=0), mlp(hidden=[16], seed=0)
    rng = np.random.default_rng(0)
    batch = {"input": rng.standard_normal((8, 1, 28, 28)).astype(np.float32),
             "labels": rng.integers(0, 10, 8)}
    losses = []
    for graph, name in zip(graphs, ("sgd", "torch_sgd")):
        executor = ReferenceExecutor(graph).train()
        opt = build_optimizer(OPTIMIZERS[name], {"lr": 0.1, "momentum": 0.9},
                              graph.parameters, 10, 1)
        run = []
        for _ in range(3):
            values, grads = executor.inference_and_backprop(batch)
            opt.step(grads)
            run.append(float(values["loss"]))
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
    assert losses[1][2] < losses[1][0]
    for key in graphs[0].parameters:
        np.testing.assert_allclose(graphs[1].parameters[key], graphs[0].parameters[key],
                                   rtol=1e-6, atol=1e-7)


def test_a_strategy_moves_the_parameters_into_its_flat_buffer_and_torch_follows():
    params = _params()
    opt = build_optimizer(OPTIMIZERS["torch_sgd"], {"lr": 0.5}, params, 1, 1)
    strategy = Allreduce(opt)  # re-points params to views of its flat buffer (size-1 comm)
    assert params["w"].base is strategy.flat_params.buffer
    before = params["w"].copy()
    strategy.step({k: np.ones_like(v) for k, v in params.items()})
    np.testing.assert_allclose(params["w"], before - 0.5)
    np.testing.assert_allclose(strategy.flat_params.views["w"], before - 0.5)


def test_state_dict_survives_a_checkpoint_and_resumes_exactly():
    def fresh():
        params = _params()
        return params, build_optimizer(OPTIMIZERS["torch_adam"], {"lr": 0.01}, params, 1, 1)

    rng = np.random.default_rng(2)
    grads = [_grads(rng, _params()) for _ in range(6)]
    straight, opt = fresh()
    for g in grads:
        opt.step(g)
    resumed, first = fresh()
    for g in grads[:3]:
        first.step(g)
    arrays: dict[str, np.ndarray] = {}
    stored = unflatten_tree(flatten_tree(first.state_dict(), arrays), arrays)  # as a .npz does
    copy, second = fresh()
    for key in copy:
        copy[key][...] = resumed[key]
    second.load_state_dict(stored)
    for g in grads[3:]:
        second.step(g)
    for key in straight:
        np.testing.assert_array_equal(copy[key], straight[key])


def test_recipe_options_are_declared_and_checked_without_torch_imported():
    component = OPTIMIZERS["torch_adamw"]
    assert component.meta["framework"] == "pytorch"
    assert component.options["weight_decay"].default == 0.01
    assert component.options["betas"].default == (0.9, 0.999)
    assert "unknown option 'momentum'" in component.check({"momentum": 0.9})[0]
    assert "must be below 1" in OPTIMIZERS["torch_sgd"].check({"momentum": 1.5})[0]


def test_downpour_servers_are_told_they_need_a_meta_rule():
    opt = TorchOptimizer("SGD", _params(), lr=0.1, label="torch_sgd")
    with pytest.raises(ComponentError, match="torch_sgd.*Downpour"):
        opt.transform  # noqa: B018


@pytest.mark.parametrize("name", ["torch_sgd", "torch_adam", "torch_adamw", "torch_rmsprop",
                                  "torch_adagrad"])
def test_every_torch_optimizer_fits_a_linear_classifier(name):
    """Logistic regression on two separable blobs: > 95 % training accuracy in 60 steps."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, (100, 2)), rng.normal(2, 1, (100, 2))]).astype(
        np.float32)
    y = np.repeat([0.0, 1.0], 100).astype(np.float32)
    params = {"w": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)}
    lr = {"torch_sgd": 0.5, "torch_adagrad": 0.5}.get(name, 0.05)
    opt = build_optimizer(OPTIMIZERS[name], {"lr": lr}, params, 60, 1)
    for _ in range(60):
        p = 1 / (1 + np.exp(-(x @ params["w"] + params["b"])))
        opt.step({"w": x.T @ (p - y) / len(y), "b": np.array([np.mean(p - y)], np.float32)})
    accuracy = np.mean((x @ params["w"] + params["b"] > 0) == (y > 0.5))
    assert accuracy > 0.95, f"{name}: {accuracy:.1%}"
