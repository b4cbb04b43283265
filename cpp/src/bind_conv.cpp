// 2-D convolution forward and backward (ops/conv.py's NativeConv). The Python side resolves the
// window (ops/_window.geometry: auto_pad, pads, output shape) and passes it in; these functions
// check that the arrays agree with it, then run meta/conv.hpp with the GIL released.
#include <pybind11/stl.h>

#include <optional>

#include "bindings.hpp"
#include "meta/conv.hpp"

namespace meta::bind {

namespace {

using Pair = std::pair<std::int64_t, std::int64_t>;

template <typename T>
conv::Geometry geometry(const char* kernel, const Array<T>& x, const Array<T>& w,
                        std::int64_t group, Pair strides, Pair dilations, Pair pads, Pair out) {
  require_ndim(kernel, "X", x, 4);
  require_ndim(kernel, "W", w, 4);
  conv::Geometry g{x.shape(0), x.shape(1), x.shape(2), x.shape(3), w.shape(0), group,
                   w.shape(2), w.shape(3), strides.first, strides.second, dilations.first,
                   dilations.second, pads.first, pads.second, out.first, out.second};
  const bool ok = group >= 1 && g.c % group == 0 && g.m % group == 0 &&
                  w.shape(1) * group == g.c && g.sh >= 1 && g.sw >= 1 && g.dh >= 1 &&
                  g.dw >= 1 && g.ph >= 0 && g.pw >= 0 && g.oh >= 0 && g.ow >= 0;
  if (!ok)
    throw py::value_error(std::string(kernel) + ": X " + describe(x) + " and W " + describe(w) +
                          " do not agree with group=" + std::to_string(group) +
                          " (or a stride, dilation or pad is out of range)");
  return g;
}

template <typename T>
py::array conv_forward(const Array<T>& x, const Array<T>& w, std::optional<Array<T>> b,
                       std::int64_t group, Pair strides, Pair dilations, Pair pads, Pair out,
                       std::int64_t images_per_gemm) {
  const conv::Geometry g = geometry("conv_forward", x, w, group, strides, dilations, pads, out);
  if (b && (b->ndim() != 1 || b->shape(0) != g.m))
    throw py::value_error("conv_forward: B " + describe(*b) + " must be (" +
                          std::to_string(g.m) + ",) for W " + describe(w));
  Array<T> y(Shape{g.n, g.m, g.oh, g.ow});
  const T* px = x.data();
  const T* pw = w.data();
  const T* pb = b ? b->data() : nullptr;
  T* py_ = y.mutable_data();
  {
    py::gil_scoped_release release;
    conv::forward(g, px, pw, pb, py_, images_per_gemm);
  }
  return y;
}

// (dx, dw, db), each None unless asked for.
template <typename T>
py::tuple conv_backward(const Array<T>& x, const Array<T>& w, const Array<T>& dy,
                        std::int64_t group, Pair strides, Pair dilations, Pair pads, Pair out,
                        bool need_x, bool need_w, bool need_b, std::int64_t images_per_gemm) {
  const conv::Geometry g = geometry("conv_backward", x, w, group, strides, dilations, pads, out);
  require_ndim("conv_backward", "dY", dy, 4);
  if (dy.shape(0) != g.n || dy.shape(1) != g.m || dy.shape(2) != g.oh || dy.shape(3) != g.ow)
    throw py::value_error("conv_backward: dY " + describe(dy) + " must be (" +
                          std::to_string(g.n) + ", " + std::to_string(g.m) + ", " +
                          std::to_string(g.oh) + ", " + std::to_string(g.ow) + ") for X " +
                          describe(x) + " and W " + describe(w));
  py::object dx = py::none(), dw = py::none(), db = py::none();
  T *pdx = nullptr, *pdw = nullptr, *pdb = nullptr;
  if (need_x) {
    Array<T> a(shape_of(x));
    pdx = a.mutable_data();
    dx = a;
  }
  if (need_w) {
    Array<T> a(shape_of(w));
    pdw = a.mutable_data();
    dw = a;
  }
  if (need_b) {
    Array<T> a(Shape{g.m});
    pdb = a.mutable_data();
    db = a;
  }
  const T* px = x.data();
  const T* pw = w.data();
  const T* pdy = dy.data();
  {
    py::gil_scoped_release release;
    if (pdb) conv::bias_backward(g, pdy, pdb);
    conv::backward(g, px, pw, pdy, pdx, pdw, images_per_gemm);
  }
  return py::make_tuple(dx, dw, db);
}

template <typename T>
void bind_float(py::module_& m) {
  m.def("conv_forward", &conv_forward<T>, py::arg("x").noconvert(), py::arg("w").noconvert(),
        py::arg("b").noconvert(), py::arg("group"), py::arg("strides"), py::arg("dilations"),
        py::arg("pads"), py::arg("out"), py::arg("images_per_gemm") = 0,
        "2-D grouped convolution, NCHW: im2col of a few images at a time + one BLAS GEMM per "
        "group. pads are the begin pads (top, left); out is (OH, OW). images_per_gemm=0 picks "
        "the chunk size.");
  m.def("conv_backward", &conv_backward<T>, py::arg("x").noconvert(), py::arg("w").noconvert(),
        py::arg("dy").noconvert(), py::arg("group"), py::arg("strides"), py::arg("dilations"),
        py::arg("pads"), py::arg("out"), py::arg("need_x") = true, py::arg("need_w") = true,
        py::arg("need_b") = true, py::arg("images_per_gemm") = 0,
        "(dX, dW, dB) of conv_forward, each None unless asked for; the columns are recomputed "
        "from X.");
}

}  // namespace

void bind_conv(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
