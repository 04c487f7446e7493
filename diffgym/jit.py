"""Compiled kernels: numba's ``njit`` with the settings every diffgym kernel uses.

The step's hot loops (the small NCP solve, shape-on-plane contacts, constraint assembly, the
mode system of the step derivatives) run on a few dozen numbers per contact; in numpy each
operation would cost a microsecond of Python dispatch. They are written as plain loops over
floats and compiled by numba on first use.

The machine code is cached on disk so that later processes load it instead of compiling again,
in the first writable place of:

1. ``$NUMBA_CACHE_DIR`` when it is set;
2. ``__pycache__`` beside the kernel modules (a checkout, or a user-writable install);
3. diffgym's user cache, ``$XDG_CACHE_HOME/diffgym/numba`` (default ``~/.cache/diffgym/numba``).

When none is writable (a read-only image with a read-only HOME), the kernels are compiled in
memory for the process, and one line on stderr says so. The first compilation in a process is
announced on stderr with its duration (``DIFFGYM_QUIET_COMPILE=1`` silences that).

Kernels never use ``fastmath``: their results must be the IEEE arithmetic the loops spell out.
"""
from __future__ import annotations

import atexit
import os
import sys
import tempfile
import threading
import time

import numba
from numba.core import event as _event

# DIFFGYM_JIT=0 runs the kernels as plain Python (for debugging them with pdb; very slow)
ENABLED = os.environ.get("DIFFGYM_JIT", "1") != "0"

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def user_cache_dir() -> str:
    """diffgym's own cache directory for compiled kernels (XDG base directory convention)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "diffgym", "numba")


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _choose_cache() -> tuple[str, str | None]:
    """(mode, directory): where this process caches kernels ('memory', None when nowhere)."""
    from numba.core import config
    if config.CACHE_DIR and _writable(config.CACHE_DIR):
        return "NUMBA_CACHE_DIR", config.CACHE_DIR
    if _writable(os.path.join(_PKG_DIR, "__pycache__")):
        return "in-tree", os.path.join(_PKG_DIR, "__pycache__")
    if _writable(user_cache_dir()):
        return "user", user_cache_dir()
    return "memory", None


CACHE_MODE, CACHE_DIR = _choose_cache() if ENABLED else ("off", None)

if ENABLED and CACHE_MODE == "memory":
    print(f"diffgym: no writable cache for compiled kernels (not {_PKG_DIR}, not "
          f"{user_cache_dir()}, NUMBA_CACHE_DIR unset or read-only): compiling them in memory for "
          "this process only; set NUMBA_CACHE_DIR to a writable directory to keep them",
          file=sys.stderr)


if ENABLED and CACHE_MODE != "memory":
    from numba.core import caching as _caching

    # numba keys a cached kernel on its own file only; a kernel that calls kernels of another
    # file (the fused step calls the solver's) would load stale machine code after that file
    # changed. The stamp here covers every diffgym file that defines kernels.
    _KERNEL_FILES = sorted(
        os.path.join(_PKG_DIR, f) for f in os.listdir(_PKG_DIR)
        if f.endswith(".py") and f != "jit.py" and "njit" in open(os.path.join(_PKG_DIR, f), encoding="utf-8").read())

    def _kernels_stamp():
        out = []
        for path in _KERNEL_FILES:
            st = os.stat(path)
            out.append(_caching._hash_source_file(path, st.st_mtime, st.st_size))
        return tuple(out)

    class _AllKernelsStamp:
        def get_source_stamp(self):
            return (super().get_source_stamp(), _kernels_stamp())

    class _UserProvidedLocator(_AllKernelsStamp, _caching.UserProvidedCacheLocator):
        pass

    class _InTreeLocator(_AllKernelsStamp, _caching.InTreeCacheLocator):
        pass

    class _UserCacheLocator(_AllKernelsStamp, _caching._SourceFileBackedLocatorMixin,
                            _caching._CacheLocator):
        """Caches a kernel under :func:`user_cache_dir` (after numba's own two locators)."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = os.path.join(user_cache_dir(), self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self):
            return self._cache_path

    class _CacheImpl(_caching.CompileResultCacheImpl):
        _locator_classes = [_UserProvidedLocator, _InTreeLocator, _UserCacheLocator]

    class _FunctionCache(_caching.FunctionCache):
        _impl_class = _CacheImpl


class _CompileAnnouncer(_event.Listener):
    """Says on stderr when diffgym's kernels are being compiled, and how long it took.

    numba fires ``numba:compile`` only for real compilations (a kernel loaded from the disk
    cache fires nothing). A burst of compilations (the kernels one step needs) is announced by
    one line when it starts and one line, with its duration, once no compilation has followed
    for a moment; on a terminal the first line is kept up to date with the kernel being built.
    """

    QUIET_GAP = 1.0   # s without a compilation that ends a burst

    def __init__(self):
        self.depth = 0
        self.burst_start = None
        self.count = 0
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.tty = sys.stderr.isatty() if hasattr(sys.stderr, "isatty") else False

    @staticmethod
    def _ours(event) -> bool:
        disp = event.data.get("dispatcher") if isinstance(event.data, dict) else None
        mod = getattr(getattr(disp, "py_func", None), "__module__", "") or ""
        return mod.startswith("diffgym")

    def on_start(self, event):
        if not self._ours(event):
            return
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if self.burst_start is None:
                self.burst_start, self.count = time.perf_counter(), 0
                where = f"cached in {CACHE_DIR}" if CACHE_DIR else "in memory, not cached"
                print(f"diffgym: compiling the simulation kernels (first use only; {where}; "
                      "a minute or more)...", file=sys.stderr, flush=True)
            self.depth += 1
            if self.tty and self.depth == 1:
                name = event.data["dispatcher"].py_func.__name__
                print(f"\r\x1b[K  [{self.count + 1}] {name} "
                      f"({time.perf_counter() - self.burst_start:.0f} s)", end="", file=sys.stderr,
                      flush=True)

    def on_end(self, event):
        if not self._ours(event):
            return
        with self.lock:
            self.depth = max(0, self.depth - 1)
            if self.depth == 0:
                self.count += 1
                self.last_end = time.perf_counter()
                if self.tty:                       # (the program's own output starts clean)
                    print("\r\x1b[K", end="", file=sys.stderr, flush=True)
                self.timer = threading.Timer(self.QUIET_GAP, self._finish)
                self.timer.daemon = True
                self.timer.start()

    def _finish(self):
        with self.lock:
            if self.depth or self.burst_start is None or not self.count:
                return
            took = self.last_end - self.burst_start
            print(f"diffgym: compiled {self.count} kernels in {max(took, 0.0):.0f} s"
                  + (" (later runs load them from the cache)" if CACHE_DIR else ""),
                  file=sys.stderr, flush=True)
            self.burst_start, self.timer = None, None


if ENABLED and os.environ.get("DIFFGYM_QUIET_COMPILE", "0") in ("", "0"):
    _ANNOUNCER = _CompileAnnouncer()
    _event.register("numba:compile", _ANNOUNCER)
    atexit.register(_ANNOUNCER._finish)


def njit(fn=None, **kw):
    """``numba.njit(nogil=True)`` with diffgym's disk cache (or the function itself with
    DIFFGYM_JIT=0)."""
    def wrap(f):
        if not ENABLED:
            return f
        disp = numba.njit(nogil=True, **kw)(f)
        if CACHE_MODE != "memory":
            disp._cache = _FunctionCache(disp.py_func)
        return disp
    return wrap(fn) if fn is not None else wrap
