from __future__ import annotations

import math

import numpy as np
import pytest

from meta.lv2.optimizers import (
    Optimizer,
    adadelta,
    adagrad,
    adam,
    adamw,
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


def run(transform, grads_seq, p0=1.0):
    opt = Optimizer(transform, {"w": np.array([p0])})
    for g in grads_seq:
        opt.step({"w": np.array([g])})
    return float(opt.params["w"][0])


def test_plain_sgd_by_hand():
    # p <- p - lr * g: 1 - 0.1*2 - 0.1*(-1) = 0.9
    assert run(sgd(0.1), [2.0, -1.0]) == pytest.approx(0.9)


def test_momentum_by_hand():
    # v1 = 2, p1 = 1 - 0.2 = 0.8; v2 = 0.9*2 + 1 = 2.8, p2 = 0.8 - 0.28 = 0.52
    assert run(sgd(0.1, momentum=0.9), [2.0, 1.0]) == pytest.approx(0.52)


def test_nesterov_by_hand():
    # v1 = 2, u1 = 2 + 0.9*2 = 3.8, p1 = 0.62; v2 = 2.8, u2 = 1 + 2.52 = 3.52, p2 = 0.268
    assert run(sgd(0.1, momentum=0.9, nesterov=True), [2.0, 1.0]) == pytest.approx(0.268)


def test_chain_composes_in_order():
    assert run(chain(trace(0.5), scale(-1.0)), [1.0, 1.0]) == pytest.approx(1 - 1 - 1.5)


def test_missing_gradient_is_named():
    opt = Optimizer(sgd(0.1), {"a": np.zeros(1), "b": np.zeros(1)})
    with pytest.raises(KeyError, match="'b'"):
        opt.step({"a": np.ones(1)})


def test_invalid_learning_rate():
    with pytest.raises(ValueError, match="learning rate"):
        sgd(0.0)


def test_adagrad_by_hand():
    # s = 4, p = 1 - 0.1 * 2/2; s = 5, p -= 0.1 * 1/sqrt(5)
    assert run(adagrad(0.1, eps=0.0), [2.0, 1.0]) == pytest.approx(0.9 - 0.1 / math.sqrt(5))


def test_rmsprop_by_hand():
    # s = 0.1*4 = 0.4, p = 1 - 0.1*2/sqrt(0.4); s = 0.9*0.4 + 0.1*1 = 0.46, p -= 0.1/sqrt(0.46)
    expected = 1 - 0.1 * 2 / math.sqrt(0.4) - 0.1 / math.sqrt(0.46)
    assert run(rmsprop(0.1, decay=0.9, eps=0.0), [2.0, 1.0]) == pytest.approx(expected)


def test_adadelta_by_hand():
    eps = 1e-6
    lam1 = 0.1 * 4                                   # lambda after g = 2
    d1 = 2 * math.sqrt((0 + eps) / (lam1 + eps))     # first update
    delta1 = 0.1 * d1 * d1
    lam2 = 0.9 * lam1 + 0.1 * 1                      # after g = 1
    d2 = 1 * math.sqrt((delta1 + eps) / (lam2 + eps))
    assert run(adadelta(1.0, rho=0.9, eps=eps), [2.0, 1.0]) == pytest.approx(1 - d1 - d2)


def test_adam_by_hand():
    # PyTorch's form: t=1: m = 0.2, v = 0.004; t=2: m = 0.28, v = 0.004996
    u1 = 0.2 / (1 - 0.9) / (math.sqrt(0.004 / (1 - 0.999)) + 1e-8)
    u2 = 0.28 / (1 - 0.9**2) / (math.sqrt(0.004996 / (1 - 0.999**2)) + 1e-8)
    assert run(adam(0.1), [2.0, 1.0]) == pytest.approx(1 - 0.1 * u1 - 0.1 * u2, abs=1e-12)


def test_adam_kingma_form_by_hand():
    # Kingma & Ba's (seed 003's) form: step = sqrt(1-0.999^t)/(1-0.9^t), eps beside sqrt(v)
    eps = 1e-3  # large, so the two forms part visibly
    u1 = math.sqrt(1 - 0.999) / (1 - 0.9) * 0.2 / (math.sqrt(0.004) + eps)
    u2 = math.sqrt(1 - 0.999**2) / (1 - 0.9**2) * 0.28 / (math.sqrt(0.004996) + eps)
    kingma = run(adam(0.1, eps=eps, eps_form="kingma"), [2.0, 1.0])
    assert kingma == pytest.approx(1 - 0.1 * u1 - 0.1 * u2, abs=1e-12)
    assert abs(kingma - run(adam(0.1, eps=eps), [2.0, 1.0])) > 1e-4


def test_adam_amsgrad_by_hand():
    # v: 0.004 then 0.999*0.004 = 0.003996; the maximum keeps 0.004, bias-corrected at t=2
    u1 = 0.2 / (1 - 0.9) / (math.sqrt(0.004 / (1 - 0.999)) + 1e-8)
    u2 = 0.18 / (1 - 0.9**2) / (math.sqrt(0.004 / (1 - 0.999**2)) + 1e-8)
    got = run(adam(0.1, amsgrad=True), [2.0, 0.0])
    assert got == pytest.approx(1 - 0.1 * u1 - 0.1 * u2, abs=1e-12)
    assert abs(got - run(adam(0.1), [2.0, 0.0])) > 1e-5


def test_adamw_decay_is_decoupled():
    # one step from p = 1 with g = 2: Adam's update is ~1, decay adds 0.5 * p, times lr 0.1
    assert run(adamw(0.1, weight_decay=0.5), [2.0]) == pytest.approx(1 - 0.1 * (1 + 0.5))


def test_sgd_weight_decay_adds_l2_to_the_gradient():
    assert run(sgd(0.1, weight_decay=0.5), [2.0]) == pytest.approx(1 - 0.1 * (2 + 0.5))


def test_clip_by_global_norm():
    t = clip_by_global_norm(5.0)
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([0.0, 4.0, 12.0])}  # norm 13
    clipped, _ = t.update(grads, t.init(grads), grads)
    norm = math.sqrt(sum(float((g * g).sum()) for g in clipped.values()))
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(clipped["a"], [15 / 13, 0])
    small = {"a": np.array([1.0])}
    assert t.update(small, (), small)[0]["a"] is small["a"]


