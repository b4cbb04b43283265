// 2-D max and average pooling, forward and backward (ops/max_pool.py's NativeMaxPool and
// ops/average_pool.py's NativeAveragePool). The window comes resolved from ops/_window.geometry.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "meta/pool.hpp"

namespace meta::bind {

namespace {

using Pair = std::pair<std::int64_t, std::int64_t>;
using Index = py::array_t<std::int64_t, py::array::c_style>;

pool::Geometry geometry(const char* kernel, const py::array& x, Pair kernel_shape, Pair strides,
                        Pair dilations, Pair pads_begin, Pair pads_end, Pair out) {
  require_ndim(kernel, "X", x, 4);
  pool::Geometry g{x.shape(0) * x.shape(1), x.shape(2),       x.shape(3),
                   kernel_shape.first,      kernel_shape.second, strides.first,
                   strides.second,          dilations.first,   dilations.second,
                   pads_begin.first,        pads_begin.second, pads_end.first,
                   pads_end.second,         out.first,         out.second};
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.ph < 0 ||
      g.pw < 0 || g.eh < 0 || g.ew < 0 || g.oh < 0 || g.ow < 0)
    throw py::value_error(std::string(kernel) + ": X " + describe(x) +
                          ": a kernel size, stride, dilation, pad or output size is out of range");
  return g;
}

Shape out_shape(const py::array& x, const pool::Geometry& g) {
  return Shape{x.shape(0), x.shape(1), g.oh, g.ow};
}

void require_out(const char* kernel, const char* name, const py::array& a, const py::array& x,
                 const pool::Geometry& g) {
  const Shape want = out_shape(x, g);
  bool ok = a.ndim() == 4;
  for (py::ssize_t d = 0; ok && d < 4; ++d) ok = a.shape(d) == want[d];
  if (!ok)
    throw py::value_error(std::string(kernel) + ": " + name + " " + describe(a) + " must be (" +
                          std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", " +
                          std::to_string(g.oh) + ", " + std::to_string(g.ow) + ") for X " +
                          describe(x));
}

// (Y, row-major Indices, Indices as asked: column-major spatially when storage_order).
template <typename T>
py::tuple max_pool_forward(const Array<T>& x, Pair kernel_shape, Pair strides, Pair dilations,
                           Pair pads_begin, Pair pads_end, Pair out, bool storage_order) {
  const pool::Geometry g = geometry("max_pool_forward", x, kernel_shape, strides, dilations,
                                    pads_begin, pads_end, out);
  Array<T> y(out_shape(x, g));
  Index index(out_shape(x, g));
  const T* px = x.data();
  T* py_ = y.mutable_data();
  std::int64_t* pi = index.mutable_data();
  py::object as_asked = index;
  {
    py::gil_scoped_release release;
    pool::max_forward(g, px, py_, pi);
  }
  if (storage_order) {
    Index f(out_shape(x, g));
    std::int64_t* pf = f.mutable_data();
    {
      py::gil_scoped_release release;
      pool::column_major(g, pi, pf);
    }
    as_asked = f;
  }
  return py::make_tuple(y, index, as_asked);
}

template <typename T>
py::array max_pool_backward(const Index& index, const Array<T>& dy, Shape x_shape,
                            Pair kernel_shape, Pair strides, Pair dilations, Pair pads_begin,
                            Pair pads_end, Pair out) {
  Array<T> dx(x_shape);
  const pool::Geometry g = geometry("max_pool_backward", dx, kernel_shape, strides, dilations,
                                    pads_begin, pads_end, out);
  require_out("max_pool_backward", "dY", dy, dx, g);
  require_out("max_pool_backward", "Indices", index, dx, g);
  const std::int64_t* pi = index.data();
  const T* pdy = dy.data();
  T* pdx = dx.mutable_data();
  {
    py::gil_scoped_release release;
    pool::max_backward(g, pi, pdy, pdx);
  }
  return dx;
}

template <typename T>
py::array average_pool_forward(const Array<T>& x, Pair kernel_shape, Pair strides,
                               Pair dilations, Pair pads_begin, Pair pads_end, Pair out,
                               bool count_include_pad) {
  const pool::Geometry g = geometry("average_pool_forward", x, kernel_shape, strides, dilations,
                                    pads_begin, pads_end, out);
  Array<T> y(out_shape(x, g));
  const T* px = x.data();
  T* py_ = y.mutable_data();
  {
    py::gil_scoped_release release;
    pool::average_forward(g, px, py_, count_include_pad);
  }
  return y;
}

template <typename T>
py::array average_pool_backward(const Array<T>& dy, Shape x_shape, Pair kernel_shape,
                                Pair strides, Pair dilations, Pair pads_begin, Pair pads_end,
                                Pair out, bool count_include_pad) {
  Array<T> dx(x_shape);
  const pool::Geometry g = geometry("average_pool_backward", dx, kernel_shape, strides,
                                    dilations, pads_begin, pads_end, out);
  require_out("average_pool_backward", "dY", dy, dx, g);
  const T* pdy = dy.data();
  T* pdx = dx.mutable_data();
  {
    py::gil_scoped_release release;
    pool::average_backward(g, pdy, pdx, count_include_pad);
  }
  return dx;
}

template <typename T>
void bind_float(py::module_& m) {
  m.def("max_pool_forward", &max_pool_forward<T>, py::arg("x").noconvert(),
        py::arg("kernel_shape"), py::arg("strides"), py::arg("dilations"),
        py::arg("pads_begin"), py::arg("pads_end"), py::arg("out"),
        py::arg("storage_order") = false,
        "2-D max pool, NCHW: (Y, row-major Indices, Indices in the storage order asked).");
  m.def("max_pool_backward", &max_pool_backward<T>, py::arg("index").noconvert(),
        py::arg("dy").noconvert(), py::arg("x_shape"), py::arg("kernel_shape"),
        py::arg("strides"), py::arg("dilations"), py::arg("pads_begin"), py::arg("pads_end"),
        py::arg("out"), "dX of max_pool_forward from its row-major Indices.");
  m.def("average_pool_forward", &average_pool_forward<T>, py::arg("x").noconvert(),
        py::arg("kernel_shape"), py::arg("strides"), py::arg("dilations"),
        py::arg("pads_begin"), py::arg("pads_end"), py::arg("out"),
        py::arg("count_include_pad") = false, "2-D average pool, NCHW.");
  m.def("average_pool_backward", &average_pool_backward<T>, py::arg("dy").noconvert(),
        py::arg("x_shape"), py::arg("kernel_shape"), py::arg("strides"), py::arg("dilations"),
        py::arg("pads_begin"), py::arg("pads_end"), py::arg("out"),
        py::arg("count_include_pad") = false, "dX of average_pool_forward.");
}

}  // namespace

void bind_pool(py::module_& m) {
  bind_float<float>(m);
  bind_float<double>(m);
}

}  // namespace meta::bind
