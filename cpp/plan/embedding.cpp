// Gather in a plan (our loops), for the embedding (rows of a (rows, width) float32 table by
// int32 or int64 token ids, meta/lv1/plan/lowering/embedding.py) and for Gather by constant
// indices along any axis (lowering/views.py: a BERT's first token, h[:, 0]): x seen as
// (outer, rows, inner), y[o, j] = x[o, ids[j]]; and the backward, the scatter-add of dy's
// rows into dx.
//
// Forward copies one row per (o, j), shared among the threads. Backward must give the same
// bits at any thread count, so no thread splits a sum: each thread owns whole slabs o, or,
// with fewer slabs than threads (the embedding: one), a range of columns (whole cache lines of
// 16 floats), and walks every id in order, adding its slice of dy's row into the id's row.
// Every gradient entry is thus summed in the ids' order whatever the threads, as numpy's
// add.at does, and the work is balanced however the tokens are spread over the vocabulary (a
// character model's few common letters).
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

// y[o, j] = x[o, ids[j]] for o < outer, j < n: rows of `inner` floats, one per (o, j), shared
// among the threads.
template <class I>
StepPtr forward(std::int64_t outer, std::int64_t rows, std::int64_t inner, std::int64_t n,
                const I* ids, const float* x, float* y, const std::string& node) {
  return std::make_shared<LambdaStep>("gather", [=] {
    check_ids(ids, n, rows, node);
#pragma omp parallel for schedule(static) if (outer * n * inner >= kParallel)
    for (std::int64_t k = 0; k < outer * n; ++k) {
      const std::int64_t o = k / n, j = k % n;
      std::memcpy(y + k * inner, x + (o * rows + wrap(ids[j], rows)) * inner,
                  inner * sizeof(float));
    }
  });
}

// dx[o, ids[j]] (+)= dy[o, j] for every j in order; `add` keeps what dx holds (a tied weight's
// other gradient), else dx is zeroed first. With at least as many slabs (o) as threads, each
// thread owns whole slabs; else (the embedding: one slab) each owns a range of columns.
template <class I>
StepPtr backward(std::int64_t outer, std::int64_t rows, std::int64_t inner, std::int64_t n,
                 const I* ids, const float* dy, float* dx, bool add, const std::string& node) {
  return std::make_shared<LambdaStep>("gather backward", [=] {
    check_ids(ids, n, rows, node);
    const std::int64_t slab = rows * inner;
    const std::int64_t work = outer * (n * inner + (add ? 0 : slab));
#pragma omp parallel if (work >= kParallel)
    {
      const std::int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      std::int64_t o0 = 0, o1 = outer, c0 = 0, c1 = inner;
      if (outer >= threads) {
        o0 = outer * t / threads;
        o1 = outer * (t + 1) / threads;
        if (!add) std::memset(dx + o0 * slab, 0, (o1 - o0) * slab * sizeof(float));
      } else {
        if (!add) {
          const std::int64_t total = outer * rows;  // rows of all slabs, shared out
          const std::int64_t r0 = total * t / threads, r1 = total * (t + 1) / threads;
          std::memset(dx + r0 * inner, 0, (r1 - r0) * inner * sizeof(float));
#pragma omp barrier
        }
        const std::int64_t lines = (inner + 15) / 16;
        c0 = std::min(inner, lines * t / threads * 16);
        c1 = std::min(inner, lines * (t + 1) / threads * 16);
      }
      for (std::int64_t o = o0; o < o1 && c0 < c1; ++o) {
        for (std::int64_t j = 0; j < n; ++j) {
          float* __restrict d = dx + o * slab + wrap(ids[j], rows) * inner;
          const float* __restrict s = dy + (o * n + j) * inner;
#pragma omp simd
          for (std::int64_t c = c0; c < c1; ++c) d[c] += s[c];
        }
      }
    }
  });
}

// The ids' element type picks the loop: int64 (what exporters write) or int32. Dtypes are
// compared by value (numpy's ==), never by identity: an array that crossed a process boundary
// (pickled, a multiprocessing loader's batch) has an equal but distinct dtype object.
template <class F>
StepPtr by_id_type(const py::array& ids, std::int64_t n, const char* what, F&& make) {
  if (ids.dtype().equal(py::dtype::of<std::int64_t>()))
    return make(static_cast<const std::int64_t*>(address(ids, n * 8, what)));
  if (ids.dtype().equal(py::dtype::of<std::int32_t>()))
    return make(static_cast<const std::int32_t*>(address(ids, n * 4, what)));
  throw std::invalid_argument(std::string("meta._plan: ") + what +
                              " must be int32 or int64 in native byte order, got " +
                              py::str(ids.dtype()).cast<std::string>());
}

StepPtr gather(std::int64_t outer, std::int64_t rows, std::int64_t inner, std::int64_t n,
               const py::array& ids, const py::array& x, const py::array& y,
               const std::string& node) {
  const float* px =
      static_cast<const float*>(address(x, outer * rows * inner * 4, "gather input"));
  float* out = static_cast<float*>(address(y, outer * n * inner * 4, "gather output"));
  return by_id_type(ids, n, "gather indices", [&](const auto* p) {
    return forward(outer, rows, inner, n, p, px, out, node);
  });
}

StepPtr gather_backward(std::int64_t outer, std::int64_t rows, std::int64_t inner,
                        std::int64_t n, const py::array& ids, const py::array& dy,
                        const py::array& dx, bool add, const std::string& node) {
  const float* g = static_cast<const float*>(address(dy, outer * n * inner * 4, "gather dy"));
  float* d = static_cast<float*>(address(dx, outer * rows * inner * 4, "gather dx"));
  return by_id_type(ids, n, "gather indices", [&](const auto* p) {
    return backward(outer, rows, inner, n, p, g, d, add, node);
  });
}

}  // namespace

void bind_embedding(py::module_& m) {
  m.def("gather", &gather, py::arg("outer"), py::arg("rows"), py::arg("inner"), py::arg("n"),
        py::arg("ids"), py::arg("x"), py::arg("y"), py::arg("node"),
        "y[o, j] = x[o, ids[j]]: x seen as (outer, rows, inner), y as (outer, n, inner); "
        "n ids, int32 or int64, -k is row rows-k.");
  m.def("gather_backward", &gather_backward, py::arg("outer"), py::arg("rows"),
        py::arg("inner"), py::arg("n"), py::arg("ids"), py::arg("dy"), py::arg("dx"),
        py::arg("add"), py::arg("node"),
        "dx[o, ids[j]] += dy[o, j] in the ids' order (dx zeroed first unless add): the same "
        "bits at any thread count.");
}

}  // namespace meta::plan
