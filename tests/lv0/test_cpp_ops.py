"""User C++ ops compiled at run time (meta.register_cpp_op).

The shipped example is compiled once per session into a temporary cache; every test then
registers it again (a cache hit) inside ``registry.scratch()`` so the real registry stays clean.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from meta.lv0 import Context, Operator, check_gradients, cpp_ops, register, registry
from meta.lv0.cpp_ops import CppOpBuildError, register_cpp_op
from meta.lv1 import GraphBuilder, ReferenceExecutor
from meta.lv2 import Optimizer, sgd

pytestmark = pytest.mark.slow  # compiling takes 10-30 s of CPU

SWISH = Path(__file__).resolve().parents[2] / "examples" / "cpp_ops" / "swish.cpp"
DOMAIN = "ai.meta.custom"

# Several inputs and outputs, a scalar (0-d) input, attributes, a reduction in backward:
# s = a + b, p = alpha * w * a * b.
SUM_PRODUCT = r"""
#include "meta/custom_op.hpp"

template <typename T>
void forward(meta::Forward<T>& op) {
  auto a = op.input(0), b = op.input(1), w = op.input(2);
  auto s = op.output(0, a.shape), p = op.output(1, a.shape);
  const T scale = T(op.attr("alpha")) * w[0];
  meta::parallel_for(a.size, [&](std::int64_t i) {
    s[i] = a[i] + b[i];
    p[i] = scale * a[i] * b[i];
  });
}

template <typename T>
void backward(meta::Backward<T>& op) {
  auto a = op.input(0), b = op.input(1), w = op.input(2);
  auto ds = op.grad_output(0), dp = op.grad_output(1);
  const T alpha = T(op.attr("alpha")), scale = alpha * w[0];
  auto da = op.grad_input(0), db = op.grad_input(1);
  meta::parallel_for(a.size, [&](std::int64_t i) {
    da[i] = ds[i] + scale * b[i] * dp[i];
    db[i] = ds[i] + scale * a[i] * dp[i];
  });
  if (op.needs_grad(2))
    op.grad_input(2)[0] = T(meta::parallel_sum(a.size, [&](std::int64_t i) {
      return alpha * a[i] * b[i] * dp[i];
    }));
}

META_OP(forward, backward)
"""

BROKEN = """#include "meta/custom_op.hpp"

template <typename T>
void forward(meta::Forward<T>& op) {
  auto x = op.input(0);
  auto y = op.output(0, x.shape);
  y[0] = not_declared_anywhere;
}

META_OP_FORWARD_ONLY(forward)
"""


def swish_reference(x: np.ndarray, beta: float) -> np.ndarray:
    return x / (1 + np.exp(-beta * x))


@pytest.fixture(scope="session")
def cpp_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private cache holding the example, compiled once for the whole session."""
    cache = tmp_path_factory.mktemp("meta_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("META_CACHE_DIR", str(cache))
        start = time.perf_counter()
        cpp_ops.build(SWISH)
        print(f"compiled {SWISH.name} in {time.perf_counter() - start:.1f} s")
    return cache


@pytest.fixture
def in_cache(cpp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("META_CACHE_DIR", str(cpp_cache))
    with registry.scratch():
        yield cpp_cache


@pytest.fixture
def swish(in_cache: Path) -> type:
    return register_cpp_op("Swish", SWISH, attributes={"beta": 1.0})


def test_gradients_float64(swish):
    x = np.random.default_rng(0).standard_normal((4, 5))
    report = check_gradients(swish(beta=1.5), [x])
    assert report.passed, report


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-6), (np.float64, 1e-14)])
def test_forward_matches_numpy_in_both_dtypes(swish, dtype, rtol):
    x = np.linspace(-4, 4, 24, dtype=dtype).reshape(2, 3, 4)
    y = swish(beta=0.5).apply(Context(), x)[0]
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_allclose(y, swish_reference(x.astype(np.float64), 0.5), rtol=rtol,
                               atol=1e-7)


def test_non_contiguous_input_is_made_contiguous(swish):
    x = np.random.default_rng(1).standard_normal((6, 8))[:, ::2].T
    assert not x.flags.c_contiguous
    op, ctx = swish(), Context()
    (y,) = op.apply(ctx, x)
    np.testing.assert_allclose(y, swish_reference(x, 1.0), rtol=1e-14)
    (dx,) = op.backward(ctx, np.ones((y.shape[0], 2 * y.shape[1]))[:, ::2])
    assert dx.shape == x.shape


