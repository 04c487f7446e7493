"""Forward step of a scene whose contacts go through the convex refinement (issue 16:
``convex_support.solve`` refines coal's witness points and normal of cylinder, ellipsoid and
sphere-mesh pairs on every step): the compiled refinement of this tree against the numpy one of
an earlier commit (loaded from git) and no refinement at all, side by side in one process, alternating block by block.
Also reports the largest difference of their outputs over the calls made.

    python scripts/bench_convex_refine.py [blocks] [steps per block] [git revision of the numpy version]
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

import diffgym
from diffgym.sim import collision_driver, convex_support

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pair_jacobian import SCENE  # noqa: E402  (the 36-dof cylinder/ellipsoid scene)

warnings.simplefilter("ignore")


def load_numpy_version(rev):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = subprocess.run(["git", "show", f"{rev}:diffgym/sim/convex_support.py"], cwd=root,
                         check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "convex_support_numpy.py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location("diffgym.sim._convex_support_numpy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    rev = sys.argv[3] if len(sys.argv) > 3 else "d1e36e5"
    old = load_numpy_version(rev)
    olds = {}

    def old_solve(sa, RA, tA, sb, RB, tB, n, p1, p2, previous=None):
        def conv(s):
            o = olds.get(id(s))
            if o is None:
                o = olds[id(s)] = old.Shape.__new__(old.Shape)
                o.__dict__.update(s.__dict__)
            return o
        return old.solve(conv(sa), RA, tA, conv(sb), RB, tB, n, p1, p2, previous)

    sim = diffgym.Simulator.from_string(SCENE)
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(150):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    worst = [0.0, 0]

    def compare(*a):
        x, y = convex_support.solve(*a), old_solve(*a)
        if (x is None) != (y is None):
            worst[1] += 1
        elif x is not None:
            worst[0] = max(worst[0], float(np.abs(x[0] - y[0]).max()), abs(x[1] - y[1]),
                           float(np.abs(x[2] - y[2]).max()), float(np.abs(x[3] - y[3]).max()))
        return x
    engines = {"compiled": convex_support.solve, "numpy": old_solve, "none": None}
    col, convex = sim.collision, sim.collision._convex
    times = {k: [] for k in engines}
    for b in range(blocks):
        for name in (("compiled", "numpy", "none") if b % 2 == 0 else ("none", "numpy", "compiled")):
            collision_driver.solve = engines[name] or convex_support.solve
            col._convex = convex if engines[name] else {}     # none: coal's points unrefined
            qq, vv = q, v
            t0 = time.perf_counter()
            for _ in range(steps):
                qq, vv = sim.step(qq, vv, np.zeros(sim.nv))
            times[name].append((time.perf_counter() - t0) / steps)
    col._convex = convex
    collision_driver.solve = compare
    qq, vv = q, v
    for _ in range(steps):
        qq, vv = sim.step(qq, vv, np.zeros(sim.nv))
    collision_driver.solve = convex_support.solve
    calls = len(sim.collision.convex_pairs)
    print(f"nv {sim.nv}, {sim.last.num_contacts} contact points, {calls} refined pairs")
    print(f"{'refinement':12s} {'ms / forward step (median)':>28s} {'min':>8s} {'max':>8s}")
    for name in engines:
        t = 1e3 * np.array(times[name])
        print(f"{name:12s} {np.median(t):28.2f} {t.min():8.2f} {t.max():8.2f}")
    print("(none: coal's witness points unrefined, as before the refinement; their derivatives "
          "then take the finite-difference fallback)")
    print(f"ratio compiled / numpy: {np.median(times['compiled']) / np.median(times['numpy']):.2f} "
          f"({blocks} alternating blocks of {steps} steps)")
    print(f"largest difference of the outputs over {steps} steps: {worst[0]:.1e} "
          f"(n, d, p1, p2; m); answered by one only: {worst[1]}")


if __name__ == "__main__":
    main()
