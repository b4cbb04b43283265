// Normalizations in a plan: BatchNormalization (training with batch statistics and the running
// statistics' update as PyTorch does it, inference with the stored ones, an optional fused
// ReLU) and LayerNormalization over the last dimension, forward and backward. (An eval-mode
// BatchNormalization is a per-channel scale and shift: eltwise.cpp's affine_fold.)
//
// Training in the plain or channels-last layout runs meta's own loops (meta/batchnorm.hpp, the
// native twin's): they sum the batch statistics and the backward's reductions in double, as
// PyTorch's CPU kernel does; oneDNN's sum in float32, and a train-mode CNN drifted from PyTorch
// 24x further than PyTorch's float32 run does from its float64 one.
//
// Mixed precision (a bf16 plan, meta/lv1/plan/precision.py): the training loops also read and
// write bf16 arrays (2-byte elements), as PyTorch's autocast keeps a ResNet's activations in
// bf16 between its convolutions: the input (a convolution's bf16 output), the output (+ReLU,
// read only by bf16 convolutions), the output gradient and the input gradient may each be
// bf16. Every element is widened to float32 as it is read and rounded once as it is written;
// the statistics and the backward's sums stay double, the per-channel arithmetic float32.
// There a BatchNorm may also add a residual before its ReLU (a ResNet block's end, y =
// relu(bn(x) + r), autocast's bf16 Add and ReLU in one pass): its backward masks dy by y > 0
// and writes that masked gradient as r's too.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "meta/batchnorm.hpp"
#include "plan.hpp"

namespace meta::plan {

namespace {

struct Aligned {
  std::vector<char> bytes;
  float* floats(std::size_t n) {
    bytes.resize(n * sizeof(float) + 64);
    return reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(bytes.data()) + 63) & ~63ull);
  }
};

struct BatchNormKernel {
  memory::desc md, c_md;
  std::int64_t channels, count;
  float epsilon, momentum;
  bool training, fuse_relu;
  dnnl::batch_normalization_forward::primitive_desc fwd;
  dnnl::batch_normalization_backward::primitive_desc bwd;
  Aligned mean_buf, var_buf, ws_buf, dscale_buf, dshift_buf, inv_buf;
  float *mean = nullptr, *var = nullptr, *inv_std = nullptr;
  std::string info;
  // Training by meta's loops: X seen as (n, c, s), n * c * s elements.
  bool own = false;
  std::int64_t n = 0, s = 0;
  std::vector<float> masked;  // dy through the fused ReLU

  BatchNormKernel(const Dims& dims, const std::string& layout, float eps, float mom, bool train,
                  bool relu)
      : channels(dims[1]), epsilon(eps), momentum(mom), training(train), fuse_relu(relu) {
    md = make_md(dims, layout);
    c_md = make_md({channels}, "plain");
    count = 1;
    for (std::size_t i = 0; i < dims.size(); ++i)
      if (i != 1) count *= dims[i];
    if (training && count > 0 && (layout == "plain" || layout == "nhwc" || dims.size() == 2)) {
      own = true;
      s = layout == "nhwc" || dims.size() == 2 ? 1 : count / dims[0];
      n = count / s;
      mean = mean_buf.floats(channels);
      var = var_buf.floats(channels);
      inv_std = inv_buf.floats(channels);
      info = "meta batchnorm (sums in double)";
      return;
    }
    auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    if (relu) flags |= dnnl::normalization_flags::fuse_norm_relu;
    if (!training) flags |= dnnl::normalization_flags::use_global_stats;
    const auto prop = training ? dnnl::prop_kind::forward_training
                               : dnnl::prop_kind::forward_inference;
    fwd = dnnl::batch_normalization_forward::primitive_desc(engine(), prop, md, md, epsilon,
                                                            flags, scratch_attr());
    info = impl(fwd);
    if (training) {
      mean = mean_buf.floats(channels);
      var = var_buf.floats(channels);
      bwd = dnnl::batch_normalization_backward::primitive_desc(
          engine(), dnnl::prop_kind::backward, md, md, md, epsilon, flags, fwd, scratch_attr());
      info += ", bwd " + impl(bwd);
    }
  }

  memory workspace() {
    const auto wd = fwd.workspace_desc();
    ws_buf.floats(wd.get_size() / sizeof(float) + 1);
    void* p = reinterpret_cast<void*>(
        (reinterpret_cast<std::uintptr_t>(ws_buf.bytes.data()) + 63) & ~63ull);
    return memory(wd, engine(), p);
  }
};

using BatchNormPtr = std::shared_ptr<BatchNormKernel>;

// bf16 elements (Half) read and written as float32: widen and put (plan.hpp).
bool holds_bf16(const py::array& a) { return a.itemsize() == 2; }

