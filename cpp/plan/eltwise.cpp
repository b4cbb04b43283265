// Elementwise kernels of a plan: unary activations (oneDNN eltwise, forward and backward),
// binary ops with broadcasting of the second input, sums of n inputs and reductions by sum
// (what the backward of a broadcast needs).
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "meta/activations.hpp"
#include <cstring>

#include "plan.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace meta::plan {

namespace {

struct EltwiseName {
  const char* name;
  dnnl::algorithm forward;
  dnnl::algorithm with_dst;  // the backward that reads y instead of x; undef if none
};

const EltwiseName kEltwise[] = {
    {"relu", dnnl::algorithm::eltwise_relu, dnnl::algorithm::eltwise_relu_use_dst_for_bwd},
    {"clip", dnnl::algorithm::eltwise_clip_v2,
     dnnl::algorithm::eltwise_clip_v2_use_dst_for_bwd},
    {"logistic", dnnl::algorithm::eltwise_logistic,
     dnnl::algorithm::eltwise_logistic_use_dst_for_bwd},
    {"tanh", dnnl::algorithm::eltwise_tanh, dnnl::algorithm::eltwise_tanh_use_dst_for_bwd},
    {"elu", dnnl::algorithm::eltwise_elu, dnnl::algorithm::eltwise_elu_use_dst_for_bwd},
    {"exp", dnnl::algorithm::eltwise_exp, dnnl::algorithm::eltwise_exp_use_dst_for_bwd},
    {"sqrt", dnnl::algorithm::eltwise_sqrt, dnnl::algorithm::eltwise_sqrt_use_dst_for_bwd},
    {"gelu_erf", dnnl::algorithm::eltwise_gelu_erf, dnnl::algorithm::undef},
    {"gelu_tanh", dnnl::algorithm::eltwise_gelu_tanh, dnnl::algorithm::undef},
    {"log", dnnl::algorithm::eltwise_log, dnnl::algorithm::undef},
    {"abs", dnnl::algorithm::eltwise_abs, dnnl::algorithm::undef},
    {"soft_relu", dnnl::algorithm::eltwise_soft_relu, dnnl::algorithm::undef},
    {"hardsigmoid", dnnl::algorithm::eltwise_hardsigmoid, dnnl::algorithm::undef},
    {"hardswish", dnnl::algorithm::eltwise_hardswish, dnnl::algorithm::undef},
    {"mish", dnnl::algorithm::eltwise_mish, dnnl::algorithm::undef},
    {"swish", dnnl::algorithm::eltwise_swish, dnnl::algorithm::undef},
    {"square", dnnl::algorithm::eltwise_square, dnnl::algorithm::undef},
    {"linear", dnnl::algorithm::eltwise_linear, dnnl::algorithm::undef},
    {"round", dnnl::algorithm::eltwise_round, dnnl::algorithm::undef},
    {"pow", dnnl::algorithm::eltwise_pow, dnnl::algorithm::undef},
};

const EltwiseName& find(const std::string& name) {
  for (const auto& e : kEltwise)
    if (name == e.name) return e;
  throw std::invalid_argument("meta._plan: unknown eltwise algorithm '" + name + "'");
}

dnnl::algorithm binary_algorithm(const std::string& name) {
  if (name == "add") return dnnl::algorithm::binary_add;
  if (name == "sub") return dnnl::algorithm::binary_sub;
  if (name == "mul") return dnnl::algorithm::binary_mul;
  if (name == "div") return dnnl::algorithm::binary_div;
  if (name == "max") return dnnl::algorithm::binary_max;
  if (name == "min") return dnnl::algorithm::binary_min;
  throw std::invalid_argument("meta._plan: unknown binary algorithm '" + name + "'");
}

dnnl::eltwise_forward::primitive_desc eltwise_pd(const memory::desc& md, dnnl::algorithm alg,
                                                 float alpha, float beta) {
  return dnnl::eltwise_forward::primitive_desc(engine(), dnnl::prop_kind::forward_training,
                                               alg, md, md, alpha, beta, scratch_attr());
}

StepPtr eltwise_forward(const Dims& dims, const std::string& layout, const std::string& name,
                        float alpha, float beta, const py::array& x, const py::array& y) {
  const memory::desc md = make_md(dims, layout);
  const auto& e = find(name);
  // the use_dst form computes the same forward; using it lets backward read y
  const dnnl::algorithm alg =
      e.with_dst != dnnl::algorithm::undef && eltwise_has_dst_form(name, alpha) ? e.with_dst
                                                                               : e.forward;
  auto pd = eltwise_pd(md, alg, alpha, beta);
  return primitive_step(std::string("eltwise ") + name, dnnl::eltwise_forward(pd),
                        {{DNNL_ARG_SRC, bind(md, x, "eltwise input")},
                         {DNNL_ARG_DST, bind(md, y, "eltwise output")}},
                        pd.scratchpad_desc());
}

// dx = dy * f'(saved), where saved is y for the use_dst forms (use_dst) and x otherwise.
StepPtr eltwise_backward(const Dims& dims, const std::string& layout, const std::string& name,
                         float alpha, float beta, bool use_dst, const py::array& saved,
                         const py::array& dy, const py::array& dx) {
  const memory::desc md = make_md(dims, layout);
  const auto& e = find(name);
  if (use_dst && !eltwise_has_dst_form(name, alpha))
    throw std::invalid_argument("meta._plan: eltwise '" + name + "' has no backward from y");
  const dnnl::algorithm alg = use_dst ? e.with_dst : e.forward;
  auto hint = eltwise_pd(md, alg, alpha, beta);
  auto pd = dnnl::eltwise_backward::primitive_desc(engine(), alg, md, md, md, alpha, beta, hint,
                                                   scratch_attr());
  return primitive_step(std::string("eltwise backward ") + name, dnnl::eltwise_backward(pd),
                        {{use_dst ? DNNL_ARG_DST : DNNL_ARG_SRC, bind(md, saved, "eltwise saved")},
                         {DNNL_ARG_DIFF_DST, bind(md, dy, "eltwise dy")},
                         {DNNL_ARG_DIFF_SRC, bind(md, dx, "eltwise dx")}},
                        pd.scratchpad_desc());
}

// y = a (op) b, y of a's dims; b's dims equal a's or are 1 where it broadcasts. Then the
// post-ops in order: ("eltwise", name, alpha, beta) an activation, ("binary", alg) another
// broadcast operand from `post_args` (its dims in `post_dims`).
using PostOp = std::tuple<std::string, std::string, float, float>;

StepPtr binary(const Dims& dims_a, const Dims& dims_b, const std::string& layout_a,
               const std::string& layout_b, const std::string& name, const py::array& a,
               const py::array& b, const py::array& y, const std::vector<PostOp>& post,
               const std::vector<py::array>& post_args, const std::vector<Dims>& post_dims) {
  const memory::desc ma = make_md(dims_a, layout_a), mb = make_md(dims_b, layout_b);
  dnnl::primitive_attr attr = scratch_attr();
  dnnl::post_ops po;
  std::vector<memory::desc> post_mds;
  for (const auto& [kind, alg, alpha, beta] : post) {
    if (kind == "eltwise") {
      po.append_eltwise(find(alg).forward, alpha, beta);
    } else if (kind == "binary") {
      if (post_mds.size() >= post_dims.size())
        throw std::invalid_argument("meta._plan.binary: a binary post-op without dims");
      post_mds.push_back(make_md(post_dims[post_mds.size()], "plain"));
      po.append_binary(binary_algorithm(alg), post_mds.back());
    } else {
      throw std::invalid_argument("meta._plan.binary: unknown post-op " + kind);
    }
  }
  attr.set_post_ops(po);
  auto pd = dnnl::binary::primitive_desc(engine(), binary_algorithm(name), ma, mb, ma, attr);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC_0, bind(ma, a, "binary a")},
                                       {DNNL_ARG_SRC_1, bind(mb, b, "binary b")},
                                       {DNNL_ARG_DST, bind(ma, y, "binary output")}};
  for (std::size_t i = 0, k = 0; i < post.size(); ++i) {
    if (std::get<0>(post[i]) != "binary") continue;
    if (k >= post_args.size())
      throw std::invalid_argument("meta._plan.binary: a binary post-op without its operand");
    args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(int(i)) | DNNL_ARG_SRC_1] =
        bind(post_mds[k], post_args[k], "binary post-op operand");
    ++k;
  }
  return primitive_step("binary " + name, dnnl::binary(pd), std::move(args),
                        pd.scratchpad_desc());
}

