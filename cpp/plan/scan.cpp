// CumSum in a plan (meta/lv1/plan/lowering/scan.py): running sums along one axis, optionally
// exclusive (each element left out of its own sum) and/or reversed; the backward is the same
// scan of dy in the opposite direction (ops/cum_sum.py), so one kernel runs both.
//
// The axis is read when the step runs, from the plan's array holding it (ONNX gives it as an
// input, which a caller may feed), so a plan traced with one axis stays exact with another.
// x is seen as (outer, n, inner) around the axis; each (o, column block) is an independent
// sequential sum in the axis's order, the order numpy's cumsum adds in, so the results are the
// reference's bits (float32 sums in float32, integers wrap as numpy's do).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

namespace {

constexpr std::int64_t kColumns = 256;  // columns of one task (a few cache lines)
constexpr std::int64_t kParallel = 1 << 15;

std::int64_t read_int(const void* p, std::size_t itemsize) {
  return itemsize == 4 ? std::int64_t(*static_cast<const std::int32_t*>(p))
                       : *static_cast<const std::int64_t*>(p);
}

template <class T>
void scan(const Dims& dims, std::int64_t axis, bool exclusive, bool reverse, const T* x, T* y) {
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t i = 0; i < axis; ++i) outer *= dims[i];
  for (std::size_t i = axis + 1; i < dims.size(); ++i) inner *= dims[i];
  const std::int64_t n = dims[axis];
  const std::int64_t blocks = (inner + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) collapse(2) if (outer * n * inner >= kParallel)
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t c0 = b * kColumns, c1 = std::min(inner, c0 + kColumns);
      const std::int64_t base = o * n * inner;
      for (std::int64_t s = 0; s < n; ++s) {
        const std::int64_t k = reverse ? n - 1 - s : s, prev = reverse ? k + 1 : k - 1;
        T* out = y + base + k * inner;
        if (s == 0) {
          if (exclusive)
            std::fill(out + c0, out + c1, T(0));
          else
            std::copy(x + base + k * inner + c0, x + base + k * inner + c1, out + c0);
          continue;
        }
        const T* before = y + base + prev * inner;
        const T* add = x + base + (exclusive ? prev : k) * inner;
#pragma omp simd
        for (std::int64_t i = c0; i < c1; ++i) out[i] = before[i] + add[i];
      }
    }
}

// y = CumSum(x, axis read from `axis` when run); x and y of one dtype (float32, float64,
// int32, int64) and shape `dims`.
StepPtr cumsum(const Dims& dims, const py::array& axis, bool exclusive, bool reverse,
               const py::array& x, const py::array& y, const std::string& node) {
  std::int64_t count = 1;
  for (auto d : dims) count *= d;
  const auto kind = x.dtype().kind();
  const auto size = x.itemsize();
  if (!y.dtype().is(x.dtype()) && !(y.dtype().kind() == kind && y.itemsize() == size))
    throw std::invalid_argument("cumsum: x and y must have one dtype");
  if (axis.dtype().kind() != 'i' || (axis.itemsize() != 4 && axis.itemsize() != 8))
    throw std::invalid_argument("cumsum: axis must be int32 or int64");
  const void* pa = address(axis, axis.itemsize(), "cumsum axis");
  const std::size_t asize = axis.itemsize();
  const void* px = address(x, count * size, "cumsum input");
  void* py_ = address(y, count * size, "cumsum output");
  const auto rank = std::int64_t(dims.size());
  auto run = [=](auto tag) {
    using T = decltype(tag);
    return std::make_shared<LambdaStep>("cumsum", [=] {
      std::int64_t a = read_int(pa, asize);
      if (a < -rank || a >= rank)
        throw std::out_of_range("node '" + node + "': CumSum axis " + std::to_string(a) +
                                " is out of range for rank " + std::to_string(rank));
      scan<T>(dims, a < 0 ? a + rank : a, exclusive, reverse, static_cast<const T*>(px),
              static_cast<T*>(py_));
    });
  };
  if (kind == 'f' && size == 4) return run(float{});
  if (kind == 'f' && size == 8) return run(double{});
  if (kind == 'i' && size == 4) return run(std::int32_t{});
  if (kind == 'i' && size == 8) return run(std::int64_t{});
  throw std::invalid_argument("cumsum: dtype must be float32, float64, int32 or int64");
}

}  // namespace

void bind_scan(py::module_& m) {
  m.def("cumsum", &cumsum, py::arg("dims"), py::arg("axis"), py::arg("exclusive"),
        py::arg("reverse"), py::arg("x"), py::arg("y"), py::arg("node"));
}

}  // namespace meta::plan
