"""Learning curves of several ``diffgym train`` runs side by side (issue 13: SHAC with the exact
and the smooth step Jacobians against PPO): one CSV of every run's training return against
environment steps and wall-clock, a PNG (return against steps and against wall-clock) and a
markdown table (last return, best return, the return at the smallest budget all runs reached,
env steps and wall-clock reached, and the steps and
seconds each run needed to reach ``--target``, if it did).

    python scripts/compare_runs.py LABEL=RUN_DIR ... --target -400 --out docs/issue13/cartpole
"""
from __future__ import annotations

import argparse
import csv
import math
import os


def _curve(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    out = []
    for r in rows:
        try:
            ret = float(r.get("episode_return", "nan"))
        except ValueError:
            ret = math.nan
        if math.isfinite(ret):
            out.append((int(float(r["env_steps"])), float(r["wall_time"]), ret))
    last = rows[-1] if rows else {"env_steps": 0, "wall_time": 0}
    return out, int(float(last["env_steps"])), float(last["wall_time"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("--out", required=True, help="output prefix")
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    curves = {}
    for spec in a.runs:
        label, d = spec.rsplit("=", 1)
        curves[label] = _curve(d)
    with open(a.out + "_curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "env_steps", "wall_time_s", "train_return"])
        for label, (c, _, _) in curves.items():
            for s, t, r in c:
                w.writerow([label, s, f"{t:.1f}", f"{r:.2f}"])
    common = min(steps for _, steps, _ in curves.values())
    lines = [f"| run | env steps reached | wall-clock (s) | env steps/s | last return | best return "
             f"| last logged return at or before {common} steps "
             + (f"| steps to {a.target:g} | seconds to {a.target:g} " if a.target is not None else "")
             + "|", "|---|---|---|---|---|---|---|" + ("---|---|" if a.target is not None else "")]
    for label, (c, steps, wall) in curves.items():
        last = c[-1][2] if c else math.nan
        best = max((r for _, _, r in c), default=math.nan)
        line = (f"| {label} | {steps} | {wall:.0f} | {steps / wall if wall else math.nan:.0f} | "
                f"{last:.0f} | {best:.0f} |")
        upto = [(s_, r) for s_, _, r in c if s_ <= common]
        line += f" {upto[-1][1]:.0f} (at {upto[-1][0]}) |" if upto else " - |"
        if a.target is not None:
            hit = [(s, t) for s, t, r in c if r >= a.target]
            line += (f" {hit[0][0]} | {hit[0][1]:.0f} |" if hit else " not reached | not reached |")
        lines.append(line)
    table = "\n".join(lines)
    with open(a.out + "_table.md", "w") as f:
        f.write(table + "\n")
    print(table)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for label, (c, _, _) in curves.items():
        if not c:
            continue
        ax[0].plot([s for s, _, _ in c], [r for _, _, r in c], label=label)
        ax[1].plot([t for _, t, _ in c], [r for _, _, r in c], label=label)
    for k, x in enumerate(("environment steps", "wall-clock (s)")):
        ax[k].set_xlabel(x)
        ax[k].set_ylabel("training episode return")
        if a.target is not None:
            ax[k].axhline(a.target, color="k", lw=0.5, ls="--")
        ax[k].legend()
    fig.tight_layout()
    fig.savefig(a.out + "_curves.png", dpi=110)


if __name__ == "__main__":
    main()
