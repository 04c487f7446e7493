"""Step-Jacobian time on box scenes: closed-form box-box contact geometry against the
finite-difference fallback it replaced, side by side with MuJoCo's centered mjd_transitionFD.

    python scripts/bench_box_jacobian.py [--states 10] [--warmup 100] [--repeats 3]

Scenes (one MJCF each, loaded by both engines): a column of 4 and of 16 unit boxes (0.2 m,
each turned 10 degrees from the one below) on a plane, and a pyramid pile of 14 boxes (3x3, 2x2,
1). After ``--warmup`` steps from rest (not timed; the boxes settle) the same ``--states``
consecutive steps are timed, per repeat and engine, alternating engines block by block:

* ``fwd``: our forward step;
* ``jac``: our step with ``jacobian=True`` (closed-form collision geometry, the default);
* ``jac-fd``: the same with every box-box contact routed to the finite-difference fallback
  (``derivatives._collision_fd``: 2 nv coal queries), i.e. the route before closed forms;
* ``mj_step`` and MuJoCo's ``mjd_transitionFD`` (centered, eps 1e-6) on its own trajectory
  from the same initial state.

Medians over repeats, in milliseconds per step; the ratio columns are ours over MuJoCo's FD.
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import diffgym
from diffgym.sim import derivatives


def column(n: int) -> str:
    bodies = "".join(
        f'<body name="b{i}" pos="0 0 {0.1 + 0.2 * i:.4f}" euler="0 0 {10 * i}"><freejoint/>'
        f'<geom type="box" size="0.1 0.1 0.1" mass="1" friction="0.6"/></body>' for i in range(n))
    return (f'<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" '
            f'friction="0.6"/>{bodies}</worldbody></mujoco>')


def pyramid() -> str:
    bodies, k = [], 0
    for layer, m in enumerate((3, 2, 1)):
        off = -(m - 1) * 0.105
        for i in range(m):
            for j in range(m):
                bodies.append(f'<body name="b{k}" pos="{off + 0.21 * i:.4f} {off + 0.21 * j:.4f} '
                              f'{0.1 + 0.2 * layer + 1e-4 * layer:.4f}"><freejoint/><geom type="box" '
                              f'size="0.1 0.1 0.1" mass="1" friction="0.6"/></body>')
                k += 1
    return (f'<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" '
            f'friction="0.6"/>{"".join(bodies)}</worldbody></mujoco>')


def settle(sim, q, v, steps):
    for _ in range(steps):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    return q, v


def time_ours(sim, q0, v0, states, jacobian, fallback):
    real = derivatives.polytope_pairs
    if fallback:
        derivatives.polytope_pairs = lambda sim, kin, c, groups, *a: [k for _, _, rows in groups for k in rows]
    try:
        q, v = q0.copy(), v0.copy()
        tau = np.zeros(sim.nv)
        sim.reset_warmstart()
        n_c = 0
        t0 = time.perf_counter()
        for _ in range(states):
            if jacobian:
                q, v, _ = sim.step(q, v, tau, jacobian=True)
            else:
                q, v = sim.step(q, v, tau)
            n_c += sim.last.num_contacts
        return (time.perf_counter() - t0) / states, n_c / states
    finally:
        derivatives.polytope_pairs = real


def time_mujoco(mujoco, m, qpos, qvel, states, warmup):
    d = mujoco.MjData(m)
    nx = 2 * m.nv
    A = np.zeros((nx, nx))
    out = []
    for kind in ("step", "fd"):
        mujoco.mj_resetData(m, d)
        d.qpos[:], d.qvel[:] = qpos, qvel
        for _ in range(warmup):
            mujoco.mj_step(m, d)
        total = 0.0
        for _ in range(states):
            t0 = time.perf_counter()
            if kind == "fd":
                mujoco.mjd_transitionFD(m, d, 1e-6, True, A, None, None, None)
            else:
                mujoco.mj_step(m, d)
            total += time.perf_counter() - t0
            if kind == "fd":
                mujoco.mj_step(m, d)
        out.append(total / states)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=10)
    ap.add_argument("--fd-states", type=int, default=3, help="states timed with the FD fallback")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import mujoco
    warnings.simplefilter("ignore")
    rows = []
    for name, xml in (("column of 4", column(4)), ("column of 16", column(16)), ("pyramid of 14", pyramid())):
        sim = diffgym.Simulator.from_string(xml)
        m = mujoco.MjModel.from_xml_string(xml)
        q, v = settle(sim, sim.q0, np.zeros(sim.nv), args.warmup)
        sim.step(q, v, np.zeros(sim.nv), jacobian=True)       # set-up, not timed
        res = {k: [] for k in ("fwd", "jac", "jac-fd", "mj_step", "mjd")}
        contacts = 0.0
        for _ in range(args.repeats):
            res["fwd"].append(time_ours(sim, q, v, args.states, False, False)[0])
            t, contacts = time_ours(sim, q, v, args.states, True, False)
            res["jac"].append(t)
            s, f = time_mujoco(mujoco, m, m.qpos0.copy(), np.zeros(m.nv), args.states, args.warmup)
            res["mj_step"].append(s)
            res["mjd"].append(f)
            res["jac-fd"].append(time_ours(sim, q, v, args.fd_states, True, True)[0])
        med = {k: float(np.median(x)) for k, x in res.items()}
        rows.append((name, sim.nv, contacts, med))
    print(f"{'scene':15s} {'nv':>4s} {'contacts':>8s} {'fwd ms':>8s} {'jac ms':>8s} {'jac-fd ms':>10s} "
          f"{'mj_step ms':>10s} {'mjdFD ms':>9s} {'jac/mjdFD':>9s} {'jac-fd/mjdFD':>12s} {'speed-up':>8s}")
    for name, nv, contacts, t in rows:
        print(f"{name:15s} {nv:4d} {contacts:8.1f} {1e3 * t['fwd']:8.2f} {1e3 * t['jac']:8.2f} "
              f"{1e3 * t['jac-fd']:10.2f} {1e3 * t['mj_step']:10.3f} {1e3 * t['mjd']:9.2f} "
              f"{t['jac'] / t['mjd']:9.2f} {t['jac-fd'] / t['mjd']:12.2f} {t['jac-fd'] / t['jac']:8.1f}")


if __name__ == "__main__":
    main()
