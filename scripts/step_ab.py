"""Step speed of two diffgym source trees side by side (for example a base commit exported with
``git archive`` and this checkout), alternating block by block.

Each tree runs in its own worker process (``PYTHONPATH`` = the tree; its own kernel cache
directory, warmed before timing). The parent alternates A and B blocks of the same steps of
the same rollout and prints, per environment, the median time per step of each and the
ratio B / A.

    python scripts/step_ab.py OLD_TREE NEW_TREE [--blocks 8] [--steps 200] [ID ...]

A tree is a directory holding ``diffgym/`` (with ``diffgym/envs`` inside it, as installed).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

IDS = ["DiffCartPole-v0", "DiffHopper-v0", "DiffGo1-v0", "DiffPush-v0", "DiffBilliards-v0"]

WORKER = r"""
import sys, time
import gymnasium as gym, numpy as np, diffgym
env = gym.make(sys.argv[1])
steps = int(sys.argv[2])
rng = np.random.default_rng(0)
acts = rng.uniform(-1, 1, (steps,) + env.action_space.shape)
env.reset(seed=0)
for i in range(20):                     # compile / load the kernels, settle
    env.step(acts[i])
print("ready", flush=True)
for line in sys.stdin:
    env.reset(seed=0)
    t = time.perf_counter()
    for i in range(steps):
        _, _, term, trunc, _ = env.step(acts[i])
        if term or trunc:
            env.reset(seed=0)
    print((time.perf_counter() - t) / steps, flush=True)
"""


def worker(tree: str, cache: str, env_id: str, steps: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), NUMBA_CACHE_DIR=cache,
               DIFFGYM_QUIET_COMPILE="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-c", WORKER, env_id, str(steps)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    line = p.stdout.readline()
    if line.strip() != "ready":
        raise SystemExit(f"{tree} {env_id}: worker failed")
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                     "diffgym-step-ab"))
    ap.add_argument("ids", nargs="*")
    args = ap.parse_intermixed_args()
    print(f"{'environment':18s} {'A us/step':>10s} {'B us/step':>10s} {'B/A':>6s}   "
          f"(median of {args.blocks} alternating blocks of {args.steps} steps)")
    for env_id in args.ids or IDS:
        ws = [worker(t, os.path.join(args.cache, k), env_id, args.steps)
              for k, t in (("a", args.a), ("b", args.b))]
        times = ([], [])
        for blk in range(args.blocks):
            order = (0, 1) if blk % 2 == 0 else (1, 0)
            for k in order:
                ws[k].stdin.write("go\n")
                ws[k].stdin.flush()
                times[k].append(float(ws[k].stdout.readline()))
        for w in ws:
            w.stdin.close()
            w.wait()
        a, b = (statistics.median(t) * 1e6 for t in times)
        print(f"{env_id:18s} {a:10.1f} {b:10.1f} {b / a:6.3f}", flush=True)


if __name__ == "__main__":
    main()