// The mixed loops' kernels, each over the rows [n0, n1) of X seen as (n, c, s): written once
// (always inlined), run as an AVX-512 copy where the CPU has it (every CPU a bf16 plan runs
// on: precision.py asks for avx512_bf16) and as the default build's elsewhere. The package
// is built for the baseline x86-64, where a bf16 element's widening and rounding vectorise
// poorly: the AVX-512 copy runs the bf16 loops as fast as the float32 ones (the float32
// loops ran 6x slower than these before, as lambdas the compiler did not vectorise).
#define META_INLINE [[gnu::always_inline]] inline
#define META_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// Statistics' sums: s1[j] += sum d, s2[j] += sum d^2, d = x - x[0, j] (batchnorm_statistics'
// shift), in double.
template <typename TX>
META_INLINE void stat_sums(const TX* __restrict x, std::int64_t n0, std::int64_t n1,
                           std::int64_t c, std::int64_t s, double* __restrict s1,
                           double* __restrict s2) {
  for (std::int64_t i = n0; i < n1; ++i) {
    if (s == 1) {  // channels-last: along the channels
      const TX* xr = x + i * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) {
        const double d = double(widen(xr[j])) - double(widen(x[j]));
        s1[j] += d;
        s2[j] += d * d;
      }
      continue;
    }
    for (std::int64_t j = 0; j < c; ++j) {
      const TX* xr = x + (i * c + j) * s;
      const double first = widen(x[j * s]);
      double r1 = 0.0, r2 = 0.0;
#pragma omp simd reduction(+ : r1, r2)
      for (std::int64_t k = 0; k < s; ++k) {
        const double d = double(widen(xr[k])) - first;
        r1 += d;
        r2 += d * d;
      }
      s1[j] += r1;
      s2[j] += r2;
    }
  }
}

// y = relu?(((x - mean) * inv_std) * scale + shift [+ res]), rounded once (res: RES).
template <bool RELU, bool RES, typename TX, typename TY, typename TR>
META_INLINE void apply_rows(const TX* __restrict x, TY* __restrict y, const TR* __restrict res,
                            std::int64_t n0, std::int64_t n1, std::int64_t c, std::int64_t s,
                            const float* __restrict mean, const float* __restrict inv,
                            const float* __restrict sc, const float* __restrict sh) {
  for (std::int64_t i = n0; i < n1; ++i) {
    if (s == 1) {
      const std::int64_t o = i * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) {
        float r = ((widen(x[o + j]) - mean[j]) * inv[j]) * sc[j] + sh[j];
        if constexpr (RES) r += widen(res[o + j]);
        put(y[o + j], RELU ? std::max(r, 0.f) : r);
      }
      continue;
    }
    for (std::int64_t j = 0; j < c; ++j) {
      const std::int64_t base = (i * c + j) * s;
      const float m = mean[j], iv = inv[j], a = sc[j], b = sh[j];
#pragma omp simd
      for (std::int64_t k = 0; k < s; ++k) {
        float r = ((widen(x[base + k]) - m) * iv) * a + b;
        if constexpr (RES) r += widen(res[base + k]);
        put(y[base + k], RELU ? std::max(r, 0.f) : r);
      }
    }
  }
}

// How the backward finds the gradient reaching the normalisation: dy (kPlain), through the
// fused ReLU (kRelu: the forward's output recomputed as it computed it, > 0 passes dy), or
// through the ReLU after a residual addition (kResidual: the output y read, > 0 passes dy).
enum Mode { kPlain, kRelu, kResidual };

// (y: the output's row, read only by kResidual; k its element)
template <int MODE, typename TG, typename TY>
META_INLINE float grad_in(TG dy, const TY* __restrict y, std::int64_t k, float xv, float m,
                          float inv, float sc, float sh) {
  const float g = widen(dy);
  if constexpr (MODE == kRelu) return ((xv - m) * inv) * sc + sh > 0.f ? g : 0.f;
  if constexpr (MODE == kResidual) return widen(y[k]) > 0.f ? g : 0.f;
  return g;
}

// Row i's start in a (null without kResidual) array of y's or dr's shape.
template <int MODE, typename T>
META_INLINE T* row(T* a, std::int64_t offset) {
  if constexpr (MODE == kResidual) return a + offset;
  return a;
}

// The backward's sums: s1[j] += sum g, s2[j] += sum g * (x - mean), in double.
template <int MODE, typename TX, typename TG, typename TY>
META_INLINE void grad_sums(const TX* __restrict x, const TG* __restrict dy,
                           const TY* __restrict y, std::int64_t n0,
                           std::int64_t n1, std::int64_t c, std::int64_t s,
                           const float* __restrict mean, const float* __restrict inv,
                           const float* __restrict sc, const float* __restrict sh,
                           double* __restrict s1, double* __restrict s2) {
  for (std::int64_t i = n0; i < n1; ++i) {
    if (s == 1) {
      const TX* xr = x + i * c;
      const TG* gr = dy + i * c;
      const TY* yr = row<MODE>(y, i * c);
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) {
        const float xv = widen(xr[j]);
        const float g = grad_in<MODE>(gr[j], yr, j, xv, mean[j], inv[j], sc[j], sh[j]);
        s1[j] += g;
        s2[j] += double(g) * (double(xv) - double(mean[j]));
      }
      continue;
    }
    for (std::int64_t j = 0; j < c; ++j) {
      const std::int64_t base = (i * c + j) * s;
      const TX* xr = x + base;
      const TG* gr = dy + base;
      const TY* yr = row<MODE>(y, base);
      const float m = mean[j], iv = inv[j], a = sc[j], b = sh[j];
      double r1 = 0.0, r2 = 0.0;
#pragma omp simd reduction(+ : r1, r2)
      for (std::int64_t k = 0; k < s; ++k) {
        const float xv = widen(xr[k]);
        const float g = grad_in<MODE>(gr[k], yr, k, xv, m, iv, a, b);
        r1 += g;
        r2 += double(g) * (double(xv) - double(m));
      }
      s1[j] += r1;
      s2[j] += r2;
    }
  }
}