// The per-channel scale and shift of an eval-mode BatchNormalization followed by per-channel
// multiplications ("mul") and additions ("add") by the vectors given (densenet's layout).
StepPtr affine_fold(const py::array& gamma, const py::array& beta, const py::array& mean,
                    const py::array& var, float eps,
                    const std::vector<std::pair<std::string, py::array>>& then,
                    const py::array& scale, const py::array& shift, std::int64_t c) {
  const float* g = static_cast<const float*>(address(gamma, c * 4, "scale"));
  const float* b = static_cast<const float*>(address(beta, c * 4, "B"));
  const float* mu = static_cast<const float*>(address(mean, c * 4, "mean"));
  const float* v = static_cast<const float*>(address(var, c * 4, "var"));
  float* s = static_cast<float*>(address(scale, c * 4, "folded scale"));
  float* t = static_cast<float*>(address(shift, c * 4, "folded shift"));
  std::vector<std::pair<bool, const float*>> ops;
  for (const auto& [kind, array] : then)
    ops.emplace_back(kind == "mul", static_cast<const float*>(address(array, c * 4, kind.c_str())));
  return std::make_shared<LambdaStep>("batchnorm fold", [=] {
    for (std::int64_t i = 0; i < c; ++i) {
      float si = g[i] / std::sqrt(v[i] + eps), ti = b[i] - mu[i] * si;
      for (const auto& [mul, p] : ops) {
        if (mul) {
          si *= p[i];
          ti *= p[i];
        } else {
          ti += p[i];
        }
      }
      s[i] = si;
      t[i] = ti;
    }
  });
}

