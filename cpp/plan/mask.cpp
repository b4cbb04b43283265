// Tensors computed from their element indices, in a plan (meta/lv1/plan/lowering/mask.py):
// Trilu (the triangle of the last two axes from diagonal k; the causal masks of decoders) and
// Range (start + i * delta). Both read their scalar inputs (k; start, limit, delta) when the
// step runs, from the plan's arrays holding them, since a caller may feed them.
//
// Trilu moves bytes: each row keeps one run of columns and zeroes the rest, so one kernel
// serves every dtype (zero is all-zero bytes in each) and the backward (dy masked the same
// way). Range computes in its dtype as the operator does (start + i * delta, numpy's order),
// and refuses values whose length differs from the one the plan was traced with.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "plan.hpp"

namespace meta::plan {

namespace {

constexpr std::int64_t kParallel = 1 << 16;

std::int64_t read_int(const void* p, std::size_t itemsize) {
  return itemsize == 4 ? std::int64_t(*static_cast<const std::int32_t*>(p))
                       : *static_cast<const std::int64_t*>(p);
}

// y = triu(x, k) (upper) or tril(x, k) over `batch` matrices of rows x cols elements of
// `itemsize` bytes; k read from `k` (int32/int64) when run, or 0 when None.
StepPtr trilu(std::int64_t batch, std::int64_t rows, std::int64_t cols, const py::object& k,
              bool upper, const py::array& x, const py::array& y) {
  const std::size_t size = x.itemsize();
  const std::int64_t total = batch * rows * cols;
  if (y.itemsize() != std::int64_t(size))
    throw std::invalid_argument("trilu: x and y must have one dtype");
  const char* px = static_cast<const char*>(address(x, total * size, "trilu input"));
  char* py_ = static_cast<char*>(address(y, total * size, "trilu output"));
  const void* pk = nullptr;
  std::size_t ksize = 8;
  if (!k.is_none()) {
    auto a = k.cast<py::array>();
    if (a.dtype().kind() != 'i' || (a.itemsize() != 4 && a.itemsize() != 8))
      throw std::invalid_argument("trilu: k must be int32 or int64");
    ksize = a.itemsize();
    pk = address(a, ksize, "trilu k");
  }
  return std::make_shared<LambdaStep>("trilu", [=] {
    const std::int64_t diag = pk ? read_int(pk, ksize) : 0;
#pragma omp parallel for schedule(static) if (total >= kParallel)
    for (std::int64_t r = 0; r < batch * rows; ++r) {
      const std::int64_t i = r % rows;
      // the kept columns: [lo, hi)
      const std::int64_t edge = std::clamp<std::int64_t>(upper ? i + diag : i + diag + 1, 0,
                                                         cols);
      const std::int64_t lo = upper ? edge : 0, hi = upper ? cols : edge;
      const char* src = px + r * cols * size;
      char* dst = py_ + r * cols * size;
      std::memset(dst, 0, lo * size);
      if (hi > lo) std::memcpy(dst + lo * size, src + lo * size, (hi - lo) * size);
      std::memset(dst + hi * size, 0, (cols - hi) * size);
    }
  });
}

template <class T>
T value_of(const void* p) {
  return *static_cast<const T*>(p);
}

// y[i] = start + i * delta for i < n (the traced length; other values raise).
StepPtr range(const py::array& start, const py::array& limit, const py::array& delta,
              const py::array& y, std::int64_t n, const std::string& node) {
  const auto kind = y.dtype().kind();
  const auto size = y.itemsize();
  for (const auto* a : {&start, &limit, &delta})
    if (a->dtype().kind() != kind || a->itemsize() != size)
      throw std::invalid_argument("range: start, limit, delta and y must have one dtype");
  const void* ps = address(start, size, "range start");
  const void* pl = address(limit, size, "range limit");
  const void* pd = address(delta, size, "range delta");
  void* py_ = address(y, n * size, "range output");
  auto make = [=](auto tag) -> StepPtr {
    using T = decltype(tag);
    return std::make_shared<LambdaStep>("range", [=] {
      const T s = value_of<T>(ps), l = value_of<T>(pl), d = value_of<T>(pd);
      if (d == T(0)) throw std::invalid_argument("node '" + node + "': Range delta is 0");
      const double want = std::ceil((double(l) - double(s)) / double(d));
      const std::int64_t count = want > 0 ? std::int64_t(want) : 0;
      if (count != n)
        throw std::runtime_error("node '" + node + "': Range gives " + std::to_string(count) +
                                 " elements where the plan traced " + std::to_string(n) +
                                 " (a shape that depends on the data cannot be planned)");
      T* out = static_cast<T*>(py_);
      for (std::int64_t i = 0; i < n; ++i) out[i] = T(s + T(i) * d);
    });
  };
  if (kind == 'f' && size == 4) return make(float{});
  if (kind == 'f' && size == 8) return make(double{});
  if (kind == 'i' && size == 4) return make(std::int32_t{});
  if (kind == 'i' && size == 8) return make(std::int64_t{});
  throw std::invalid_argument("range: dtype must be float32, float64, int32 or int64");
}

// A step that checks an int32/int64 array read at run time holds `expected` (a Tile's fed
// repeats: the plan's shapes were traced from them), raising with `what` otherwise.
StepPtr expect_ints(const py::array& a, const std::vector<std::int64_t>& expected,
                    const std::string& what) {
  if (a.dtype().kind() != 'i' || (a.itemsize() != 4 && a.itemsize() != 8))
    throw std::invalid_argument("expect_ints: the array must be int32 or int64");
  const std::size_t size = a.itemsize();
  const char* p = static_cast<const char*>(address(a, expected.size() * size, "checked ints"));
  return std::make_shared<LambdaStep>("check", [=] {
    for (std::size_t i = 0; i < expected.size(); ++i)
      if (read_int(p + i * size, size) != expected[i])
        throw std::runtime_error(what + ": entry " + std::to_string(i) + " is " +
                                 std::to_string(read_int(p + i * size, size)) +
                                 " where the plan was traced with " +
                                 std::to_string(expected[i]) +
                                 " (a shape that depends on the data cannot be planned)");
  });
}

}  // namespace

void bind_mask(py::module_& m) {
  m.def("trilu", &trilu, py::arg("batch"), py::arg("rows"), py::arg("cols"), py::arg("k"),
        py::arg("upper"), py::arg("x"), py::arg("y"));
  m.def("range", &range, py::arg("start"), py::arg("limit"), py::arg("delta"), py::arg("y"),
        py::arg("n"), py::arg("node"));
  m.def("expect_ints", &expect_ints, py::arg("a"), py::arg("expected"), py::arg("what"));
}

}  // namespace meta::plan