// dx = k (g - (sum_dy + xhat sum_dy_xhat) / count), k = scale * inv_std, rounded once; with
// a residual (kResidual) g is also r's gradient, written to dr (added to it with ADD).
template <int MODE, bool ADD, typename TX, typename TG, typename TD, typename TY>
META_INLINE void grad_dx(const TX* __restrict x, const TG* __restrict dy, TD* __restrict dx,
                         const TY* __restrict y, float* __restrict dr, std::int64_t n0, std::int64_t n1, std::int64_t c, std::int64_t s,
                         const float* __restrict mean, const float* __restrict inv,
                         const float* __restrict sc, const float* __restrict sh,
                         const float* __restrict kk, const float* __restrict sd,
                         const float* __restrict sdx, float count) {
  for (std::int64_t i = n0; i < n1; ++i) {
    if (s == 1) {
      const TX* xr = x + i * c;
      const TG* gr = dy + i * c;
      TD* dxr = dx + i * c;
      const TY* yr = row<MODE>(y, i * c);
      float* drr = row<MODE>(dr, i * c);
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) {
        const float xv = widen(xr[j]);
        const float g = grad_in<MODE>(gr[j], yr, j, xv, mean[j], inv[j], sc[j], sh[j]);
        put(dxr[j], kk[j] * (g - (sd[j] + ((xv - mean[j]) * inv[j]) * sdx[j]) / count));
        if constexpr (MODE == kResidual) drr[j] = ADD ? drr[j] + g : g;
      }
      continue;
    }
    for (std::int64_t j = 0; j < c; ++j) {
      const std::int64_t base = (i * c + j) * s;
      const float m = mean[j], iv = inv[j], a = sc[j], b = sh[j], kj = kk[j], sdj = sd[j],
                  sdxj = sdx[j];
      const TX* xr = x + base;
      const TG* gr = dy + base;
      TD* dxr = dx + base;
      const TY* yr = row<MODE>(y, base);
      float* drr = row<MODE>(dr, base);
#pragma omp simd
      for (std::int64_t k = 0; k < s; ++k) {
        const float xv = widen(xr[k]);
        const float g = grad_in<MODE>(gr[k], yr, k, xv, m, iv, a, b);
        put(dxr[k], kj * (g - (sdj + ((xv - m) * iv) * sdxj) / count));
        if constexpr (MODE == kResidual) drr[k] = ADD ? drr[k] + g : g;
      }
    }
  }
}

// Each kernel's AVX-512 copy.
template <typename... A>
META_AVX512 void stat_sums_wide(const A&... a) { stat_sums(a...); }
template <bool RELU, bool RES, typename... A>
META_AVX512 void apply_rows_wide(const A&... a) { apply_rows<RELU, RES>(a...); }
template <int MODE, typename... A>
META_AVX512 void grad_sums_wide(const A&... a) { grad_sums<MODE>(a...); }
template <int MODE, bool ADD, typename... A>
META_AVX512 void grad_dx_wide(const A&... a) { grad_dx<MODE, ADD>(a...); }

bool wide_cpu() {
  static const bool wide = __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return wide;
}

// Per-thread rows of 2 * c doubles, summed by `rows(t, n0, n1, s1, s2)` over a split of the
// batch, then added into acc's first 2 * c.
template <typename F>
void thread_sums(std::int64_t n, std::int64_t c, std::int64_t s, std::vector<double>& acc,
                 F&& rows) {
  acc.assign(static_cast<std::size_t>(2 * c) * omp_get_max_threads(), 0.0);
  const int used = meta::detail::over_batch(
      n, n * c * s, [&](int t, std::int64_t n0, std::int64_t n1) {
        double* s1 = acc.data() + 2 * c * t;
        rows(n0, n1, s1, s1 + c);
      });
  for (int t = 1; t < used; ++t)
    for (std::int64_t j = 0; j < 2 * c; ++j) acc[j] += acc[2 * c * t + j];
}

