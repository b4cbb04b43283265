// Softmax, LogSoftmax and SoftmaxCrossEntropyLoss forward and backward: the native twins of
// ops/softmax.py, ops/log_softmax.py and ops/softmax_cross_entropy_loss.py.
//
// Every kernel sees its input as (outer, c, inner): normalised along the middle axis of c
// entries, whose elements lie inner apart (inner = 1 for the last axis). Exponential sums run
// in double; the formulas are written as the numpy versions write them.
#pragma once
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "meta/activations.hpp"
#include "meta/parallel.hpp"

namespace meta {

namespace detail {

// The larger of m and v, NaN winning as in numpy.max.
template <typename T>
inline T nan_max(T m, T v) { return (v > m || v != v) ? v : m; }

// Calls body(o, scratch) for o in [0, outer), on several threads when the tensor is large;
// scratch holds 2 * inner doubles private to the thread.
template <typename Body>
void for_outer(std::int64_t outer, std::int64_t c, std::int64_t inner, Body&& body) {
  const bool parallel = outer * c * inner > kParallelThreshold && outer > 1;
#pragma omp parallel if (parallel)
  {
    std::vector<double> scratch(static_cast<std::size_t>(2 * inner));
#pragma omp for schedule(static)
    for (std::int64_t o = 0; o < outer; ++o) body(o, scratch.data());
  }
}

// Along one (outer) slab of a (c, inner) layout: m = max over c and s = sum of e^(x - m), per
// inner position; with Store, e^(x - m) is written to e.
template <bool Store, typename T>
void max_and_sum(const T* x, std::int64_t c, std::int64_t inner, T* m, double* s, T* e) {
  if (inner == 1) {  // one contiguous row: vectorise along it
    T mx = x[0];
    for (std::int64_t k = 1; k < c; ++k) mx = nan_max(mx, x[k]);
    double total = 0.0;
#pragma omp simd reduction(+ : total)
    for (std::int64_t k = 0; k < c; ++k) {
      const T v = exp_vec(static_cast<T>(x[k] - mx));
      if (Store) e[k] = v;
      total += v;
    }
    *m = mx;
    *s = total;
    return;
  }
  for (std::int64_t i = 0; i < inner; ++i) m[i] = x[i];
  for (std::int64_t k = 1; k < c; ++k)
    for (std::int64_t i = 0; i < inner; ++i) m[i] = nan_max(m[i], x[k * inner + i]);
  for (std::int64_t i = 0; i < inner; ++i) s[i] = 0.0;
  for (std::int64_t k = 0; k < c; ++k) {
    for (std::int64_t i = 0; i < inner; ++i) {
      const T v = exp_vec(static_cast<T>(x[k * inner + i] - m[i]));
      if (Store) e[k * inner + i] = v;
      s[i] += v;
    }
  }
}

}  // namespace detail

// y = softmax (Log = false) or log-softmax (Log = true) of x along the middle axis.
template <bool Log, typename T>
void softmax_forward(const T* x, T* y, std::int64_t outer, std::int64_t c, std::int64_t inner) {
  detail::for_outer(outer, c, inner, [&](std::int64_t o, double* scratch) {
    const T* xs = x + o * c * inner;
    T* ys = y + o * c * inner;
    // The per-position maxima live in the first half of the scratch, as T.
    T* m = reinterpret_cast<T*>(scratch);
    double* s = scratch + inner;
    detail::max_and_sum<!Log>(xs, c, inner, m, s, ys);
    if (inner == 1) {  // a contiguous row
      const T mx = m[0], lse = static_cast<T>(std::log(s[0])), total = static_cast<T>(s[0]);
      if (Log) {
        for (std::int64_t k = 0; k < c; ++k) ys[k] = (xs[k] - mx) - lse;
      } else {
        for (std::int64_t k = 0; k < c; ++k) ys[k] = ys[k] / total;
      }
    } else if (Log) {
      for (std::int64_t i = 0; i < inner; ++i) s[i] = static_cast<T>(std::log(s[i]));
      for (std::int64_t k = 0; k < c; ++k)
        for (std::int64_t i = 0; i < inner; ++i)
          ys[k * inner + i] = (xs[k * inner + i] - m[i]) - static_cast<T>(s[i]);
    } else {
      for (std::int64_t k = 0; k < c; ++k)
        for (std::int64_t i = 0; i < inner; ++i)
          ys[k * inner + i] = ys[k * inner + i] / static_cast<T>(s[i]);
    }
  });
}

// Softmax: dx = y (dy - sum(dy y)); LogSoftmax: dx = dy - e^y sum(dy). Sums along the middle
// axis, in T as numpy sums them.
template <bool Log, typename T>
void softmax_backward(const T* y, const T* dy, T* dx, std::int64_t outer, std::int64_t c,
                      std::int64_t inner) {
  detail::for_outer(outer, c, inner, [&](std::int64_t o, double* scratch) {
    const std::int64_t base = o * c * inner;
    const T* ys = y + base;
    const T* gs = dy + base;
    T* out = dx + base;
    if (inner == 1) {  // a contiguous row
      double total = 0.0;
#pragma omp simd reduction(+ : total)
      for (std::int64_t k = 0; k < c; ++k) total += Log ? gs[k] : gs[k] * ys[k];
      const T sum = static_cast<T>(total);
      for (std::int64_t k = 0; k < c; ++k)
        out[k] = Log ? gs[k] - exp_vec(ys[k]) * sum : ys[k] * (gs[k] - sum);
      return;
    }
    double* s = scratch;
    for (std::int64_t i = 0; i < inner; ++i) s[i] = 0.0;
    for (std::int64_t k = 0; k < c; ++k)
      for (std::int64_t i = 0; i < inner; ++i)
        s[i] += Log ? gs[k * inner + i] : gs[k * inner + i] * ys[k * inner + i];
    for (std::int64_t k = 0; k < c; ++k) {
      for (std::int64_t i = 0; i < inner; ++i) {
        const std::int64_t j = k * inner + i;
        const T sum = static_cast<T>(s[i]);
        out[j] = Log ? gs[j] - exp_vec(ys[j]) * sum : ys[j] * (gs[j] - sum);
      }
    }
  });
}

// Softmax cross-entropy forward over scores (n, c, inner) with labels (n, inner), each in
// [0, c) (the caller checks): writes logp (n, c, inner) and, when loss is not null, the
// per-element losses -logp[label]; returns their sum (in double).
template <typename T>
double softmax_cross_entropy_forward(const T* x, const std::int64_t* labels, T* logp, T* loss,
                                     std::int64_t n, std::int64_t c, std::int64_t inner) {
  softmax_forward<true>(x, logp, n, c, inner);
  double total = 0.0;
  const std::int64_t count = n * inner;
  for (std::int64_t e = 0; e < count; ++e) {
    const std::int64_t o = e / inner, i = e - o * inner;
    const T l = -logp[(o * c + labels[e]) * inner + i];
    if (loss) loss[e] = l;
    total += l;
  }
  return total;
}

// d(scores) = g - e^logp sum_c(g), with g = dlogp - coeff one-hot(label): coeff is the
// incoming gradient of each element's loss (one value when coeff_size is 1), dlogp may be null.
template <typename T>
void softmax_cross_entropy_backward(const T* logp, const std::int64_t* labels, const T* coeff,
                                    std::int64_t coeff_size, const T* dlogp, T* dx,
                                    std::int64_t n, std::int64_t c, std::int64_t inner) {
  detail::for_outer(n, c, inner, [&](std::int64_t o, double* scratch) {
    const std::int64_t base = o * c * inner;
    const T* lp = logp + base;
    const T* dl = dlogp ? dlogp + base : nullptr;
    const std::int64_t* lab = labels + o * inner;
    T* out = dx + base;
    T* s = reinterpret_cast<T*>(scratch);
    auto g = [&](std::int64_t k, std::int64_t i) {
      const T hit = k == lab[i] ? coeff[coeff_size == 1 ? 0 : o * inner + i] : T(0);
      return (dl ? dl[k * inner + i] : T(0)) - hit;
    };
    if (dl) {
      double* acc = scratch + inner;
      for (std::int64_t i = 0; i < inner; ++i) acc[i] = 0.0;
      for (std::int64_t k = 0; k < c; ++k)
        for (std::int64_t i = 0; i < inner; ++i) acc[i] += g(k, i);
      for (std::int64_t i = 0; i < inner; ++i) s[i] = static_cast<T>(acc[i]);
    } else {  // one nonzero per position: the sum is exact
      for (std::int64_t i = 0; i < inner; ++i) s[i] = -coeff[coeff_size == 1 ? 0 : o * inner + i];
    }
    for (std::int64_t k = 0; k < c; ++k)
      for (std::int64_t i = 0; i < inner; ++i)
        out[k * inner + i] = g(k, i) - exp_vec(lp[k * inner + i]) * s[i];
  });
}

}  // namespace meta
