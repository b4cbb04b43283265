// BatchNormalization forward and backward: the native twin of ops/batch_normalization.py.
//
// X is seen as (n, c, s): batch, channels, and the spatial positions flattened (s = 1 for a
// 2-D input). Statistics are per channel over n * s values, summed in double. Elementwise
// formulas are written as the numpy version writes them.
#pragma once
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "meta/parallel.hpp"

namespace meta {

namespace detail {

// Calls body(thread, n_begin, n_end) over a split of the batch, on several threads only when
// the tensor is large; returns the number of threads used.
template <typename Body>
int over_batch(std::int64_t n, std::int64_t total, Body&& body) {
  const int threads = total > kParallelThreshold && n > 1 ? omp_get_max_threads() : 1;
  if (threads == 1) {
    body(0, std::int64_t{0}, n);
    return 1;
  }
  int used = 1;
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#pragma omp single
    used = static_cast<int>(nt);
    body(static_cast<int>(t), n * t / nt, n * (t + 1) / nt);
  }
  return used;
}

// Per-channel sums f(x) and g(x, dy) accumulated by each thread into its own rows of acc
// (2 * c doubles per thread), then added into acc's first 2 * c.
template <typename T, typename F>
void channel_sums(const T* a, const T* b, std::int64_t n, std::int64_t c, std::int64_t s,
                  std::vector<double>& acc, F&& terms) {
  const int max_threads = omp_get_max_threads();
  acc.assign(static_cast<std::size_t>(2 * c) * max_threads, 0.0);
  const int used = over_batch(n, n * c * s, [&](int t, std::int64_t n0, std::int64_t n1) {
    double* s1 = acc.data() + 2 * c * t;
    double* s2 = s1 + c;
    for (std::int64_t i = n0; i < n1; ++i) {
      if (s == 1) {
        const T* pa = a + i * c;
        const T* pb = b + i * c;
        for (std::int64_t j = 0; j < c; ++j) {
          double u, v;
          terms(j, pa[j], pb[j], u, v);
          s1[j] += u;
          s2[j] += v;
        }
        continue;
      }
      for (std::int64_t j = 0; j < c; ++j) {
        const T* pa = a + (i * c + j) * s;
        const T* pb = b + (i * c + j) * s;
        double r1 = 0.0, r2 = 0.0;
#pragma omp simd reduction(+ : r1, r2)
        for (std::int64_t k = 0; k < s; ++k) {
          double u, v;
          terms(j, pa[k], pb[k], u, v);
          r1 += u;
          r2 += v;
        }
        s1[j] += r1;
        s2[j] += r2;
      }
    }
  });
  for (int t = 1; t < used; ++t)
    for (std::int64_t j = 0; j < 2 * c; ++j) acc[j] += acc[2 * c * t + j];
}

// out[i, j, k] = f(j, a[i, j, k], b[i, j, k]) over the whole tensor.
template <typename T, typename F>
void channel_map(const T* a, const T* b, T* out, std::int64_t n, std::int64_t c, std::int64_t s,
                 F&& f) {
  over_batch(n, n * c * s, [&](int, std::int64_t n0, std::int64_t n1) {
    if (s == 1) {  // (n, c): vectorise along the channels
      for (std::int64_t i = n0; i < n1; ++i)
        for (std::int64_t j = 0; j < c; ++j) out[i * c + j] = f(j, a[i * c + j], b[i * c + j]);
      return;
    }
    for (std::int64_t i = n0; i < n1; ++i)
      for (std::int64_t j = 0; j < c; ++j) {
        const std::int64_t base = (i * c + j) * s;
        for (std::int64_t k = 0; k < s; ++k) out[base + k] = f(j, a[base + k], b[base + k]);
      }
  });
}

}  // namespace detail

// The batch mean and biased variance of each channel, shifted by the channel's first value so
// that one pass keeps its precision when the mean is large against the spread.
template <typename T>
void batchnorm_statistics(const T* x, std::int64_t n, std::int64_t c, std::int64_t s,
                          double* mean, double* var) {
  std::vector<double> acc;
  const T* shift = x;  // x[0, j, 0] is shift[j * s]
  detail::channel_sums(x, x, n, c, s, acc, [&](std::int64_t j, T v, T, double& u, double& w) {
    const double d = static_cast<double>(v) - static_cast<double>(shift[j * s]);
    u = d;
    w = d * d;
  });
  const double count = static_cast<double>(n * s);
  for (std::int64_t j = 0; j < c; ++j) {
    const double d = acc[j] / count;
    mean[j] = static_cast<double>(shift[j * s]) + d;
    const double v = acc[c + j] / count - d * d;
    var[j] = v > 0.0 ? v : 0.0;
  }
}

// y = ((x - mean) * inv_std) * scale + bias, per channel.
template <typename T>
void batchnorm_apply(const T* x, T* y, std::int64_t n, std::int64_t c, std::int64_t s,
                     const T* mean, const T* inv_std, const T* scale, const T* bias) {
  detail::channel_map(x, x, y, n, c, s, [&](std::int64_t j, T v, T) {
    return ((v - mean[j]) * inv_std[j]) * scale[j] + bias[j];
  });
}

// Per channel: sum(dy) and sum(dy * xhat), xhat = (x - mean) * inv_std.
template <typename T>
void batchnorm_gradient_sums(const T* x, const T* dy, std::int64_t n, std::int64_t c,
                             std::int64_t s, const T* mean, const T* inv_std, double* sum_dy,
                             double* sum_dy_xhat) {
  std::vector<double> acc;
  detail::channel_sums(x, dy, n, c, s, acc, [&](std::int64_t j, T v, T g, double& u, double& w) {
    u = g;
    w = static_cast<double>(g) * (static_cast<double>(v) - static_cast<double>(mean[j]));
  });
  for (std::int64_t j = 0; j < c; ++j) {
    sum_dy[j] = acc[j];
    sum_dy_xhat[j] = acc[c + j] * static_cast<double>(inv_std[j]);
  }
}

// Training mode: dx = k (dy - (sum_dy + xhat sum_dy_xhat) / count) [+ em + ev xhat], with
// k = scale * inv_std per channel; em, ev (null when absent) carry the gradients of the
// running statistics.
template <typename T>
void batchnorm_dx_training(const T* x, const T* dy, T* dx, std::int64_t n, std::int64_t c,
                           std::int64_t s, const T* mean, const T* inv_std, const T* k,
                           const T* sum_dy, const T* sum_dy_xhat, const T* em, const T* ev) {
  const T count = static_cast<T>(n * s);
  if (em) {
    detail::channel_map(x, dy, dx, n, c, s, [&](std::int64_t j, T a, T g) {
      const T xhat = (a - mean[j]) * inv_std[j];
      return k[j] * (g - (sum_dy[j] + xhat * sum_dy_xhat[j]) / count) + em[j] + ev[j] * xhat;
    });
  } else {
    detail::channel_map(x, dy, dx, n, c, s, [&](std::int64_t j, T a, T g) {
      const T xhat = (a - mean[j]) * inv_std[j];
      return k[j] * (g - (sum_dy[j] + xhat * sum_dy_xhat[j]) / count);
    });
  }
}

// Inference mode: dx = dy * k.
template <typename T>
void batchnorm_dx_inference(const T* dy, T* dx, std::int64_t n, std::int64_t c, std::int64_t s,
                            const T* k) {
  detail::channel_map(dy, dy, dx, n, c, s, [&](std::int64_t j, T g, T) { return g * k[j]; });
}

}  // namespace meta
