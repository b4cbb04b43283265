from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, mlp
from meta.lv2 import mnist
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv2.second_order import (
    LBFGS,
    ConjugateGradient,
    fletcher_reeves,
    hestenes_stiefel,
    polak_ribiere_plus,
    strong_wolfe,
    two_loop,
)


def quadratic(n=10, condition=100.0, seed=0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = q @ np.diag(np.geomspace(1, condition, n)) @ q.T
    b = rng.standard_normal(n)
    params = {"x": np.zeros(n)}

    def closure():
        x = params["x"]
        return 0.5 * x @ a @ x - b @ x, {"x": a @ x - b}

    return params, closure, np.linalg.solve(a, b)


def rosenbrock():
    params = {"xy": np.array([-1.2, 1.0])}

    def closure():
        x, y = params["xy"]
        f = (1 - x) ** 2 + 100 * (y - x * x) ** 2
        return f, {"xy": np.array([-2 * (1 - x) - 400 * x * (y - x * x), 200 * (y - x * x)])}

    return params, closure


def test_beta_formulas_by_hand():
    g, g_prev, d_prev = np.array([1.0, 3.0]), np.array([3.0, 1.0]), np.array([-3.0, -1.0])
    # g.g = 10, g_prev.g_prev = 10; y = g - g_prev = (-2, 2); g.y = 4; y.d_prev = 6 - 2 = 4
    assert fletcher_reeves(g, g_prev, d_prev) == pytest.approx(1.0)
    assert hestenes_stiefel(g, g_prev, d_prev) == pytest.approx(1.0)
    assert polak_ribiere_plus(g, g_prev, d_prev) == pytest.approx(0.4)
    shrinking = np.array([1.0, 1.0]), np.array([2.0, 2.0])  # g.(g - g_prev) = -2 < 0
    assert polak_ribiere_plus(*shrinking, d_prev) == 0.0


def test_two_loop_equals_the_bfgs_inverse_hessian_update():
    rng = np.random.default_rng(1)
    a = np.diag([1.0, 3.0, 10.0])
    pairs = []
    for _ in range(3):
        s = rng.standard_normal(3)
        pairs.append((s, a @ s))
    s, y = pairs[-1]
    h = np.eye(3) * (s @ y) / (y @ y)
    for s, y in pairs:
        rho = 1 / (y @ s)
        v = np.eye(3) - rho * np.outer(y, s)
        h = v.T @ h @ v + rho * np.outer(s, s)
    g = rng.standard_normal(3)
    np.testing.assert_allclose(two_loop(g, pairs), -h @ g, rtol=1e-10)


def test_strong_wolfe_conditions_hold():
    params, closure = rosenbrock()
    x0 = params["xy"].copy()
    f0, g0 = closure()
    g0 = g0["xy"]
    d = -g0

    def at(alpha):
        params["xy"] = x0 + alpha * d
        f, g = closure()
        return f, g["xy"]

    alpha, f, g, evals = strong_wolfe(at, f0, g0, d, step=1.0)
    assert f <= f0 + 1e-4 * alpha * (g0 @ d)
    assert abs(g @ d) <= 0.9 * abs(g0 @ d)
    assert evals <= 25


def test_lbfgs_solves_rosenbrock():
    params, closure = rosenbrock()
    opt = LBFGS(params, history=5)
    for _ in range(100):
        opt.step(closure)
    np.testing.assert_allclose(params["xy"], [1.0, 1.0], atol=1e-5)


@pytest.mark.parametrize("method", ["FR", "HS", "PR+"])
def test_conjugate_gradients_solve_a_quadratic(method):
    params, closure, solution = quadratic()
    opt = ConjugateGradient(params, method=method)
    for _ in range(60):
        opt.step(closure)
    np.testing.assert_allclose(params["x"], solution, atol=1e-5)


def test_unknown_cg_method():
    with pytest.raises(ValueError, match="unknown method 'XY'"):
        ConjugateGradient({"x": np.zeros(1)}, method="XY")


def test_lbfgs_beats_sgd_on_full_batch_logistic_regression(mnist_dir):
    """Same number of gradient evaluations (60) on 2,000 MNIST images: L-BFGS gets lower."""
    x, y = mnist("train").batch(np.arange(2000))
    feeds = {"input": x, "labels": y}

    def final_loss(make_optimizer):
        graph = mlp(hidden=(), seed=0)  # Flatten + one Gemm: logistic regression
        ex = ReferenceExecutor(graph)

        def closure():
            values, grads = ex.inference_and_backprop(feeds)
            return float(values["loss"]), grads

        opt = make_optimizer(graph.parameters)
        if getattr(opt, "needs_closure", False):
            while opt.evaluations < 60:
                opt.step(closure)
            evaluations = opt.evaluations
        else:
            for _ in range(60):
                opt.step(closure()[1])
            evaluations = 60
        return closure()[0], evaluations

    lbfgs_loss, n = final_loss(lambda p: LBFGS(p, history=10))
    sgd_loss, _ = final_loss(lambda p: Optimizer(sgd(0.5, momentum=0.9), p))
    assert n <= 60 + 25  # the last step's line search may run past 60
    assert lbfgs_loss < sgd_loss, (lbfgs_loss, sgd_loss)
