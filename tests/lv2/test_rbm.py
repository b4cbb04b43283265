"""RBM: one CD-1 step against numbers worked out by hand, PCD's persistent chain, learning on
binary and real-valued data, the monitors against brute-force enumeration, reproducibility."""

from __future__ import annotations

import doctest
import itertools
import math

import numpy as np
import pytest

import meta.lv2.rbm
from meta.lv2.rbm import RBM, sigmoid

L = math.log(3.0)  # sigmoid(L) = 3/4, sigmoid(-L) = 1/4, sigmoid(0) = 1/2: exact by hand


class ScriptedDraws:
    """Stands in for a numpy Generator: ``random`` returns the given uniforms in order, so a
    CD step's samples are known in advance."""

    def __init__(self, *uniforms):
        self.uniforms = [np.array(u, dtype=np.float64) for u in uniforms]

    def random(self, shape, dtype=np.float64):
        u = self.uniforms.pop(0)
        assert u.shape == tuple(shape), (u.shape, shape)
        return u.astype(dtype)


def tiny_rbm(lr=0.1, **kw):
    """3 visible, 2 hidden units; W, b (visible) and c (hidden) multiples of ln 3."""
    rbm = RBM(3, 2, lr=lr, dtype=np.float64, **kw)
    rbm.W[...] = L * np.array([[1, -1, 0],
                               [0, 1, 1]])
    rbm.b[...] = L * np.array([0, 1, -1])
    rbm.c[...] = L * np.array([0, -1])
    return rbm


V0 = np.array([[1, 0, 1],
               [0, 1, 1]], dtype=np.float64)
U_H0 = [[0.5, 0.6], [0.1, 0.9]]
U_V1 = [[0.7, 0.4, 0.3], [0.8, 0.3, 0.2]]
U_H1 = [[0.4, 0.6], [0.3, 0.7]]


def test_one_cd1_step_matches_the_hand_computation():
    rbm = tiny_rbm(lr=0.1)
    w_before = rbm.W.copy()
    rbm.rng = ScriptedDraws(U_H0, U_V1, U_H1)
    s = rbm.cd_update(V0)

    # Go up. c + W v0:  example 1 (1,0,1): [0 + L(1 - 0 + 0), -L + L(0 + 0 + 1)] = [L, 0]
    #                   example 2 (0,1,1): [0 + L(0 - 1 + 0), -L + L(0 + 1 + 1)] = [-L, L]
    np.testing.assert_allclose(s.h0_prob, [[0.75, 0.5], [0.25, 0.75]])
    # h0 = [u < p]: 0.5 < .75, 0.6 < .5 no; 0.1 < .25, 0.9 < .75 no
    np.testing.assert_array_equal(s.h0, [[1, 0], [1, 0]])
    # Go down. b + W'h0 = L[0, 1, -1] + L[1, -1, 0] = L[1, 0, -1] -> [.75, .5, .25] for both;
    # v1 = [u < p]: (.7, .4, .3) -> (1, 1, 0); (.8, .3, .2) -> (0, 1, 1)
    np.testing.assert_array_equal(s.v_neg, [[1, 1, 0], [0, 1, 1]])
    # Go up again. (1,1,0): [L(1 - 1), -L + L(1)] = [0, 0]; (0,1,1): [-L, L] as above
    np.testing.assert_allclose(s.h_neg_prob, [[0.5, 0.5], [0.25, 0.75]])
    np.testing.assert_array_equal(s.h_neg, [[1, 0], [0, 1]])  # (.4, .6), (.3, .7) vs those

    # Positive statistics h0 v0' / 2: row 1 = ((1,0,1) + (0,1,1)) / 2, row 2 = 0.
    # Negative Q(h1) v1' / 2: row 1 = (.5 (1,1,0) + .25 (0,1,1)) / 2 = (.25, .375, .125)
    #                         row 2 = (.5 (1,1,0) + .75 (0,1,1)) / 2 = (.25, .625, .375)
    grad_w = np.array([[0.5 - 0.25, 0.5 - 0.375, 1.0 - 0.125],
                       [0.0 - 0.25, 0.0 - 0.625, 0.0 - 0.375]])
    np.testing.assert_allclose(s.grad_W, grad_w)
    # b: mean(v0 - v1) = ((0, -1, 1) + (0, 0, 0)) / 2; c: mean(h0 - Q(h1)) =
    # ((.5, -.5) + (.75, -.75)) / 2
    np.testing.assert_allclose(s.grad_b, [0, -0.5, 0.5])
    np.testing.assert_allclose(s.grad_c, [0.625, -0.625])
    # E[v|h0] = (.75, .5, .25): squared errors (.0625 + .25 + .5625) + (.5625 + .25 + .5625)
    assert s.reconstruction_error == pytest.approx(2.25 / 6)

    np.testing.assert_allclose(rbm.W, w_before + 0.1 * grad_w)
    np.testing.assert_allclose(rbm.b, L * np.array([0, 1, -1]) + 0.1 * np.array([0, -0.5, 0.5]))
    np.testing.assert_allclose(rbm.c, L * np.array([0, -1]) + 0.1 * np.array([0.625, -0.625]))


