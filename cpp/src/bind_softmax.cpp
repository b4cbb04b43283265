// Softmax, LogSoftmax and SoftmaxCrossEntropyLoss (the native twins in ops/softmax.py,
// ops/log_softmax.py, ops/softmax_cross_entropy_loss.py).
#include <cstdint>
#include <string>

#include "bindings.hpp"
#include "meta/softmax.hpp"

namespace meta::bind {

namespace {

using Labels = py::array_t<std::int64_t, py::array::c_style>;

struct Layout {
  std::int64_t outer = 1, c = 1, inner = 1;
};

// x seen as (outer, c, inner) around axis (already in [0, ndim)).
Layout layout(const char* kernel, const py::array& x, py::ssize_t axis) {
  if (axis < 0 || axis >= x.ndim())
    throw py::value_error(std::string(kernel) + ": axis " + std::to_string(axis) +
                          " is out of range for an input of shape " + describe(x));
  Layout l;
  for (py::ssize_t d = 0; d < x.ndim(); ++d) {
    if (d < axis) l.outer *= x.shape(d);
    else if (d == axis) l.c = x.shape(d);
    else l.inner *= x.shape(d);
  }
  return l;
}

template <bool Log, typename T>
py::array forward(const Array<T>& x, py::ssize_t axis, const char* kernel) {
  const Layout l = layout(kernel, x, axis);
  Array<T> y(shape_of(x));
  const T* px = x.data();
  T* py_ = y.mutable_data();
  if (x.size() == 0) return y;
  {
    py::gil_scoped_release release;
    meta::softmax_forward<Log>(px, py_, l.outer, l.c, l.inner);
  }
  return y;
}

template <bool Log, typename T>
py::array backward(const Array<T>& y, const Array<T>& dy, py::ssize_t axis, const char* kernel) {
  require_same_shape(kernel, y, dy);
  const Layout l = layout(kernel, y, axis);
  Array<T> dx(shape_of(y));
  const T* py_ = y.data();
  const T* pdy = dy.data();
  T* pdx = dx.mutable_data();
  if (y.size() == 0) return dx;
  {
    py::gil_scoped_release release;
    meta::softmax_backward<Log>(py_, pdy, pdx, l.outer, l.c, l.inner);
  }
  return dx;
}

// Labels must have the scores' shape without axis 1, each in [0, c).
Layout check_labels(const char* kernel, const py::array& scores, const Labels& labels) {
  bool ok = scores.ndim() >= 2 && labels.ndim() == scores.ndim() - 1;
  for (py::ssize_t d = 0; ok && d < labels.ndim(); ++d)
    ok = labels.shape(d) == scores.shape(d == 0 ? 0 : d + 1);
  if (!ok)
    throw py::value_error(std::string(kernel) + ": labels " + describe(labels) +
                          " do not match scores " + describe(scores));
  const Layout l = layout(kernel, scores, 1);
  const std::int64_t* p = labels.data();
  for (py::ssize_t e = 0; e < labels.size(); ++e)
    if (p[e] < 0 || p[e] >= l.c)
      throw py::index_error(std::string(kernel) + ": label " + std::to_string(p[e]) +
                            " is outside [0, " + std::to_string(l.c - 1) + "]");
  return l;
}

template <typename T>
py::tuple sce_forward(const Array<T>& scores, const Labels& labels, const std::string& reduction) {
  const char* kernel = "softmax_cross_entropy_forward";
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    throw py::value_error(std::string(kernel) + ": unknown reduction " + reduction);
  const Layout l = check_labels(kernel, scores, labels);
  const bool each = reduction == "none";
  Array<T> logp(shape_of(scores));
  Array<T> loss(each ? shape_of(labels) : Shape{});
  const T* px = scores.data();
  const std::int64_t* pl = labels.data();
  T* plogp = logp.mutable_data();
  T* ploss = loss.mutable_data();
  double total = 0.0;
  if (scores.size() > 0) {
    py::gil_scoped_release release;
    total = meta::softmax_cross_entropy_forward(px, pl, plogp, each ? ploss : nullptr, l.outer,
                                                l.c, l.inner);
  }
  if (!each) {
    const double count = static_cast<double>(labels.size());
    *ploss = static_cast<T>(reduction == "mean" ? total / count : total);
  }
  return py::make_tuple(loss, logp);
}

template <typename T>
py::array sce_backward(const Array<T>& logp, const Labels& labels, const Array<T>& coeff,
                       const py::object& dlogp) {
  const char* kernel = "softmax_cross_entropy_backward";
  const Layout l = check_labels(kernel, logp, labels);
  if (coeff.size() != 1 && coeff.size() != labels.size())
    throw py::value_error(std::string(kernel) + ": coeff " + describe(coeff) +
                          " is neither one value nor one per label " + describe(labels));
  const T* pdlogp = nullptr;
  Array<T> dl;
  if (!dlogp.is_none()) {
    dl = py::cast<Array<T>>(dlogp);
    require_same_shape(kernel, logp, dl);
    pdlogp = dl.data();
  }
  Array<T> dx(shape_of(logp));
  const T* plogp = logp.data();
  const std::int64_t* pl = labels.data();
  const T* pc = coeff.data();
  const std::int64_t csize = coeff.size();
  T* pdx = dx.mutable_data();
  if (logp.size() == 0) return dx;
  {
    py::gil_scoped_release release;
    meta::softmax_cross_entropy_backward(plogp, pl, pc, csize, pdlogp, pdx, l.outer, l.c,
                                         l.inner);
  }
  return dx;
}

template <typename T>
void bind_float(py::module_& m) {
  const auto x = py::arg("x").noconvert(), y = py::arg("y").noconvert(),
             dy = py::arg("dy").noconvert(), axis = py::arg("axis");
  m.def("softmax_forward", [](const Array<T>& a, py::ssize_t ax) {
    return forward<false>(a, ax, "softmax_forward"); }, x, axis, "softmax along axis.");
  m.def("log_softmax_forward", [](const Array<T>& a, py::ssize_t ax) {
    return forward<true>(a, ax, "log_softmax_forward"); }, x, axis, "log-softmax along axis.");
  m.def("softmax_backward", [](const Array<T>& a, const Array<T>& g, py::ssize_t ax) {
    return backward<false>(a, g, ax, "softmax_backward");
  }, y, dy, axis, "dx = y (dy - sum(dy y)) along axis, from the softmax y.");
  m.def("log_softmax_backward", [](const Array<T>& a, const Array<T>& g, py::ssize_t ax) {
    return backward<true>(a, g, ax, "log_softmax_backward");
  }, y, dy, axis, "dx = dy - exp(y) sum(dy) along axis, from the log-softmax y.");
  m.def("softmax_cross_entropy_forward", &sce_forward<T>, py::arg("scores").noconvert(),
        py::arg("labels").noconvert(), py::arg("reduction"),
        "(loss, log-probabilities) of scores (N, C, d...) against int64 labels (N, d...); "
        "reduction mean, sum or none.");
  m.def("softmax_cross_entropy_backward", &sce_backward<T>, py::arg("logp").noconvert(),
        py::arg("labels").noconvert(), py::arg("coeff").noconvert(),
        py::arg("dlogp") = py::none(),
        "d(scores) from the log-probabilities, the labels, each loss element's incoming "
        "gradient coeff (one value, or one per label) and optionally d(logp).");
}

}  // namespace

void bind_softmax(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