// The training forward with a bf16 input or output (TX, TY: float or Half): the batch
// statistics in double, shifted by each channel's first value (batchnorm_statistics' way),
// then y = relu?(((x - mean) * inv_std) * scale + shift) rounded once.
template <bool RELU, bool RES, typename TX, typename TY, typename TR>
void mixed_forward(BatchNormKernel& k, const TX* x, TY* y, const TR* res, const float* scale,
                   const float* shift) {
  const std::int64_t n = k.n, c = k.channels, s = k.s;
  const bool wide = wide_cpu();
  std::vector<double> acc;
  thread_sums(n, c, s, acc, [&](std::int64_t n0, std::int64_t n1, double* s1, double* s2) {
    if (wide) stat_sums_wide(x, n0, n1, c, s, s1, s2);
    else stat_sums(x, n0, n1, c, s, s1, s2);
  });
  const double count = double(n * s);
  for (std::int64_t j = 0; j < c; ++j) {
    const double d = acc[j] / count;
    const double var = acc[c + j] / count - d * d;
    k.mean[j] = float(double(widen(x[j * s])) + d);
    k.var[j] = float(var > 0.0 ? var : 0.0);
    k.inv_std[j] = 1.f / std::sqrt(k.var[j] + k.epsilon);
  }
  const float *mean = k.mean, *inv = k.inv_std;
  meta::detail::over_batch(n, n * c * s, [&](int, std::int64_t n0, std::int64_t n1) {
    if (wide) apply_rows_wide<RELU, RES>(x, y, res, n0, n1, c, s, mean, inv, scale, shift);
    else apply_rows<RELU, RES>(x, y, res, n0, n1, c, s, mean, inv, scale, shift);
  });
}

// The training backward with any of x, dy, dx in bf16: dy through the fused ReLU, sum(dy)
// and sum(dy * xhat) in double, then dx = k (dy - (sum_dy + xhat sum_dy_xhat) / count).
template <int MODE, typename TX, typename TG, typename TD, typename TY>
void mixed_backward(BatchNormKernel& k, const TX* x, const TG* dy, TD* dx, const TY* y,
                    float* dr, bool add, const float* scale, const float* shift, float* dscale,
                    float* dshift) {
  const std::int64_t n = k.n, c = k.channels, s = k.s;
  const float *mean = k.mean, *inv = k.inv_std;
  const bool wide = wide_cpu();
  std::vector<double> acc;
  thread_sums(n, c, s, acc, [&](std::int64_t n0, std::int64_t n1, double* s1, double* s2) {
    if (wide) grad_sums_wide<MODE>(x, dy, y, n0, n1, c, s, mean, inv, scale, shift, s1, s2);
    else grad_sums<MODE>(x, dy, y, n0, n1, c, s, mean, inv, scale, shift, s1, s2);
  });
  std::vector<float> sum_dy(c), sum_dy_xhat(c), kk(c);
  for (std::int64_t j = 0; j < c; ++j) {
    sum_dy[j] = float(acc[j]);
    sum_dy_xhat[j] = float(acc[c + j] * double(inv[j]));
    kk[j] = scale[j] * inv[j];
    if (dscale) dscale[j] = sum_dy_xhat[j];
    if (dshift) dshift[j] = sum_dy[j];
  }
  const float count = float(n * s);
  const float *sd = sum_dy.data(), *sdx = sum_dy_xhat.data(), *kp = kk.data();
  meta::detail::over_batch(n, n * c * s, [&](int, std::int64_t n0, std::int64_t n1) {
    if (wide && add)
      grad_dx_wide<MODE, true>(x, dy, dx, y, dr, n0, n1, c, s, mean, inv, scale, shift, kp, sd,
                               sdx, count);
    else if (wide)
      grad_dx_wide<MODE, false>(x, dy, dx, y, dr, n0, n1, c, s, mean, inv, scale, shift, kp, sd,
                                sdx, count);
    else if (add)
      grad_dx<MODE, true>(x, dy, dx, y, dr, n0, n1, c, s, mean, inv, scale, shift, kp, sd, sdx,
                          count);
    else
      grad_dx<MODE, false>(x, dy, dx, y, dr, n0, n1, c, s, mean, inv, scale, shift, kp, sd, sdx,
                           count);
  });
}

// Calls f with `a`'s data as float* or Half* (its element type).
template <typename F>
void as_typed(const py::array& a, std::size_t elements, const char* what, F&& f) {
  void* p = address(a, elements * a.itemsize(), what);
  if (holds_bf16(a)) f(static_cast<Half*>(p));
  else f(static_cast<float*>(p));
}

// The training forward of a BatchNorm whose input or output is bf16, or that adds a residual.
StepPtr mixed_forward_step(const BatchNormPtr& k, const py::array& x, const py::array& scale,
                           const py::array& shift, const py::array& y,
                           const std::optional<py::array>& res) {
  const std::size_t elements = static_cast<std::size_t>(k->count * k->channels);
  const float* ps = static_cast<const float*>(address(scale, k->channels * 4, "batchnorm scale"));
  const float* pb = static_cast<const float*>(address(shift, k->channels * 4, "batchnorm B"));
  std::function<void()> run;
  const BatchNormPtr kp = k;  // the step keeps its kernel alive
  as_typed(x, elements, "batchnorm input", [&](auto* px) {
    as_typed(y, elements, "batchnorm output", [&](auto* py_) {
      if (res) {  // relu(bn(x) + r)
        as_typed(*res, elements, "batchnorm residual", [&](auto* pr) {
          run = [=] { mixed_forward<true, true>(*kp, px, py_, pr, ps, pb); };
        });
        return;
      }
      const float* none = nullptr;
      run = [=] {
        if (kp->fuse_relu) mixed_forward<true, false>(*kp, px, py_, none, ps, pb);
        else mixed_forward<false, false>(*kp, px, py_, none, ps, pb);
      };
    });
  });
  return std::make_shared<LambdaStep>("batchnorm forward (meta, bf16)", std::move(run));
}

