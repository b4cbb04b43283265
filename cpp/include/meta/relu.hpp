// ReLU forward and backward, the native twin of ops/relu.py.
#pragma once
#include <cstdint>

#include "meta/parallel.hpp"

namespace meta {

// y = max(x, 0); NaN propagates like numpy.maximum (a NaN is not < 0, so it is kept).
template <typename T>
void relu_forward(const T* x, T* y, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
}

// dx = dy where the forward output was positive, else 0 (the subgradient at 0 is taken as 0).
template <typename T>
void relu_backward(const T* y, const T* dy, T* dx, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
}

}  // namespace meta
