"""Why Adam does not solve billiards at the paper's settings: the loss landscape around the
iterates of ``diffgym trajopt``'s long_range Adam run (issue 13).

For a task seed and spot rule (``uniform``: the environment's, the paper's settings;
``reachable``: where a random shot leaves the targets), runs the benchmark's Adam (lr 3e-2,
betas (0.3, 0.5)) from the trivial start in the long_range mode for ``--iters`` iterations and at
the iterates listed in ``--probe`` measures:

- the gradient's norm and, for reachable spots, its cosine with the direction to the known shot;
- the directional derivative along -g: the gradient's prediction ``-|g|`` against central
  differences of the rolled-out loss (step ``--h``), i.e. whether the gradient describes the
  loss at all at the scale of 1e-4;
- a scan of the loss along -g/|g| over +-``--span`` (Adam's steps are ~lr per coordinate, so
  ~0.06 in norm): the best decrease within the scan, and how many local minima the scan crosses
  (the roughness Adam's steps see);
- for uniform spots, the best loss CMA-ES-free random shooting finds among ``--shots`` random
  aimed shots (is any one shot close to the spots at all?).

    nice python scripts/billiards_landscape.py --seed 0 --spots uniform --out results/issue13_billiards

Writes ``landscape_<spots>_s<seed>.csv`` (iterates), ``scan_<spots>_s<seed>.csv`` and prints a
table.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import time

import numpy as np

from diffgym.trajopt import Adam, Billiards


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spots", default="uniform", choices=("uniform", "reachable"))
    ap.add_argument("--mode", default="long_range")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--probe", default="0,4,8,16,24,39")
    ap.add_argument("--span", type=float, default=0.1)
    ap.add_argument("--npts", type=int, default=41)
    ap.add_argument("--h", type=float, default=1e-4)
    ap.add_argument("--shots", type=int, default=200)
    ap.add_argument("--out", default="results/issue13_billiards")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    task = Billiards(a.mode, a.seed, 100, a.spots)
    probe = {int(s) for s in a.probe.split(",")}
    opt = Adam(task.trivial.copy(), Billiards.lr)
    rows, scans = [], []
    for it in range(a.iters):
        p = opt.x.copy()
        loss, g, ok = task.rollout(p, True)
        gn = float(np.linalg.norm(g))
        row = dict(it=it, loss=loss, gnorm=gn, x0=p[0], y0=p[1], vx=p[2], vy=p[3],
                   g=" ".join(f"{v:.3e}" for v in g))
        if task.shot is not None and gn > 0:
            d = task.shot - p
            row["cos_to_shot"] = float(-g @ d / (gn * np.linalg.norm(d)))
        if it in probe and gn > 0:
            u = -g / gn
            lp = task.rollout(p + a.h * u, False)[0]
            lm = task.rollout(p - a.h * u, False)[0]
            row["fd_slope"] = (lp - lm) / (2 * a.h)
            row["pred_slope"] = -gn
            ts = np.linspace(-a.span, a.span, a.npts)
            ls = np.array([task.rollout(p + t * u, False)[0] for t in ts])
            for t, l in zip(ts, ls):
                scans.append(dict(it=it, t=t, loss=l))
            interior = (ls[1:-1] < ls[:-2]) & (ls[1:-1] < ls[2:])
            row["scan_local_minima"] = int(interior.sum())
            row["scan_best_t"] = float(ts[np.argmin(ls)])
            row["scan_best_decrease"] = float(loss - ls.min())
            row["step_norm_next"] = float("nan")
        rows.append(row)
        if loss == 0.0 or gn == 0.0:
            break
        opt.step(g)
        opt.x = np.clip(opt.x, task.LOWER, task.UPPER)
        row["step_norm_next"] = float(np.linalg.norm(opt.x - p))
        print(f"it {it}: loss {loss:.5g} |g| {gn:.3g} " + " ".join(
            f"{k} {row[k]:.3g}" for k in ("cos_to_shot", "fd_slope", "pred_slope",
                                          "scan_local_minima", "scan_best_decrease",
                                          "step_norm_next") if k in row), flush=True)
    best_shot = None
    if a.spots == "uniform":
        rng = np.random.default_rng(99)
        best = math.inf
        for _ in range(a.shots):
            q = task.sample()
            l = task.rollout(q, False)[0]
            if l < best:
                best, best_shot = l, q
        print(f"random shooting, {a.shots} shots: best loss {best:.5g} (trivial start "
              f"{rows[0]['loss']:.5g})")
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[-1]).index(k)
                  if k in rows[-1] else 99)
    keys = list(dict.fromkeys(["it", "loss", "gnorm", "cos_to_shot", "fd_slope", "pred_slope",
                               "scan_local_minima", "scan_best_t", "scan_best_decrease",
                               "step_norm_next", "x0", "y0", "vx", "vy", "g"]))
    tag = f"{a.mode}_{a.spots}_s{a.seed}"
    with open(os.path.join(a.out, f"landscape_{tag}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in keys})
    with open(os.path.join(a.out, f"scan_{tag}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["it", "t", "loss"])
        w.writeheader()
        w.writerows(scans)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for it in sorted({s["it"] for s in scans}):
            ts = [s["t"] for s in scans if s["it"] == it]
            ls = [s["loss"] for s in scans if s["it"] == it]
            ax.plot(ts, ls, label=f"iterate {it}")
        ax.set_xlabel("step along -g/|g| (parameter units)")
        ax.set_ylabel("loss")
        ax.set_title(f"billiards {a.spots} spots seed {a.seed}, {a.mode}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, f"scan_{tag}.png"), dpi=110)
    except Exception as exc:  # noqa: BLE001
        print("no plot:", exc)
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