def test_mean_field_reconstruction_draws_nothing_for_the_visible_units():
    rbm = tiny_rbm(sample_visible=False)
    rbm.rng = ScriptedDraws(U_H0, U_H1)  # no uniforms for v: v1 = E[v|h0]
    s = rbm.cd_update(V0)
    np.testing.assert_allclose(s.v_neg, [[0.75, 0.5, 0.25]] * 2)
    # c + W v1 = [0 + L(.75 - .5), -L + L(.5 + .25)] = [L/4, -L/4]
    p = 1 / (1 + 3 ** -0.25)
    np.testing.assert_allclose(s.h_neg_prob, [[p, 1 - p]] * 2)


def test_momentum_and_weight_decay_follow_the_documented_rule():
    rbm = tiny_rbm(lr=0.1, momentum=0.5, weight_decay=0.01)
    rbm.rng = ScriptedDraws(U_H0, U_V1, U_H1, U_H0, U_V1, U_H1)
    w0, b0 = rbm.W.copy(), rbm.b.copy()
    s1 = rbm.cd_update(V0)
    dw1 = 0.1 * (s1.grad_W - 0.01 * w0)
    np.testing.assert_allclose(rbm.W, w0 + dw1)
    np.testing.assert_allclose(rbm.b, b0 + 0.1 * s1.grad_b)  # no decay on biases
    w1, b1 = rbm.W.copy(), rbm.b.copy()
    s2 = rbm.cd_update(V0)
    np.testing.assert_allclose(rbm.W, w1 + 0.5 * dw1 + 0.1 * (s2.grad_W - 0.01 * w1))
    np.testing.assert_allclose(rbm.b, b1 + 0.5 * 0.1 * s1.grad_b + 0.1 * s2.grad_b)


def test_cd_k_runs_k_gibbs_steps():
    rbm = tiny_rbm(k=3)
    draws = [U_H0] + [U_V1, U_H1] * 3
    rbm.rng = ScriptedDraws(*draws)
    rbm.cd_update(V0)
    assert rbm.rng.uniforms == []  # h0, then (v, h) three times


# -- persistent CD ------------------------------------------------------------------------

def test_pcd_continues_its_chain_from_the_previous_update():
    rng = np.random.default_rng(3)
    batches = [(rng.random((8, 12)) < 0.5).astype(np.float32) for _ in range(3)]
    rbm = RBM(12, 5, persistent=True, rng=0)
    assert rbm.fantasy is None
    first = rbm.cd_update(batches[0])
    np.testing.assert_array_equal(rbm.fantasy, first.h_neg)  # the chain's end is kept

    # The next negative phase starts from the fantasy, not from the new batch's h0: replay it
    # by hand with a copy of the generator, after the h0 draw.
    fantasy, W, b, c = rbm.fantasy.copy(), rbm.W.copy(), rbm.b.copy(), rbm.c.copy()
    replay = np.random.Generator(np.random.PCG64())
    replay.bit_generator.state = rbm.rng.bit_generator.state
    second = rbm.cd_update(batches[1])
    replay.random(second.h0.shape, dtype=np.float32)  # h0 of batch 2
    v_mean = sigmoid(fantasy @ W + b)
    v = (replay.random(v_mean.shape, dtype=np.float32) < v_mean).astype(np.float32)
    np.testing.assert_array_equal(second.v_neg, v)
    np.testing.assert_allclose(second.h_neg_prob, sigmoid(v @ W.T + c), rtol=1e-6)
    np.testing.assert_array_equal(rbm.fantasy, second.h_neg)


