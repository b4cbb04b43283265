"""meta: a modular deep-learning meta-framework.

Level 0 operators (``meta.lv0``), Level 1 graphs and executors (``meta.lv1``), Level 2 data,
optimizers and training (``meta.lv2``), Level 3 distribution over MPI (``meta.lv3``), composed by
recipes (``meta.recipe``).
"""

from meta import _threads

_threads.apply_default()  # before numpy starts its BLAS threads

from meta.lv0 import Context, Operator, check_gradients, load_library, register  # noqa: E402
from meta.lv0.cpp_ops import CppOpBuildError, register_cpp_op  # noqa: E402

load_library("meta.ops")  # the operator library: one ONNX operator per file in ops/, registered

__version__ = "0.1.0"

__all__ = [
    "Context",
    "CppOpBuildError",
    "Operator",
    "__version__",
    "check_gradients",
    "load_library",
    "register",
    "register_cpp_op",
]
