// Softmax, LogSoftmax and Concat in a plan (oneDNN), forward and backward, and the conversion
// of a tensor between float32 and bf16 (mixed precision). The fused softmax cross-entropy
// loss is in loss.cpp.
#include <cmath>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

StepPtr convert_loop(const py::array& x, const py::array& y, std::int64_t n, bool to_half);

namespace {

dnnl::softmax_forward::primitive_desc softmax_pd(const memory::desc& md, int axis, bool log) {
  return dnnl::softmax_forward::primitive_desc(
      engine(), dnnl::prop_kind::forward_training,
      log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, md, md, axis,
      scratch_attr());
}

StepPtr softmax(const Dims& dims, int axis, bool log, const py::array& x, const py::array& y) {
  const memory::desc md = make_md(dims, "plain");
  auto pd = softmax_pd(md, axis, log);
  return primitive_step(log ? "logsoftmax" : "softmax", dnnl::softmax_forward(pd),
                        {{DNNL_ARG_SRC, bind(md, x, "softmax input")},
                         {DNNL_ARG_DST, bind(md, y, "softmax output")}},
                        pd.scratchpad_desc());
}

StepPtr softmax_backward(const Dims& dims, int axis, bool log, const py::array& y,
                         const py::array& dy, const py::array& dx) {
  const memory::desc md = make_md(dims, "plain");
  auto hint = softmax_pd(md, axis, log);
  auto pd = dnnl::softmax_backward::primitive_desc(
      engine(), log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, md, md,
      md, axis, hint, scratch_attr());
  return primitive_step(log ? "logsoftmax backward" : "softmax backward",
                        dnnl::softmax_backward(pd),
                        {{DNNL_ARG_DST, bind(md, y, "softmax output")},
                         {DNNL_ARG_DIFF_DST, bind(md, dy, "softmax dy")},
                         {DNNL_ARG_DIFF_SRC, bind(md, dx, "softmax dx")}},
                        pd.scratchpad_desc());
}

StepPtr concat(const std::vector<Dims>& dims, const std::string& layout, int axis,
               const std::vector<py::array>& xs, const py::array& y) {
  std::vector<memory::desc> mds;
  Dims out = dims.at(0);
  out[axis] = 0;
  for (const auto& d : dims) {
    mds.push_back(make_md(d, layout));
    out[axis] += d[axis];
  }
  const memory::desc my = make_md(out, layout);
  auto pd = dnnl::concat::primitive_desc(engine(), my, axis, mds, scratch_attr());
  std::unordered_map<int, memory> args{{DNNL_ARG_DST, bind(my, y, "concat output")}};
  for (std::size_t i = 0; i < xs.size(); ++i)
    args[DNNL_ARG_MULTIPLE_SRC + int(i)] = bind(mds[i], xs[i], "concat input");
  return primitive_step("concat", dnnl::concat(pd), std::move(args), pd.scratchpad_desc());
}

// dx_i = the slice of dy that input i filled (None entries are skipped).
std::vector<StepPtr> concat_backward(const std::vector<Dims>& dims, const std::string& layout,
                                     int axis, const py::array& dy,
                                     const std::vector<std::optional<py::array>>& dxs) {
  Dims out = dims.at(0);
  out[axis] = 0;
  for (const auto& d : dims) out[axis] += d[axis];
  const memory::desc my = make_md(out, layout);
  const memory dym = bind(my, dy, "concat dy");
  std::vector<StepPtr> steps;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    memory::dims off(out.size(), 0);
    off[axis] = offset;
    offset += dims[i][axis];
    if (!dxs[i]) continue;
    const memory::desc part =
        my.submemory_desc(memory::dims(dims[i].begin(), dims[i].end()), off);
    const memory::desc mx = make_md(dims[i], layout);
    auto pd = dnnl::reorder::primitive_desc(engine(), part, engine(), mx, scratch_attr());
    steps.push_back(primitive_step(
        "concat backward", dnnl::reorder(pd),
        {{DNNL_ARG_FROM, memory(part, engine(), dym.get_data_handle())},
         {DNNL_ARG_TO, bind(mx, *dxs[i], "concat dx")}},
        pd.scratchpad_desc()));
  }
  return steps;
}

// y = x converted between float32 and bf16 (a oneDNN reorder: round to nearest even), n
// elements of dense arrays; the direction follows the arrays' element sizes (4: float32,
// 2: bf16). The plan's bf16 copy of a tensor read by several bf16 products is made once.
StepPtr convert(const py::array& x, const py::array& y, std::int64_t n) {
  auto type = [](const py::array& a, const char* what) {
    if (a.itemsize() == 4) return dt::f32;
    if (a.itemsize() == 2 && a.dtype().kind() == 'V') return dt::bf16;
    throw std::invalid_argument(std::string("meta._plan.convert: ") + what +
                                " is neither float32 nor bf16");
  };
  const dt from = type(x, "source"), to = type(y, "destination");
  if (from != to) return convert_loop(x, y, n, to == dt::bf16);  // eltwise.cpp
  const memory::desc src({n}, from, tag::a), dst({n}, to, tag::a);
  auto pd = dnnl::reorder::primitive_desc(engine(), src, engine(), dst, scratch_attr());
  return primitive_step(to == dt::bf16 ? "to bf16" : "to float32", dnnl::reorder(pd),
                        {{DNNL_ARG_FROM, bind(src, x, "convert source")},
                         {DNNL_ARG_TO, bind(dst, y, "convert destination")}},
                        pd.scratchpad_desc());
}

}  // namespace

void bind_tensor(py::module_& m) {
  m.def("convert", &convert, py::arg("x"), py::arg("y"), py::arg("n"),
        "y = x between float32 and bf16 (the arrays' element sizes say which way).");
  m.def("softmax", &softmax, py::arg("dims"), py::arg("axis"), py::arg("log"), py::arg("x"),
        py::arg("y"));
  m.def("softmax_backward", &softmax_backward, py::arg("dims"), py::arg("axis"), py::arg("log"),
        py::arg("y"), py::arg("dy"), py::arg("dx"));
  m.def("concat", &concat, py::arg("dims"), py::arg("layout"), py::arg("axis"), py::arg("xs"),
        py::arg("y"));
  m.def("concat_backward", &concat_backward, py::arg("dims"), py::arg("layout"),
        py::arg("axis"), py::arg("dy"), py::arg("dxs"));
}

}  // namespace meta::plan