// y = sum_i scales[i] * xs[i], all of one dims and layout.
StepPtr sum(const Dims& dims, const std::string& layout, const std::vector<float>& scales,
            const std::vector<py::array>& xs, const py::array& y) {
  const memory::desc md = make_md(dims, layout);
  std::vector<memory::desc> mds(xs.size(), md);
  auto pd = dnnl::sum::primitive_desc(engine(), md, scales, mds, scratch_attr());
  std::unordered_map<int, memory> args{{DNNL_ARG_DST, bind(md, y, "sum output")}};
  for (std::size_t i = 0; i < xs.size(); ++i)
    args[DNNL_ARG_MULTIPLE_SRC + int(i)] = bind(md, xs[i], "sum input");
  return primitive_step("sum", dnnl::sum(pd), std::move(args), pd.scratchpad_desc());
}

// y (dims_y, 1 where reduced) = sum of x over the reduced dims.
StepPtr reduce_sum(const Dims& dims_x, const Dims& dims_y, const std::string& layout_x,
                   const py::array& x, const py::array& y) {
  const memory::desc mx = make_md(dims_x, layout_x), my = make_md(dims_y, "plain");
  auto pd = dnnl::reduction::primitive_desc(engine(), dnnl::algorithm::reduction_sum, mx, my,
                                            0.f, 0.f, scratch_attr());
  return primitive_step("reduce sum", dnnl::reduction(pd),
                        {{DNNL_ARG_SRC, bind(mx, x, "reduction input")},
                         {DNNL_ARG_DST, bind(my, y, "reduction output")}},
                        pd.scratchpad_desc());
}

// bf16 elements: to_bf16, from_bf16, widen and put (plan.hpp).

// y[j] (+)= sum_i x[i, j] for x (rows, cols) of float32 or bf16 elements (a gradient kept
// in bf16 is summed in float32), in blocks of columns.
template <typename T>
void column_sum_loop(std::int64_t rows, std::int64_t cols, const T* px, float* py_,
                     bool accumulate) {
  constexpr std::int64_t kBlock = 256;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 18))
  for (std::int64_t j0 = 0; j0 < cols; j0 += kBlock) {
    const std::int64_t j1 = std::min(cols, j0 + kBlock);
    float acc[kBlock];
    for (std::int64_t j = j0; j < j1; ++j) acc[j - j0] = accumulate ? py_[j] : 0.f;
    for (std::int64_t i = 0; i < rows; ++i) {
      const T* row = px + i * cols;
#pragma omp simd
      for (std::int64_t j = j0; j < j1; ++j) acc[j - j0] += widen(row[j]);
    }
    for (std::int64_t j = j0; j < j1; ++j) py_[j] = acc[j - j0];
  }
}

// Rows a partial column sum adds up (ColumnSum): a bias gradient's 1024 x 128 is 8 parts.
constexpr std::int64_t kSumRows = 128;

// y[j] (+)= sum_i x[i, j] over many rows: partial sums of kSumRows rows each (parts and
// column blocks on the plan's threads), then the parts added in order. A bias gradient has
// few columns (128: one block), so the column blocks alone left the second thread idle
// (the transformer's ten bias gradients: 0.175 ms at 1 thread, 0.178 at 2). The parts are
// fixed by the shape, so the sum is the same at any thread count.
template <typename T>
struct ColumnSum {
  std::int64_t rows, cols;
  const T* x;
  float* y;
  bool accumulate;
  std::shared_ptr<std::vector<float>> parts;  // (parts, cols), the step's own

  void operator()() const {
    constexpr std::int64_t kBlock = 256;
    const std::int64_t count = (rows + kSumRows - 1) / kSumRows;
    const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
    float* part = parts->data();
#pragma omp parallel
    {
#pragma omp for schedule(static)
      for (std::int64_t t = 0; t < count * blocks; ++t) {
        const std::int64_t p = t / blocks, j0 = t % blocks * kBlock;
        const std::int64_t j1 = std::min(cols, j0 + kBlock), i1 = std::min(rows, (p + 1) * kSumRows);
        float acc[kBlock] = {};
        for (std::int64_t i = p * kSumRows; i < i1; ++i) {
          const T* row = x + i * cols;
#pragma omp simd
          for (std::int64_t j = j0; j < j1; ++j) acc[j - j0] += widen(row[j]);
        }
        std::memcpy(part + p * cols + j0, acc, std::size_t(j1 - j0) * 4);
      }
#pragma omp for schedule(static)
      for (std::int64_t j = 0; j < cols; ++j) {
        float total = accumulate ? y[j] : 0.f;
        for (std::int64_t p = 0; p < count; ++p) total += part[p * cols + j];
        y[j] = total;
      }
    }
  }
};

