// Fused optimizer updates (meta/lv2/optimizers.py's in-place paths): SGD with momentum as one
// pass over the parameter, its velocity and its gradient instead of the four numpy passes of
// the transformation chain, OpenMP-parallel like PyTorch's foreach kernels.
#include "bindings.hpp"
#include "meta/parallel.hpp"

namespace meta::bind {

namespace {

template <typename T>
void sgd_momentum(Array<T> p, Array<T> v, const Array<T>& g, double lr, double momentum,
                  bool nesterov) {
  require_same_shape("sgd_momentum", p, v);
  require_same_shape("sgd_momentum", p, g);
  T* pp = p.mutable_data();
  T* pv = v.mutable_data();
  const T* pg = g.data();
  const std::int64_t n = p.size();
  const T m = T(momentum), a = T(lr);
  py::gil_scoped_release release;
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const T vi = m * pv[i] + pg[i];  // v <- m v + g
    pv[i] = vi;
    pp[i] -= a * (nesterov ? pg[i] + m * vi : vi);  // p <- p - lr (v, or g + m v)
  }
}

template <typename T>
void bind_float(py::module_& m) {
  m.def("sgd_momentum_", &sgd_momentum<T>, py::arg("p").noconvert(), py::arg("v").noconvert(),
        py::arg("g").noconvert(), py::arg("lr"), py::arg("momentum"), py::arg("nesterov"),
        "In place: v = momentum v + g; p -= lr v (Nesterov: p -= lr (g + momentum v)).");
}

}  // namespace

void bind_optim(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