// The training backward of a BatchNorm whose input, output gradient or input gradient is bf16.
StepPtr mixed_backward_step(const BatchNormPtr& k, const py::array& x, const py::array& dy,
                            const py::array& scale, const py::array& shift, const py::array& dx,
                            std::optional<py::array> dscale, std::optional<py::array> dshift,
                            const std::optional<py::array>& y = std::nullopt,
                            const std::optional<py::array>& dres = std::nullopt,
                            bool add = false) {
  const std::int64_t c = k->channels;
  const std::size_t elements = static_cast<std::size_t>(k->count * c);
  const float* ps = static_cast<const float*>(address(scale, c * 4, "batchnorm scale"));
  // B (the fused ReLU's; scale stands in without one: read, not used)
  const float* pb = static_cast<const float*>(address(shift, c * 4, "batchnorm B"));
  float* pds = dscale ? static_cast<float*>(address(*dscale, c * 4, "batchnorm dscale")) : nullptr;
  float* pdb = dshift ? static_cast<float*>(address(*dshift, c * 4, "batchnorm dB")) : nullptr;
  std::function<void()> run;
  const BatchNormPtr kp = k;
  if (y) {  // relu(bn(x) + r): dy masked by y > 0, which is r's gradient too (float32 dy)
    if (!dres || holds_bf16(dy) || holds_bf16(*dres))
      throw std::invalid_argument("meta._plan.BatchNorm: a residual's backward needs float32 dy "
                                  "and d(residual)");
    const float* pdy = static_cast<const float*>(address(dy, elements * 4, "batchnorm dy"));
    float* pdr = static_cast<float*>(address(*dres, elements * 4, "batchnorm d(residual)"));
    as_typed(x, elements, "batchnorm input", [&](auto* px) {
      as_typed(dx, elements, "batchnorm dx", [&](auto* pdx) {
        as_typed(*y, elements, "batchnorm output", [&](auto* pyv) {
          run = [=] {
            mixed_backward<kResidual>(*kp, px, pdy, pdx, pyv, pdr, add, ps, pb, pds, pdb);
          };
        });
      });
    });
    return std::make_shared<LambdaStep>("batchnorm+residual backward (meta, bf16)",
                                        std::move(run));
  }
  const float* no_y = nullptr;
  float* no_dr = nullptr;
  as_typed(x, elements, "batchnorm input", [&](auto* px) {
    as_typed(dy, elements, "batchnorm dy", [&](auto* pdy) {
      as_typed(dx, elements, "batchnorm dx", [&](auto* pdx) {
        run = [=] {
          if (kp->fuse_relu)
            mixed_backward<kRelu>(*kp, px, pdy, pdx, no_y, no_dr, false, ps, pb, pds, pdb);
          else
            mixed_backward<kPlain>(*kp, px, pdy, pdx, no_y, no_dr, false, ps, pb, pds, pdb);
        };
      });
    });
  });
  return std::make_shared<LambdaStep>("batchnorm backward (meta, bf16)", std::move(run));
}

// Training forward by meta's loops: statistics summed in double, then y = relu?(xhat * scale +
// shift), written as the native twin writes it.
StepPtr own_forward(const BatchNormPtr& k, const py::array& x, const py::array& scale,
                    const py::array& shift, const py::array& y) {
  const std::size_t bytes = static_cast<std::size_t>(k->count * k->channels) * 4;
  const float* px = static_cast<const float*>(address(x, bytes, "batchnorm input"));
  float* py_ = static_cast<float*>(address(y, bytes, "batchnorm output"));
  const float* ps = static_cast<const float*>(address(scale, k->channels * 4, "batchnorm scale"));
  const float* pb = static_cast<const float*>(address(shift, k->channels * 4, "batchnorm B"));
  const BatchNormPtr kp = k;  // the steps keep their kernel alive
  return std::make_shared<LambdaStep>("batchnorm forward (meta)", [=] {
    const std::int64_t c = kp->channels;
    std::vector<double> m(c), v(c);
    meta::batchnorm_statistics(px, kp->n, c, kp->s, m.data(), v.data());
    const float eps = kp->epsilon;
    for (std::int64_t j = 0; j < c; ++j) {
      kp->mean[j] = static_cast<float>(m[j]);
      kp->var[j] = static_cast<float>(v[j]);
      kp->inv_std[j] = 1.f / std::sqrt(kp->var[j] + eps);
    }
    meta::batchnorm_apply(px, py_, kp->n, c, kp->s, kp->mean, kp->inv_std, ps, pb);
    if (kp->fuse_relu) {
      const std::int64_t total = kp->n * c * kp->s;
#pragma omp parallel for if (total > meta::kParallelThreshold)
      for (std::int64_t i = 0; i < total; ++i) py_[i] = std::max(py_[i], 0.f);
    }
  });
}