def test_integer_input_is_a_clear_type_error(swish):
    with pytest.raises(TypeError, match=r"Swish .*swish\.cpp.*input 0 has dtype int64"):
        swish().apply(Context(), np.arange(4))


def test_second_registration_is_a_cache_hit(in_cache, monkeypatch):
    def no_compiler(*args):
        raise AssertionError("compiled again instead of loading from the cache")

    monkeypatch.setattr(cpp_ops, "_compile", no_compiler)
    start = time.perf_counter()
    cls = register_cpp_op("Swish", SWISH, attributes={"beta": 1.0})
    elapsed = time.perf_counter() - start
    assert Path(cls.module.__file__).is_relative_to(in_cache / "cpp_ops")
    assert elapsed < 2.0, f"a cache hit took {elapsed:.2f} s"
    # registering again replaces the earlier C++ class rather than failing
    assert register_cpp_op("Swish", SWISH, attributes={"beta": 1.0}) is not cls


def test_compiler_error_names_file_and_line(in_cache, tmp_path):
    source = tmp_path / "broken.cpp"
    source.write_text(BROKEN)
    with pytest.raises(CppOpBuildError) as info:
        register_cpp_op("Broken", source)
    message = str(info.value)
    assert "broken.cpp:7:10: error:" in message and "not_declared_anywhere" in message
    assert "command: " in message and "-fopenmp" in message
    assert len(message.splitlines()) < 10, message


def test_several_inputs_outputs_and_attributes(in_cache, tmp_path):
    source = tmp_path / "sum_product.cpp"
    source.write_text(SUM_PRODUCT)
    cls = register_cpp_op("SumProduct", source, attributes={"alpha": 2.0})
    rng = np.random.default_rng(2)
    a, b, w = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), np.array(0.7)
    s, p = cls(alpha=3.0).apply(Context(), a, b, w)
    np.testing.assert_allclose(s, a + b)
    np.testing.assert_allclose(p, 3.0 * 0.7 * a * b)
    report = check_gradients(cls(alpha=3.0), [a, b, w])
    assert report.passed, report
    ctx = Context([True, True, False])  # w needs no gradient: None comes back
    cls().apply(ctx, a, b, w)
    assert cls().backward(ctx, None, np.ones((3, 4)))[2] is None


def test_native_twin_of_a_numpy_op(in_cache):
    @register("Swish", domain=DOMAIN)
    class Swish(Operator):
        attributes = {"beta": 1.0}

        def forward(self, ctx, x):
            return swish_reference(x, self.beta)

    native = register_cpp_op("Swish", SWISH, backend="native")
    assert native.attributes == {"beta": 1.0}
    assert registry.lookup("Swish", 1, DOMAIN, backends=("native",)) is native
    x = np.random.default_rng(3).standard_normal(10)
    np.testing.assert_allclose(native(beta=2.0).apply(Context(), x)[0],
                               Swish(beta=2.0).apply(Context(), x)[0], rtol=1e-14)


def blobs(n: int = 120, classes: int = 3, features: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, features)) * 3
    labels = rng.integers(0, classes, n)
    return (centers[labels] + rng.standard_normal((n, features))).astype(np.float32), labels


def test_network_with_the_cpp_op_trains(swish):
    rng = np.random.default_rng(0)
    b = GraphBuilder("swish_mlp")
    x = b.input("x", np.float32, ("N", 4))
    y = b.input("labels", np.int64, ("N",))
    w1 = b.initializer("w1", (rng.standard_normal((16, 4)) * 0.5).astype(np.float32))
    b1 = b.initializer("b1", np.zeros(16, np.float32))
    w2 = b.initializer("w2", (rng.standard_normal((3, 16)) * 0.25).astype(np.float32))
    b2 = b.initializer("b2", np.zeros(3, np.float32))
    h = b.node("Swish", [b.node("Gemm", [x, w1, b1], transB=1)], domain=DOMAIN, beta=1.0)
    logits = b.node("Gemm", [h, w2, b2], transB=1)
    b.output(b.node("SoftmaxCrossEntropyLoss", [logits, y], name="loss"), np.float32, ())
    graph = b.build()
    executor = ReferenceExecutor(graph)
    assert type(executor.ops["swish1"]) is swish
    optimizer = Optimizer(sgd(0.2), graph.parameters)
    data, labels = blobs()
    losses = []
    for _ in range(40):
        values, grads = executor.inference_and_backprop({"x": data, "labels": labels})
        losses.append(float(values["loss"]))
        optimizer.step(grads)
    assert losses[-1] < 0.3 * losses[0], losses