// A column sum's loop: in parts (ColumnSum) when there are rows for several and enough
// elements to share, else one pass over the column blocks.
template <typename T>
StepPtr column_sum_of(const char* name, std::int64_t rows, std::int64_t cols, const T* px,
                      float* py_, bool accumulate) {
  if (rows >= 4 * kSumRows && rows * cols >= (1 << 16)) {
    auto parts = std::make_shared<std::vector<float>>(
        std::size_t((rows + kSumRows - 1) / kSumRows * cols));
    return std::make_shared<LambdaStep>(name,
                                        ColumnSum<T>{rows, cols, px, py_, accumulate, parts});
  }
  return std::make_shared<LambdaStep>(name, [=] {
    column_sum_loop(rows, cols, px, py_, accumulate);
  });
}

// y[j] (+)= sum_i x[i, j] for x (rows, cols): a bias's gradient, or a per-channel one of a
// channels-last tensor (rows = N*H*W). oneDNN's reduction ran 1.2 ms on (128, 512) here; this
// loop runs 10 us.
StepPtr column_sum(std::int64_t rows, std::int64_t cols, const py::array& x, const py::array& y,
                   bool accumulate) {
  float* py_ = static_cast<float*>(address(y, cols * 4, "sum output"));
  if (x.itemsize() == 2) {  // a gradient kept in bf16 (mixed precision): summed in float32
    const auto* px = static_cast<const std::uint16_t*>(address(x, rows * cols * 2, "sum input"));
    return column_sum_of("column sum bf16", rows, cols, px, py_, accumulate);
  }
  const float* px = static_cast<const float*>(address(x, rows * cols * 4, "sum input"));
  return column_sum_of("column sum", rows, cols, px, py_, accumulate);
}

// y[c] = sum over n and the plane of x (N, C, plane): a per-channel gradient of a plain tensor.
StepPtr channel_sum(std::int64_t n, std::int64_t c, std::int64_t plane, const py::array& x,
                    const py::array& y) {
  const float* px = static_cast<const float*>(address(x, n * c * plane * 4, "sum input"));
  float* py_ = static_cast<float*>(address(y, c * 4, "sum output"));
  return std::make_shared<LambdaStep>("channel sum", [=] {
#pragma omp parallel for schedule(static) if (n * c * plane > (1 << 18))
    for (std::int64_t k = 0; k < c; ++k) {
      double acc = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const float* p = px + (i * c + k) * plane;
        float part = 0;
#pragma omp simd reduction(+ : part)
        for (std::int64_t j = 0; j < plane; ++j) part += p[j];
        acc += part;
      }
      py_[k] = float(acc);
    }
  });
}

// y (outer, inner) = scale * sum over mid of x (outer, mid, inner): ReduceSum / ReduceMean
// over a run of adjacent axes. Over the last axes (inner 1: RMSNorm's mean of squares, a
// squeeze-excite's pooling) each row is summed in a local accumulator: the general loop's
// out[0] += row[m] per element is a chain through memory, 34x slower there. Rows of
// kLaneSum elements or more (a hidden width) are summed in vector lanes; shorter ones (a CNN's
// global pooling over 8x8) in order, the same bits as before: as for loss.cpp's classes, a
// ReLU network's trajectory is not continuous in the last bit (the BatchNorm precision
// test's CNN, which pools so, ends 3.6e-4 from PyTorch instead of 1e-6 with lane sums).
constexpr std::int64_t kLaneSum = 256;
StepPtr reduce_mid(std::int64_t outer, std::int64_t mid, std::int64_t inner, float scale,
                   const py::array& x, const py::array& y) {
  const float* px = static_cast<const float*>(address(x, outer * mid * inner * 4, "reduce input"));
  float* py_ = static_cast<float*>(address(y, outer * inner * 4, "reduce output"));
  if (inner == 1) {
    return std::make_shared<LambdaStep>("reduce", [=] {
#pragma omp parallel for schedule(static) if (outer * mid > (1 << 18))
      for (std::int64_t o = 0; o < outer; ++o) {
        const float* row = px + o * mid;
        float s = 0.f;
        if (mid >= kLaneSum) {
#pragma omp simd reduction(+ : s)
          for (std::int64_t m = 0; m < mid; ++m) s += row[m];
        } else {
          for (std::int64_t m = 0; m < mid; ++m) s += row[m];  // in order
        }
        py_[o] = s * scale;
      }
    });
  }
  return std::make_shared<LambdaStep>("reduce", [=] {
#pragma omp parallel for schedule(static) if (outer * mid * inner > (1 << 18))
    for (std::int64_t o = 0; o < outer; ++o) {
      float* out = py_ + o * inner;
      std::fill(out, out + inner, 0.f);
      for (std::int64_t m = 0; m < mid; ++m) {
        const float* row = px + (o * mid + m) * inner;
#pragma omp simd
        for (std::int64_t i = 0; i < inner; ++i) out[i] += row[i];
      }
#pragma omp simd
      for (std::int64_t i = 0; i < inner; ++i) out[i] *= scale;
    }
  });
}

