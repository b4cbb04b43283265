// Swish: y = x * sigmoid(beta * x), with attribute beta (default given at registration).
//   meta.register_cpp_op("Swish", "examples/cpp_ops/swish.cpp", attributes={"beta": 1.0})
#include <cmath>
#include <cstdint>

#include "meta/custom_op.hpp"

template <typename T>
T sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}

template <typename T>
void forward(meta::Forward<T>& op) {
  auto x = op.input(0);
  auto y = op.output(0, x.shape);
  const T beta = op.attr("beta");
  meta::parallel_for(x.size, [&](std::int64_t i) { y[i] = x[i] * sigmoid(beta * x[i]); });
}

// dy/dx = s + beta * x * s * (1 - s), with s = sigmoid(beta * x)
template <typename T>
void backward(meta::Backward<T>& op) {
  auto x = op.input(0);
  auto dy = op.grad_output(0);
  auto dx = op.grad_input(0);
  const T beta = op.attr("beta");
  meta::parallel_for(x.size, [&](std::int64_t i) {
    const T s = sigmoid(beta * x[i]);
    dx[i] = dy[i] * (s + beta * x[i] * s * (T(1) - s));
  });
}

META_OP(forward, backward)
