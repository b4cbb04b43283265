// SoftmaxCrossEntropyLoss in a plan, exactly as ONNX defines it (ops/softmax_cross_entropy_loss.py
// is the reference): log-softmax of scores (N, C, D...) over C, then each element's loss
// -w[t] * logp[n, t, d] with t its label (w the class weights, 1 without; 0 where t is the
// ignore_index), reduced by "none" (loss (N, D...)), "sum", or "mean" (divided by the sum of the
// elements' w: their count without weights, the counted ones with an ignore_index).
//
// D is the product of the trailing dims (1 for (N, C)); the classes of one element lie D apart.
// Work is split into tasks of (n, a block of d) over OpenMP; the reduction adds the tasks'
// partial sums in task order (in double), so the loss does not depend on the thread count.
// e^x over positions (D > 1, a language model's (N, vocab, T)) is meta::exp_vec, vectorised
// across the block (std::exp, a scalar call, made this slower than numpy). (N, C) rows keep
// std::exp summed in class order, the loop this kernel replaced, so a classifier's results are
// the same to the bit as before. Not for accuracy (both are within about 1 ulp of float64,
// unbiased) but because a ReLU network's trajectory is not a continuous function of the last
// bit: in tests/lv1/test_batchnorm_precision.py's CNN one pre-ReLU value sits 8e-7 below zero
// at step 5 (PyTorch float64), exp_vec's 1-ulp differences in dscores put it above, and its
// parameters end 3.6e-4 from PyTorch's instead of 1.4e-6 (PyTorch float32 itself, its initial
// weights moved by 1 ulp, lands that far in 3 of 12 tries). Rows of kVectorClasses classes or
// more (a language model's (N*T, vocab) logits) take exp_vec with a vectorised sum too: there
// std::exp's scalar calls were 5-9 % of a GPT-2 or Llama fixture's training step.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "meta/activations.hpp"
#include "plan.hpp"

