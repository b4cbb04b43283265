// Softmax, LogSoftmax and Concat in a plan (oneDNN), and the fused softmax cross-entropy loss
// (our loop): forward and backward.
#include <cmath>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

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

// loss = mean_n -log softmax(scores)[n, label_n]; logp kept for the backward.
StepPtr cross_entropy(std::int64_t n, std::int64_t c, const py::array& scores,
                      const py::array& labels, const py::array& loss, const py::array& logp) {
  const float* s = static_cast<const float*>(address(scores, n * c * 4, "loss scores"));
  const std::int64_t* t =
      static_cast<const std::int64_t*>(address(labels, n * 8, "loss labels"));
  float* l = static_cast<float*>(address(loss, 4, "loss"));
  float* lp = static_cast<float*>(address(logp, n * c * 4, "loss log-probabilities"));
  return std::make_shared<LambdaStep>("softmax cross-entropy", [=] {
    double total = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float* row = s + i * c;
      float* out = lp + i * c;
      float m = row[0];
      for (std::int64_t j = 1; j < c; ++j) m = std::max(m, row[j]);
      float z = 0;
      for (std::int64_t j = 0; j < c; ++j) z += std::exp(row[j] - m);
      const float lz = m + std::log(z);
      for (std::int64_t j = 0; j < c; ++j) out[j] = row[j] - lz;
      const std::int64_t k = t[i];
      if (k < 0 || k >= c) throw std::out_of_range("softmax cross-entropy: label out of range");
      total -= out[k];
    }
    *l = float(total / double(n));
  });
}

// dscores = (softmax - onehot) * dloss / n
StepPtr cross_entropy_backward(std::int64_t n, std::int64_t c, const py::array& dloss,
                               const py::array& logp, const py::array& labels,
                               const py::array& dscores) {
  const float* dl = static_cast<const float*>(address(dloss, 4, "loss gradient"));
  const float* lp = static_cast<const float*>(address(logp, n * c * 4, "log-probabilities"));
  const std::int64_t* t = static_cast<const std::int64_t*>(address(labels, n * 8, "labels"));
  float* d = static_cast<float*>(address(dscores, n * c * 4, "loss dscores"));
  return std::make_shared<LambdaStep>("softmax cross-entropy backward", [=] {
    const float k = *dl / float(n);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < c; ++j) d[i * c + j] = std::exp(lp[i * c + j]) * k;
      d[i * c + t[i]] -= k;
    }
  });
}

}  // namespace

void bind_tensor(py::module_& m) {
  m.def("softmax", &softmax, py::arg("dims"), py::arg("axis"), py::arg("log"), py::arg("x"),
        py::arg("y"));
  m.def("softmax_backward", &softmax_backward, py::arg("dims"), py::arg("axis"), py::arg("log"),
        py::arg("y"), py::arg("dy"), py::arg("dx"));
  m.def("concat", &concat, py::arg("dims"), py::arg("layout"), py::arg("axis"), py::arg("xs"),
        py::arg("y"));
  m.def("concat_backward", &concat_backward, py::arg("dims"), py::arg("layout"),
        py::arg("axis"), py::arg("dy"), py::arg("dxs"));
}

void bind_loss(py::module_& m) {
  m.def("cross_entropy", &cross_entropy, py::arg("n"), py::arg("c"), py::arg("scores"),
        py::arg("labels"), py::arg("loss"), py::arg("logp"));
  m.def("cross_entropy_backward", &cross_entropy_backward, py::arg("n"), py::arg("c"),
        py::arg("dloss"), py::arg("logp"), py::arg("labels"), py::arg("dscores"));
}

}  // namespace meta::plan