// dx (outer, mid, inner) (+)= scale * dy (outer, inner) repeated over mid: their backward.
StepPtr broadcast_mid(std::int64_t outer, std::int64_t mid, std::int64_t inner, float scale,
                      const py::array& dy, const py::array& dx, bool accumulate) {
  const float* pg = static_cast<const float*>(address(dy, outer * inner * 4, "reduce dy"));
  float* pd = static_cast<float*>(address(dx, outer * mid * inner * 4, "reduce dx"));
  return std::make_shared<LambdaStep>("reduce backward", [=] {
#pragma omp parallel for schedule(static) if (outer * mid * inner > (1 << 18))
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t m = 0; m < mid; ++m) {
        const float* g = pg + o * inner;
        float* d = pd + (o * mid + m) * inner;
        if (accumulate) {
#pragma omp simd
          for (std::int64_t i = 0; i < inner; ++i) d[i] += scale * g[i];
        } else {
#pragma omp simd
          for (std::int64_t i = 0; i < inner; ++i) d[i] = scale * g[i];
        }
      }
  });
}


// Gelu (erf form) forward and backward in one pass each: Phi(x) from Abramowitz & Stegun
// 7.1.26 for erfc (absolute error 7e-8 in Phi, the approximation oneDNN's gelu_erf uses),
// written as Phi = q or 1 - q with q = erfc(|x| / sqrt 2) / 2, and e^(-x^2/2) shared by
// Phi and the density. Cloned for AVX-512, AVX2 and the baseline: oneDNN's eltwise backward
// took 0.9 ms on 2048 x 512 at one thread (three times a memory pass over the same bytes).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define META_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define META_CLONES
#endif

// Phi(v) and e^(-v^2/2) of one element.
inline void gelu_parts(float v, float& phi, float& e) {
  constexpr float kP = 0.3275911f, kA1 = 0.254829592f, kA2 = -0.284496736f,
                  kA3 = 1.421413741f, kA4 = -1.453152027f, kA5 = 1.061405429f;
  const float z = std::fabs(v) * 0.70710678118654752f;
  const float t = 1.f / (1.f + kP * z);
  const float poly = t * (kA1 + t * (kA2 + t * (kA3 + t * (kA4 + t * kA5))));
  e = meta::exp_vec(-z * z);
  const float q = 0.5f * poly * e;
  phi = v < 0.f ? q : 1.f - q;
}

constexpr float kRsqrt2Pi = 0.39894228040143268f;

META_CLONES void gelu_forward_chunk(const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    float phi, e;
    gelu_parts(x[i], phi, e);
    y[i] = x[i] * phi;
  }
}

// gelu'(v) = Phi(v) + v phi(v), from the parts gelu_parts gives.
inline float gelu_derivative(float v, float phi, float e) { return phi + v * e * kRsqrt2Pi; }

// y = gelu(x) and d = gelu'(x): a training forward keeps d for the backward (dx = dy * d),
// one pass of multiplication instead of the derivative's exp and division.
META_CLONES void gelu_forward_derivative_chunk(const float* x, float* y, float* d,
                                               std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    float phi, e;
    gelu_parts(x[i], phi, e);
    y[i] = x[i] * phi;
    d[i] = gelu_derivative(x[i], phi, e);
  }
}

#if defined(__GNUC__) && defined(__x86_64__)
// to_bf16 and from_bf16 sixteen lanes at a time, written out: the compiler's vectorisation of
// the element loops ran at a fifth of this (a bf16 Gelu forward, 2^18 elements at 1 thread:
// 0.24 ms against float32's 0.14, most of it the two roundings). The same bits as to_bf16:
// round to nearest even by the same integer sum, a NaN kept quiet.
#define META_AVX512F __attribute__((target("avx512f")))
META_AVX512F void to_bf16_avx512(const float* x, std::uint16_t* y, std::int64_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff),
                magnitude = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                quiet = _mm512_set1_epi32(0x40);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    const __m512i high = _mm512_srli_epi32(v, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(v, bias), _mm512_and_si512(high, one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, magnitude), inf);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(high, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < n; ++i) y[i] = to_bf16(x[i]);
}

