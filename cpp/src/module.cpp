// pybind11 bindings of meta's native kernels (module meta._native).
// Every kernel takes C-contiguous float32 or float64 arrays, checks them, and runs with the GIL
// released so other Python threads (data loading, MPI progress) keep going.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <omp.h>

#include <sstream>
#include <string>

#include "meta/relu.hpp"

namespace py = pybind11;

namespace {

template <typename T>
using Array = py::array_t<T, py::array::c_style>;

std::string shape_of(const py::array& a) {
  std::ostringstream s;
  s << "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s << (d ? ", " : "") << a.shape(d);
  s << (a.ndim() == 1 ? ",)" : ")");
  return s.str();
}

void require_same_shape(const char* kernel, const py::array& a, const py::array& b) {
  bool same = a.ndim() == b.ndim();
  for (py::ssize_t d = 0; same && d < a.ndim(); ++d) same = a.shape(d) == b.shape(d);
  if (!same)
    throw py::value_error(std::string(kernel) + ": shapes differ, " + shape_of(a) + " vs " +
                          shape_of(b));
}

template <typename T>
py::array relu_forward(const Array<T>& x) {
  Array<T> y(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  const T* src = x.data();
  T* dst = y.mutable_data();
  const std::int64_t n = x.size();
  {
    py::gil_scoped_release release;
    meta::relu_forward(src, dst, n);
  }
  return y;
}

template <typename T>
py::array relu_backward(const Array<T>& y, const Array<T>& dy) {
  require_same_shape("relu_backward", y, dy);
  Array<T> dx(std::vector<py::ssize_t>(y.shape(), y.shape() + y.ndim()));
  const T* py = y.data();
  const T* pdy = dy.data();
  T* pdx = dx.mutable_data();
  const std::int64_t n = y.size();
  {
    py::gil_scoped_release release;
    meta::relu_backward(py, pdy, pdx, n);
  }
  return dx;
}

// Overloads are tried in order; py::arg().noconvert() keeps a float32 array from being
// silently widened to float64 (or the reverse).
template <typename T>
void bind_float(py::module_& m) {
  m.def("relu_forward", &relu_forward<T>, py::arg("x").noconvert(),
        "y = max(x, 0), elementwise, OpenMP-parallel.");
  m.def("relu_backward", &relu_backward<T>, py::arg("y").noconvert(), py::arg("dy").noconvert(),
        "dx = dy * (y > 0), elementwise, OpenMP-parallel.");
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "meta's native (C++/OpenMP) kernels.";
  bind_float<float>(m);
  bind_float<double>(m);
  m.def("max_threads", &omp_get_max_threads, "OpenMP threads a parallel region would use.");
  m.def("set_threads", &omp_set_num_threads, py::arg("n"), "Set OpenMP threads for this process.");
}