def test_schedules():
    table = step_table(1.0, epochs=[2, 4], factor=0.1, steps_per_epoch=10)
    assert [table(s) for s in (0, 19, 20, 39, 40)] == pytest.approx([1, 1, 0.1, 0.1, 0.01])
    cos = cosine_decay(1.0, total_steps=10)
    assert cos(0) == pytest.approx(1) and cos(5) == pytest.approx(0.5) and cos(20) == 0
    ramp = warmup(2.0, warmup_steps=4)
    assert [ramp(s) for s in range(5)] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0])
    # a schedule drives the learning rate step by step
    assert run(sgd(lambda step: 0.1 * (step + 1)), [1.0, 1.0]) == pytest.approx(1 - 0.1 - 0.2)


@pytest.mark.parametrize("transform", [
    sgd(0.5), sgd(0.2, 0.9), sgd(0.2, 0.9, nesterov=True), adagrad(0.5), rmsprop(0.02),
    adadelta(1.0), adam(0.05), adamw(0.05, weight_decay=0.01)],
    ids=["sgd", "momentum", "nesterov", "adagrad", "rmsprop", "adadelta", "adam", "adamw"])
def test_fits_a_linear_classifier(transform):
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 5)) * 3
    y = rng.integers(0, 3, 600)
    x = centers[y] + rng.standard_normal((600, 5))
    params = {"w": np.zeros((5, 3)), "b": np.zeros(3)}
    opt = Optimizer(transform, params)
    for _ in range(100):
        logits = x @ params["w"] + params["b"]
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        opt.step({"w": x.T @ p / len(y), "b": p.mean(0)})
    accuracy = ((x @ params["w"] + params["b"]).argmax(1) == y).mean()
    assert accuracy > 0.9


