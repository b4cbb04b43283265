// Attention's softmax in a plan (our loops): softmax(x * scale + mask) over the last axis of
// (heads, queries, keys) scores in one pass per row, and its backward times the scale, for
// the fused attention node (meta/lv1/plan/lowering/attention.py). oneDNN's softmax needs the
// scale and the mask as two more passes over the scores and spends most of its time in exp;
// under a causal mask (query i sees keys 0..i) half of each row is a known 0, so these loops
// only touch the keys a query sees and write the zeros, which halves the exps. In a bf16 plan
// each also writes its output's bf16 copy (the products after it read that): rounded once per
// row while it is in cache, into the plan's arena, instead of each product converting its
// block into the process-wide staging buffer (1 MiB resident at the GPT's sequence 256).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "plan.hpp"

namespace meta::plan {

void round_to_bf16(const float* x, std::uint16_t* y, std::int64_t n);  // eltwise.cpp

namespace {

// exp(v) >= 2^-126 only above this: below it the probability is written as 0
constexpr float kExpLow = -87.3f;

// One row: y[j] = softmax(x * scale + mask)[j] over j < n (the keys this query sees), 0 for
// n <= j < k. `mask` may be null.
void softmax_row_scalar(const float* x, const float* mask, float* y, int n, int k,
                        float scale) {
  float top = -INFINITY;
  for (int j = 0; j < n; ++j) {
    y[j] = x[j] * scale + (mask ? mask[j] : 0.f);
    top = std::max(top, y[j]);
  }
  float sum = 0.f;
  for (int j = 0; j < n; ++j) {
    const float v = y[j] - top;
    y[j] = v < kExpLow ? 0.f : std::exp(v);
    sum += y[j];
  }
  const float inv = 1.f / sum;
  for (int j = 0; j < n; ++j) y[j] *= inv;
  for (int j = n; j < k; ++j) y[j] = 0.f;
}

// dx[j] = scale * p[j] * (dp[j] - sum_i p[i] dp[i]) over j < n, 0 for n <= j < k.
void softmax_backward_row_scalar(const float* p, const float* dp, float* dx, int n, int k,
                                 float scale) {
  float dot = 0.f;
  for (int j = 0; j < n; ++j) dot += p[j] * dp[j];
  for (int j = 0; j < n; ++j) dx[j] = scale * p[j] * (dp[j] - dot);
  for (int j = n; j < k; ++j) dx[j] = 0.f;
}

#if defined(__x86_64__)
#define META_AVX2 __attribute__((target("avx2,fma")))

// Lanes j < left of 8 (the tail of a row) as an all-ones mask.
META_AVX2 inline __m256i tail_mask(int left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane);
}

META_AVX2 inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

META_AVX2 inline float hsum(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// exp(v) for v <= 0 (a score less the row's max), 0 below kExpLow: 2^n times a degree-6
// polynomial on [-ln2/2, ln2/2] (Cephes' expf coefficients), relative error ~1e-7.
META_AVX2 inline __m256 exp_nonpositive(__m256 v) {
  const __m256 keep = _mm256_cmp_ps(v, _mm256_set1_ps(kExpLow), _CMP_GE_OQ);
  v = _mm256_max_ps(v, _mm256_set1_ps(kExpLow));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), v);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

// Vectors of 8 cover keys [0, vec_end(n, k)): up to n rounded up to 8 where the row has room
// (lanes past n are read, treated as masked, and written as 0), the rest one by one. AMD's
// masked stores are microcoded and slow, so no maskstore.
inline int vec_end(int n, int k) { return std::min((n + 7) & ~7, k & ~7); }

META_AVX2 void softmax_row_avx2(const float* x, const float* mask, float* y, int n, int k,
                                float scale) {
  const int nv = vec_end(n, k);
  const __m256 s = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
  __m256 top = ninf;
  for (int j = 0; j < nv; j += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j), s);
    if (mask) v = _mm256_add_ps(v, _mm256_loadu_ps(mask + j));
    v = _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(tail_mask(n - j)));
    _mm256_storeu_ps(y + j, v);
    top = _mm256_max_ps(top, v);
  }
  float most = hmax(top);
  for (int j = nv; j < n; ++j) {
    y[j] = x[j] * scale + (mask ? mask[j] : 0.f);
    most = std::max(most, y[j]);
  }
  const __m256 m = _mm256_set1_ps(most);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < nv; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(y + j), m));
    _mm256_storeu_ps(y + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum(sum);
  for (int j = nv; j < n; ++j) {
    const float v = y[j] - most;
    y[j] = v < kExpLow ? 0.f : std::exp(v);
    total += y[j];
  }
  const float inv_s = 1.f / total;
  const __m256 inv = _mm256_set1_ps(inv_s);
  for (int j = 0; j < nv; j += 8)
    _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), inv));
  for (int j = nv; j < n; ++j) y[j] *= inv_s;
  for (int j = std::max(n, nv); j < k; ++j) y[j] = 0.f;
}

