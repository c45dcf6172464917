"""Thread counts of the two BLAS/OpenMP runtimes in this process, read and set at run time.

Torch: ``torch.get_num_threads``/``set_num_threads``. NumPy: the OpenBLAS bundled
in the wheel (``numpy.libs/libscipy_openblas*.so``), through ctypes; where NumPy
uses another BLAS, ``openblas_threads`` is ``None`` and setting does nothing.
Nothing here touches ``OPENBLAS_CORETYPE`` or any environment variable: the
counts are changed only around one variant's calls and restored after.
"""
from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from functools import lru_cache


@lru_cache(maxsize=1)
def _openblas():
    import numpy as np

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*.so"))
    if not libs:
        return None
    try:
        lib = ctypes.CDLL(libs[0])
        lib.scipy_openblas_get_num_threads64_.restype = ctypes.c_int
        lib.scipy_openblas_get_corename64_.restype = ctypes.c_char_p
        lib.scipy_openblas_set_num_threads64_.argtypes = [ctypes.c_int]
        return lib
    except (OSError, AttributeError):
        return None


def openblas_threads() -> int | None:
    """Threads NumPy's bundled OpenBLAS uses now (``None`` if NumPy has another BLAS)."""
    lib = _openblas()
    return int(lib.scipy_openblas_get_num_threads64_()) if lib else None


def openblas_core() -> str | None:
    """The kernel set OpenBLAS chose (e.g. ``SkylakeX``; ``OPENBLAS_CORETYPE`` forces it)."""
    lib = _openblas()
    return lib.scipy_openblas_get_corename64_().decode() if lib else None


def set_openblas_threads(n: int) -> None:
    """Set NumPy's OpenBLAS thread count (no-op without the bundled OpenBLAS)."""
    lib = _openblas()
    if lib:
        lib.scipy_openblas_set_num_threads64_(int(n))


def setter(openblas: int | None, torch_threads: int) -> Callable[[], None]:
    """A zero-argument callable that sets both counts (``openblas`` None: leave OpenBLAS alone)."""
    import torch

    def apply() -> None:
        """Set the counts."""
        if openblas is not None:
            set_openblas_threads(openblas)
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)

    return apply
