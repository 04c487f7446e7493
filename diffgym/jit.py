"""Compiled kernels: numba's ``njit`` with the settings every diffgym kernel uses.

The step's hot loops (the small NCP solve, shape-on-plane contacts, constraint assembly, the
mode system of the step derivatives) run on a few dozen numbers per contact; in numpy each
operation would cost a microsecond of Python dispatch. They are written as plain loops over
floats and compiled by numba on first use. ``cache=True`` stores the machine code next to the
module (or under ``NUMBA_CACHE_DIR``), so later processes load it instead of compiling again.

Kernels never use ``fastmath``: their results must be the IEEE arithmetic the loops spell out.
"""
from __future__ import annotations

import os

import numba

# DIFFGYM_JIT=0 runs the kernels as plain Python (for debugging them with pdb; very slow)
ENABLED = os.environ.get("DIFFGYM_JIT", "1") != "0"


def njit(fn=None, **kw):
    """``numba.njit(cache=True, nogil=True)`` (or the function itself with DIFFGYM_JIT=0)."""
    def wrap(f):
        if not ENABLED:
            return f
        return numba.njit(cache=True, nogil=True, **kw)(f)
    return wrap(fn) if fn is not None else wrap
