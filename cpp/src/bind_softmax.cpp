// Kernels of this family are being written; this file binds none yet.
#include "bindings.hpp"

namespace meta::bind {

void bind_softmax(py::module_& m) { (void)m; }

}  // namespace meta::bind