META_AVX512F void from_bf16_avx512(const std::uint16_t* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm512_storeu_si512(y + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  for (; i < n; ++i) y[i] = from_bf16(x[i]);
}

bool has_avx512f() {
  __builtin_cpu_init();  // this may run before the library's own constructors
  return __builtin_cpu_supports("avx512f");
}
const bool kAvx512f = has_avx512f();

// The same bits by the CPU's own conversion where it has one (vcvtneps2bf16: round to nearest
// even, a NaN made quiet as to_bf16 does) at a third fewer cycles: a bf16 Gelu's two roundings
// and the attention's bf16 rows. It reads a denormal input as 0, so those lanes (rare: a
// probability or gradient below 2^-126) take the integer rounding.
META_AVX512F __attribute__((target("avx512bf16,avx512vl,avx512bw"))) void to_bf16_avx512bf16(
    const float* x, std::uint16_t* y, std::int64_t n) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x7fffff),
                one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 f = _mm512_loadu_ps(x + i);
    __m256i h = (__m256i)_mm512_cvtneps_pbh(f);
    const __m512i v = _mm512_castps_si512(f);
    const __mmask16 denormal = _mm512_testn_epi32_mask(v, exponent) &
                               _mm512_test_epi32_mask(v, mantissa);
    if (denormal) {
      const __m512i r = _mm512_srli_epi32(
          _mm512_add_epi32(_mm512_add_epi32(v, bias),
                           _mm512_and_si512(_mm512_srli_epi32(v, 16), one)), 16);
      h = _mm256_mask_mov_epi16(h, denormal, _mm512_cvtepi32_epi16(r));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), h);
  }
  for (; i < n; ++i) y[i] = to_bf16(x[i]);
}

bool has_avx512bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}
const bool kAvx512bf16 = has_avx512bf16();
#else
const bool kAvx512f = false;
const bool kAvx512bf16 = false;
#endif

// float32 -> bf16 over n elements.
META_CLONES void to_bf16_loop(const float* x, std::uint16_t* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
}

void to_bf16_chunk(const float* x, std::uint16_t* y, std::int64_t n) {
#if defined(__GNUC__) && defined(__x86_64__)
  if (kAvx512bf16) return to_bf16_avx512bf16(x, y, n);
  if (kAvx512f) return to_bf16_avx512(x, y, n);
#endif
  to_bf16_loop(x, y, n);
}

// bf16 -> float32 over n elements (exact).
META_CLONES void from_bf16_loop(const std::uint16_t* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = from_bf16(x[i]);
}

void from_bf16_chunk(const std::uint16_t* x, float* y, std::int64_t n) {
#if defined(__GNUC__) && defined(__x86_64__)
  if (kAvx512f) return from_bf16_avx512(x, y, n);
#endif
  from_bf16_loop(x, y, n);
}

// The same in bf16 (mixed precision): y and d computed by the float32 loop in blocks on the
// stack (bit for bit its values), then rounded to bf16 (one loop doing both ran slower). A
// bf16 x (a product's output autocast keeps in bf16) is widened by the same blocks.
template <typename X>
void gelu_forward_derivative_bf16_chunk(const X* x, std::uint16_t* y, std::uint16_t* d,
                                        std::int64_t n) {
  constexpr std::int64_t kBlock = 2048;  // three blocks: 24 KiB, in L1
  alignas(64) float fx[kBlock], fy[kBlock], fd[kBlock];
  for (std::int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const std::int64_t len = std::min(kBlock, n - i0);
    const float* xs = fx;
    if constexpr (std::is_same_v<X, float>)
      xs = x + i0;
    else
      from_bf16_chunk(x + i0, fx, len);
    gelu_forward_derivative_chunk(xs, fy, fd, len);
    to_bf16_chunk(fy, y + i0, len);
    to_bf16_chunk(fd, d + i0, len);
  }
}

// out (+)= a * b, each float32 or bf16 (products and sums in float32).
template <typename A, typename B, typename O>
inline void mixed_multiply(const void* pa, const void* pb, void* po, std::int64_t n,
                           bool accumulate) {
  const A* a = static_cast<const A*>(pa);
  const B* b = static_cast<const B*>(pb);
  O* o = static_cast<O*>(po);
  if (accumulate) {
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) put(o[k], widen(o[k]) + widen(a[k]) * widen(b[k]));
  } else {
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) put(o[k], widen(a[k]) * widen(b[k]));
  }
}

META_CLONES void mixed_multiply_chunk(const void* a, bool a16, const void* b, bool b16, void* o,
                                      bool o16, std::int64_t n, bool accumulate) {
  using H = std::uint16_t;
  const int kind = (a16 ? 4 : 0) | (b16 ? 2 : 0) | (o16 ? 1 : 0);
  switch (kind) {
    case 0: return mixed_multiply<float, float, float>(a, b, o, n, accumulate);
    case 1: return mixed_multiply<float, float, H>(a, b, o, n, accumulate);
    case 2: return mixed_multiply<float, H, float>(a, b, o, n, accumulate);
    case 3: return mixed_multiply<float, H, H>(a, b, o, n, accumulate);
    case 4: return mixed_multiply<H, float, float>(a, b, o, n, accumulate);
    case 5: return mixed_multiply<H, float, H>(a, b, o, n, accumulate);
    case 6: return mixed_multiply<H, H, float>(a, b, o, n, accumulate);
    default: return mixed_multiply<H, H, H>(a, b, o, n, accumulate);
  }
}

// dx (+)= dy * gelu'(x); ``accumulate`` is tested once, outside each vectorised loop.
META_CLONES void gelu_backward_chunk(const float* x, const float* dy, float* dx,
                                     std::int64_t n, bool accumulate) {
  if (accumulate) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      float phi, e;
      gelu_parts(x[i], phi, e);
      dx[i] += dy[i] * gelu_derivative(x[i], phi, e);
    }
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      float phi, e;
      gelu_parts(x[i], phi, e);
      dx[i] = dy[i] * gelu_derivative(x[i], phi, e);
    }
  }
}

