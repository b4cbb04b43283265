// pybind11 module meta._native: meta's C++/OpenMP kernels. Each kernel family binds itself in
// its own src/bind_*.cpp; every kernel takes C-contiguous float32 or float64 arrays, checks
// them, and runs with the GIL released so other Python threads (data loading, MPI progress)
// keep going.
#include <omp.h>

#include "bindings.hpp"

PYBIND11_MODULE(_native, m) {
  using namespace meta::bind;
  m.doc() = "meta's native (C++/OpenMP) kernels.";
  bind_blas(m);
  bind_relu(m);
  bind_gemm(m);
  bind_conv(m);
  bind_pool(m);
  bind_batchnorm(m);
  bind_activations(m);
  bind_softmax(m);
  bind_elementwise(m);
  bind_optim(m);
  m.def("max_threads", &omp_get_max_threads, "OpenMP threads a parallel region would use.");
  m.def("set_threads", &omp_set_num_threads, py::arg("n"), "Set OpenMP threads for this process.");
}