StepPtr bn_forward(const BatchNormPtr& k, const py::array& x, const py::array& scale,
                   const py::array& shift, const py::array& running_mean,
                   const py::array& running_var, const py::array& y,
                   std::optional<py::array> residual) {
  if (residual && !(k->own && k->fuse_relu))
    throw std::invalid_argument("meta._plan.BatchNorm: a residual needs the training loops and "
                                "the fused ReLU");
  if (k->own && (holds_bf16(x) || holds_bf16(y) || residual))
    return mixed_forward_step(k, x, scale, shift, y, residual);
  if (k->own) return own_forward(k, x, scale, shift, y);
  if (holds_bf16(x) || holds_bf16(y))
    throw std::invalid_argument("meta._plan.BatchNorm: bf16 arrays in training only, plain or "
                                "channels-last");
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, bind(k->md, x, "batchnorm input")},
                                       {DNNL_ARG_DST, bind(k->md, y, "batchnorm output")},
                                       {DNNL_ARG_SCALE, bind(k->c_md, scale, "batchnorm scale")},
                                       {DNNL_ARG_SHIFT, bind(k->c_md, shift, "batchnorm B")}};
  if (k->training) {
    args[DNNL_ARG_MEAN] = memory(k->c_md, engine(), k->mean);
    args[DNNL_ARG_VARIANCE] = memory(k->c_md, engine(), k->var);
  } else {
    args[DNNL_ARG_MEAN] = bind(k->c_md, running_mean, "batchnorm mean");
    args[DNNL_ARG_VARIANCE] = bind(k->c_md, running_var, "batchnorm var");
  }
  if (k->fuse_relu && k->training) args[DNNL_ARG_WORKSPACE] = k->workspace();
  return primitive_step("batchnorm forward", dnnl::batch_normalization_forward(k->fwd),
                        std::move(args), k->fwd.scratchpad_desc());
}

// running = running * momentum + batch * (1 - momentum), the variance unbiased (n / (n - 1)).
StepPtr bn_update(const BatchNormPtr& k, const py::array& running_mean,
                  const py::array& running_var) {
  if (!k->training) throw std::invalid_argument("meta._plan.BatchNorm: built for inference");
  float* rm = static_cast<float*>(address(running_mean, k->channels * 4, "running mean"));
  float* rv = static_cast<float*>(address(running_var, k->channels * 4, "running var"));
  const float* mean = k->mean;
  const float* var = k->var;
  const float m = k->momentum;
  const double n = double(k->count);
  const float unbias = n > 1 ? float(n / (n - 1)) : 1.f;
  const std::int64_t c = k->channels;
  return std::make_shared<LambdaStep>("batchnorm running statistics", [=] {
    for (std::int64_t i = 0; i < c; ++i) {
      rm[i] = rm[i] * m + mean[i] * (1 - m);
      rv[i] = rv[i] * m + var[i] * unbias * (1 - m);
    }
  });
}

// Training backward by meta's loops: sum(dy) and sum(dy * xhat) in double, then the usual
// three-term dx; through a fused ReLU, dy where the forward's output was positive.
StepPtr own_backward(const BatchNormPtr& k, const py::array& x, const py::array& dy,
                     const py::array& scale, const py::array& shift, const py::array& dx,
                     std::optional<py::array> dscale, std::optional<py::array> dshift) {
  const std::int64_t c = k->channels;
  const std::size_t bytes = static_cast<std::size_t>(k->count * c) * 4;
  const float* px = static_cast<const float*>(address(x, bytes, "batchnorm input"));
  const float* pdy = static_cast<const float*>(address(dy, bytes, "batchnorm dy"));
  float* pdx = static_cast<float*>(address(dx, bytes, "batchnorm dx"));
  const float* ps = static_cast<const float*>(address(scale, c * 4, "batchnorm scale"));
  const float* pb = k->fuse_relu ? static_cast<const float*>(address(shift, c * 4, "batchnorm B"))
                                 : nullptr;
  float* pds = dscale ? static_cast<float*>(address(*dscale, c * 4, "batchnorm dscale")) : nullptr;
  float* pdb = dshift ? static_cast<float*>(address(*dshift, c * 4, "batchnorm dB")) : nullptr;
  const BatchNormPtr kp = k;  // the steps keep their kernel alive
  if (k->fuse_relu) k->masked.resize(static_cast<std::size_t>(k->count * c));
  return std::make_shared<LambdaStep>("batchnorm backward (meta)", [=] {
    const std::int64_t n = kp->n, s = kp->s;
    const float* g = pdy;
    if (kp->fuse_relu) {  // the forward's output, recomputed as it computed it: > 0 passes dy
      float* gm = kp->masked.data();
      const float *mean = kp->mean, *inv = kp->inv_std;
      meta::detail::channel_map(px, pdy, gm, n, c, s, [&](std::int64_t j, float a, float d) {
        return ((a - mean[j]) * inv[j]) * ps[j] + pb[j] > 0.f ? d : 0.f;
      });
      g = gm;
    }
    std::vector<double> a(c), b(c);
    meta::batchnorm_gradient_sums(px, g, n, c, s, kp->mean, kp->inv_std, a.data(), b.data());
    std::vector<float> sum_dy(c), sum_dy_xhat(c), kk(c);
    for (std::int64_t j = 0; j < c; ++j) {
      sum_dy[j] = static_cast<float>(a[j]);
      sum_dy_xhat[j] = static_cast<float>(b[j]);
      kk[j] = ps[j] * kp->inv_std[j];
      if (pds) pds[j] = sum_dy_xhat[j];
      if (pdb) pdb[j] = sum_dy[j];
    }
    const float* none = nullptr;  // no running statistics' gradients
    meta::batchnorm_dx_training(px, g, pdx, n, c, s, kp->mean, kp->inv_std, kk.data(),
                                sum_dy.data(), sum_dy_xhat.data(), none, none);
  });
}

