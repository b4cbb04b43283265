"""Loading ``meta._plan``, the planned executor's C++ runtime on oneDNN.

The extension links ``libdnnl.so.3`` from the ``onednn-cpu-gomp`` wheel, which installs it in
the ``lib`` folder of the environment's prefix; the extension's run path points there, and where
that does not reach (a checkout whose extension was built in place) the library is loaded here
first, by its full path, so the extension's link to it resolves. Without oneDNN the extension
is not built and ``module()`` raises ``PlanUnavailableError`` saying so: the planned executor
then runs its plans on numpy's path.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache
from types import ModuleType


class PlanUnavailableError(ImportError):
    """meta._plan (oneDNN) is not built or cannot be loaded."""


def _preload_onednn() -> None:
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        path = os.path.join(prefix, "lib", "libdnnl.so.3")
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


@cache
def module() -> ModuleType:
    """The extension, loaded once; PlanUnavailableError (with what to install) if missing."""
    _preload_onednn()
    try:
        from meta import _plan
    except ImportError as err:
        raise PlanUnavailableError(
            "meta's planned runtime (meta._plan, on oneDNN) is not available: install "
            "onednn-cpu-gomp==2023.2.0 and onednn-devel-cpu-gomp==2023.2.0 and rebuild meta "
            f"(`pip install -e .`); {err}") from err
    return _plan


def available() -> bool:
    try:
        module()
    except PlanUnavailableError:
        return False
    return True
