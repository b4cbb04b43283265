from __future__ import annotations

import numpy as np
import pytest

from meta.lv2 import Optimizer, chain, scale, sgd, trace


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


@pytest.mark.parametrize("transform", [sgd(0.5), sgd(0.2, 0.9), sgd(0.2, 0.9, nesterov=True)],
                         ids=["sgd", "momentum", "nesterov"])
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
