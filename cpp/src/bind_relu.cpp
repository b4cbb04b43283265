// Relu forward and backward (ops/relu.py's NativeRelu).
#include "bindings.hpp"
#include "meta/relu.hpp"

namespace meta::bind {

namespace {

template <typename T>
void bind_float(py::module_& m) {
  m.def("relu_forward", [](const Array<T>& x) {
    return unary(x, [](const T* s, T* d, std::int64_t n) { meta::relu_forward(s, d, n); });
  }, py::arg("x").noconvert(), "y = max(x, 0), elementwise, OpenMP-parallel.");
  m.def("relu_backward", [](const Array<T>& y, const Array<T>& dy) {
    return gradient("relu_backward", y, dy, [](const T* s, const T* d, T* o, std::int64_t n) {
      meta::relu_backward(s, d, o, n); });
  }, py::arg("y").noconvert(), py::arg("dy").noconvert(),
     "dx = dy * (y > 0), elementwise, OpenMP-parallel.");
}

}  // namespace

void bind_relu(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