def test_registering_names():
    from meta.lv2.optimizers import OPTIMIZERS, register_optimizer

    def mine(lr):
        return sgd(lr)

    register_optimizer("mine_for_test")(mine)
    try:
        register_optimizer("mine_for_test")(mine)  # the same definition again: fine
        with pytest.raises(ValueError, match="'sgd' is already registered"):
            register_optimizer("sgd")(mine)
    finally:
        del OPTIMIZERS["mine_for_test"]


def test_fused_momentum_step_matches_the_chain():
    """sgd with momentum and a constant rate steps in place through meta's native kernel; the
    result is the transformation chain's (float64: the same rounding up to the last bits)."""
    from meta.lv2.optimizers import sgd as make_sgd

    rng = np.random.default_rng(0)
    for nesterov in (False, True):
        fused = make_sgd(0.1, momentum=0.9, nesterov=nesterov)
        assert fused.in_place is not None
        plain = fused._replace(in_place=None)
        params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
        a = {k: v.copy() for k, v in params.items()}
        b = {k: v.copy() for k, v in params.items()}
        opt_a, opt_b = Optimizer(fused, a), Optimizer(plain, b)
        for _ in range(3):
            grads = {k: rng.standard_normal(v.shape) for k, v in a.items()}
            opt_a.step(grads)
            opt_b.step(grads)
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-12)
    assert make_sgd(0.1, momentum=0.9, weight_decay=1e-4).in_place is None


@pytest.mark.parametrize("name,lr", [("adam", 1e-3), ("adamw", 1e-3), ("rmsprop", 1e-2),
                                     ("adagrad", 1e-2), ("adadelta", 1.0), ("sgd", 0.05),
                                     ("torch_adam", 1e-3), ("torch_sgd", 1e-3),
                                     ("torch_rmsprop", 1e-2), ("torch_adagrad", 1e-2)])
def test_default_learning_rates_are_the_literatures(name, lr):
    """A recipe naming an optimizer and no lr gets its paper's and PyTorch's rate (one shared
    0.05 made Adam diverge); SGD keeps meta's 0.05, which goes with its momentum 0.9."""
    from meta.run.recipe import AtLeast, make_recipe

    recipe = make_recipe("t", {"optimizer": name}, {}, {"test_accuracy": AtLeast(0.5)})
    assert recipe.definitions.choices["optimizer"].values()["lr"] == lr


def test_adam_by_default_steps_each_weight_by_1e_3():
    """Built from a recipe as the runner builds it: Adam's first step moves every weight by
    its learning rate (the bias-corrected m / sqrt(v) is the gradient's sign)."""
    from meta.lv2 import build_optimizer
    from meta.run.recipe import AtLeast, make_recipe

    recipe = make_recipe("t", {"optimizer": "adam"}, {}, {"test_accuracy": AtLeast(0.5)})
    choice = recipe.definitions.choices["optimizer"]
    params = {"w": np.array([1.0, -2.0, 3.0])}
    opt = build_optimizer(choice.component, choice.options, params, 10, 1)
    opt.step({"w": np.array([0.5, -4.0, 1e-3])})
    np.testing.assert_allclose(params["w"], [1.0 - 1e-3, -2.0 + 1e-3, 3.0 - 1e-3], rtol=1e-6)


def test_a_registered_optimizer_keeps_its_own_default_lr():
    from meta.lv2.optimizers import OPTIMIZERS, register_optimizer

    register_optimizer("own_lr_for_test")(lambda lr=3e-4: sgd(lr))
    try:
        assert OPTIMIZERS["own_lr_for_test"].options["lr"].default == 3e-4
        assert OPTIMIZERS["own_lr_for_test"].options["lr"].doc == \
            "learning rate (default: own_lr_for_test's own)"
    finally:
        del OPTIMIZERS["own_lr_for_test"]