def test_pcd_negative_phase_ignores_the_current_batch_and_cd_does_not():
    rng = np.random.default_rng(4)
    a, b1, b2 = ((rng.random((6, 10)) < 0.5).astype(np.float32) for _ in range(3))
    negatives = {}
    for persistent in (True, False):
        for name, second in (("b1", b1), ("b2", b2)):
            # Large weights, so that h0 depends visibly on the data.
            rbm = RBM(10, 4, persistent=persistent, init_std=1.0, rng=7)
            rbm.cd_update(a)
            negatives[persistent, name] = rbm.cd_update(second).v_neg
    np.testing.assert_array_equal(negatives[True, "b1"], negatives[True, "b2"])
    assert not np.array_equal(negatives[False, "b1"], negatives[False, "b2"])


# -- learning -----------------------------------------------------------------------------

def binary_prototypes(n=600, d=36, seed=0, flip=0.05):
    """Four random binary prototypes with 5 % of bits flipped per example."""
    rng = np.random.default_rng(seed)
    protos = rng.random((4, d)) < 0.5
    x = protos[rng.integers(0, 4, n)] ^ (rng.random((n, d)) < flip)
    return x.astype(np.float32)


@pytest.mark.parametrize("persistent", [False, True])
def test_reconstruction_error_falls_and_pseudo_likelihood_rises_on_binary_data(persistent):
    x = binary_prototypes()
    rbm = RBM(36, 16, lr=0.1, momentum=0.5, persistent=persistent, rng=0)
    before_err, before_pll = rbm.reconstruction_error(x), rbm.pseudo_log_likelihood(x)
    history = rbm.fit(x, epochs=15, batch_size=20)
    errors = [m["reconstruction_error"] for m in history]
    assert errors[-1] < errors[0] / 2
    assert rbm.reconstruction_error(x) < before_err / 4  # 0.25 -> about 0.03
    assert rbm.pseudo_log_likelihood(x) > before_pll + 10  # about -25 -> -8 nats


def test_gaussian_binary_rbm_learns_real_valued_data():
    rng = np.random.default_rng(1)
    factors = rng.standard_normal((3, 20)) * 2  # data = sum of active factors + noise
    on = rng.random((800, 3)) < 0.5
    x = on @ factors + 0.3 * rng.standard_normal((800, 20))
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)  # unit variance, as the RBM assumes
    rbm = RBM(20, 12, visible="gaussian", lr=0.01, momentum=0.5, rng=0)
    assert rbm.reconstruction_error(x) == pytest.approx(1.0, abs=0.05)  # ~ E[x^2] at init
    history = rbm.fit(x, epochs=30, batch_size=20)
    assert history[-1]["reconstruction_error"] < 0.3
    assert rbm.reconstruction_error(x) < 0.3
    # The free energy learned to tell the data from noise of the same variance.
    noise = rng.standard_normal(x.shape).astype(np.float32)
    assert rbm.free_energy(x).mean() < rbm.free_energy(noise).mean() - 5
    with pytest.raises(ValueError, match="binary visible units only"):
        rbm.pseudo_log_likelihood(x)


def test_binary_units_refuse_standardised_data():
    with pytest.raises(ValueError, match=r"need data in \[0, 1\].*visible='gaussian'"):
        RBM(3, 2).cd_update(np.array([[-0.4, 0.1, 2.5]]))
    with pytest.raises(ValueError, match=r"shape \(N, 3\)"):
        RBM(3, 2).cd_update(np.zeros((2, 4)))


def test_equal_seeds_give_bit_identical_weights():
    x = binary_prototypes(n=200)
    runs = [RBM(36, 8, persistent=True, momentum=0.5, rng=seed) for seed in (5, 5, 6)]
    for rbm in runs:
        rbm.fit(x, epochs=2, batch_size=25, seed=1)
    assert np.array_equal(runs[0].W, runs[1].W) and np.array_equal(runs[0].c, runs[1].c)
    assert not np.array_equal(runs[0].W, runs[2].W)
    assert runs[0].W.dtype == np.float32



