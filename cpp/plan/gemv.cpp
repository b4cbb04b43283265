// A product of a few rows by a weight stored as (N, K) rows (Gemm with transB, PyTorch's
// Linear): y[m, n] = act(sum_k x[m, k] * w[n, k] + bias[n]) for M <= 4 rows. At batch 1 such a
// product is one pass over the weight and nothing else: oneDNN's brgemm matmul copies the
// transposed weight into its blocks on every call (MobileNetV3's 576 x 1024 head: 125 us at
// 1 thread, onnxruntime's pre-packed Gemm 80 us, this kernel ~45 us, the time to read 2.4 MB).
// Four weight rows at a time, each row's dot products with every x row in vector registers,
// summed across the register at the end; AVX-512 or AVX2 where the CPU has them (chosen at
// run time: the extension is built for any x86-64), else a scalar loop. The activation after
// it (ReLU, LeakyRelu, HardSigmoid, HardSwish, Clip; oneDNN's names and alpha/beta) is applied
// to each output as it is written.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

namespace {

constexpr int kMaxRows = 4;

enum class Post { none, relu, hardsigmoid, hardswish, clip };

Post post_of(const std::string& name) {
  if (name.empty()) return Post::none;
  if (name == "relu") return Post::relu;
  if (name == "hardsigmoid") return Post::hardsigmoid;
  if (name == "hardswish") return Post::hardswish;
  if (name == "clip") return Post::clip;
  throw std::invalid_argument("meta._plan.gemv: no activation '" + name + "'");
}

struct Args {
  std::int64_t m, k, n;
  const float* x;
  const float* w;
  const float* bias;  // nullptr: none
  float* y;
  Post post;
  float alpha, beta;
};

inline float finish(const Args& a, float v, std::int64_t j) {
  if (a.bias) v += a.bias[j];
  switch (a.post) {
    case Post::none:
      return v;
    case Post::relu:
      return v > 0.f ? v : v * a.alpha;
    case Post::hardsigmoid:
      return std::max(0.f, std::min(1.f, a.alpha * v + a.beta));
    case Post::hardswish:
      return v * std::max(0.f, std::min(1.f, a.alpha * v + a.beta));
    case Post::clip:
      return std::max(a.alpha, std::min(a.beta, v));
  }
  return v;
}

// Rows [n0, n1) of the output, one weight row at a time (the tails and the scalar path).
void rows_scalar(const Args& a, std::int64_t n0, std::int64_t n1) {
  for (std::int64_t j = n0; j < n1; ++j) {
    const float* w = a.w + j * a.k;
    for (std::int64_t r = 0; r < a.m; ++r) {
      const float* x = a.x + r * a.k;
      float s = 0.f;
      for (std::int64_t i = 0; i < a.k; ++i) s += x[i] * w[i];
      a.y[r * a.n + j] = finish(a, s, j);
    }
  }
}

#define META_GEMV_AVX512 __attribute__((target("avx512f")))
#define META_GEMV_AVX2 __attribute__((target("avx2,fma")))

// M (the rows of x) a template argument: the accumulators stay in registers
template <int M>
META_GEMV_AVX512 void rows_avx512_m(const Args& a, std::int64_t n0, std::int64_t n1) {
  const std::int64_t k = a.k, full = k / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (k - full)) - 1u);
  std::int64_t j = n0;
  for (; j + 4 <= n1; j += 4) {
    __m512 acc[M][4];
    for (int r = 0; r < M; ++r)
      for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
    const float* w = a.w + j * k;
    for (std::int64_t i = 0; i < k; i += 16) {
      const __mmask16 mask = i < full ? static_cast<__mmask16>(0xFFFF) : tail;
      const __m512 w0 = _mm512_maskz_loadu_ps(mask, w + i),
                   w1 = _mm512_maskz_loadu_ps(mask, w + k + i),
                   w2 = _mm512_maskz_loadu_ps(mask, w + 2 * k + i),
                   w3 = _mm512_maskz_loadu_ps(mask, w + 3 * k + i);
      for (int r = 0; r < M; ++r) {
        const __m512 xv = _mm512_maskz_loadu_ps(mask, a.x + r * k + i);
        acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(xv, w2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(xv, w3, acc[r][3]);
      }
    }
    for (int r = 0; r < M; ++r)
      for (int q = 0; q < 4; ++q)
        a.y[r * a.n + j + q] = finish(a, _mm512_reduce_add_ps(acc[r][q]), j + q);
  }
  rows_scalar(a, j, n1);
}

