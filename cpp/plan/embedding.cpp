// The embedding in a plan (our loops): Gather of rows of a (rows, width) float32 table by
// int32 or int64 ids, and its backward, the scatter-add of dy's rows into the table's
// gradient (meta/lv1/plan/lowering/embedding.py).
//
// Forward copies one row per token, the tokens shared among the threads. Backward must give
// the same bits at any thread count, so no thread splits a sum: each thread owns a range of
// the width's columns (whole cache lines of 16 floats) and walks every token in order, adding
// its slice of dy's row into the token's row. Every gradient entry is thus summed in token
// order whatever the threads, as numpy's add.at does, and the work is balanced however the
// tokens are spread over the vocabulary (a character model's few common letters).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

namespace {

// below this many floats moved, a parallel region costs more than it saves
constexpr std::int64_t kParallel = 1 << 15;

// The ids wrapped into 0..rows-1 (ONNX: -k is row rows-k); an id out of [-rows, rows) raises
// IndexError (pybind11 maps std::out_of_range to it) naming the node, as the Python step did.
template <class I>
void check_ids(const I* ids, std::int64_t n, std::int64_t rows, const std::string& node) {
  I low = 0, high = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    low = std::min(low, ids[i]);
    high = std::max(high, ids[i]);
  }
  if (n && (std::int64_t(low) < -rows || std::int64_t(high) >= rows))
    throw std::out_of_range("node '" + node + "': Gather index out of range [-" +
                            std::to_string(rows) + ", " + std::to_string(rows - 1) + "]");
}

template <class I>
inline std::int64_t wrap(I id, std::int64_t rows) {
  return id < 0 ? std::int64_t(id) + rows : std::int64_t(id);
}

template <class I>
StepPtr forward(std::int64_t rows, std::int64_t width, std::int64_t n, const I* ids,
                const float* table, float* y, const std::string& node) {
  return std::make_shared<LambdaStep>("embedding", [=] {
    check_ids(ids, n, rows, node);
#pragma omp parallel for schedule(static) if (n * width >= kParallel)
    for (std::int64_t i = 0; i < n; ++i)
      std::memcpy(y + i * width, table + wrap(ids[i], rows) * width, width * sizeof(float));
  });
}

// dw (+)= sum over tokens i of dy[i] into row ids[i]; `add` keeps what dw holds (a tied
// weight's other gradient), else dw is zeroed first (rows shared among the threads).
template <class I>
StepPtr backward(std::int64_t rows, std::int64_t width, std::int64_t n, const I* ids,
                 const float* dy, float* dw, bool add, const std::string& node) {
  return std::make_shared<LambdaStep>("embedding backward", [=] {
    check_ids(ids, n, rows, node);
    const std::int64_t work = n * width + (add ? 0 : rows * width);
#pragma omp parallel if (work >= kParallel)
    {
      const std::int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      if (!add) {
        const std::int64_t r0 = rows * t / threads, r1 = rows * (t + 1) / threads;
        std::memset(dw + r0 * width, 0, (r1 - r0) * width * sizeof(float));
#pragma omp barrier
      }
      const std::int64_t lines = (width + 15) / 16;
      const std::int64_t c0 = std::min(width, lines * t / threads * 16);
      const std::int64_t c1 = std::min(width, lines * (t + 1) / threads * 16);
      if (c0 < c1) {
        for (std::int64_t i = 0; i < n; ++i) {
          float* __restrict d = dw + wrap(ids[i], rows) * width;
          const float* __restrict s = dy + i * width;
#pragma omp simd
          for (std::int64_t c = c0; c < c1; ++c) d[c] += s[c];
        }
      }
    }
  });
}

// The ids' element type picks the loop: int64 (what exporters write) or int32.
template <class F>
StepPtr by_id_type(const py::array& ids, std::int64_t n, const char* what, F&& make) {
  if (ids.dtype().is(py::dtype::of<std::int64_t>()))
    return make(static_cast<const std::int64_t*>(address(ids, n * 8, what)));
  if (ids.dtype().is(py::dtype::of<std::int32_t>()))
    return make(static_cast<const std::int32_t*>(address(ids, n * 4, what)));
  throw std::invalid_argument(std::string("meta._plan: ") + what + " must be int32 or int64");
}

StepPtr embedding(std::int64_t rows, std::int64_t width, std::int64_t n, const py::array& ids,
                  const py::array& table, const py::array& y, const std::string& node) {
  const float* t =
      static_cast<const float*>(address(table, rows * width * 4, "embedding table"));
  float* out = static_cast<float*>(address(y, n * width * 4, "embedding output"));
  return by_id_type(ids, n, "embedding ids", [&](const auto* p) {
    return forward(rows, width, n, p, t, out, node);
  });
}

StepPtr embedding_backward(std::int64_t rows, std::int64_t width, std::int64_t n,
                           const py::array& ids, const py::array& dy, const py::array& dw,
                           bool add, const std::string& node) {
  const float* g = static_cast<const float*>(address(dy, n * width * 4, "embedding dy"));
  float* d = static_cast<float*>(address(dw, rows * width * 4, "embedding table gradient"));
  return by_id_type(ids, n, "embedding ids", [&](const auto* p) {
    return backward(rows, width, n, p, g, d, add, node);
  });
}

}  // namespace

void bind_embedding(py::module_& m) {
  m.def("embedding", &embedding, py::arg("rows"), py::arg("width"), py::arg("n"),
        py::arg("ids"), py::arg("table"), py::arg("y"), py::arg("node"),
        "y[i] = table[ids[i]] for n ids (int32 or int64; -k is row rows-k).");
  m.def("embedding_backward", &embedding_backward, py::arg("rows"), py::arg("width"),
        py::arg("n"), py::arg("ids"), py::arg("dy"), py::arg("dw"), py::arg("add"),
        py::arg("node"),
        "dw[ids[i]] += dy[i] in token order (dw zeroed first unless add): the same bits at "
        "any thread count.");
}

}  // namespace meta::plan