StepPtr bn_backward(const BatchNormPtr& k, const py::array& x, const py::array& dy,
                    const py::array& scale, const py::array& dx,
                    std::optional<py::array> dscale, std::optional<py::array> dshift,
                    std::optional<py::array> shift, std::optional<py::array> y,
                    std::optional<py::array> dres, bool add) {
  if (!k->training) throw std::invalid_argument("meta._plan.BatchNorm: built for inference");
  if (y) {
    if (!k->own || !k->fuse_relu || !shift)
      throw std::invalid_argument("meta._plan.BatchNorm: a residual needs the training loops, "
                                  "the fused ReLU and B");
    return mixed_backward_step(k, x, dy, scale, *shift, dx, dscale, dshift, y, dres, add);
  }
  if (k->own) {
    if (k->fuse_relu && !shift)
      throw std::invalid_argument("meta._plan.BatchNorm: a fused ReLU's backward needs B");
    if (holds_bf16(x) || holds_bf16(dy) || holds_bf16(dx))
      return mixed_backward_step(k, x, dy, scale, shift ? *shift : scale, dx, dscale, dshift);
    return own_backward(k, x, dy, scale, shift ? *shift : scale, dx, dscale, dshift);
  }
  const memory ds = dscale ? bind(k->c_md, *dscale, "batchnorm dscale")
                           : memory(k->c_md, engine(), k->dscale_buf.floats(k->channels));
  const memory db = dshift ? bind(k->c_md, *dshift, "batchnorm dB")
                           : memory(k->c_md, engine(), k->dshift_buf.floats(k->channels));
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, bind(k->md, x, "batchnorm input")},
      {DNNL_ARG_DIFF_DST, bind(k->md, dy, "batchnorm dy")},
      {DNNL_ARG_MEAN, memory(k->c_md, engine(), k->mean)},
      {DNNL_ARG_VARIANCE, memory(k->c_md, engine(), k->var)},
      {DNNL_ARG_SCALE, bind(k->c_md, scale, "batchnorm scale")},
      {DNNL_ARG_DIFF_SRC, bind(k->md, dx, "batchnorm dx")},
      {DNNL_ARG_DIFF_SCALE, ds},
      {DNNL_ARG_DIFF_SHIFT, db}};
  if (k->fuse_relu) args[DNNL_ARG_WORKSPACE] = k->workspace();
  return primitive_step("batchnorm backward", dnnl::batch_normalization_backward(k->bwd),
                        std::move(args), k->bwd.scratchpad_desc());
}

struct LayerNormKernel {
  memory::desc md, stat_md, c_md;
  std::int64_t rows, cols;
  bool training, has_shift;
  dnnl::layer_normalization_forward::primitive_desc fwd;
  dnnl::layer_normalization_backward::primitive_desc bwd;
  Aligned mean_buf, var_buf, zero_shift, dscale_buf, dshift_buf;
  float *mean = nullptr, *var = nullptr;
  std::string info;

  memory::desc dst_md;  // md, or its bf16 twin when the output is kept in bf16

  LayerNormKernel(std::int64_t r, std::int64_t c, float eps, bool train, bool shift,
                  bool bf16_output)
      : rows(r), cols(c), training(train), has_shift(shift) {
    md = make_md({rows, cols}, "plain");
    dst_md = make_md({rows, cols}, "plain", bf16_output ? dt::bf16 : dt::f32);
    stat_md = make_md({rows}, "plain");
    c_md = make_md({cols}, "plain");
    auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    const auto prop = training ? dnnl::prop_kind::forward_training
                               : dnnl::prop_kind::forward_inference;
    fwd = dnnl::layer_normalization_forward::primitive_desc(engine(), prop, md, dst_md, stat_md, eps,
                                                            flags, scratch_attr());
    mean = mean_buf.floats(rows);
    var = var_buf.floats(rows);
    info = impl(fwd);
    if (!has_shift) {
      float* z = zero_shift.floats(cols);
      std::fill(z, z + cols, 0.f);
    }
    if (training) {
      bwd = dnnl::layer_normalization_backward::primitive_desc(
          engine(), dnnl::prop_kind::backward, md, md, md, stat_md, eps, flags, fwd,
          scratch_attr());
      info += ", bwd " + impl(bwd);
    }
  }

