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


def _code_names(code) -> set:
    """Every global or attribute name a function's bytecode (nested code objects included)
    mentions."""
    names = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            names |= _code_names(c)
    return names


_FROZEN = (bool, int, float, complex, str, bytes, type(None))


def _fingerprint(x):
    """A value numba freezes into machine code when a kernel reads it as a global, as
    something comparable and picklable; None for what numba does not freeze that way."""
    import numpy as np
    if isinstance(x, _FROZEN) or isinstance(x, np.generic):
        return (type(x).__name__, repr(x))
    if isinstance(x, np.ndarray):
        import hashlib
        return ("ndarray", str(x.dtype), x.shape, hashlib.sha256(
            np.ascontiguousarray(x).tobytes()).hexdigest())
    if isinstance(x, tuple):
        parts = tuple(_fingerprint(y) for y in x)
        return ("tuple", parts) if all(p is not None for p in parts) else None
    return None


def kernel_dependencies(py_func) -> tuple[list[str], list]:
    """(source files, frozen globals) a kernel's machine code depends on: its own file, the
    files of every kernel it calls (transitively; by a global name, a module attribute or a
    closure variable), and the values of the constant globals each of them reads (numba
    copies those into the code when it compiles it)."""
    files, consts = [], []
    seen, todo = set(), [py_func]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        path = os.path.abspath(f.__code__.co_filename)
        if path not in files:
            files.append(path)
        names = _code_names(f.__code__)
        values = []
        for name in sorted(names):
            if name in f.__globals__:
                values.append((name, f.__globals__[name]))
        for cell, name in zip(f.__closure__ or (), f.__code__.co_freevars):
            try:
                values.append((name, cell.cell_contents))
            except ValueError:                 # (an empty cell)
                pass
        expanded = []
        for name, x in values:
            expanded.append((name, x))
            if isinstance(x, type(os)):          # a module: the attributes the code names
                for attr in sorted(names):
                    if attr in getattr(x, "__dict__", {}):
                        expanded.append((f"{name}.{attr}", x.__dict__[attr]))
        for name, x in expanded:
            if isinstance(x, numba.core.dispatcher.Dispatcher):
                todo.append(x.py_func)
            elif isinstance(x, tuple) and any(isinstance(y, numba.core.dispatcher.Dispatcher)
                                               for y in x):
                todo.extend(y.py_func for y in x
                            if isinstance(y, numba.core.dispatcher.Dispatcher))
            else:
                fp = _fingerprint(x)
                if fp is not None:
                    consts.append((f.__module__, f.__qualname__, name, fp))
    return files, consts