void rows_avx512(const Args& a, std::int64_t n0, std::int64_t n1) {
  switch (a.m) {
    case 1: return rows_avx512_m<1>(a, n0, n1);
    case 2: return rows_avx512_m<2>(a, n0, n1);
    case 3: return rows_avx512_m<3>(a, n0, n1);
    default: return rows_avx512_m<4>(a, n0, n1);
  }
}

META_GEMV_AVX2 inline float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

template <int M>
META_GEMV_AVX2 void rows_avx2_m(const Args& a, std::int64_t n0, std::int64_t n1) {
  const std::int64_t k = a.k, full = k / 8 * 8;
  std::int64_t j = n0;
  for (; j + 4 <= n1; j += 4) {
    __m256 acc[M][4];
    for (int r = 0; r < M; ++r)
      for (int q = 0; q < 4; ++q) acc[r][q] = _mm256_setzero_ps();
    const float* w = a.w + j * k;
    for (std::int64_t i = 0; i < full; i += 8) {
      const __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + k + i),
                   w2 = _mm256_loadu_ps(w + 2 * k + i), w3 = _mm256_loadu_ps(w + 3 * k + i);
      for (int r = 0; r < M; ++r) {
        const __m256 xv = _mm256_loadu_ps(a.x + r * k + i);
        acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
        acc[r][2] = _mm256_fmadd_ps(xv, w2, acc[r][2]);
        acc[r][3] = _mm256_fmadd_ps(xv, w3, acc[r][3]);
      }
    }
    for (int r = 0; r < M; ++r)
      for (int q = 0; q < 4; ++q) {
        float s = hsum256(acc[r][q]);
        const float* x = a.x + r * k;
        for (std::int64_t i = full; i < k; ++i) s += x[i] * w[q * k + i];
        a.y[r * a.n + j + q] = finish(a, s, j + q);
      }
  }
  rows_scalar(a, j, n1);
}

void rows_avx2(const Args& a, std::int64_t n0, std::int64_t n1) {
  switch (a.m) {
    case 1: return rows_avx2_m<1>(a, n0, n1);
    case 2: return rows_avx2_m<2>(a, n0, n1);
    case 3: return rows_avx2_m<3>(a, n0, n1);
    default: return rows_avx2_m<4>(a, n0, n1);
  }
}

using Rows = void (*)(const Args&, std::int64_t, std::int64_t);

Rows pick() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return rows_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return rows_avx2;
  return rows_scalar;
}

void run_gemv(const Args& a) {
  static const Rows rows = pick();
  // blocks of 64 output rows per thread where the weight is large enough to split
  constexpr std::int64_t kBlock = 64;
  const std::int64_t blocks = (a.n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (a.n * a.k > (1 << 18))
  for (std::int64_t b = 0; b < blocks; ++b)
    rows(a, b * kBlock, std::min(a.n, (b + 1) * kBlock));
}

StepPtr gemv(std::int64_t m, std::int64_t k, std::int64_t n, const py::array& x,
             const py::array& w, std::optional<py::array> bias, const py::array& y,
             const std::string& post, float alpha, float beta) {
  if (m < 1 || m > kMaxRows || k < 1 || n < 1)
    throw std::invalid_argument("meta._plan.gemv: needs 1 to 4 rows and K, N >= 1");
  for (const py::array* a : {&x, &w, &y})
    if (a->itemsize() != 4 || a->dtype().kind() != 'f')
      throw std::invalid_argument("meta._plan.gemv: operands must be float32");
  Args a{m, k, n,
         static_cast<const float*>(address(x, m * k * 4, "gemv x")),
         static_cast<const float*>(address(w, n * k * 4, "gemv weight")),
         bias ? static_cast<const float*>(address(*bias, n * 4, "gemv bias")) : nullptr,
         static_cast<float*>(address(y, m * n * 4, "gemv output")),
         post_of(post), alpha, beta};
  if (bias && (bias->itemsize() != 4 || bias->dtype().kind() != 'f'))
    throw std::invalid_argument("meta._plan.gemv: the bias must be float32");
  return std::make_shared<LambdaStep>("gemv", [a] { run_gemv(a); });
}

}  // namespace

void bind_gemv(py::module_& m) {
  m.def("gemv", &gemv, py::arg("m"), py::arg("k"), py::arg("n"), py::arg("x"), py::arg("w"),
        py::arg("bias"), py::arg("y"), py::arg("post") = "", py::arg("alpha") = 0.f,
        py::arg("beta") = 0.f,
        "y = act(x . w^T + bias) for 1 to 4 rows of x (M, K) and a weight w (N, K): one pass "
        "over the weight (inference plans' batch-1 Linear layers).");
  m.attr("gemv_max_rows") = kMaxRows;
}

}  // namespace meta::plan
