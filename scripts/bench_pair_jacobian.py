"""Cost of a Jacobian step on a scene whose contacts are cylinder and ellipsoid pairs (issue 16):
the closed-form collision derivatives (convex_support: refined single points, cap and facet
contacts) against the finite-difference fallback they replace (the driver's convex and face
routes switched off: coal's points and ``derivatives._collision_fd``, as before), side by side
in one process, alternating block by block.

    python scripts/bench_pair_jacobian.py [blocks] [steps per block]
"""
import sys
import time
import warnings

import numpy as np

import diffgym
from diffgym.sim import derivatives

warnings.simplefilter("ignore")
SCENE = """<mujoco><option timestep="0.01"/><worldbody>
<geom type="plane" size="5 5 .1" friction="0.6"/>
<geom name="table" type="box" pos="0 0 0.05" size="0.6 0.6 0.05" friction="0.6"/>
<geom name="drum" type="cylinder" pos="0.8 0 0.1" size="0.15 0.1" friction="0.6"/>
<body pos="-0.3 -0.3 0.2"><freejoint/><geom name="can" type="cylinder" size="0.06 0.08" mass="0.5" friction="0.6"/></body>
<body pos="-0.3 -0.3 0.4" euler="0 0 30"><freejoint/><geom name="can2" type="cylinder" size="0.05 0.06" mass="0.3" friction="0.6"/></body>
<body pos="0.2 -0.2 0.3" euler="20 10 0"><freejoint/><geom name="egg" type="ellipsoid" size="0.08 0.06 0.04" mass="0.3" friction="0.6"/></body>
<body pos="0.25 0.2 0.3"><freejoint/><geom name="ball" type="sphere" size="0.05" mass="0.2" friction="0.6"/></body>
<body pos="0.25 0.2 0.5" euler="10 0 0"><freejoint/><geom name="egg2" type="ellipsoid" size="0.06 0.05 0.04" mass="0.2" friction="0.6"/></body>
<body pos="0.8 0 0.35"><freejoint/><geom name="box" type="box" size="0.06 0.05 0.04" mass="0.3" friction="0.6"/></body>
</worldbody></mujoco>"""


def main():
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    sim = diffgym.Simulator.from_string(SCENE)
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(150):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    print("contacts:", sorted({tuple(sorted(g)) for g in sim.last.contact_geoms}))
    col = sim.collision
    routes = (col._convex, col._face)

    def use(closed):
        col._convex, col._face = routes if closed else ({}, {})

    times = {True: [], False: []}
    fwd = {True: [], False: []}
    rows = {True: 0, False: 0}
    for b in range(blocks):
        for closed in ((True, False) if b % 2 == 0 else (False, True)):
            use(closed)
            qq, vv = q, v
            before = sum(derivatives.fallback_counts.values())
            t0 = time.perf_counter()
            for _ in range(steps):
                qq, vv, jac = sim.step(qq, vv, np.zeros(sim.nv), jacobian=True)
            times[closed].append((time.perf_counter() - t0) / steps)
            rows[closed] += sum(derivatives.fallback_counts.values()) - before
            qq, vv = q, v
            t0 = time.perf_counter()
            for _ in range(steps):
                qq, vv = sim.step(qq, vv, np.zeros(sim.nv))
            fwd[closed].append((time.perf_counter() - t0) / steps)
    use(True)
    t_cf, t_fd = np.median(times[True]), np.median(times[False])
    print(f"nv {sim.nv}, {sim.last.num_contacts} contact points")
    print(f"{'route':28s} {'ms / Jacobian step':>20s} {'fallback rows / step':>22s}")
    print(f"{'closed form (this branch)':28s} {1e3 * t_cf:20.2f} {rows[True] / (blocks * steps):22.1f}")
    print(f"{'finite-difference fallback':28s} {1e3 * t_fd:20.2f} {rows[False] / (blocks * steps):22.1f}")
    print(f"ratio closed form / fallback: {t_cf / t_fd:.2f} (median of {blocks} blocks of {steps} steps)")
    f_cf, f_fd = np.median(fwd[True]), np.median(fwd[False])
    print(f"forward step (no Jacobian): refined points {1e3 * f_cf:.2f} ms, coal's points "
          f"{1e3 * f_fd:.2f} ms, ratio {f_cf / f_fd:.2f}")


if __name__ == "__main__":
    main()