if ENABLED and CACHE_MODE != "memory":
    from numba.core import caching as _caching

    # numba keys a cached kernel on its own source file only; a kernel that calls kernels of
    # another file (the fused step calls the solver's) would load stale machine code after
    # that file changed, and so would one reading a constant imported from another module.
    # The stamp here covers the source of every kernel the kernel calls (transitively) and the
    # values of the globals they read; it is computed on the kernel's first use (when every
    # module it calls into has been imported).

    def _dependency_stamp(py_func):
        files, consts = kernel_dependencies(py_func)
        out = []
        for path in files:
            st = os.stat(path)
            out.append((os.path.basename(path), _caching._hash_source_file(path, st.st_mtime,
                                                                           st.st_size)))
        return ("diffgym-deps-1", tuple(out), tuple(consts))

    class _LazyStampIndex(_caching.IndexDataCacheFile):
        """numba's index file, with the source stamp computed when first needed."""

        def __init__(self, cache_path, filename_base, stamp_fn):
            super().__init__(cache_path, filename_base, None)
            self._stamp_fn = stamp_fn
            self._stamp = None

        @property
        def _source_stamp(self):
            if self._stamp is None:
                self._stamp = self._stamp_fn()
            return self._stamp

        @_source_stamp.setter
        def _source_stamp(self, value):        # (numba's __init__ sets it: computed lazily)
            pass

    class _UserCacheLocator(_caching._SourceFileBackedLocatorMixin, _caching._CacheLocator):
        """Caches a kernel under :func:`user_cache_dir` (after numba's own two locators)."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = os.path.join(user_cache_dir(), self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self):
            return self._cache_path

    class _CacheImpl(_caching.CompileResultCacheImpl):
        _locator_classes = [_caching.UserProvidedCacheLocator, _caching.InTreeCacheLocator,
                            _UserCacheLocator]

    class _FunctionCache(_caching.FunctionCache):
        _impl_class = _CacheImpl

        def __init__(self, py_func):
            super().__init__(py_func)
            self._cache_file = _LazyStampIndex(self._cache_path, self._impl.filename_base,
                                               lambda: _dependency_stamp(py_func))


# what each kernel module computes (the progress lines name the group being compiled)
_GROUPS = {"collision_kernels": "collision", "constraint": "constraint assembly",
           "forward": "contact step", "solver_kernels": "contact solver",
           "derivative_kernels": "step derivatives"}


def _group(event) -> str:
    f = event.data["dispatcher"].py_func
    mod = f.__module__.rsplit(".", 1)[-1]
    return f"{_GROUPS.get(mod, mod)} ({f.__name__})"


class _CompileAnnouncer(_event.Listener):
    """Says on stderr when diffgym's kernels are being compiled, and how long it took.

    numba fires ``numba:compile`` only for real compilations (a kernel loaded from the disk
    cache fires nothing). A burst of compilations (the kernels one step needs) still running after
    ``ANNOUNCE_AFTER`` seconds is announced by one line (a shorter one, such as the small
    kernel a model load compiles, says nothing) and one line, with its duration, once no compilation has followed
    for a moment; in between, each kernel group (a kernel called from Python, with the kernels
    it calls) that took a second or more gets a line with its time and the time so far, and on
    a terminal a status line names the group being built.
    """

    ANNOUNCE_AFTER = 1.0   # s: a burst that ends sooner (a small load-time kernel) says nothing
    QUIET_GAP = 1.0   # s without a compilation that ends a burst
    REPORT_GROUP = 1.0   # a kernel group (a kernel called from Python) taking this long: a line

    def __init__(self):
        self.depth = 0
        self.burst_start = None
        self.count = 0
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.announce_timer: threading.Timer | None = None
        self.announced = False
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
                self.burst_start, self.count, self.announced = time.perf_counter(), 0, False
                self.announce_timer = threading.Timer(self.ANNOUNCE_AFTER, self._announce)
                self.announce_timer.daemon = True
                self.announce_timer.start()
            self.depth += 1
            if self.depth == 1:
                self.group_start = time.perf_counter()
                if self.tty and self.announced:
                    print(f"\r\x1b[K  [{self.count + 1}] {_group(event)} "
                          f"({time.perf_counter() - self.burst_start:.0f} s)", end="",
                          file=sys.stderr, flush=True)

    def on_end(self, event):
        if not self._ours(event):
            return
        with self.lock:
            self.depth = max(0, self.depth - 1)
            if self.depth == 0:
                self.count += 1
                self.last_end = time.perf_counter()
                took = self.last_end - self.group_start
                if self.tty and self.announced:    # (the program's own output starts clean)
                    print("\r\x1b[K", end="", file=sys.stderr, flush=True)
                if took >= self.REPORT_GROUP:
                    self._say_start()
                    print(f"diffgym:   {_group(event)}: {took:.0f} s "
                          f"({self.last_end - self.burst_start:.0f} s so far)", file=sys.stderr,
                          flush=True)
                self.timer = threading.Timer(self.QUIET_GAP, self._finish)
                self.timer.daemon = True
                self.timer.start()

    def _say_start(self):
        """The burst's first line (the caller holds the lock)."""
        if self.announced or self.burst_start is None:
            return
        self.announced = True
        where = f"cached in {CACHE_DIR}" if CACHE_DIR else "in memory, not cached"
        print(f"diffgym: compiling the simulation kernels (first use only; {where}; "
              "a minute or more)...", file=sys.stderr, flush=True)

    def _announce(self):
        with self.lock:
            if self.depth:                     # (still compiling after ANNOUNCE_AFTER)
                self._say_start()

    def _finish(self):
        with self.lock:
            if self.depth or self.burst_start is None or not self.count:
                return
            if self.announce_timer is not None:
                self.announce_timer.cancel()
            if not self.announced:                 # (a short burst: nothing to say)
                self.burst_start, self.timer = None, None
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


if ENABLED:
    from numba.core import types as _types
    from numba.core.registry import CPUDispatcher as _CPUDispatcher

    class Kernel(_CPUDispatcher):
        """numba's CPU dispatcher, except that a kernel called from another kernel is compiled
        for the plain types of its arguments, never for literal values: numba would otherwise
        compile ``f(x, 0)`` (a ``Literal[int](0)``) and ``f(x, i)`` (an ``int64``) as two
        machine-code copies of ``f``, each costing the whole compilation again."""

        def get_call_template(self, args, kws):
            args = tuple(_types.unliteral(a) for a in args)
            kws = {k: _types.unliteral(a) for k, a in kws.items()}
            return super().get_call_template(args, kws)


def njit(fn=None, **kw):
    """``numba.njit(nogil=True)`` with diffgym's disk cache (or the function itself with
    DIFFGYM_JIT=0)."""
    def wrap(f):
        if not ENABLED:
            return f
        disp = numba.njit(nogil=True, **kw)(f)
        disp.__class__ = Kernel
        if CACHE_MODE != "memory":
            disp._cache = _FunctionCache(disp.py_func)
        return disp
    return wrap(fn) if fn is not None else wrap
