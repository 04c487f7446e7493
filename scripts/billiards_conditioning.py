"""How the billiards trajectory-optimization task is conditioned in diffgym, against the
long-range paper's setting (issue 13).

For the reachable-spot tasks of ``diffgym trajopt --billiards-spots reachable`` (task seeds
``--seeds``), measures on the exact simulator and on the long_range forward at several barrier
scales:

1. **Forward deviation of the long_range mode** from the exact simulation, trivial start (the cue
   ball at rest) and the known solving shot: the largest ball displacement between the two
   rollouts after 100 steps (4 s), and the loss of the known shot in the long_range forward (0
   in the exact one). The paper's billiards mu = 1e-7 is ``scale = 12 mu = 1.2e-6`` here (its
   centred term is ``12 mu (1 + r^-1/2)^2``; ours ``scale (1 + r^-1/2)^2``).
2. **The balls still roll at the end**: speed of the two target balls at t = 4 s after the
   known shot (no rolling resistance: a ball rolls until it meets something), and how far the
   targets move in the last 0.04 s step (the task's 5 cm radius against the timing).
3. **The width of the solving basin in units of Adam's step**: along each decision coordinate
   around the known shot, the interval where the loss is 0 (success), scanned at
   resolution (``--res``, 2.5 mm or mm/s) over +-``--span`` (0.05), against lr = 3e-2.

    python scripts/billiards_conditioning.py --seeds 0,1,2,3,4 > docs/issue13/billiards_conditioning.md
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from diffgym.trajopt import Billiards


def positions(task):
    x = task.env.get_state()
    return x[:task.env.nq].reshape(-1, 7)[:, :2].copy(), x[task.env.nq:task.env.nq + task.env.nv].reshape(-1, 6)[:, :2].copy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--scales", default="1e-8,1.2e-6,1.2e-5")
    ap.add_argument("--span", type=float, default=0.05)
    ap.add_argument("--res", type=float, default=2.5e-3)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    scales = [float(s) for s in a.scales.split(",")]
    t0 = time.perf_counter()
    rows1, rows2, rows3 = [], [], []
    for seed in seeds:
        ex = Billiards("exact", seed, 100, "reachable")
        shot = ex.shot
        ex.rollout(ex.trivial, False)
        p_triv, _ = positions(ex)
        l_shot, _, _ = ex.rollout(shot, False)
        p_shot, v_shot = positions(ex)
        for s in scales:
            lr = Billiards({"mode": "long_range", "scale": s}, seed, 100, "reachable")
            lr.rollout(lr.trivial, False)
            d_triv = np.linalg.norm(positions(lr)[0] - p_triv, axis=1).max()
            l, _, _ = lr.rollout(shot, False)
            d_shot = np.linalg.norm(positions(lr)[0] - p_shot, axis=1).max()
            rows1.append((seed, s, d_triv, d_shot, l))
        sp = np.linalg.norm(v_shot[ex.balls], axis=1)
        rows2.append((seed, shot, sp, sp * 0.04, l_shot))
        widths = []
        for i in range(4):
            n = int(round(a.span / a.res))
            ok = []
            for k in range(-n, n + 1):
                p = shot.copy()
                p[i] += k * a.res
                ok.append(ex.rollout(p, False)[2])
            ok = np.array(ok)
            # the connected run of successes around the shot itself
            lo = hi = n
            while lo > 0 and ok[lo - 1]:
                lo -= 1
            while hi < 2 * n and ok[hi + 1]:
                hi += 1
            widths.append(((hi - lo + 1) * a.res if ok[n] else 0.0, int(ok.sum()) * a.res))
        rows3.append((seed, widths))
    print("## Forward deviation of the long_range mode from the exact simulation (100 steps)\n")
    print("| seed | scale | max ball displacement vs exact, trivial start (m) | same, known shot (m) "
          "| loss of the known shot in long_range (0 in exact) |")
    print("|---|---|---|---|---|")
    for seed, s, dt_, ds, l in rows1:
        print(f"| {seed} | {s:g} | {dt_:.3g} | {ds:.3g} | {l:.4g} |")
    print("\n## Target balls at t = 4 s after the known shot (exact)\n")
    print("| seed | shot (x0, y0, vx0, vy0) | target speeds (m/s) | their travel in the last step (m) |")
    print("|---|---|---|---|")
    for seed, shot, sp, tr, l in rows2:
        print(f"| {seed} | {np.array2string(shot, precision=3)} | {np.array2string(sp, precision=3)} "
              f"| {np.array2string(tr, precision=3)} |")
    print(f"\n## Success basin around the known shot, per decision coordinate (scan +-{a.span} at "
          f"{a.res}; Adam's step is about lr = 0.03 per coordinate)\n")
    print("| seed | x0: width around the shot / total success length | y0 | vx0 | vy0 |")
    print("|---|---|---|---|---|")
    for seed, w in rows3:
        print(f"| {seed} | " + " | ".join(f"{c:.3f} / {t:.3f}" for c, t in w) + " |")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
