// pybind11 module meta._plan: the planned executor's runtime and kernels (oneDNN). Built only
// where oneDNN is found at build time; meta/lv1/plan runs without it on numpy's path.
#include "plan.hpp"

namespace meta::plan {
// issue 41's coverage kernels (scan.cpp, scatter.cpp, mask.cpp)
void bind_scan(py::module_& m);
void bind_scatter(py::module_& m);
void bind_mask(py::module_& m);
void bind_gemv(py::module_& m);  // gemv.cpp: batch-1 Linear layers
}  // namespace meta::plan

PYBIND11_MODULE(_plan, m) {
  using namespace meta::plan;
  m.doc() = "The planned executor's runtime: steps bound to buffers, oneDNN kernels.";
  bind_runtime(m);
  bind_conv(m);
  bind_matmul(m);
  bind_pool(m);
  bind_norm(m);
  bind_eltwise(m);
  bind_tensor(m);
  bind_loss(m);
  bind_rnn(m);
  bind_attention(m);
  bind_embedding(m);
  bind_fused(m);
  bind_scan(m);
  bind_scatter(m);
  bind_mask(m);
  bind_gemv(m);
  m.attr("onednn_version") = [] {
    const auto* v = dnnl::version();
    return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch);
  }();
}
