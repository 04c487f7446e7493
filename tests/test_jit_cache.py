"""The kernel cache (diffgym/sim/jit.py): stale machine code is never loaded, an unrelated file's
change does not throw a kernel's cache away, and a kernel called with a literal and with a
variable is compiled once."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from diffgym.sim import jit

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="DIFFGYM_JIT=0: no compiled kernels")

CALLER = """
from diffgym.sim.jit import njit
from toypkg.callee import helper, SCALE

@njit
def entry(x):
    return helper(x, 0) + helper(x, 1) * SCALE
"""
CALLEE = """
from diffgym.sim.jit import njit
SCALE = {scale}

@njit
def helper(x, k):
    return x * {factor} + k
"""
OTHER = """
from diffgym.sim.jit import njit

@njit
def lonely(x):
    return x + {n}
"""
RUN = """
import sys
from numba.core import event
compiled = []
class L(event.Listener):
    def on_start(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__name__)
    def on_end(self, ev):
        pass
event.register("numba:compile", L())
from toypkg.caller import entry
from toypkg.callee import helper
from toypkg.other import lonely
print(entry(2.0), lonely(1.0), len(helper.signatures), "c:" + ",".join(sorted(compiled)))
"""


def _write(root, factor, scale, n):
    pkg = root / "toypkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "caller.py").write_text(CALLER)
    (pkg / "callee.py").write_text(CALLEE.format(factor=factor, scale=scale))
    (pkg / "other.py").write_text(OTHER.format(n=n))


def _run(root, cache):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(root),
               DIFFGYM_QUIET_COMPILE="1")
    out = subprocess.run([sys.executable, "-c", RUN], env=env, cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    v, w, nsig, compiled = out.stdout.split()
    return float(v), float(w), int(nsig), set(compiled[2:].split(",")) - {""}


def test_cache_follows_the_kernels_a_kernel_calls(tmp_path):
    root, cache = tmp_path / "src", tmp_path / "cache"
    root.mkdir()
    _write(root, factor=3.0, scale=10.0, n=1.0)
    v, w, nsig, compiled = _run(root, cache)
    assert (v, w) == (2 * 3 + 0 + (2 * 3 + 1) * 10, 2.0)
    assert nsig == 1, "helper(x, 0) and helper(x, 1) compiled as two specializations"
    assert {"entry", "helper", "lonely"} <= compiled
    assert _run(root, cache)[3] == set()                  # warm: everything loaded
    # the called kernel's file changes: the caller must not load its old machine code
    _write(root, factor=5.0, scale=10.0, n=1.0)
    v, w, _, compiled = _run(root, cache)
    assert v == 2 * 5 + 0 + (2 * 5 + 1) * 10
    assert "entry" in compiled and "lonely" not in compiled   # (other.py is unrelated)
    # a constant the caller imports from the other file changes (numba freezes it into the code)
    _write(root, factor=5.0, scale=100.0, n=1.0)
    v, _, _, compiled = _run(root, cache)
    assert v == 2 * 5 + 0 + (2 * 5 + 1) * 100
    # an unrelated file changes: the caller and its callee stay cached
    _write(root, factor=5.0, scale=100.0, n=7.0)
    v, w, _, compiled = _run(root, cache)
    assert (v, w) == (2 * 5 + 0 + (2 * 5 + 1) * 100, 8.0)
    assert compiled == {"lonely"}


def test_dependencies_of_the_fused_step():
    from diffgym.sim import collision_kernels, forward
    files = {os.path.basename(p) for p in jit.kernel_dependencies(
        forward._constrained_velocity.py_func)[0]}
    assert {"forward.py", "constraint.py", "solver_kernels.py"} <= files
    assert "collision_kernels.py" not in files
    files = {os.path.basename(p) for p in jit.kernel_dependencies(
        collision_kernels.detect_closed_form.py_func)[0]}
    assert files == {"collision_kernels.py"}


# kernels allowed more than one machine-code copy after a run of every environment (each copy
# costs its whole compilation again on first use): _mm, a small product, multiplies row-major
# matrices and, in dynamics_terms_system, a transposed (column-major) view (a callee shows its
# signatures when it was compiled in this process, not when its caller came from the disk
# cache). (Trees' column-major ABA derivatives, which compiled dynamics_terms and all it calls
# twice, go to the kernels as row-major copies.)
EXTRA_SIGNATURES = {"_mm": 2}


_SIGNATURES_SCRIPT = textwrap.dedent("""
    import json, sys
    import gymnasium as gym
    import numba
    import diffgym  # (registers the environments)
    for env_id in ("DiffCartPole-v0", "DiffHopper-v0", "DiffGo1-v0", "DiffPush-v0",
                   "DiffBilliards-v0"):
        env = gym.make(env_id)
        env.reset(seed=0)
        env.action_space.seed(0)
        for _ in range(2):
            env.step(env.action_space.sample())
            env.unwrapped.step_with_jacobian(env.action_space.sample())
        env.close()
    counts = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("diffgym"):
            continue
        for k, v in list(vars(mod).items()):
            if isinstance(v, numba.core.dispatcher.Dispatcher) and v.__module__ == name:
                counts[name + "." + k] = [k, [str(s) for s in v.signatures]]
    print(json.dumps(counts))
""")


def test_each_kernel_is_compiled_once_across_the_environments(tmp_path):
    """The first use of diffgym compiles each kernel once: every environment calls the kernels
    with the same argument types (a layout or dtype that differs in one environment would
    compile a kernel, and everything it calls, a second time: DiffBilliards' column-major M^-1
    did that to the whole constrained step). Run in a fresh process, from outside the checkout,
    as a user's first session would (this test process has called the kernels with whatever
    the other tests passed)."""
    import json
    env = dict(os.environ, DIFFGYM_QUIET_COMPILE="1")
    out = subprocess.run([sys.executable, "-c", _SIGNATURES_SCRIPT], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert any(s for _, s in counts.values())          # (the run did use the kernels)
    many = {q: sigs for q, (k, sigs) in counts.items()
            if len(sigs) > EXTRA_SIGNATURES.get(k, 1)}
    assert not many, f"kernels compiled for several argument types: {many}"
