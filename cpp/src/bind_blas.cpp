// Connecting the BLAS numpy loaded (see meta/blas.hpp and meta.lv0.native).
#include "bindings.hpp"
#include "meta/blas.hpp"

namespace meta::bind {

void bind_blas(py::module_& m) {
  m.def("set_blas", &meta::blas::set_provider, py::arg("sgemm"), py::arg("dgemm"),
        py::arg("ilp64"), py::arg("set_threads"), py::arg("get_threads"), py::arg("name"),
        "Use these cblas_sgemm / cblas_dgemm addresses for matrix products (0: built-in loops), "
        "and these openblas_set/get_num_threads (0: none) to keep the BLAS single-threaded "
        "inside the kernels.");
  m.def("blas_name", [] { return meta::blas::provider().name; },
        "Which BLAS the kernels' matrix products run on.");
}

}  // namespace meta::bind