META_AVX2 void softmax_backward_row_avx2(const float* p, const float* dp, float* dx, int n,
                                         int k, float scale) {
  const int nv = vec_end(n, k);
  __m256 dot = _mm256_setzero_ps();
  for (int j = 0; j < nv; j += 8) {
    const __m256 pj = _mm256_and_ps(_mm256_loadu_ps(p + j),
                                    _mm256_castsi256_ps(tail_mask(n - j)));
    dot = _mm256_fmadd_ps(pj, _mm256_loadu_ps(dp + j), dot);
  }
  float total = hsum(dot);
  for (int j = nv; j < n; ++j) total += p[j] * dp[j];
  const __m256 d = _mm256_set1_ps(total), s = _mm256_set1_ps(scale);
  for (int j = 0; j < nv; j += 8) {
    const __m256 pj = _mm256_and_ps(_mm256_loadu_ps(p + j),
                                    _mm256_castsi256_ps(tail_mask(n - j)));
    const __m256 g = _mm256_sub_ps(_mm256_loadu_ps(dp + j), d);
    _mm256_storeu_ps(dx + j, _mm256_mul_ps(_mm256_mul_ps(pj, s), g));
  }
  for (int j = nv; j < n; ++j) dx[j] = scale * p[j] * (dp[j] - total);
  for (int j = std::max(n, nv); j < k; ++j) dx[j] = 0.f;
}

bool has_avx2() {
  __builtin_cpu_init();  // this may run before the library's own constructors
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const bool kAvx2 = has_avx2();
#else
const bool kAvx2 = false;
#endif

struct Rows {
  std::int64_t heads, queries, keys;
};

// The bf16 copy of one row of k (a bf16 plan's products read the probabilities and their
// gradient in bf16): rounded to nearest even, as oneDNN's reorder rounds, by eltwise.cpp's
// sixteen-lane rounding (the same bits as to_bf16). The compiler's vectorisation of the
// element loop (baseline SSE2 here) made a bf16 plan's softmax and its backward twice
// float32's: 220 against 99 us a layer forward, the same backward (transformer, 1 thread).
inline void row_to_bf16(const float* y, Half* y16, int k) { round_to_bf16(y, y16, k); }

// The bf16 array of n elements a kernel also writes, or null when none is given.
Half* bf16_copy(const std::optional<py::array>& a, std::int64_t n, const char* what) {
  if (!a) return nullptr;
  if (a->itemsize() != 2)
    throw std::invalid_argument(std::string("meta._plan: ") + what + " is not bf16");
  return static_cast<Half*>(address(*a, n * 2, what));
}

Rows rows_of(const Dims& dims) {
  if (dims.size() != 3 || dims[0] < 1 || dims[1] < 1 || dims[2] < 1)
    throw std::invalid_argument("meta._plan.attention_softmax: dims must be (heads, queries, "
                                "keys), all >= 1");
  return {dims[0], dims[1], dims[2]};
}

// Keys query i of `queries` sees: all, or (causal) those up to the diagonal, the block's last
// query seeing the last key (a row block ending at the last key of a causal square).
inline int seen(bool causal, std::int64_t i, const Rows& r) {
  return causal ? int(r.keys - r.queries + i + 1) : int(r.keys);
}

StepPtr attention_softmax(const Dims& dims, float scale, std::optional<py::array> mask,
                          bool causal, const py::array& x, const py::array& y,
                          std::optional<py::array> y16) {
  const Rows r = rows_of(dims);
  if (causal && r.queries > r.keys)
    throw std::invalid_argument("meta._plan.attention_softmax: causal needs queries <= keys");
  const std::int64_t n = r.heads * r.queries * r.keys;
  const float* px = static_cast<const float*>(address(x, n * 4, "attention scores"));
  float* py_ = static_cast<float*>(address(y, n * 4, "attention probabilities"));
  const float* pm = mask ? static_cast<const float*>(
                               address(*mask, r.queries * r.keys * 4, "attention mask"))
                         : nullptr;
  Half* p16 = bf16_copy(y16, n, "attention probabilities' bf16 copy");
  return std::make_shared<LambdaStep>("attention softmax", [=] {
    const std::int64_t rows = r.heads * r.queries;
#pragma omp parallel for schedule(static) if (n > (1 << 15))
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t i = row % r.queries;
      const float* m = pm ? pm + i * r.keys : nullptr;
      const std::int64_t at = row * r.keys;
#if defined(__x86_64__)
      if (kAvx2)
        softmax_row_avx2(px + at, m, py_ + at, seen(causal, i, r), int(r.keys), scale);
      else
#endif
        softmax_row_scalar(px + at, m, py_ + at, seen(causal, i, r), int(r.keys), scale);
      if (p16) row_to_bf16(py_ + at, p16 + at, int(r.keys));
    }
  });
}

