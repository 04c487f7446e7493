"""Where the cold start's compile time goes: every numba compilation of a diffgym kernel, per
phase (make+reset, forward steps, first Jacobian step), per kernel and per signature.

Each id runs in a fresh process with ``NUMBA_CACHE_DIR`` set to an empty directory. Times are
the CPU time of the process (``time.process_time``), which a loaded machine does not inflate.
"self" is a compilation's own time without the kernels it compiled while typing its body.

    python scripts/compile_profile.py [--top N] [ID ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

IDS = ["DiffCartPole-v0", "DiffHopper-v0", "DiffGo1-v0", "DiffPush-v0", "DiffBilliards-v0"]

CHILD = r"""
import json, sys, time
from numba.core import event
recs, stack = [], []
phase = ["make+reset"]

class L(event.Listener):
    def on_start(self, ev):
        stack.append([time.process_time(), 0.0])
    def on_end(self, ev):
        t0, child = stack.pop()
        dt = time.process_time() - t0
        if stack:
            stack[-1][1] += dt
        d = ev.data["dispatcher"]
        recs.append(dict(name=d.py_func.__module__.rsplit(".", 1)[-1] + "." + d.py_func.__name__,
                         sig=", ".join(str(a) for a in ev.data["args"]), incl=dt, self=dt - child,
                         phase=phase[0], top=not stack))

event.register("numba:compile", L())
c = {}
t = time.process_time()
import gymnasium as gym, numpy as np, diffgym
env = gym.make(sys.argv[1])
env.reset(seed=0)
c["make+reset"] = time.process_time() - t; t = time.process_time()
phase[0] = "step x10"
a = np.zeros(env.action_space.shape)
for _ in range(10):
    env.step(a)
c["step x10"] = time.process_time() - t; t = time.process_time()
phase[0] = "jacobian"
env.unwrapped.step_with_jacobian(a)
c["jacobian"] = time.process_time() - t
print(json.dumps(dict(cpu=c, recs=recs)))
"""


def run(env_id: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, DIFFGYM_QUIET_COMPILE="1")
        out = subprocess.run([sys.executable, "-c", CHILD, env_id], env=env, capture_output=True,
                             text=True, cwd=tempfile.gettempdir())
    if out.returncode:
        raise SystemExit(f"{env_id}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=12, help="kernels listed per phase")
    ap.add_argument("--json", help="also write the raw records here")
    ap.add_argument("ids", nargs="*")
    args = ap.parse_args()
    raw = {}
    for env_id in args.ids or IDS:
        r = raw[env_id] = run(env_id)
        print(f"\n== {env_id}: CPU " + ", ".join(f"{k} {v:.1f} s" for k, v in r["cpu"].items()))
        for ph in r["cpu"]:
            recs = [x for x in r["recs"] if x["phase"] == ph]
            if not recs:
                continue
            tot = sum(x["self"] for x in recs)
            print(f"  {ph}: {len(recs)} compilations, {tot:.1f} s CPU in numba")
            by = {}
            for x in recs:
                b = by.setdefault(x["name"], [0.0, 0])
                b[0] += x["self"]
                b[1] += 1
            for name, (s, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:args.top]:
                print(f"    {s:6.2f} s  {name}" + (f"  ({n} signatures)" if n > 1 else ""))
        dup = {}
        for x in r["recs"]:
            dup.setdefault(x["name"], []).append(x["sig"])
        for name, sigs in dup.items():
            if len(sigs) > 1:
                print(f"  {name}: {len(sigs)} signatures")
                for s in sigs:
                    print(f"      ({s})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f)


if __name__ == "__main__":
    main()
