"""Access to meta's compiled kernels (the ``meta._native`` pybind11 extension).

The first use loads the extension and connects its matrix products to the BLAS numpy already
loaded (found through threadpoolctl), so numpy and the C++ kernels share one BLAS and one
thread pool. ``META_BLAS=builtin`` keeps the extension's own loops instead (slower; for
checking the kernels without BLAS). ``blas()`` says which is in use.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from functools import cache
from types import ModuleType

import numpy as np

NATIVE_DTYPES = (np.float32, np.float64)

# (sgemm, dgemm, 64-bit integers) entry points to look for, in order: numpy >= 2's wheels ship
# OpenBLAS with a "scipy_" prefix and a "64_" suffix for its ILP64 interface.
GEMM_SYMBOLS = (
    ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", True),
    ("cblas_sgemm64_", "cblas_dgemm64_", True),
    ("scipy_cblas_sgemm", "scipy_cblas_dgemm", False),
    ("cblas_sgemm", "cblas_dgemm", False),
)


# openblas_set_num_threads / openblas_get_num_threads under the same naming schemes: the kernels
# keep the BLAS at one thread while they split products over OpenMP's threads (cpp/include/
# meta/blas.hpp says why).
THREAD_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


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
    if os.environ.get("META_BLAS", "").lower() != "builtin":
        _connect_blas(_native)
    return _native


def _numpy_blas_libraries() -> list[dict]:
    from threadpoolctl import threadpool_info

    return [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]


def _connect_blas(ext: ModuleType) -> None:
    """Hand the extension the cblas GEMMs of numpy's BLAS, after checking one product."""
    for lib in _numpy_blas_libraries():
        try:
            handle = ctypes.CDLL(lib["filepath"])
        except OSError:
            continue
        for sgemm, dgemm, ilp64 in GEMM_SYMBOLS:
            # An unsuffixed cblas_sgemm of a 64-bit-integer build cannot be told from a 32-bit
            # one by its name: trust it only when the file does not say "64".
            if not ilp64 and "64" in os.path.basename(lib["filepath"]):
                continue
            try:
                s, d = getattr(handle, sgemm), getattr(handle, dgemm)
            except AttributeError:
                continue
            name = (f"{lib.get('internal_api', 'blas')} {lib.get('version') or ''} "
                    f"({os.path.basename(lib['filepath'])}, {sgemm}, numpy's)").replace("  ", " ")
            ext.set_blas(_address(s), _address(d), ilp64, *_thread_functions(handle), name)
            if _gemm_agrees(ext):
                return
            ext.set_blas(0, 0, False, 0, 0, "")
    warnings.warn("meta: no usable BLAS found beside numpy; the C++ kernels use their own "
                  "(slower) matrix-product loops", RuntimeWarning, stacklevel=3)


def _address(function: ctypes._CFuncPtr) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def _thread_functions(handle: ctypes.CDLL) -> tuple[int, int]:
    """Addresses of the library's (set, get) thread-count functions, or (0, 0)."""
    for setter, getter in THREAD_SYMBOLS:
        try:
            return _address(getattr(handle, setter)), _address(getattr(handle, getter))
        except AttributeError:
            continue
    return 0, 0


def _gemm_agrees(ext: ModuleType) -> bool:
    rng = np.random.default_rng(0)
    for dtype in NATIVE_DTYPES:
        a, b = rng.standard_normal((5, 3)).astype(dtype), rng.standard_normal((4, 3)).astype(dtype)
        out = np.zeros((5, 4), dtype)
        ext.gemm_into(a, b, out, False, True, 1.0, 0.0)
        if not np.allclose(out, a @ b.T, rtol=1e-4, atol=1e-5):
            return False
    return True


def blas() -> str:
    """Which BLAS the native kernels' matrix products run on."""
    return module().blas_name()


def available() -> bool:
    """Whether meta's C++ extension (``meta._native``) loads on this machine.

        >>> isinstance(available(), bool)
        True
    """
    try:
        module()
    except NativeUnavailableError:
        return False
    return True


def float_dtype(kernel: str, *arrays: np.ndarray) -> np.dtype:
    """The one float dtype the kernel runs in, or a TypeError naming the kernel and dtype."""
    dtype = np.result_type(*arrays)
    if dtype not in NATIVE_DTYPES:
        raise TypeError(f"native kernel {kernel}: dtype {dtype} is not supported "
                        f"(float32 or float64)")
    return dtype


def supports(*arrays: np.ndarray) -> bool:
    """Whether native kernels take these arrays: all float32 or all float64, so a native twin
    runs them as its numpy operator would (no dtype promotion to mimic), and none empty (a
    zero-size tensor goes to numpy: a kernel's empty loop bounds once divided by zero)."""
    dtype = arrays[0].dtype
    return dtype in NATIVE_DTYPES and all(a.dtype == dtype and a.size for a in arrays)


def call_into(kernel: str, *arrays: np.ndarray, out: np.ndarray, **options) -> np.ndarray:
    """Like ``call`` for kernels that write into ``out`` (C-contiguous, of the inputs' dtype)."""
    dtype = float_dtype(kernel, *arrays)
    if out.dtype != dtype or not out.flags.c_contiguous:
        raise TypeError(f"native kernel {kernel}: out must be C-contiguous {dtype}, got "
                        f"{out.dtype}{' (not contiguous)' if not out.flags.c_contiguous else ''}")
    contiguous = [np.ascontiguousarray(a, dtype=dtype) for a in arrays]
    getattr(module(), kernel)(*contiguous, out, **options)
    return out


def call(kernel: str, *arrays: np.ndarray, **options) -> np.ndarray:
    """Call a kernel on C-contiguous arrays of one float dtype (float32 or float64); keyword
    ``options`` (ints, floats, flags) are passed through."""
    dtype = float_dtype(kernel, *arrays)
    contiguous = [np.ascontiguousarray(a, dtype=dtype) for a in arrays]
    return getattr(module(), kernel)(*contiguous, **options)
