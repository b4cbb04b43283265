// Sigmoid, Tanh and LeakyRelu forward and backward (the native twins in ops/sigmoid.py,
// ops/tanh.py, ops/leaky_relu.py).
#include "bindings.hpp"
#include "meta/activations.hpp"

namespace meta::bind {

namespace {

template <typename T>
void bind_float(py::module_& m) {
  const auto x = py::arg("x").noconvert(), y = py::arg("y").noconvert(),
             dy = py::arg("dy").noconvert();
  m.def("sigmoid_forward", [](const Array<T>& a) {
    return unary(a, [](const T* s, T* d, std::int64_t n) { meta::sigmoid_forward(s, d, n); });
  }, x, "y = 1 / (1 + exp(-x)), elementwise.");
  m.def("sigmoid_backward", [](const Array<T>& a, const Array<T>& g) {
    return gradient("sigmoid_backward", a, g, [](const T* s, const T* d, T* o, std::int64_t n) {
      meta::sigmoid_backward(s, d, o, n); });
  }, y, dy, "dx = dy * y * (1 - y), from the forward output y.");
  m.def("tanh_forward", [](const Array<T>& a) {
    return unary(a, [](const T* s, T* d, std::int64_t n) { meta::tanh_forward(s, d, n); });
  }, x, "y = tanh(x), elementwise.");
  m.def("tanh_backward", [](const Array<T>& a, const Array<T>& g) {
    return gradient("tanh_backward", a, g, [](const T* s, const T* d, T* o, std::int64_t n) {
      meta::tanh_backward(s, d, o, n); });
  }, y, dy, "dx = dy * (1 - y^2), from the forward output y.");
  m.def("leaky_relu_forward", [](const Array<T>& a, double slope) {
    return unary(a, [slope](const T* s, T* d, std::int64_t n) {
      meta::leaky_relu_forward(s, d, n, T(slope)); });
  }, x, py::arg("slope"), "y = x where x >= 0, else slope * x.");
  m.def("leaky_relu_backward", [](const Array<T>& a, const Array<T>& g, double slope) {
    return gradient("leaky_relu_backward", a, g,
                    [slope](const T* s, const T* d, T* o, std::int64_t n) {
      meta::leaky_relu_backward(s, d, o, n, T(slope)); });
  }, x, dy, py::arg("slope"), "dx = dy where x >= 0, else slope * dy (from the input x).");
}

}  // namespace

void bind_activations(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
