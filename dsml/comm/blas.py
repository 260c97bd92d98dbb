"""Plumbing (hand-written): one BLAS thread in each processes-engine rank.

Spawned children get OMP/OPENBLAS/MKL_NUM_THREADS=1 in their environment
(`_ChildEnvironment`); a forked child's BLAS is already loaded and ignores the environment,
so it also calls the library's own set-threads function through ctypes (`one_blas_thread`).
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads",
                 "MKL_Set_Num_Threads", "bli_thread_set_num_threads")
_BLAS_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                 "openblas_get_num_threads64_", "openblas_get_num_threads",
                 "MKL_Get_Max_Threads", "bli_thread_get_num_threads")


def _blas_libraries() -> list:
    """The BLAS libraries loaded in this process (Linux: from /proc/self/maps; elsewhere the
    ones NumPy's wheel bundles)."""
    paths = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and fields[5].startswith("/"):
                    name = os.path.basename(fields[5]).lower()
                    if any(key in name for key in ("blas", "mkl_rt", "blis")):
                        paths.add(fields[5])
    except OSError:
        base = os.path.dirname(os.path.dirname(np.__file__))
        for folder in (os.path.join(base, "numpy.libs"), os.path.join(np.__path__[0], ".dylibs")):
            if os.path.isdir(folder):
                paths.update(os.path.join(folder, name) for name in os.listdir(folder)
                             if "blas" in name.lower())
    libraries = []
    for path in sorted(paths):
        try:
            libraries.append(ctypes.CDLL(path))
        except OSError:
            pass
    return libraries


def one_blas_thread() -> None:
    """Make this process's BLAS use one thread (see the module docstring)."""
    for var in _BLAS_VARS:
        os.environ[var] = "1"
    for library in _blas_libraries():
        for name in _BLAS_SETTERS:
            setter = getattr(library, name, None)
            if setter is not None:
                setter(1)
                break


def blas_threads() -> list[int]:
    """Threads each loaded BLAS library uses (for tests; empty if none can be asked)."""
    counts = []
    for library in _blas_libraries():
        for name in _BLAS_GETTERS:
            getter = getattr(library, name, None)
            if getter is not None:
                counts.append(int(getter()))
                break
    return counts



class _ChildEnvironment:
    """One BLAS thread in the environment of spawned children (a forked child inherits the
    parent's loaded BLAS and sets its threads itself)."""

    def __init__(self, method):
        self.method = method
        self.saved = {}

    def __enter__(self):
        if self.method != "fork":
            self.saved = {var: os.environ.get(var) for var in _BLAS_VARS}
            os.environ.update(dict.fromkeys(_BLAS_VARS, "1"))
        return self

    def __exit__(self, *exc):
        for var, value in self.saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
