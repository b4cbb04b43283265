// Relu forward and backward (ops/relu.py's NativeRelu).
#include "bindings.hpp"
#include "meta/relu.hpp"

namespace meta::bind {

namespace {

template <typename T>
py::array relu_forward(const Array<T>& x) {
  Array<T> y(shape_of(x));
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
  Array<T> dx(shape_of(y));
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

template <typename T>
void bind_float(py::module_& m) {
  m.def("relu_forward", &relu_forward<T>, py::arg("x").noconvert(),
        "y = max(x, 0), elementwise, OpenMP-parallel.");
  m.def("relu_backward", &relu_backward<T>, py::arg("y").noconvert(), py::arg("dy").noconvert(),
        "dx = dy * (y > 0), elementwise, OpenMP-parallel.");
}

}  // namespace

void bind_relu(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