// forward: y = gelu(x) (and its derivative, when asked); backward: dx (+)= dy * gelu'(x).
// n elements, plain.
// In a bf16 plan's training forward x may be bf16 too (with a bf16 y and derivative).
StepPtr gelu(std::int64_t n, const py::array& x, std::optional<py::array> dy,
             const py::array& out, bool accumulate, std::optional<py::array> derivative) {
  const bool x16 = x.itemsize() == 2;
  if (x16 && (dy || !derivative || out.itemsize() != 2))
    throw std::invalid_argument("meta._plan.gelu: a bf16 input is read only by the forward "
                                "writing a bf16 output and derivative");
  const void* px_any = address(x, n * x.itemsize(), "gelu input");
  const float* px = static_cast<const float*>(px_any);
  if (!dy && derivative && out.itemsize() == 2) {  // bf16 y and d (mixed precision)
    if (derivative->itemsize() != 2)
      throw std::invalid_argument("meta._plan.gelu: a bf16 output needs a bf16 derivative");
    auto* py_ = static_cast<std::uint16_t*>(address(out, n * 2, "gelu output"));
    auto* pd = static_cast<std::uint16_t*>(address(*derivative, n * 2, "gelu derivative"));
    const auto* px16 = static_cast<const std::uint16_t*>(px_any);
    return std::make_shared<LambdaStep>("gelu bf16", [=] {
      constexpr std::int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (std::int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
        const std::int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
        if (x16)
          gelu_forward_derivative_bf16_chunk(px16 + i0, py_ + i0, pd + i0, len);
        else
          gelu_forward_derivative_bf16_chunk(px + i0, py_ + i0, pd + i0, len);
      }
    });
  }
  const float* pg = dy ? static_cast<const float*>(address(*dy, n * 4, "gelu dy")) : nullptr;
  float* po = static_cast<float*>(address(out, n * 4, "gelu output"));
  float* pd =
      derivative ? static_cast<float*>(address(*derivative, n * 4, "gelu derivative")) : nullptr;
  const bool backward = pg != nullptr;
  return std::make_shared<LambdaStep>(backward ? "gelu backward" : "gelu", [=] {
    constexpr std::int64_t kChunk = 1 << 14;
    const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
      if (pd && !backward)
        gelu_forward_derivative_chunk(px + i0, po + i0, pd + i0, len);
      else if (!backward)
        gelu_forward_chunk(px + i0, po + i0, len);
      else
        gelu_backward_chunk(px + i0, pg + i0, po + i0, len, accumulate);
    }
  });
}

// out (+)= a * b over n elements (an activation's backward from its kept derivative).
StepPtr multiply(std::int64_t n, const py::array& a, const py::array& b, const py::array& out,
                 bool accumulate) {
  if (a.itemsize() == 2 || b.itemsize() == 2 || out.itemsize() == 2) {
    // an operand or the output in bf16 (mixed precision): float32 products
    const bool a16 = a.itemsize() == 2, b16 = b.itemsize() == 2, o16 = out.itemsize() == 2;
    const char* pa = static_cast<const char*>(address(a, n * a.itemsize(), "multiply a"));
    const char* pb = static_cast<const char*>(address(b, n * b.itemsize(), "multiply b"));
    char* po = static_cast<char*>(address(out, n * out.itemsize(), "multiply output"));
    const std::int64_t sa = a.itemsize(), sb = b.itemsize(), so = out.itemsize();
    return std::make_shared<LambdaStep>("multiply bf16", [=] {
      constexpr std::int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > (1 << 17))
      for (std::int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
        const std::int64_t i0 = c * kChunk;
        mixed_multiply_chunk(pa + i0 * sa, a16, pb + i0 * sb, b16, po + i0 * so, o16,
                             std::min(kChunk, n - i0), accumulate);
      }
    });
  }
  const float* pa = static_cast<const float*>(address(a, n * 4, "multiply a"));
  const float* pb = static_cast<const float*>(address(b, n * 4, "multiply b"));
  float* po = static_cast<float*>(address(out, n * 4, "multiply output"));
  return std::make_shared<LambdaStep>("multiply", [=] {
    constexpr std::int64_t kChunk = 1 << 14;
    const std::int64_t chunks = (n + kChunk - 1) / kChunk;
    // (a combined "parallel for simd" left this loop scalar)
#pragma omp parallel for schedule(static) if (n > (1 << 17))
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
      if (accumulate) {
#pragma omp simd
        for (std::int64_t i = i0; i < i1; ++i) po[i] += pa[i] * pb[i];
      } else {
#pragma omp simd
        for (std::int64_t i = i0; i < i1; ++i) po[i] = pa[i] * pb[i];
      }
    }
  });
}

}  // namespace

