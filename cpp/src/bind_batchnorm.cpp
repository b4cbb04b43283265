// BatchNormalization forward and backward (ops/batch_normalization.py's native twin).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "meta/batchnorm.hpp"

namespace meta::bind {

namespace {

struct Dims3 {
  std::int64_t n, c, s;
};

Dims3 layout(const char* kernel, const py::array& x) {
  if (x.ndim() < 2)
    throw py::value_error(std::string(kernel) + ": X " + describe(x) +
                          " must have at least 2 dimensions (N, C, ...)");
  Dims3 d{x.shape(0), x.shape(1), 1};
  for (py::ssize_t i = 2; i < x.ndim(); ++i) d.s *= x.shape(i);
  return d;
}

void require_channels(const char* kernel, const char* name, const py::array& v, std::int64_t c) {
  if (v.ndim() != 1 || v.shape(0) != c)
    throw py::value_error(std::string(kernel) + ": " + name + " " + describe(v) + " must be (" +
                          std::to_string(c) + ",)");
}

// (y, mean used, variance used, 1 / sqrt(variance used + epsilon)).
template <typename T>
py::tuple forward(const Array<T>& x, const Array<T>& scale, const Array<T>& bias,
                  const Array<T>& mean, const Array<T>& var, double epsilon, bool training) {
  const char* kernel = "batchnorm_forward";
  const Dims3 d = layout(kernel, x);
  require_channels(kernel, "scale", scale, d.c);
  require_channels(kernel, "B", bias, d.c);
  require_channels(kernel, "input_mean", mean, d.c);
  require_channels(kernel, "input_var", var, d.c);
  Array<T> y(shape_of(x)), mean_used(Shape{d.c}), var_used(Shape{d.c}), inv_std(Shape{d.c});
  const T* px = x.data();
  T* py_ = y.mutable_data();
  T* pm = mean_used.mutable_data();
  T* pv = var_used.mutable_data();
  T* pi = inv_std.mutable_data();
  const T* ps = scale.data();
  const T* pb = bias.data();
  const T* pmean = mean.data();
  const T* pvar = var.data();
  {
    py::gil_scoped_release release;
    if (training && d.n * d.s > 0) {
      std::vector<double> m(d.c), v(d.c);
      meta::batchnorm_statistics(px, d.n, d.c, d.s, m.data(), v.data());
      for (std::int64_t j = 0; j < d.c; ++j) {
        pm[j] = static_cast<T>(m[j]);
        pv[j] = static_cast<T>(v[j]);
      }
    } else if (training) {  // no values: numpy's mean and variance are NaN
      for (std::int64_t j = 0; j < d.c; ++j) pm[j] = pv[j] = static_cast<T>(NAN);
    } else {
      for (std::int64_t j = 0; j < d.c; ++j) {
        pm[j] = pmean[j];
        pv[j] = pvar[j];
      }
    }
    const T eps = static_cast<T>(epsilon);
    for (std::int64_t j = 0; j < d.c; ++j) pi[j] = T(1) / std::sqrt(pv[j] + eps);
    meta::batchnorm_apply(px, py_, d.n, d.c, d.s, pm, pi, ps, pb);
  }
  return py::make_tuple(y, mean_used, var_used, inv_std);
}

// (dx or None, sum(dy), sum(dy * xhat)) per channel; em, ev: None or the (C,) terms that the
// running statistics' gradients add to dx (as em + ev * xhat).
template <typename T>
py::tuple backward(const Array<T>& x, const Array<T>& dy, const Array<T>& mean,
                   const Array<T>& inv_std, const Array<T>& scale, bool training, bool need_dx,
                   const py::object& em, const py::object& ev) {
  const char* kernel = "batchnorm_backward";
  require_same_shape(kernel, x, dy);
  const Dims3 d = layout(kernel, x);
  require_channels(kernel, "mean", mean, d.c);
  require_channels(kernel, "inv_std", inv_std, d.c);
  require_channels(kernel, "scale", scale, d.c);
  Array<T> aem, aev;
  const bool extra = !em.is_none();
  if (extra) {
    aem = py::cast<Array<T>>(em);
    aev = py::cast<Array<T>>(ev);
    require_channels(kernel, "em", aem, d.c);
    require_channels(kernel, "ev", aev, d.c);
  }
  Array<T> sum_dy(Shape{d.c}), sum_dy_xhat(Shape{d.c});
  py::object dx = py::none();
  T* pdx = nullptr;
  if (need_dx) {
    Array<T> out(shape_of(x));
    pdx = out.mutable_data();
    dx = out;
  }
  const T* px = x.data();
  const T* pdy = dy.data();
  const T* pm = mean.data();
  const T* pi = inv_std.data();
  const T* ps = scale.data();
  const T* pem = extra ? aem.data() : nullptr;
  const T* pev = extra ? aev.data() : nullptr;
  T* psd = sum_dy.mutable_data();
  T* psx = sum_dy_xhat.mutable_data();
  {
    py::gil_scoped_release release;
    std::vector<double> a(d.c), b(d.c);
    meta::batchnorm_gradient_sums(px, pdy, d.n, d.c, d.s, pm, pi, a.data(), b.data());
    std::vector<T> k(d.c);
    for (std::int64_t j = 0; j < d.c; ++j) {
      psd[j] = static_cast<T>(a[j]);
      psx[j] = static_cast<T>(b[j]);
      k[j] = ps[j] * pi[j];
    }
    if (pdx && training)
      meta::batchnorm_dx_training(px, pdy, pdx, d.n, d.c, d.s, pm, pi, k.data(), psd, psx, pem,
                                  pev);
    else if (pdx)
      meta::batchnorm_dx_inference(pdy, pdx, d.n, d.c, d.s, k.data());
  }
  return py::make_tuple(dx, sum_dy, sum_dy_xhat);
}

template <typename T>
void bind_float(py::module_& m) {
  m.def("batchnorm_forward", &forward<T>, py::arg("x").noconvert(),
        py::arg("scale").noconvert(), py::arg("bias").noconvert(), py::arg("mean").noconvert(),
        py::arg("var").noconvert(), py::arg("epsilon"), py::arg("training"),
        "(y, mean used, variance used, inv_std) of X (N, C, ...): batch statistics when "
        "training, else the given mean and variance.");
  m.def("batchnorm_backward", &backward<T>, py::arg("x").noconvert(), py::arg("dy").noconvert(),
        py::arg("mean").noconvert(), py::arg("inv_std").noconvert(),
        py::arg("scale").noconvert(), py::arg("training"), py::arg("need_dx"),
        py::arg("em") = py::none(), py::arg("ev") = py::none(),
        "(dx or None, sum(dy), sum(dy * xhat)) per channel; training backprops through the "
        "batch statistics; em + ev * xhat (C,) terms are added to dx when given.");
}

}  // namespace

void bind_batchnorm(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
