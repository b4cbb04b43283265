"""meta: a modular deep-learning meta-framework.

Level 0 operators (``meta.lv0``), Level 1 graphs and executors (``meta.lv1``), Level 2 data,
optimizers and training (``meta.lv2``), Level 3 distribution over MPI (``meta.lv3``), composed by
recipes (``meta.recipe``, whose home is ``meta.run.recipe``).

The package root holds the levels, ``common/`` (what every level imports), ``run/`` (where a
recipe becomes a run), the tools (``bench/``, ``planner/``) and the command line (``cli``).
"""

from meta.common import threads as _threads
from meta.common.moved import alias_modules

_threads.apply_default()  # before numpy starts its BLAS threads

# Modules that left the package root (issue 40): their old paths import the new module, with a
# DeprecationWarning, for one release. meta.recipe is not among them: it stays public.
MOVED = {
    "_moved": "common.moved", "_threads": "common.threads", "component": "common.component",
    "files": "common.files", "user_code": "common.user_code",
    "runner": "run.runner", "run_dir": "run.run_dir", "preflight": "run.preflight",
    "errors": "run.errors", "launch": "run.launch", "replay": "run.replay",
    "replay_record": "run.replay_record", "replay_workers": "run.replay_workers",
    "onnx_backend": "lv1.onnx_backend",
}
alias_modules(__name__, MOVED)

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
