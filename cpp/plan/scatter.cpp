// ScatterND in a plan (meta/lv1/plan/lowering/scatter.py): y = data with each of the n slices
// of `updates` written at (reduction "none") or combined into (add, mul, max, min) the slice
// of y its index tuple names; and the backward's two halves (ops/scatter_nd.py): dy with the
// written slices zeroed (none) or as is (add), and dy's slices at the indices (gather); for
// mul, max and min the same halves from the forward's values (scatter_nd_backward_reduce).
//
// Indices are read when the step runs (a caller may feed them), each tuple checked against
// data's shape (negative entries count from the end, as numpy's indexing does). Tuples are
// applied one at a time in their order, as numpy's assignment and ufunc.at do (a repeated
// index: the last write wins, or the reductions combine in order); the columns of one slice
// are split among the threads when slices are long enough to pay for it.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "plan.hpp"

namespace meta::plan {

namespace {

constexpr std::int64_t kParallel = 1 << 14;

// Where each index tuple's slice starts in data (elements): k entries per tuple.
struct Layout {
  Dims dims;              // data's shape
  std::int64_t k = 0;     // entries per tuple
  std::int64_t n = 0;     // tuples
  std::int64_t slice = 1; // elements per slice
  std::int64_t total = 1; // elements of data
};

std::vector<std::int64_t> offsets(const Layout& l, const std::int64_t* idx,
                                  const std::string& node) {
  std::vector<std::int64_t> out(l.n);
  for (std::int64_t j = 0; j < l.n; ++j) {
    std::int64_t off = 0;
    for (std::int64_t t = 0; t < l.k; ++t) {
      std::int64_t i = idx[j * l.k + t], d = l.dims[t];
      if (i < -d || i >= d)
        throw std::out_of_range("node '" + node + "': ScatterND index " + std::to_string(i) +
                                " is out of bounds for axis " + std::to_string(t) +
                                " with size " + std::to_string(d));
      off = off * d + (i < 0 ? i + d : i);
    }
    out[j] = off * l.slice;
  }
  return out;
}

template <class T>
inline void combine(int reduction, T* y, const T* u, std::int64_t c0, std::int64_t c1) {
  switch (reduction) {
    case 0:
      std::copy(u + c0, u + c1, y + c0);
      break;
    case 1:
#pragma omp simd
      for (std::int64_t i = c0; i < c1; ++i) y[i] += u[i];
      break;
    case 2:
#pragma omp simd
      for (std::int64_t i = c0; i < c1; ++i) y[i] *= u[i];
      break;
    case 3:
      for (std::int64_t i = c0; i < c1; ++i) y[i] = std::max(y[i], u[i]);
      break;
    default:
      for (std::int64_t i = c0; i < c1; ++i) y[i] = std::min(y[i], u[i]);
  }
}

// Calls f(T{}) for x's dtype (float32, float64, int32, int64).
template <class F>
StepPtr by_dtype(const py::array& x, const char* what, F f) {
  const auto kind = x.dtype().kind();
  const auto size = x.itemsize();
  if (kind == 'f' && size == 4) return f(float{});
  if (kind == 'f' && size == 8) return f(double{});
  if (kind == 'i' && size == 4) return f(std::int32_t{});
  if (kind == 'i' && size == 8) return f(std::int64_t{});
  throw std::invalid_argument(std::string(what) + ": dtype must be float32, float64, int32 "
                              "or int64");
}

Layout layout(const Dims& dims, std::int64_t k, std::int64_t n) {
  Layout l{dims, k, n};
  for (std::size_t i = 0; i < dims.size(); ++i) {
    l.total *= dims[i];
    if (std::int64_t(i) >= k) l.slice *= dims[i];
  }
  return l;
}

// y = data, then slice j of updates combined into y at tuple j, for j in order.
StepPtr scatter_nd(const Dims& dims, std::int64_t k, std::int64_t n, const py::array& indices,
                   const std::string& reduction, const py::array& data,
                   const py::array& updates, const py::array& y, const std::string& node) {
  const Layout l = layout(dims, k, n);
  const int red = reduction == "none" ? 0 : reduction == "add" ? 1 : reduction == "mul" ? 2
                  : reduction == "max" ? 3 : reduction == "min" ? 4 : -1;
  if (red < 0) throw std::invalid_argument("scatter_nd: unknown reduction " + reduction);
  const auto size = data.itemsize();
  const auto* pi = static_cast<const std::int64_t*>(address(indices, n * k * 8, "indices"));
  const void* pd = address(data, l.total * size, "scatter data");
  const void* pu = address(updates, n * l.slice * size, "scatter updates");
  void* py_ = address(y, l.total * size, "scatter output");
  return by_dtype(data, "scatter_nd", [=](auto tag) -> StepPtr {
    using T = decltype(tag);
    return std::make_shared<LambdaStep>("scatter_nd", [=] {
      const auto at = offsets(l, pi, node);
      T* out = static_cast<T*>(py_);
      const T* u = static_cast<const T*>(pu);
      if (pd != py_) std::memcpy(py_, pd, l.total * sizeof(T));
      const bool wide = l.slice >= kParallel;
      for (std::int64_t j = 0; j < l.n; ++j) {
#pragma omp parallel if (wide)
        {
          const std::int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
          const std::int64_t c0 = l.slice * t / threads, c1 = l.slice * (t + 1) / threads;
          combine<T>(red, out + at[j], u + j * l.slice, c0, c1);
        }
      }
    });
  });
}

// The backward: dx = dy with the indexed slices zeroed (`zero`: reduction none) or dy itself
// (add), written into dx (either may be absent: None), and du[j] = dy's slice at tuple j.
StepPtr scatter_nd_backward(const Dims& dims, std::int64_t k, std::int64_t n,
                            const py::array& indices, bool zero, const py::array& dy,
                            const py::object& dx, const py::object& du,
                            const std::string& node) {
  const Layout l = layout(dims, k, n);
  const auto size = dy.itemsize();
  const auto* pi = static_cast<const std::int64_t*>(address(indices, n * k * 8, "indices"));
  const void* pg = address(dy, l.total * size, "scatter dy");
  void* pdx = dx.is_none() ? nullptr : address(dx.cast<py::array>(), l.total * size, "dx");
  void* pdu = du.is_none() ? nullptr : address(du.cast<py::array>(), n * l.slice * size, "du");
  return by_dtype(dy, "scatter_nd_backward", [=](auto tag) -> StepPtr {
    using T = decltype(tag);
    return std::make_shared<LambdaStep>("scatter_nd backward", [=] {
      const auto at = offsets(l, pi, node);
      const T* g = static_cast<const T*>(pg);
      if (pdu) {
        T* u = static_cast<T*>(pdu);
#pragma omp parallel for schedule(static) if (l.n * l.slice >= kParallel)
        for (std::int64_t j = 0; j < l.n; ++j)
          std::copy(g + at[j], g + at[j] + l.slice, u + j * l.slice);
      }
      if (pdx) {
        T* d = static_cast<T*>(pdx);
        std::memcpy(d, g, l.total * sizeof(T));
        if (zero)
          for (std::int64_t j = 0; j < l.n; ++j) std::fill(d + at[j], d + at[j] + l.slice, T(0));
      }
    });
  });
}

// The backward of the reductions that need the forward's values (ops/scatter_nd.py): mul,
// dx = dy * f and du[j] = dy * data * f / u at tuple j, f the product of the updates each
// element received; max/min, dx = dy where y kept data's value, du[j] = dy where u[j] is the
// value y took (every tie gets it, as the operator's comparisons give).
StepPtr scatter_nd_backward_reduce(const Dims& dims, std::int64_t k, std::int64_t n,
                                   const py::array& indices, const std::string& reduction,
                                   const py::array& data, const py::array& updates,
                                   const py::array& y, const py::array& dy,
                                   const py::object& dx, const py::object& du,
                                   const std::string& node) {
  const Layout l = layout(dims, k, n);
  const bool mul = reduction == "mul";
  if (!mul && reduction != "max" && reduction != "min")
    throw std::invalid_argument("scatter_nd_backward_reduce: reduction " + reduction);
  const auto size = dy.itemsize();
  const auto* pi = static_cast<const std::int64_t*>(address(indices, n * k * 8, "indices"));
  const void* pd = address(data, l.total * size, "scatter data");
  const void* pu = address(updates, n * l.slice * size, "scatter updates");
  const void* py_ = address(y, l.total * size, "scatter output");
  const void* pg = address(dy, l.total * size, "scatter dy");
  void* pdx = dx.is_none() ? nullptr : address(dx.cast<py::array>(), l.total * size, "dx");
  void* pdu = du.is_none() ? nullptr : address(du.cast<py::array>(), n * l.slice * size, "du");
  return by_dtype(dy, "scatter_nd_backward_reduce", [=](auto tag) -> StepPtr {
    using T = decltype(tag);
    return std::make_shared<LambdaStep>("scatter_nd backward", [=] {
      const auto at = offsets(l, pi, node);
      const T *g = static_cast<const T*>(pg), *d = static_cast<const T*>(pd),
              *u = static_cast<const T*>(pu), *out = static_cast<const T*>(py_);
      std::vector<T> factor;
      if (mul) {
        factor.assign(l.total, T(1));
        for (std::int64_t j = 0; j < l.n; ++j)
          for (std::int64_t i = 0; i < l.slice; ++i) factor[at[j] + i] *= u[j * l.slice + i];
      }
      if (pdx) {
        T* x = static_cast<T*>(pdx);
        for (std::int64_t i = 0; i < l.total; ++i)
          x[i] = mul ? g[i] * factor[i] : out[i] == d[i] ? g[i] : T(0);
      }
      if (pdu) {
        T* w = static_cast<T*>(pdu);
        for (std::int64_t j = 0; j < l.n; ++j)
          for (std::int64_t i = 0; i < l.slice; ++i) {
            const std::int64_t e = at[j] + i, f = j * l.slice + i;
            w[f] = mul ? g[e] * d[e] * factor[e] / u[f] : u[f] == out[e] ? g[e] : T(0);
          }
      }
    });
  });
}

}  // namespace

void bind_scatter(py::module_& m) {
  m.def("scatter_nd", &scatter_nd, py::arg("dims"), py::arg("k"), py::arg("n"),
        py::arg("indices"), py::arg("reduction"), py::arg("data"), py::arg("updates"),
        py::arg("y"), py::arg("node"));
  m.def("scatter_nd_backward", &scatter_nd_backward, py::arg("dims"), py::arg("k"),
        py::arg("n"), py::arg("indices"), py::arg("zero"), py::arg("dy"), py::arg("dx"),
        py::arg("du"), py::arg("node"));
  m.def("scatter_nd_backward_reduce", &scatter_nd_backward_reduce, py::arg("dims"),
        py::arg("k"), py::arg("n"), py::arg("indices"), py::arg("reduction"), py::arg("data"),
        py::arg("updates"), py::arg("y"), py::arg("dy"), py::arg("dx"), py::arg("du"),
        py::arg("node"));
}

}  // namespace meta::plan
