// What every binding file of meta._native shares: array types, shape checks, and the
// registration function of each kernel family (one src/bind_*.cpp file per family).
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace meta::bind {

namespace py = pybind11;

// C-contiguous arrays of one dtype; with py::arg().noconvert() a float32 array is never silently
// widened to float64 (or the reverse): the Python side (meta.lv0.native.call) converts.
template <typename T>
using Array = py::array_t<T, py::array::c_style>;

using Shape = std::vector<py::ssize_t>;

inline Shape shape_of(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

inline std::string describe(const py::array& a) {
  std::ostringstream s;
  s << "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s << (d ? ", " : "") << a.shape(d);
  s << (a.ndim() == 1 ? ",)" : ")");
  return s.str();
}

inline void require_same_shape(const char* kernel, const py::array& a, const py::array& b) {
  bool same = a.ndim() == b.ndim();
  for (py::ssize_t d = 0; same && d < a.ndim(); ++d) same = a.shape(d) == b.shape(d);
  if (!same)
    throw py::value_error(std::string(kernel) + ": shapes differ, " + describe(a) + " vs " +
                          describe(b));
}

inline void require_ndim(const char* kernel, const char* name, const py::array& a,
                         py::ssize_t ndim) {
  if (a.ndim() != ndim)
    throw py::value_error(std::string(kernel) + ": " + name + " " + describe(a) + " must have " +
                          std::to_string(ndim) + " dimensions");
}

// y = kernel(x) elementwise, into a new array, with the GIL released.
template <typename T, typename Kernel>
py::array unary(const Array<T>& x, Kernel kernel) {
  Array<T> y(shape_of(x));
  const T* src = x.data();
  T* dst = y.mutable_data();
  const std::int64_t n = x.size();
  {
    py::gil_scoped_release release;
    kernel(src, dst, n);
  }
  return y;
}

// dx = kernel(saved, dy) elementwise from the saved tensor (x or y) and dy, which must have its
// shape; the GIL released.
template <typename T, typename Kernel>
py::array gradient(const char* name, const Array<T>& saved, const Array<T>& dy, Kernel kernel) {
  require_same_shape(name, saved, dy);
  Array<T> dx(shape_of(saved));
  const T* ps = saved.data();
  const T* pdy = dy.data();
  T* pdx = dx.mutable_data();
  const std::int64_t n = saved.size();
  {
    py::gil_scoped_release release;
    kernel(ps, pdy, pdx, n);
  }
  return dx;
}

// One registration function per kernel family; module.cpp calls them all.
void bind_blas(py::module_& m);
void bind_relu(py::module_& m);
void bind_gemm(py::module_& m);
void bind_conv(py::module_& m);
void bind_pool(py::module_& m);
void bind_batchnorm(py::module_& m);
void bind_activations(py::module_& m);
void bind_softmax(py::module_& m);
void bind_elementwise(py::module_& m);
void bind_optim(py::module_& m);

}  // namespace meta::bind
