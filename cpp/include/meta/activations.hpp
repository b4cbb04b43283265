// Sigmoid, Tanh and LeakyRelu forward and backward: the native twins of ops/sigmoid.py,
// ops/tanh.py and ops/leaky_relu.py (Relu has its own header). One pass each, the formulas
// written as the numpy versions write them, so results agree to the last bit or two.
#pragma once
#include <cmath>
#include <cstdint>

#include "meta/parallel.hpp"

namespace meta {

// e^x in double, written so that GCC vectorises loops that call it (std::exp is a scalar
// library call: a softmax or sigmoid through it ran 5-10x slower than numpy's SIMD exp).
// Cody-Waite reduction x = k ln2 + r, |r| <= ln2 / 2, a degree-12 Taylor polynomial (error
// about 1 ulp), and 2^k applied as two factors so that subnormal results and overflow to inf
// come out as from std::exp. NaN propagates.
inline double exp_vec(double x) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  // Quiet comparisons (no FP exception on NaN) let GCC turn the selects into blends and
  // vectorise without -fno-trapping-math; a NaN compares false and so stays.
  x = __builtin_isless(x, -746.0) ? -746.0 : x;
  x = __builtin_isgreater(x, 710.0) ? 710.0 : x;
  const double t = x * kLog2e + kMagic;
  const double k = t - kMagic;
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  double p = 1.0 / 479001600.0;  // 1/12!
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^k = 2^k1 * 2^k2 with k1 = round(k / 2): each factor a normal double.
  const double k1 = (k * 0.5 + kMagic) - kMagic, k2 = k - k1;
  const std::int64_t m = __builtin_bit_cast(std::int64_t, kMagic);
  const std::int64_t b1 = (__builtin_bit_cast(std::int64_t, k1 + kMagic) - m + 1023) << 52;
  const std::int64_t b2 = (__builtin_bit_cast(std::int64_t, k2 + kMagic) - m + 1023) << 52;
  return p * __builtin_bit_cast(double, b1) * __builtin_bit_cast(double, b2);
}

// e^x in float, the same way with Cephes' degree-6 polynomial (about 1 ulp): half the work of
// the double version per value and twice the values per vector.
inline float exp_vec(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  x = __builtin_isless(x, -104.0f) ? -104.0f : x;
  x = __builtin_isgreater(x, 89.0f) ? 89.0f : x;
  const float k = (x * 1.44269504088896341f + kMagic) - kMagic;
  const float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float k1 = (k * 0.5f + kMagic) - kMagic, k2 = k - k1;
  const std::int32_t m = __builtin_bit_cast(std::int32_t, kMagic);
  const std::int32_t b1 = (__builtin_bit_cast(std::int32_t, k1 + kMagic) - m + 127) << 23;
  const std::int32_t b2 = (__builtin_bit_cast(std::int32_t, k2 + kMagic) - m + 127) << 23;
  return p * __builtin_bit_cast(float, b1) * __builtin_bit_cast(float, b2);
}

// tanh in double, vectorisable (std::tanh is a slow scalar call): Cephes' rational function
// below |x| = 0.625, 1 - 2 / (e^2|x| + 1) above.
inline double tanh_vec(double x) {
  const double a = std::fabs(x);
  const double s = x * x;
  const double p = ((-9.64399179425052238628e-1 * s - 9.92877231001918586564e1) * s -
                    1.61468768441708447952e3);
  const double q = (((s + 1.12811678491632931402e2) * s + 2.23548839060100448583e3) * s +
                    4.84406305325125486048e3);
  const double small = x + x * s * (p / q);
  const double large = 1.0 - 2.0 / (exp_vec(2.0 * a) + 1.0);
  const double signed_large = __builtin_isless(x, 0.0) ? -large : large;
  return __builtin_isless(a, 0.625) ? small : signed_large;
}

// y = 1 / (1 + e^-x), from e = e^-|x| so that nothing overflows; NaN stays NaN.
template <typename T>
void sigmoid_forward(const T* x, T* y, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const T e = exp_vec(-std::fabs(x[i]));
    const T positive = T(1) / (T(1) + e), negative = e / (T(1) + e);
    y[i] = __builtin_isgreaterequal(x[i], T(0)) ? positive : negative;
  }
}

// dx = dy * y (1 - y)
template <typename T>
void sigmoid_backward(const T* y, const T* dy, T* dx, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (y[i] * (T(1) - y[i]));
}

template <typename T>
void tanh_forward(const T* x, T* y, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(tanh_vec(x[i]));
}

// dx = dy * (1 - y^2)
template <typename T>
void tanh_backward(const T* y, const T* dy, T* dx, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (T(1) - y[i] * y[i]);
}

// y = x where x >= 0, slope * x elsewhere (NaN: slope * NaN, still NaN).
template <typename T>
void leaky_relu_forward(const T* x, T* y, std::int64_t n, T slope) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const T scaled = slope * x[i];
    y[i] = __builtin_isgreaterequal(x[i], T(0)) ? x[i] : scaled;
  }
}

// dx = dy where x >= 0, slope * dy elsewhere.
template <typename T>
void leaky_relu_backward(const T* x, const T* dy, T* dx, std::int64_t n, T slope) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const T scaled = dy[i] * slope;
    dx[i] = __builtin_isgreaterequal(x[i], T(0)) ? dy[i] : scaled;
  }
}

}  // namespace meta