// y[i] = to_bf16(x[i]) over n elements, sixteen lanes at a time where the CPU has AVX-512
// (the same bits): attention.cpp's rows of probabilities and their gradient.
void round_to_bf16(const float* x, std::uint16_t* y, std::int64_t n) { to_bf16_chunk(x, y, n); }

// y = x between float32 and bf16 (tensor.cpp's convert): the sixteen-lane roundings above (the
// same bits as to_bf16) in chunks of 16 Ki elements on the plan's threads. oneDNN's reorder ran a (1024, 128) gradient's
// copy in 10.5 us at 1 thread and 10.3 at 2 (the transformer's 34 conversions a step: 0.42 ms
// at 1 thread, 0.27 at 2). Element by element, so the same bits at any thread count.
StepPtr convert_loop(const py::array& x, const py::array& y, std::int64_t n, bool to_half) {
  constexpr std::int64_t kChunk = 1 << 14;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  if (to_half) {
    const auto* px = static_cast<const float*>(address(x, n * 4, "convert source"));
    auto* py_ = static_cast<std::uint16_t*>(address(y, n * 2, "convert destination"));
    return std::make_shared<LambdaStep>("to bf16", [=] {
#pragma omp parallel for schedule(static) if (chunks > 1)
      for (std::int64_t c = 0; c < chunks; ++c)
        to_bf16_chunk(px + c * kChunk, py_ + c * kChunk, std::min(kChunk, n - c * kChunk));
    });
  }
  const auto* px = static_cast<const std::uint16_t*>(address(x, n * 2, "convert source"));
  auto* py_ = static_cast<float*>(address(y, n * 4, "convert destination"));
  return std::make_shared<LambdaStep>("to float32", [=] {
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c)
      from_bf16_chunk(px + c * kChunk, py_ + c * kChunk, std::min(kChunk, n - c * kChunk));
  });
}

dnnl::algorithm eltwise_algorithm(const std::string& name, bool use_dst) {
  const auto& e = find(name);
  return use_dst ? e.with_dst : e.forward;
}

bool eltwise_has_dst_form(const std::string& name, float alpha) {
  const auto& e = find(name);
  if (e.with_dst == dnnl::algorithm::undef) return false;
  if (name == "relu" || name == "elu") return alpha >= 0;
  return true;
}

void bind_eltwise(py::module_& m) {
  m.def("eltwise", &eltwise_forward, py::arg("dims"), py::arg("layout"), py::arg("name"),
        py::arg("alpha"), py::arg("beta"), py::arg("x"), py::arg("y"));
  m.def("eltwise_backward", &eltwise_backward, py::arg("dims"), py::arg("layout"),
        py::arg("name"), py::arg("alpha"), py::arg("beta"), py::arg("use_dst"),
        py::arg("saved"), py::arg("dy"), py::arg("dx"));
  m.def("eltwise_has_dst_form", &eltwise_has_dst_form, py::arg("name"), py::arg("alpha"));
  m.def("binary", &binary, py::arg("dims_a"), py::arg("dims_b"), py::arg("layout_a"),
        py::arg("layout_b"), py::arg("name"), py::arg("a"), py::arg("b"), py::arg("y"),
        py::arg("post") = std::vector<PostOp>{}, py::arg("post_args") = std::vector<py::array>{},
        py::arg("post_dims") = std::vector<Dims>{});
  m.def("affine_fold", &affine_fold, py::arg("scale"), py::arg("b"), py::arg("mean"),
        py::arg("var"), py::arg("epsilon"), py::arg("then"), py::arg("folded_scale"),
        py::arg("folded_shift"), py::arg("channels"));
  m.def("sum", &sum, py::arg("dims"), py::arg("layout"), py::arg("scales"), py::arg("xs"),
        py::arg("y"));
  m.def("column_sum", &column_sum, py::arg("rows"), py::arg("cols"), py::arg("x"), py::arg("y"),
        py::arg("accumulate") = false);
  m.def("channel_sum", &channel_sum, py::arg("n"), py::arg("c"), py::arg("plane"), py::arg("x"),
        py::arg("y"));
  m.def("reduce_mid", &reduce_mid, py::arg("outer"), py::arg("mid"), py::arg("inner"),
        py::arg("scale"), py::arg("x"), py::arg("y"));
  m.def("broadcast_mid", &broadcast_mid, py::arg("outer"), py::arg("mid"), py::arg("inner"),
        py::arg("scale"), py::arg("dy"), py::arg("dx"), py::arg("accumulate") = false);
  m.def("gelu", &gelu, py::arg("n"), py::arg("x"), py::arg("dy"), py::arg("out"),
        py::arg("accumulate") = false, py::arg("derivative") = py::none());
  m.def("multiply", &multiply, py::arg("n"), py::arg("a"), py::arg("b"), py::arg("out"),
        py::arg("accumulate") = false);
  m.def("reduce_sum", &reduce_sum, py::arg("dims_x"), py::arg("dims_y"), py::arg("layout_x"),
        py::arg("x"), py::arg("y"));
}

}  // namespace meta::plan
