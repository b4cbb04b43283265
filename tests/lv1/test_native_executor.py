"""The native executor: C++ kernels where an op has one, numpy otherwise, same results."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv0 import native
from meta.lv1 import EXECUTORS, NativeExecutor, ReferenceExecutor, lenet5, mlp, resnet20, wide_cnn

MODELS = {
    "mlp": (lambda: mlp(hidden=[64, 32], seed=1), (1, 28, 28)),
    "lenet5": (lambda: lenet5(seed=1), (1, 28, 28)),
    "wide_cnn": (lambda: wide_cnn(seed=1), (1, 28, 28)),
    "resnet20": (lambda: resnet20(input_shape=(3, 16, 16), width=4, seed=1), (3, 16, 16)),
}


def batch(shape, n=8, seed=0):
    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal((n, *shape)).astype(np.float32),
            "labels": rng.integers(0, 10, n).astype(np.int64)}


@pytest.mark.parametrize("name", MODELS)
def test_native_executor_matches_the_reference(name):
    build, shape = MODELS[name]
    feeds = batch(shape)
    reference, native_ex = ReferenceExecutor(build()).train(), NativeExecutor(build()).train()
    ref_values, ref_grads = reference.inference_and_backprop(feeds, outputs=["logits"])
    values, grads = native_ex.inference_and_backprop(feeds, outputs=["logits"])
    for key, value in native_ex.graph.state.items():  # running statistics updated alike
        np.testing.assert_allclose(value, reference.graph.state[key], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values["logits"], ref_values["logits"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values["loss"], ref_values["loss"], rtol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for param, g in grads.items():
        scale = float(np.abs(ref_grads[param]).max(initial=1e-3))
        np.testing.assert_allclose(g, ref_grads[param], rtol=1e-3, atol=1e-4 * scale,
                                   err_msg=f"{name}: gradient of {param}")


def test_placement_says_which_nodes_run_native():
    ex = NativeExecutor(lenet5())
    where = ex.placement()
    assert where["fc1"] == "native" and where["relu1"] == "native"
    assert set(where.values()) <= {"native", "numpy"}
    assert set(ReferenceExecutor(lenet5()).placement().values()) == {"numpy"}


def test_executors_are_named_for_recipes():
    assert EXECUTORS["reference"].factory is ReferenceExecutor
    assert EXECUTORS["native"].factory is NativeExecutor
    assert list(EXECUTORS["native"].options) == ["profile", "free_intermediates"]


def test_missing_extension_is_a_clear_error(monkeypatch):
    def unavailable():
        raise native.NativeUnavailableError("meta's C++ extension (meta._native) is not built")

    monkeypatch.setattr(native, "module", unavailable)
    with pytest.raises(native.NativeUnavailableError, match="not built"):
        NativeExecutor(mlp(hidden=[4]))
