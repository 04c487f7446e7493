"""Cold start: the first use of each environment in a fresh process with an empty kernel cache.

For each id, a new Python process with ``NUMBA_CACHE_DIR`` set to an empty directory times
``import diffgym``, ``gym.make``, ``reset``, the first ``step`` and the first
``step_with_jacobian`` (wall clock, seconds; and the CPU time of the process, which is what
a loaded machine does not inflate), then a second process with the now warm cache times
the same (what every later run pays). Prints one table; then (CPU seconds, user + system)
the cold start split as users meet it: import + make + reset + 10 forward steps, then the
first Jacobian step; and the same with the warm cache.

    python scripts/cold_start.py [ID ...]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

IDS = ["DiffCartPole-v0", "DiffHopper-v0", "DiffGo1-v0", "DiffPush-v0", "DiffBilliards-v0"]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import gymnasium as gym, numpy as np, diffgym
t1 = time.perf_counter()
env = gym.make(sys.argv[1])
t2 = time.perf_counter()
env.reset(seed=0)
t3 = time.perf_counter()
a = np.zeros(env.action_space.shape)
env.step(a)
t4 = time.perf_counter()
for _ in range(9):
    env.step(a)
c4 = time.process_time()
env.unwrapped.step_with_jacobian(a)
t5 = time.perf_counter()
c5 = time.process_time()
print(json.dumps(dict(imp=t1 - t0, make=t2 - t1, reset=t3 - t2, step=t4 - t3, jac=t5 - t4, total=t5 - t0,
                      cpu=c5, cpu_fwd=c4, cpu_jac=c5 - c4)))
"""


def run(env_id: str, cache: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, DIFFGYM_QUIET_COMPILE="1")
    out = subprocess.run([sys.executable, "-c", CHILD, env_id], env=env, capture_output=True, text=True,
                         cwd=tempfile.gettempdir())
    if out.returncode:
        raise SystemExit(f"{env_id}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ids = sys.argv[1:] or IDS
    cpu = []
    print(f"{'environment':18s} {'cache':5s} {'import':>7s} {'make':>6s} {'reset':>6s} {'step':>7s} "
          f"{'jac step':>8s} {'total':>7s} {'CPU':>7s}   (s: wall clock, and the process's CPU time)")
    for env_id in ids:
        with tempfile.TemporaryDirectory() as cache:
            for kind in ("cold", "warm"):
                r = run(env_id, cache)
                cpu.append((env_id, kind, r["cpu_fwd"], r["cpu_jac"]))
                print(f"{env_id:18s} {kind:5s} {r['imp']:7.2f} {r['make']:6.2f} {r['reset']:6.2f} "
                      f"{r['step']:7.2f} {r['jac']:8.2f} {r['total']:7.2f} {r['cpu']:7.2f}", flush=True)
    print(f"\n{'environment':18s} {'cache':5s} {'make+reset+step x10':>20s} {'first Jacobian':>15s}"
          "   (CPU s)")
    for env_id, kind, fwd, jac in cpu:
        print(f"{env_id:18s} {kind:5s} {fwd:20.2f} {jac:15.2f}")


if __name__ == "__main__":
    main()