StepPtr attention_softmax_backward(const Dims& dims, float scale, bool causal,
                                   const py::array& p, const py::array& dp,
                                   const py::array& dx, std::optional<py::array> dx16) {
  const Rows r = rows_of(dims);
  if (causal && r.queries > r.keys)
    throw std::invalid_argument("meta._plan.attention_softmax_backward: causal needs "
                                "queries <= keys");
  const std::int64_t n = r.heads * r.queries * r.keys;
  const float* pp = static_cast<const float*>(address(p, n * 4, "attention probabilities"));
  const float* pdp = static_cast<const float*>(address(dp, n * 4, "attention dprobabilities"));
  float* pdx = static_cast<float*>(address(dx, n * 4, "attention dscores"));
  Half* d16 = bf16_copy(dx16, n, "attention dscores' bf16 copy");
  return std::make_shared<LambdaStep>("attention softmax backward", [=] {
    const std::int64_t rows = r.heads * r.queries;
#pragma omp parallel for schedule(static) if (n > (1 << 15))
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t i = row % r.queries, at = row * r.keys;
#if defined(__x86_64__)
      if (kAvx2)
        softmax_backward_row_avx2(pp + at, pdp + at, pdx + at, seen(causal, i, r),
                                  int(r.keys), scale);
      else
#endif
        softmax_backward_row_scalar(pp + at, pdp + at, pdx + at, seen(causal, i, r),
                                    int(r.keys), scale);
      if (d16) row_to_bf16(pdx + at, d16 + at, int(r.keys));
    }
  });
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def("attention_softmax", &attention_softmax, py::arg("dims"), py::arg("scale"),
        py::arg("mask"), py::arg("causal"), py::arg("x"), py::arg("y"),
        py::arg("y16") = py::none(),
        "y = softmax(x * scale + mask) over the last axis of (heads, queries, keys); causal: "
        "query i sees keys up to keys - queries + i only, the rest of its row is 0. y16: "
        "also y's bf16 copy there (a bf16 plan's products read it).");
  m.def("attention_softmax_backward", &attention_softmax_backward, py::arg("dims"),
        py::arg("scale"), py::arg("causal"), py::arg("p"), py::arg("dp"), py::arg("dx"),
        py::arg("dx16") = py::none(),
        "dx = scale * p * (dp - sum(p * dp)) over the keys each query sees, 0 beyond; dx16: "
        "also dx's bf16 copy there.");
}

}  // namespace meta::plan