def test_push_gets_the_step_and_applies_it_as_the_rbm_would():
    """Asynchronous pre-training's hook: the step goes to ``push``, which adds it itself."""
    x = binary_prototypes(n=100)
    plain, pushed = (RBM(36, 8, momentum=0.5, weight_decay=1e-3, rng=4) for _ in range(2))
    steps = []

    def push(step):
        steps.append({k: v.copy() for k, v in step.items()})
        for name, param in pushed.params.items():
            param += step[name]

    for batch in np.split(x, 4):
        before = plain.W.copy()
        plain.cd_update(batch)
        pushed.cd_update(batch, push=push)
        np.testing.assert_array_equal(steps[-1]["W"], plain.velocity["W"])  # the momentum step
        np.testing.assert_allclose(steps[-1]["W"], plain.W - before, atol=1e-7)
    assert len(steps) == 4 and pushed.updates == 4
    for name in ("W", "b", "c"):
        np.testing.assert_array_equal(pushed.params[name], plain.params[name])
    unapplied = RBM(36, 8, rng=4)
    w0 = unapplied.W.copy()
    unapplied.cd_update(x[:10], push=lambda step: None)  # push owns applying the step
    np.testing.assert_array_equal(unapplied.W, w0)


def test_bind_trains_the_given_arrays_in_place():
    rbm = RBM(6, 3, rng=0)
    buffer = np.zeros(6 * 3 + 6 + 3, np.float32)
    views = {"W": buffer[:18].reshape(3, 6), "b": buffer[18:24], "c": buffer[24:]}
    for name, view in views.items():
        view[...] = rbm.params[name]
    rbm.bind(views)
    rbm.cd_update(np.eye(6, dtype=np.float32))
    assert rbm.W is views["W"] and np.array_equal(buffer[:18], rbm.W.ravel())
    assert np.any(buffer != 0)
    with pytest.raises(ValueError, match=r"RBM.bind: expected W of shape \[3, 6\] float32, "
                                         r"got \[6, 3\] float32"):
        rbm.bind({"W": np.zeros((6, 3), np.float32), "b": views["b"], "c": views["c"]})
    with pytest.raises(ValueError, match="expected c .* got nothing"):
        rbm.bind({"W": views["W"], "b": views["b"]})


# -- monitors against enumeration --------------------------------------------------------

def energy(v, h, rbm):
    """E(v, h) = -b'v - c'h - h'W v, written out independently of the RBM class."""
    return -(rbm.b @ v) - (rbm.c @ h) - h @ rbm.W @ v


def test_free_energy_of_a_hand_example_and_by_enumerating_h():
    rbm = tiny_rbm()
    # v = (1, 0, 1): -b'v = L, c + W v = (L, 0): F = L - log(1 + 3) - log(1 + 1) = log(3/8)
    assert rbm.free_energy(V0[:1])[0] == pytest.approx(math.log(3 / 8))
    hs = [np.array(h, float) for h in itertools.product([0, 1], repeat=2)]
    for v in itertools.product([0, 1], repeat=3):
        v = np.array(v, float)
        brute = -np.log(sum(np.exp(-energy(v, h, rbm)) for h in hs))
        assert rbm.free_energy(v[None])[0] == pytest.approx(brute)


def test_stochastic_pseudo_log_likelihood_averages_to_the_exact_one():
    rbm = tiny_rbm()
    vs = [np.array(v, float) for v in itertools.product([0, 1], repeat=3)]
    unnorm = {tuple(v): sum(np.exp(-energy(v, np.array(h, float), rbm))
                            for h in itertools.product([0, 1], repeat=2)) for v in vs}
    v = np.array([1.0, 0.0, 1.0])
    exact = 0.0
    for i in range(3):  # log P(v_i | v_-i) from the joint, by enumeration
        other = v.copy()
        other[i] = 1 - other[i]
        exact += math.log(unnorm[tuple(v)] / (unnorm[tuple(v)] + unnorm[tuple(other)]))
    estimate = rbm.pseudo_log_likelihood(np.tile(v, (6000, 1)), rng=0)
    assert estimate == pytest.approx(exact, abs=0.05)


def test_docstring_examples():
    assert doctest.testmod(meta.lv2.rbm).failed == 0
