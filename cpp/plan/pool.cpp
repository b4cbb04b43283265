// Pooling in a plan: oneDNN's max and average pooling (global pooling is a window the size of
// the image), forward and backward, in any layout the planner keeps activations in. Max
// pooling in training keeps its argmax workspace inside the kernel for the backward.
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

namespace {

struct PoolKernel {
  memory::desc src_md, dst_md;
  dnnl::pooling_forward::primitive_desc fwd;
  dnnl::pooling_backward::primitive_desc bwd;
  bool training;
  std::vector<char> workspace;
  std::string info;

  PoolKernel(const Dims& src_dims, const Dims& dst_dims, const std::string& layout,
             const std::string& alg_name, const Dims& kernel, const Dims& strides,
             const Dims& pads_begin, const Dims& dilations, bool train)
      : training(train) {
    const std::size_t sp = src_dims.size() - 2;
    dnnl::algorithm alg;
    if (alg_name == "max") alg = dnnl::algorithm::pooling_max;
    else if (alg_name == "avg_include") alg = dnnl::algorithm::pooling_avg_include_padding;
    else if (alg_name == "avg_exclude") alg = dnnl::algorithm::pooling_avg_exclude_padding;
    else throw std::invalid_argument("meta._plan.Pool: unknown algorithm " + alg_name);
    memory::dims pe(sp), dil(sp);
    for (std::size_t i = 0; i < sp; ++i) {
      const std::int64_t k = (kernel[i] - 1) * dilations[i] + 1;
      pe[i] = (dst_dims[2 + i] - 1) * strides[i] + k - src_dims[2 + i] - pads_begin[i];
      dil[i] = dilations[i] - 1;
    }
    src_md = make_md(src_dims, layout);
    dst_md = make_md(dst_dims, layout);
    const auto prop = training ? dnnl::prop_kind::forward_training
                               : dnnl::prop_kind::forward_inference;
    const memory::dims st(strides.begin(), strides.end()), ke(kernel.begin(), kernel.end()),
        pb(pads_begin.begin(), pads_begin.end());
    fwd = dnnl::pooling_forward::primitive_desc(engine(), prop, alg, src_md, dst_md, st, ke, dil,
                                                pb, pe, scratch_attr());
    info = impl(fwd);
    if (training) {
      bwd = dnnl::pooling_backward::primitive_desc(engine(), alg, src_md, dst_md, st, ke, dil, pb,
                                                   pe, fwd, scratch_attr());
      workspace.resize(fwd.workspace_desc().get_size() + 64);
      info += ", bwd " + impl(bwd);
    }
  }

  memory workspace_memory() {
    void* p = reinterpret_cast<void*>(
        (reinterpret_cast<std::uintptr_t>(workspace.data()) + 63) & ~63ull);
    return memory(fwd.workspace_desc(), engine(), p);
  }
};

using PoolPtr = std::shared_ptr<PoolKernel>;

StepPtr forward(const PoolPtr& k, const py::array& x, const py::array& y) {
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, bind(k->src_md, x, "pool input")},
                                       {DNNL_ARG_DST, bind(k->dst_md, y, "pool output")}};
  if (k->training && k->fwd.workspace_desc().get_size())
    args[DNNL_ARG_WORKSPACE] = k->workspace_memory();
  return primitive_step("pool forward", dnnl::pooling_forward(k->fwd), std::move(args),
                        k->fwd.scratchpad_desc());
}

StepPtr backward(const PoolPtr& k, const py::array& dy, const py::array& dx) {
  if (!k->training) throw std::invalid_argument("meta._plan.Pool: built for inference");
  std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, bind(k->dst_md, dy, "pool dy")},
                                       {DNNL_ARG_DIFF_SRC, bind(k->src_md, dx, "pool dx")}};
  if (k->fwd.workspace_desc().get_size()) args[DNNL_ARG_WORKSPACE] = k->workspace_memory();
  return primitive_step("pool backward", dnnl::pooling_backward(k->bwd), std::move(args),
                        k->bwd.scratchpad_desc());
}

}  // namespace

void bind_pool(py::module_& m) {
  py::class_<PoolKernel, PoolPtr>(m, "Pool", "Max or average pooling's primitives.")
      .def(py::init<Dims, Dims, std::string, std::string, Dims, Dims, Dims, Dims, bool>(),
           py::arg("src_dims"), py::arg("dst_dims"), py::arg("layout"), py::arg("algorithm"),
           py::arg("kernel"), py::arg("strides"), py::arg("pads_begin"), py::arg("dilations"),
           py::arg("training"))
      .def_readonly("info", &PoolKernel::info)
      .def_property_readonly("internal_bytes",
                             [](const PoolKernel& k) { return k.workspace.size(); })
      .def("forward", &forward, py::arg("x"), py::arg("y"))
      .def("backward", &backward, py::arg("dy"), py::arg("dx"));
}

}  // namespace meta::plan