  memory shift_or_zero(std::optional<py::array> b) {
    if (b) return bind(c_md, *b, "layernorm B");
    return memory(c_md, engine(), zero_shift.floats(cols));
  }
};

using LayerNormPtr = std::shared_ptr<LayerNormKernel>;

StepPtr ln_forward(const LayerNormPtr& k, const py::array& x, const py::array& scale,
                   std::optional<py::array> b, const py::array& y) {
  return primitive_step("layernorm forward", dnnl::layer_normalization_forward(k->fwd),
                        {{DNNL_ARG_SRC, bind(k->md, x, "layernorm input")},
                         {DNNL_ARG_DST, bind(k->dst_md, y, "layernorm output")},
                         {DNNL_ARG_SCALE, bind(k->c_md, scale, "layernorm scale")},
                         {DNNL_ARG_SHIFT, k->shift_or_zero(b)},
                         {DNNL_ARG_MEAN, memory(k->stat_md, engine(), k->mean)},
                         {DNNL_ARG_VARIANCE, memory(k->stat_md, engine(), k->var)}},
                        k->fwd.scratchpad_desc());
}

StepPtr ln_backward(const LayerNormPtr& k, const py::array& x, const py::array& dy,
                    const py::array& scale, std::optional<py::array> b, const py::array& dx,
                    std::optional<py::array> dscale, std::optional<py::array> dshift) {
  if (!k->training) throw std::invalid_argument("meta._plan.LayerNorm: built for inference");
  const memory ds = dscale ? bind(k->c_md, *dscale, "layernorm dscale")
                           : memory(k->c_md, engine(), k->dscale_buf.floats(k->cols));
  const memory db = dshift ? bind(k->c_md, *dshift, "layernorm dB")
                           : memory(k->c_md, engine(), k->dshift_buf.floats(k->cols));
  return primitive_step("layernorm backward", dnnl::layer_normalization_backward(k->bwd),
                        {{DNNL_ARG_SRC, bind(k->md, x, "layernorm input")},
                         {DNNL_ARG_DIFF_DST, bind(k->md, dy, "layernorm dy")},
                         {DNNL_ARG_SCALE, bind(k->c_md, scale, "layernorm scale")},
                         {DNNL_ARG_SHIFT, k->shift_or_zero(b)},
                         {DNNL_ARG_MEAN, memory(k->stat_md, engine(), k->mean)},
                         {DNNL_ARG_VARIANCE, memory(k->stat_md, engine(), k->var)},
                         {DNNL_ARG_DIFF_SRC, bind(k->md, dx, "layernorm dx")},
                         {DNNL_ARG_DIFF_SCALE, ds},
                         {DNNL_ARG_DIFF_SHIFT, db}},
                        k->bwd.scratchpad_desc());
}

}  // namespace

void bind_norm(py::module_& m) {
  py::class_<BatchNormKernel, BatchNormPtr>(m, "BatchNorm",
                                            "BatchNormalization's primitives for one shape.")
      .def(py::init<Dims, std::string, float, float, bool, bool>(), py::arg("dims"),
           py::arg("layout"), py::arg("epsilon"), py::arg("momentum"), py::arg("training"),
           py::arg("fuse_relu") = false)
      .def_readonly("info", &BatchNormKernel::info)
      .def("forward", &bn_forward, py::arg("x"), py::arg("scale"), py::arg("b"),
           py::arg("mean"), py::arg("var"), py::arg("y"), py::arg("residual") = py::none(),
           "residual: y = relu(bn(x) + residual) (training loops, built with fuse_relu)")
      .def("update", &bn_update, py::arg("running_mean"), py::arg("running_var"))
      .def("backward", &bn_backward, py::arg("x"), py::arg("dy"), py::arg("scale"),
           py::arg("dx"), py::arg("dscale"), py::arg("db"), py::arg("b") = py::none(),
           py::arg("y") = py::none(), py::arg("dresidual") = py::none(),
           py::arg("accumulate") = false,
           "y, dresidual: the forward added a residual; dy masked by y > 0 is written to "
           "dresidual too (added to it with accumulate)");
  py::class_<LayerNormKernel, LayerNormPtr>(m, "LayerNorm",
                                            "LayerNormalization over rows of (rows, cols).")
      .def(py::init<std::int64_t, std::int64_t, float, bool, bool, bool>(), py::arg("rows"),
           py::arg("cols"), py::arg("epsilon"), py::arg("training"), py::arg("has_bias"),
           py::arg("bf16_output") = false,
           "bf16_output: y written in bf16 (statistics and the backward stay float32)")
      .def_readonly("info", &LayerNormKernel::info)
      .def("forward", &ln_forward, py::arg("x"), py::arg("scale"), py::arg("b"), py::arg("y"))
      .def("backward", &ln_backward, py::arg("x"), py::arg("dy"), py::arg("scale"),
           py::arg("b"), py::arg("dx"), py::arg("dscale"), py::arg("db"));
}

}  // namespace meta::plan
