"""Access to meta's compiled kernels (the ``meta._native`` pybind11 extension)."""

from __future__ import annotations

from functools import cache
from types import ModuleType

import numpy as np

NATIVE_DTYPES = (np.float32, np.float64)


class NativeUnavailableError(ImportError):
    """The C++ extension was not built or cannot be loaded."""


@cache
def module() -> ModuleType:
    try:
        from meta import _native
    except ImportError as err:
        raise NativeUnavailableError(
            "meta's C++ extension (meta._native) is not built or failed to load; "
            "install the package with `pip install -e .` to build it"
        ) from err
    return _native


def available() -> bool:
    try:
        module()
    except NativeUnavailableError:
        return False
    return True


def call(kernel: str, *arrays: np.ndarray) -> np.ndarray:
    """Call a kernel on C-contiguous arrays of one float dtype (float32 or float64)."""
    dtype = np.result_type(*arrays)
    if dtype not in NATIVE_DTYPES:
        raise TypeError(f"native kernel {kernel}: dtype {dtype} is not supported "
                        f"(float32 or float64)")
    contiguous = [np.ascontiguousarray(a, dtype=dtype) for a in arrays]
    return getattr(module(), kernel)(*contiguous)
