"""Issue 13: which gradient modes carry a signal from the rod to the box at DiffPush-v0's
trivial start (the rod holding its pose, the box's feet sticking), as the rod starts further
from the box.

For each rod start distance (box centre to rod, the environment's ``ROD_START_DISTANCE`` is
0.2 m) and task seed: the largest entry of the gradient of the trajopt window loss (the box's
``ReLU(|box - target|^2 - eps^2)`` after ``--window`` steps) with respect to the window's
actions, all holding the rod's starting pose (``diffgym.trajopt.Push.rollout``), per mode.

    python scripts/push_gradient_by_mode.py [--distances 0.2,0.3,0.4] [--seeds 1] [--rho 3e-3]
"""
import argparse

import numpy as np

from diffgym.trajopt import Push


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--distances", default="0.2,0.3,0.4")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--window", type=int, default=48)
    p.add_argument("--rho", type=float, default=3e-3)
    p.add_argument("--scale", type=float, default=1e-8)
    args = p.parse_args()
    modes = {"exact": "exact", "smooth": {"mode": "smooth", "rho": args.rho},
             "long_range": {"mode": "long_range", "scale": args.scale},
             "long_range+smooth": {"mode": "long_range", "scale": args.scale, "rho": args.rho}}
    print("| rod start distance (m) | seed | rod-box gap, if its row is in the contact set (m) | "
          + " | ".join(f"max abs grad, {m}" for m in modes) + " |")
    print("|---|---|---|" + "---|" * len(modes))
    for dist in map(float, args.distances.split(",")):
        for seed in range(args.seeds):
            row, gap = [], None
            for mode in modes.values():
                task = Push(mode, seed)
                e = task.env
                e.ROD_START_DISTANCE = dist
                e.reset(seed=seed)
                task.x = e.get_state()
                pose = e._rod_pose(task.x)
                task.hold = np.clip([pose[0] / e.WORKSPACE, pose[1] / e.WORKSPACE,
                                     pose[2] / np.pi], -1, 1)
                _, G, _ = task.rollout(task.x, np.tile(task.hold, (args.window, 1)), True)
                row.append(np.abs(G).max())
                if gap is None:
                    e.set_state(task.x)
                    e.sim.reset_warmstart()
                    e.step(task.hold)
                    c = e.sim.cache["cons"].contacts
                    gap = float(np.min(c.dist[(c.geom1 != 0) & (c.geom2 != 0)])) if (
                        (c.geom1 != 0) & (c.geom2 != 0)).any() else float("nan")
            print(f"| {dist:g} | {seed} | {gap:.4g} | " + " | ".join(f"{g:.3g}" for g in row) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
