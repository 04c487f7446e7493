"""How the cost of the long_range potential grows (diffgym.sim.long_range): a benchmark table, not a
timed test.

Part 1, resolution: two 20 cm cubes, each covered by k^3 leaf spheres (k per axis), near
(2 cm gap) and far (1 m between centres): the hierarchical evaluation's terms and time for the
potential, its force and the force's derivative, against the brute-force sum over all k^6 leaf
pairs (terms only; the paper's Figure 6 comparison).

Part 2, scene size: N cubes (8 leaves each) on a floor in a square grid 30 cm apart: terms and
time per step's evaluation (force + derivative). The potential is a sum over the candidate
collision pairs, so its number of root terms grows as N^2/2 (each far pair costs one compiled
term); the hierarchy makes each pair's cost independent of its shapes' resolution. The
derivative is returned dense (nv x nv), so filling it alone grows as N^2.

Part 3, the scene-level tree: billiards tables of N balls (``diffgym.bench_smooth``'s
``billiards_mjcf``: the rack grown to N balls, all ball pairs candidates) at rest and after
spreading them over the table, per-pair walk (``scene_tree=False``, every candidate pair,
the previous implementation's sum) against the scene tree, alternating block by block: terms,
best-of time for P + force and for the force derivative, and the potential's relative
difference.

    python scripts/bench_long_range.py [part1 part2 part3]
"""
from __future__ import annotations

import time

import numpy as np

from diffgym import Simulator
from diffgym.sim.gradient_modes import LongRange
from diffgym.sim.long_range import LongRangePotential, _leaves, potential  # noqa: F401


def _timed(lr, sim, q, reps=3):
    import pinocchio as pin
    model = sim.model
    trees = sim.__dict__.get("_trees")
    if trees is not None:        # tree by tree, as the step does (no whole-model Data)
        data = trees.kinematics(q, np.zeros(model.nv))
        gdata = sim.geom_data
        trees.geometry_placements(sim.geom_model, gdata)
    else:
        if "_bench_data" not in sim.__dict__:          # one pinocchio Data per scene
            sim._bench_data = (model.createData(), pin.GeometryData(sim.geom_model))
        data, gdata = sim._bench_data
        pin.forwardKinematics(model, data, q)
        pin.updateGeometryPlacements(model, data, sim.geom_model, gdata)
        pin.computeJointJacobians(model, data, q)
    J = np.array(data.J).reshape(6, model.nv)
    best = [np.inf, np.inf]
    for _ in range(reps):
        t0 = time.perf_counter()
        lr.evaluate(data, gdata, J)
        t1 = time.perf_counter()
        lr.force_derivative()
        t2 = time.perf_counter()
        best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
    return lr.rows, best


def part1():
    xml = """<mujoco><worldbody>
<body pos="0 0 1"><freejoint/><geom name="a" type="box" size="0.1 0.1 0.1"/></body>
<body pos="0.22 0 1"><freejoint/><geom name="b" type="box" size="0.1 0.1 0.1"/></body>
</worldbody></mujoco>"""
    sim = Simulator.from_string(xml)
    print("| leaves per cube | brute-force leaf pairs | terms near | ms near (P+force / derivative) "
          "| terms far | ms far |")
    print("|---|---|---|---|---|---|")
    for k in (1, 2, 4, 8):
        c, r = _leaves("box", np.array([0.1, 0.1, 0.1]), max_per_axis=k)
        c = c if k > 1 else c
        if k > 1:
            n = k
            cell = 0.1 / n
            axes = [-0.1 + (2.0 * np.arange(n) + 1.0) * cell] * 3
            c = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
            r = np.full(len(c), float(np.sqrt(3) * cell))
        lr = LongRangePotential(sim, LongRange(), leaves={0: (c, r), 1: (c, r)})
        q = sim.q0.copy()
        rows_n, (tn, dn) = _timed(lr, sim, q)
        q[7] = 1.0
        rows_f, (tf, df) = _timed(lr, sim, q)
        print(f"| {len(c)} | {len(c) ** 2} | {rows_n} | {1e3 * tn:.2f} / {1e3 * dn:.2f} | {rows_f} "
              f"| {1e3 * tf:.2f} / {1e3 * df:.2f} |")


def part2():
    print("\n| cubes N | candidate pairs | terms | ms (P+force / derivative) | ms per pair |")
    print("|---|---|---|---|---|")
    for N in (4, 16, 64, 144):
        m = int(np.ceil(np.sqrt(N)))
        bodies = "".join(
            f'<body pos="{0.3 * (i % m):.2f} {0.3 * (i // m):.2f} 0.05"><freejoint/>'
            f'<geom name="b{i}" type="box" size="0.05 0.05 0.05"/></body>' for i in range(N))
        sim = Simulator.from_string(f'<mujoco><worldbody><geom name="floor" type="plane" '
                                    f'size="5 5 0.1"/>{bodies}</worldbody></mujoco>')
        lr = LongRangePotential(sim, LongRange())
        rows, (t, d) = _timed(lr, sim, sim.q0.copy(), reps=2)
        print(f"| {N} | {len(lr.pairs)} | {rows} | {1e3 * t:.1f} / {1e3 * d:.1f} | "
              f"{1e3 * (t + d) / len(lr.pairs):.3f} |")


def part3(ns=(16, 64, 256), blocks=7):
    import pinocchio as pin

    from diffgym.bench_smooth import billiards_mjcf
    print("\n| balls N | state | candidate pairs | terms per-pair | terms scene | ms P+force per-pair "
          "| ms P+force scene | ratio | ms derivative per-pair | ms derivative scene | ratio "
          "| rel. P difference |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for N in ns:
        sim = Simulator.from_string(billiards_mjcf(N))
        rng = np.random.default_rng(0)
        for state in ("rack", "spread"):
            q = sim.q0.copy()
            if state == "spread":
                Q = q.reshape(N, 7)
                Q[:, 0] = rng.uniform(-1.2, 1.2, N)
                Q[:, 1] = rng.uniform(-0.6, 0.6, N)
                # push apart overlapping balls (a few sweeps)
                for _ in range(50):
                    d = Q[:, None, :2] - Q[None, :, :2]
                    r = np.linalg.norm(d, axis=2) + np.eye(N)
                    over = (r < 0.065) & ~np.eye(N, dtype=bool)
                    if not over.any():
                        break
                    Q[:, :2] += 0.01 * (d * over[..., None] / r[..., None]).sum(1)
            lrs = {k: LongRangePotential(sim, LongRange(), scene_tree=k) for k in (False, True)}
            best = {k: [np.inf, np.inf] for k in lrs}
            Pv = {}
            for _ in range(blocks):
                for k, lr in lrs.items():
                    rows, (t, d) = _timed(lr, sim, q, reps=2)
                    best[k] = [min(best[k][0], t), min(best[k][1], d)]
                    Pv[k] = (rows, lr.last[0][0])
            a, b = best[False], best[True]
            print(f"| {N} | {state} | {len(lrs[True].pairs)} | {Pv[False][0]} | {Pv[True][0]} | "
                  f"{1e3 * a[0]:.2f} | {1e3 * b[0]:.2f} | {a[0] / b[0]:.2f} | {1e3 * a[1]:.1f} | "
                  f"{1e3 * b[1]:.1f} | {a[1] / b[1]:.2f} | "
                  f"{abs(Pv[True][1] - Pv[False][1]) / Pv[False][1]:.2e} |", flush=True)


if __name__ == "__main__":
    import sys
    parts = sys.argv[1:] or ["part1", "part2", "part3"]
    for name in parts:
        globals()[name]()
