// Matrix products through meta::blas (Gemm's and MatMul's native twins).
#include "bindings.hpp"
#include "meta/blas.hpp"

namespace meta::bind {

namespace {

// out = alpha * op(a) op(b) + beta * out, in place; out (M, N) holds the broadcast C (or
// anything, when beta is 0).
template <typename T>
void gemm_into(const Array<T>& a, const Array<T>& b, Array<T>& out, bool trans_a, bool trans_b,
               double alpha, double beta) {
  require_ndim("gemm", "A", a, 2);
  require_ndim("gemm", "B", b, 2);
  require_ndim("gemm", "out", out, 2);
  const std::int64_t m = trans_a ? a.shape(1) : a.shape(0), k = trans_a ? a.shape(0) : a.shape(1);
  const std::int64_t kb = trans_b ? b.shape(1) : b.shape(0), n = trans_b ? b.shape(0) : b.shape(1);
  if (k != kb || out.shape(0) != m || out.shape(1) != n)
    throw py::value_error("gemm: A " + describe(a) + (trans_a ? "^T" : "") + " times B " +
                          describe(b) + (trans_b ? "^T" : "") + " into " + describe(out) +
                          ": inner or output dimensions disagree");
  const T* pa = a.data();
  const T* pb = b.data();
  T* pc = out.mutable_data();
  py::gil_scoped_release release;
  meta::blas::gemm<T>(trans_a, trans_b, m, n, k, T(alpha), pa, a.shape(1), pb, b.shape(1),
                      T(beta), pc, n);
}

// (B, M, K) @ (B, K, N) -> (B, M, N), one GEMM per matrix of the batch.
template <typename T>
py::array batched_matmul(const Array<T>& a, const Array<T>& b) {
  require_ndim("batched_matmul", "A", a, 3);
  require_ndim("batched_matmul", "B", b, 3);
  const std::int64_t batch = a.shape(0), m = a.shape(1), k = a.shape(2), n = b.shape(2);
  if (b.shape(0) != batch || b.shape(1) != k)
    throw py::value_error("batched_matmul: A " + describe(a) + " and B " + describe(b) +
                          " disagree in batch or inner dimension");
  Array<T> out(Shape{batch, m, n});
  const T* pa = a.data();
  const T* pb = b.data();
  T* pc = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (std::int64_t i = 0; i < batch; ++i)
      meta::blas::gemm<T>(false, false, m, n, k, T(1), pa + i * m * k, k, pb + i * k * n, n,
                          T(0), pc + i * m * n, n);
  }
  return out;
}

template <typename T>
void bind_float(py::module_& m) {
  m.def("gemm_into", &gemm_into<T>, py::arg("a").noconvert(), py::arg("b").noconvert(),
        py::arg("out").noconvert(), py::arg("trans_a"), py::arg("trans_b"), py::arg("alpha"),
        py::arg("beta"), "out = alpha * op(a) op(b) + beta * out, through BLAS.");
  m.def("batched_matmul", &batched_matmul<T>, py::arg("a").noconvert(),
        py::arg("b").noconvert(), "(B, M, K) @ (B, K, N), one BLAS GEMM per matrix.");
}

}  // namespace

void bind_gemm(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
