"""The threads of the BLAS libraries loaded in this process, and the guard that keeps a step of
a large model on one of them.

Both OpenBLAS builds a numpy/scipy process carries (numpy's ``scipy_openblas64_`` for ``@``
and ``np.linalg`` in Python, scipy's ``scipy_openblas`` for the compiled kernels' LAPACK and
``np.dot``) start one thread per core and split a call across them once the matrix is larger
than about 96 x 96 (a matrix-vector product of ``M^-1 J^T`` on a rack of 16 balls already
qualifies). A step makes many such calls, each a few microseconds of work; every one then waits
for the other threads to wake, and on a machine whose cores are busy (a shared server, the
workers of a vector environment, a sweep running one trial per core) that wait is the step's
largest cost. Measured on the 2-core machine at load 4, a rack of 16 balls, median of 6 blocks
per setting alternating in one process: the forward step 3.65 ms wall-clock with one BLAS
thread against 18.8 ms with two, the Jacobian step 5.95 against 32.0 ms (CPU time 2.3 against
7.9 ms and 3.2 against 18.2 ms: idle OpenBLAS threads spin). MuJoCo's step is single-threaded
for the same reason.

So ``Simulator.step`` runs models of at least :data:`PIN_MIN_NV` velocity dimensions (racks,
piles, billiards; not a hopper or a quadruped, whose matrices stay below OpenBLAS's threshold
and whose steps are too short to pay for the guard's four calls) with every loaded OpenBLAS set
to ``DIFFGYM_BLAS_THREADS`` threads (default 1) and restores the counts when the step returns
or raises, as scikit-learn does around its own small-matrix loops (threadpoolctl). Outside the
step, the user's numpy keeps its threads. ``DIFFGYM_BLAS_THREADS=0`` leaves the libraries
alone. Linux only (the libraries are found in ``/proc/self/maps``); elsewhere nothing changes.
"""
from __future__ import annotations

import ctypes
import os

# models with at least this many velocity dimensions step with their BLAS threads pinned
PIN_MIN_NV = 24

_LIBS: list | None = None


def openblas_libs(refresh: bool = False) -> list:
    """(file name, get, set) of each OpenBLAS loaded in this process (numpy's and scipy's each
    bundle one), found by their paths in /proc/self/maps (Linux; [] elsewhere). Cached once
    any is found (``refresh`` looks again)."""
    global _LIBS
    if _LIBS and not refresh:
        return _LIBS
    try:
        with open("/proc/self/maps") as fh:
            paths = sorted({ln.split()[-1] for ln in fh
                            if ln.rstrip().endswith(".so") or ".so." in ln.split()[-1]})
    except OSError:
        return []
    out = []
    for path in paths:
        base = os.path.basename(path)
        if "openblas" not in base.lower():
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pre, suf in (("openblas", ""), ("openblas", "64_"), ("scipy_openblas", ""),
                         ("scipy_openblas", "64_")):
            get = getattr(lib, f"{pre}_get_num_threads{suf}", None)
            set_ = getattr(lib, f"{pre}_set_num_threads{suf}", None)
            if get is not None and set_ is not None:
                get.restype = ctypes.c_int
                get.argtypes = []
                set_.argtypes = [ctypes.c_int]
                set_.restype = None
                out.append((base, get, set_))
                break
    _LIBS = out
    return out


def blas_threads() -> dict:
    """Threads of each BLAS loaded in this process, {library: threads} (threadpoolctl's view
    when it is installed, else each OpenBLAS asked directly; {} when none is found)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {name: int(get()) for name, get, _set in openblas_libs(refresh=True)}
    return {os.path.basename(i.get("filepath", "?")): int(i["num_threads"])
            for i in threadpool_info() if i.get("user_api") == "blas"}


def limit_blas_threads(n: int):
    """Set every loaded BLAS to ``n`` threads; returns a callable that restores the counts."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        libs = openblas_libs(refresh=True)
        before = [(set_, int(get())) for _name, get, set_ in libs]
        for _name, _get, set_ in libs:
            set_(int(n))
        return lambda: [set_(k) for set_, k in before] and None
    return threadpool_limits(limits=int(n), user_api="blas").restore_original_limits


def step_threads() -> int:
    """``DIFFGYM_BLAS_THREADS`` (default 1): the BLAS threads of a large model's step; 0 leaves
    the libraries as they are. Anything else than a non-negative integer is an error naming
    the variable."""
    env = os.environ.get("DIFFGYM_BLAS_THREADS", "").strip()
    if not env:
        return 1
    try:
        n = int(env)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"environment variable DIFFGYM_BLAS_THREADS: expected a non-negative "
                         f"integer (0: leave the BLAS threads alone), got {env!r}")
    return n


class StepThreads:
    """``enter()`` sets every loaded OpenBLAS running more than ``n`` threads to ``n``;
    ``exit()`` restores what ``enter`` changed. One per simulator, reused every step."""

    __slots__ = ("n", "saved")

    def __init__(self, n: int):
        self.n = int(n)
        self.saved: list = []

    def enter(self) -> None:
        libs = _LIBS if _LIBS else openblas_libs()
        n = self.n
        for _name, get, set_ in libs:
            k = get()
            if k > n:
                set_(n)
                self.saved.append((set_, k))

    def exit(self) -> None:
        saved = self.saved
        while saved:
            set_, k = saved.pop()
            set_(k)


def step_guard(nv: int):
    """The :class:`StepThreads` of a model with ``nv`` velocity dimensions, or None where its
    steps leave BLAS alone (below :data:`PIN_MIN_NV`, ``DIFFGYM_BLAS_THREADS=0``, or no
    OpenBLAS found)."""
    if nv < PIN_MIN_NV:
        return None
    n = step_threads()
    if n == 0 or not openblas_libs():
        return None
    return StepThreads(n)
