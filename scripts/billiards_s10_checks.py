"""Session-10 checks of long_range billiards (issue 13; ``docs/issue13/billiards_s10.md``).

    python scripts/billiards_s10_checks.py deviation 0      # long_range vs exact forward, force bound
    python scripts/billiards_s10_checks.py fd 0 1.2e-6      # rollout gradient vs central differences in contact
    python scripts/billiards_s10_checks.py near 0 0.03 40   # Adam (issue settings) from one step off the known shot

All on the reachable-spot tasks of ``diffgym trajopt --billiards-spots reachable``.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from diffgym.sim.long_range import potential
from diffgym.trajopt import Adam, Billiards


def _pos(t):
    x = t.env.get_state()
    return x[:t.env.nq].reshape(-1, 7)[:, :2].copy()


def deviation(seed: int) -> None:
    """Largest ball displacement of the long_range forward from the exact one after 100 steps
    (trivial start and the known shot), and the rolling bound from the largest resting force."""
    ex = Billiards("exact", seed, 100, "reachable")
    l_triv, _, _ = ex.rollout(ex.trivial, False)
    pt = _pos(ex)
    ex.rollout(ex.shot, False)
    ps = _pos(ex)
    for sc in (1e-8, 1.2e-6):
        lr = Billiards({"mode": "long_range", "scale": sc}, seed, 100, "reachable")
        lt, _, _ = lr.rollout(lr.trivial, False)
        dt = np.linalg.norm(_pos(lr) - pt, axis=1)
        l, _, ok = lr.rollout(lr.shot, False)
        ds = np.linalg.norm(_pos(lr) - ps, axis=1)
        print(f"seed {seed} scale {sc:g}: trivial-start max dev {dt.max() * 1e3:.2f} mm (targets "
              f"{dt[lr.balls].max() * 1e3:.2f} mm), trivial loss {lt:.4g} (exact {l_triv:.4g}); "
              f"known shot max dev {ds.max() * 1e3:.2f} mm (targets {ds[lr.balls].max() * 1e3:.2f}), "
              f"loss {l:.4g} ok {ok}", flush=True)
        _, f = potential(lr.env.sim, ex.x0[:ex.env.nq])
        fb = np.linalg.norm(f.reshape(-1, 6)[:, :2], axis=1).max()
        m = 0.17
        print(f"  largest horizontal force on a resting ball {fb:.3g} N ({fb / (m * 9.81):.2g} of "
              f"its weight); rolling bound 5F/(7m) T^2/2 at T = 4 s: "
              f"{5 * fb / (7 * m) * 8 * 1e3:.3g} mm", flush=True)


def fd(seed: int, scale: float) -> None:
    """The rollout's gradient against central differences (h = 1e-4, 1e-5) at two decisions in
    contact near the known shot."""
    t = Billiards({"mode": "long_range", "scale": scale}, seed, 100, "reachable")
    for k in (1, 2):
        p = t.shot + np.array([0.0, 0.012, -0.3, 0.05]) * k
        loss, g, _ = t.rollout(p, True)
        print(f"p {p} loss {loss:.6g}\n  gradient {g}")
        for h in (1e-4, 1e-5):
            d = []
            for i in range(4):
                e = np.zeros(4)
                e[i] = h
                d.append((t.rollout(p + e, False)[0] - t.rollout(p - e, False)[0]) / (2 * h))
            print(f"  central difference h {h:g}: {np.array(d)}")


def near(seed: int, off: float, iters: int) -> None:
    """Adam at the issue's settings in the exact mode, started at the known shot with y0 moved
    by ``off``: does it land in a solving basin?"""
    t = Billiards("exact", seed, 100, "reachable")
    opt = Adam(t.shot + np.array([0.0, off, 0.0, 0.0]), 3e-2)
    t0 = time.process_time()
    loss = np.inf
    it = -1
    for it in range(iters):
        loss, g, ok = t.rollout(opt.x, True)
        print(f"seed {seed} it {it} loss {loss:.4g} |g| {np.linalg.norm(g):.3g} "
              f"x - shot {np.array2string(opt.x - t.shot, precision=4)}", flush=True)
        if loss == 0.0:
            break
        opt.step(g)
        opt.x = np.clip(opt.x, t.LOWER, t.UPPER)
    print(f"seed {seed} off {off}: " + (f"SUCCESS at iteration {it}" if loss == 0.0 else
                                        f"no success in {iters} iterations")
          + f"; cpu {time.process_time() - t0:.0f} s")


if __name__ == "__main__":
    cmd, *a = sys.argv[1:]
    if cmd == "deviation":
        deviation(int(a[0]))
    elif cmd == "fd":
        fd(int(a[0]), float(a[1]))
    elif cmd == "near":
        near(int(a[0]), float(a[1]), int(a[2]))
    else:
        raise SystemExit(__doc__)