namespace meta::plan {

namespace {

// From this many classes an (N, C) row's e^x is vectorised (exp_vec, sums in lanes): a
// vocabulary, not a classifier's few classes, whose bits the scalar loop keeps (see the top).
constexpr std::int64_t kVectorClasses = 256;

constexpr std::int64_t kBlock = 64;  // elements d per task when D > 1
constexpr std::int64_t kParallelMin = 1 << 15;  // below this many scores: one thread

struct LossShape {
  std::int64_t n, c, d;
  std::int64_t blocks() const {
    return d == 1 ? (n + kBlock - 1) / kBlock : n * ((d + kBlock - 1) / kBlock);
  }
  // task -> the rows n0..n1 and columns d0..d1 it covers
  void range(std::int64_t task, std::int64_t& n0, std::int64_t& n1, std::int64_t& d0,
             std::int64_t& d1) const {
    if (d == 1) {
      n0 = task * kBlock;
      n1 = std::min(n, n0 + kBlock);
      d0 = 0;
      d1 = 1;
    } else {
      const std::int64_t per = (d + kBlock - 1) / kBlock;
      n0 = task / per;
      n1 = n0 + 1;
      d0 = (task % per) * kBlock;
      d1 = std::min(d, d0 + kBlock);
    }
  }
};

// Labels as int64 or int32 (both are ONNX's), read as int64.
struct Labels {
  const void* p;
  bool wide;
  std::int64_t operator[](std::int64_t i) const {
    return wide ? static_cast<const std::int64_t*>(p)[i]
                : std::int64_t(static_cast<const std::int32_t*>(p)[i]);
  }
};

std::string range_error(const std::string& node, std::int64_t c, std::int64_t bad) {
  return "SoftmaxCrossEntropyLoss node '" + node + "': targets must lie in [0, " +
         std::to_string(c - 1) + "] (or be the ignore_index), got " + std::to_string(bad);
}

// loss (1 value, or N*D for "none"); logp (N, C, D); denom: the mean's divisor, for backward.
StepPtr cross_entropy(const std::string& node, std::int64_t n, std::int64_t c, std::int64_t d,
                      const std::string& reduction, std::optional<std::int64_t> ignore_index,
                      const py::array& scores, const py::array& labels,
                      std::optional<py::array> weights, const py::array& loss,
                      const py::array& logp, const py::array& denom) {
  const LossShape sh{n, c, d};
  const std::int64_t total = n * c * d;
  const bool wide = labels.itemsize() == 8;
  const float* s = static_cast<const float*>(address(scores, total * 4, "loss scores"));
  const Labels t{address(labels, n * d * labels.itemsize(), "loss labels"), wide};
  const float* w = weights ? static_cast<const float*>(address(*weights, c * 4, "loss weights"))
                           : nullptr;
  const bool none = reduction == "none", mean = reduction == "mean";
  if (!none && !mean && reduction != "sum")
    throw std::invalid_argument("meta._plan.cross_entropy: unknown reduction " + reduction);
  float* l = static_cast<float*>(address(loss, (none ? n * d : 1) * 4, "loss"));
  float* lp = static_cast<float*>(address(logp, total * 4, "loss log-probabilities"));
  float* den = static_cast<float*>(address(denom, 4, "loss divisor"));
  const bool ignore = ignore_index.has_value();
  const std::int64_t ig = ignore ? *ignore_index : 0;
  return std::make_shared<LambdaStep>("softmax cross-entropy", [=] {
    const std::int64_t tasks = sh.blocks();
    std::vector<double> part(tasks * 2, 0.0);  // per task: sum of losses, sum of weights
    std::int64_t bad = -1;
    bool out_of_range = false;
#pragma omp parallel for schedule(static) if (total > kParallelMin)
    for (std::int64_t task = 0; task < tasks; ++task) {
      std::int64_t n0, n1, d0, d1;
      sh.range(task, n0, n1, d0, d1);
      double sum = 0, wsum = 0;
      float m[kBlock], z[kBlock];
      for (std::int64_t i = n0; i < n1; ++i) {
        const float* row = s + i * c * d;
        float* out = lp + i * c * d;
        const std::int64_t len = d1 - d0;
        if (d == 1) {  // classes contiguous
          float mx = row[0];
#pragma omp simd reduction(max : mx)
          for (std::int64_t j = 1; j < c; ++j) mx = std::max(mx, row[j]);
          float zz = 0;
          if (c >= kVectorClasses) {
#pragma omp simd reduction(+ : zz)
            for (std::int64_t j = 0; j < c; ++j) zz += meta::exp_vec(row[j] - mx);
          } else {
            for (std::int64_t j = 0; j < c; ++j) zz += std::exp(row[j] - mx);  // in order
          }
          const float lz = mx + std::log(zz);
#pragma omp simd
          for (std::int64_t j = 0; j < c; ++j) out[j] = row[j] - lz;
        } else {  // classes D apart: a block of columns at a time
          std::copy(row + d0, row + d1, m);
          for (std::int64_t j = 1; j < c; ++j) {
            const float* r = row + j * d + d0;
#pragma omp simd
            for (std::int64_t k = 0; k < len; ++k) m[k] = std::max(m[k], r[k]);
          }
          std::fill(z, z + len, 0.f);
          for (std::int64_t j = 0; j < c; ++j) {
            const float* r = row + j * d + d0;
#pragma omp simd
            for (std::int64_t k = 0; k < len; ++k) z[k] += meta::exp_vec(r[k] - m[k]);
          }
          for (std::int64_t k = 0; k < len; ++k) m[k] += std::log(z[k]);
          for (std::int64_t j = 0; j < c; ++j) {
            const float* r = row + j * d + d0;
            float* o = out + j * d + d0;
#pragma omp simd
            for (std::int64_t k = 0; k < len; ++k) o[k] = r[k] - m[k];
          }
        }
        for (std::int64_t k = d0; k < d1; ++k) {
          const std::int64_t e = i * d + k, label = t[e];
          float each = 0.f, wt = 0.f;
          if (!(ignore && label == ig)) {
            if (label < 0 || label >= c) {
#pragma omp critical(meta_loss_range)
              {
                out_of_range = true;
                bad = label;
              }
              continue;
            }
            wt = w ? w[label] : 1.f;
            each = -out[label * d + k] * wt;
          }
          if (none) l[e] = each;
          sum += each;
          wsum += wt;
        }
      }
      part[task * 2] = sum;
      part[task * 2 + 1] = wsum;
    }
    if (out_of_range) throw std::out_of_range(range_error(node, c, bad));
    *den = 1.f;
    if (none) return;
    double sum = 0, wsum = 0;
    for (std::int64_t i = 0; i < tasks; ++i) {
      sum += part[i * 2];
      wsum += part[i * 2 + 1];
    }
    // as the operator: float32 total over the divisor (0/0 is nan, as numpy's)
    *den = mean ? float(wsum) : 1.f;
    *l = mean ? float(sum) / float(wsum) : float(sum);
  });
}

// dscores = k * (softmax - onehot(t)) + dlogp - softmax * sum_c dlogp, with k the element's
// d(loss)/d(its loss): dloss (per element for "none") / divisor, times its weight (0 if
// ignored). dlogp is the log-probabilities' own gradient when they are read downstream.
// dweights (when the class weights are trained): the operator's, from logp, loss and divisor.
StepPtr cross_entropy_backward(std::int64_t n, std::int64_t c, std::int64_t d,
                               const std::string& reduction,
                               std::optional<std::int64_t> ignore_index,
                               std::optional<py::array> dloss, const py::array& logp,
                               const py::array& labels, std::optional<py::array> weights,
                               const py::array& denom, const py::array& loss,
                               std::optional<py::array> dlogp,
                               std::optional<py::array> dscores,
                               std::optional<py::array> dweights) {
  const LossShape sh{n, c, d};
  const std::int64_t total = n * c * d;
  const bool none = reduction == "none", mean = reduction == "mean";
  // no dloss: only the log-probabilities have a gradient
  const float* dl = dloss ? static_cast<const float*>(
                                address(*dloss, (none ? n * d : 1) * 4, "loss gradient"))
                          : nullptr;
  const float* lp = static_cast<const float*>(address(logp, total * 4, "log-probabilities"));
  const Labels t{address(labels, n * d * labels.itemsize(), "labels"), labels.itemsize() == 8};
  const float* w = weights ? static_cast<const float*>(address(*weights, c * 4, "loss weights"))
                           : nullptr;
  const float* den = static_cast<const float*>(address(denom, 4, "loss divisor"));
  const float* gl =
      dlogp ? static_cast<const float*>(address(*dlogp, total * 4, "logp gradient")) : nullptr;
  float* ds = dscores ? static_cast<float*>(address(*dscores, total * 4, "loss dscores"))
                      : nullptr;
  float* dw = dweights ? static_cast<float*>(address(*dweights, c * 4, "loss dweights"))
                       : nullptr;
  const float* l = static_cast<const float*>(address(loss, (none ? n * d : 1) * 4, "loss"));
  const bool ignore = ignore_index.has_value();
  const std::int64_t ig = ignore ? *ignore_index : 0;
  return std::make_shared<LambdaStep>("softmax cross-entropy backward", [=] {
    const std::int64_t tasks = sh.blocks();
    const float scale = !dl || none ? 1.f : mean ? *dl / *den : *dl;
    if (dw) {  // the class weights' gradient: each counted element's loss per unit weight
      std::vector<double> acc(c, 0.0);
      for (std::int64_t e = 0; dl && e < n * d; ++e) {
        const std::int64_t label = t[e], i = e / d, k = e % d;
        if ((ignore && label == ig) || label < 0 || label >= c) continue;
        const float picked = lp[(i * c + label) * d + k];
        acc[label] += mean ? (-picked - *l) / *den * *dl : none ? -picked * dl[e] : -picked * *dl;
      }
      for (std::int64_t j = 0; j < c; ++j) dw[j] = float(acc[j]);
    }
    if (!ds) return;
#pragma omp parallel for schedule(static) if (total > kParallelMin)
    for (std::int64_t task = 0; task < tasks; ++task) {
      std::int64_t n0, n1, d0, d1;
      sh.range(task, n0, n1, d0, d1);
      const std::int64_t len = d1 - d0;
      float k[kBlock], g[kBlock];
      for (std::int64_t i = n0; i < n1; ++i) {
        const float* lrow = lp + i * c * d;
        float* drow = ds + i * c * d;
        const float* grow = gl ? gl + i * c * d : nullptr;
        for (std::int64_t q = 0; q < len; ++q) {
          const std::int64_t e = i * d + d0 + q, label = t[e];
          // labels were checked by the forward
          const bool skip = !dl || (ignore && label == ig) || label < 0 || label >= c;
          k[q] = skip ? 0.f : (none ? dl[e] : scale) * (w ? w[label] : 1.f);
          g[q] = 0.f;
        }
        if (grow) {
          for (std::int64_t j = 0; j < c; ++j) {
            const float* r = grow + j * d + d0;
            for (std::int64_t q = 0; q < len; ++q) g[q] += r[q];
          }
        }
        for (std::int64_t q = 0; q < len; ++q) g[q] = k[q] - g[q];  // the softmax's factor
        if (d == 1) {  // one element, classes contiguous
          const float f = g[0];  // std::exp, as the forward (see the top)
          if (c >= kVectorClasses && grow) {
#pragma omp simd
            for (std::int64_t j = 0; j < c; ++j) drow[j] = meta::exp_vec(lrow[j]) * f + grow[j];
          } else if (c >= kVectorClasses) {
#pragma omp simd
            for (std::int64_t j = 0; j < c; ++j) drow[j] = meta::exp_vec(lrow[j]) * f;
          } else if (grow) {
            for (std::int64_t j = 0; j < c; ++j) drow[j] = std::exp(lrow[j]) * f + grow[j];
          } else {
            for (std::int64_t j = 0; j < c; ++j) drow[j] = std::exp(lrow[j]) * f;
          }
        } else {
          for (std::int64_t j = 0; j < c; ++j) {
            const float* r = lrow + j * d + d0;
            float* o = drow + j * d + d0;
            if (grow) {
              const float* gr = grow + j * d + d0;
#pragma omp simd
              for (std::int64_t q = 0; q < len; ++q) o[q] = meta::exp_vec(r[q]) * g[q] + gr[q];
            } else {
#pragma omp simd
              for (std::int64_t q = 0; q < len; ++q) o[q] = meta::exp_vec(r[q]) * g[q];
            }
          }
        }
        for (std::int64_t q = 0; q < len; ++q) {
          const std::int64_t label = t[i * d + d0 + q];
          if (!(ignore && label == ig) && label >= 0 && label < c)
            drow[label * d + d0 + q] -= k[q];
        }
      }
    }
  });
}

}  // namespace

void bind_loss(py::module_& m) {
  m.def("cross_entropy", &cross_entropy, py::arg("node"), py::arg("n"), py::arg("c"),
        py::arg("d"), py::arg("reduction"), py::arg("ignore_index"), py::arg("scores"),
        py::arg("labels"), py::arg("weights"), py::arg("loss"), py::arg("logp"),
        py::arg("denom"));
  m.def("cross_entropy_backward", &cross_entropy_backward, py::arg("n"), py::arg("c"),
        py::arg("d"), py::arg("reduction"), py::arg("ignore_index"), py::arg("dloss"),
        py::arg("logp"), py::arg("labels"), py::arg("weights"), py::arg("denom"),
        py::arg("loss"), py::arg("dlogp"), py::arg("dscores"), py::arg("dweights"));
}

}  // namespace meta::plan
