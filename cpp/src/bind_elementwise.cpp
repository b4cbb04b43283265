// Broadcasting Add, Sub, Mul, Div and their backward reductions (ops/add.py ... div.py's
// native twins).
#include <cstdint>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "bindings.hpp"
#include "meta/elementwise.hpp"

namespace meta::bind {

namespace {

using Dims = std::vector<std::int64_t>;

Dims dims_of(const py::array& a) { return Dims(a.shape(), a.shape() + a.ndim()); }

std::string describe_dims(const Dims& s) {
  std::string out = "(";
  for (std::size_t d = 0; d < s.size(); ++d)
    out += (d ? ", " : "") + std::to_string(s[d]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// numpy's broadcast of two shapes, or a ValueError naming the kernel and both shapes.
Dims broadcast(const char* kernel, const Dims& a, const Dims& b) {
  const std::size_t ndim = std::max(a.size(), b.size());
  Dims out(ndim);
  for (std::size_t d = 0; d < ndim; ++d) {
    const std::int64_t na = d + a.size() >= ndim ? a[d + a.size() - ndim] : 1;
    const std::int64_t nb = d + b.size() >= ndim ? b[d + b.size() - ndim] : 1;
    if (na != nb && na != 1 && nb != 1)
      throw py::value_error(std::string(kernel) + ": cannot broadcast shapes " +
                            describe_dims(a) + " and " + describe_dims(b));
    out[d] = na == 1 ? nb : na;
  }
  return out;
}

Nest nest_of(const char* kernel, const Dims& out, const std::vector<Dims>& operands) {
  Nest nest;
  if (!make_nest(out, operands, nest))
    throw py::value_error(std::string(kernel) + ": more than " + std::to_string(kMaxDims) +
                          " dimensions");
  return nest;
}

template <typename Op, typename T>
py::array forward(const Array<T>& a, const Array<T>& b, const char* kernel) {
  const Dims sa = dims_of(a), sb = dims_of(b), so = broadcast(kernel, sa, sb);
  const Nest nest = nest_of(kernel, so, {so, sa, sb});
  Array<T> out(Shape(so.begin(), so.end()));
  const T* pa = a.data();
  const T* pb = b.data();
  T* po = out.mutable_data();
  {
    py::gil_scoped_release release;
    meta::binary_forward<Op>(nest, pa, pb, po);
  }
  return out;
}

// The gradient G(dy, p, q) reduced to ``shape`` (which must broadcast to dy's shape without
// changing it); p and q broadcast to dy's shape.
template <typename G, typename T>
py::array backward(const Array<T>& dy, const Array<T>* p, const Array<T>* q, const Dims& shape,
                   const char* kernel) {
  const Dims so = dims_of(dy);
  if (broadcast(kernel, so, shape) != so)
    throw py::value_error(std::string(kernel) + ": cannot reduce a gradient of shape " +
                          describe_dims(so) + " to " + describe_dims(shape));
  const Array<T>& pp = p ? *p : dy;
  const Array<T>& pq = q ? *q : dy;
  const Dims sp = dims_of(pp), sq = dims_of(pq);
  if (broadcast(kernel, so, sp) != so || broadcast(kernel, so, sq) != so)
    throw py::value_error(std::string(kernel) + ": operand shapes " + describe_dims(sp) +
                          ", " + describe_dims(sq) + " do not broadcast to the gradient's " +
                          describe_dims(so));
  const Nest nest = nest_of(kernel, so, {shape, so, sp, sq});
  Array<T> out(Shape(shape.begin(), shape.end()));
  const std::int64_t size = out.size();
  const bool reduces = size != dy.size();
  const T* pdy = dy.data();
  const T* ppp = pp.data();
  const T* pqq = pq.data();
  T* po = out.mutable_data();
  {
    py::gil_scoped_release release;
    meta::unbroadcast<G>(nest, reduces, size, pdy, ppp, pqq, po);
  }
  return out;
}

template <typename T>
void bind_float(py::module_& m) {
  const auto a = py::arg("a").noconvert(), b = py::arg("b").noconvert();
  m.def("add_forward", [](const Array<T>& x, const Array<T>& y) {
    return forward<AddOp>(x, y, "add_forward"); }, a, b, "a + b with numpy broadcasting.");
  m.def("sub_forward", [](const Array<T>& x, const Array<T>& y) {
    return forward<SubOp>(x, y, "sub_forward"); }, a, b, "a - b with numpy broadcasting.");
  m.def("mul_forward", [](const Array<T>& x, const Array<T>& y) {
    return forward<MulOp>(x, y, "mul_forward"); }, a, b, "a * b with numpy broadcasting.");
  m.def("div_forward", [](const Array<T>& x, const Array<T>& y) {
    return forward<DivOp>(x, y, "div_forward"); }, a, b, "a / b with numpy broadcasting.");

  const auto dy = py::arg("dy").noconvert(), p = py::arg("p").noconvert(),
             q = py::arg("q").noconvert(), shape = py::arg("shape");
  m.def("unbroadcast_sum", [](const Array<T>& g, const Dims& s) {
    return backward<GradSame, T>(g, nullptr, nullptr, s, "unbroadcast_sum");
  }, dy, shape, "dy summed over the axes broadcasting stretched to reach it from shape.");
  m.def("unbroadcast_mul", [](const Array<T>& g, const Array<T>& x, const Dims& s) {
    return backward<GradMul, T>(g, &x, nullptr, s, "unbroadcast_mul");
  }, dy, p, shape, "dy * p, summed down to shape (Mul's backward).");
  m.def("unbroadcast_div", [](const Array<T>& g, const Array<T>& x, const Dims& s) {
    return backward<GradDiv, T>(g, &x, nullptr, s, "unbroadcast_div");
  }, dy, p, shape, "dy / p, summed down to shape (Div's backward to the numerator).");
  m.def("unbroadcast_div_denominator",
        [](const Array<T>& g, const Array<T>& x, const Array<T>& y, const Dims& s) {
    return backward<GradDivDenominator, T>(g, &x, &y, s, "unbroadcast_div_denominator");
  }, dy, p, q, shape, "-dy * q / p, summed down to shape (Div's backward to the denominator "
                      "p, with q the quotient).");
}

}  // namespace

void bind_elementwise(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
