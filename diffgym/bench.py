"""``diffgym bench``: forward-step time, diffgym next to MuJoCo's ``mj_step`` on the same file.

Each model is stepped from the same initial state with zero control (Go1: a PD hold of its
standing pose) for ``--steps`` steps after a warm-up; the table gives the median over three
repeats. MuJoCo is a benchmark-only extra (``pip install diffgym[bench]``).
"""
from __future__ import annotations

import time

import numpy as np

from .forward import Simulator
from .resources import asset_path

MODELS = {
    "cartpole": "cartpole.xml",
    "hopper": "hopper_gymnasium.xml",
    "go1": "go1.urdf",
    "billiards": "billiards.xml",
}


def _initial(name: str, sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
    q, v = sim.q0, np.zeros(sim.nv)
    if name == "cartpole":
        q[1] = 0.3
    if name == "billiards":
        v[0] = 2.0          # cue ball towards the rack
    return q, v


def _control(name: str, sim: Simulator, q, v) -> np.ndarray:
    tau = np.zeros(sim.nv)
    if name == "go1":
        tau[6:] = 40.0 * (sim.sm.q0[7:] - q[7:]) - 1.0 * v[6:]
    return tau


def time_diffgym(name: str, path: str, steps: int, repeats: int = 3) -> tuple[float, float, Simulator]:
    sim = Simulator.from_file(path)
    times, contacts = [], []
    for _ in range(repeats):
        q, v = _initial(name, sim)
        sim.reset_warmstart()
        for _ in range(20):
            q, v = sim.step(q, v, _control(name, sim, q, v))
        n_c = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            q, v = sim.step(q, v, _control(name, sim, q, v))
            n_c += sim.last.num_contacts
        times.append((time.perf_counter() - t0) / steps)
        contacts.append(n_c / steps)
    return float(np.median(times)), float(np.mean(contacts)), sim


def time_mujoco(name: str, path: str, steps: int, repeats: int = 3):
    try:
        import mujoco
    except ImportError:
        return None, "mujoco not installed (pip install diffgym[bench])"
    try:
        m = mujoco.MjModel.from_xml_path(path)
    except Exception as exc:   # MuJoCo cannot read every file we can
        return None, f"MuJoCo cannot load it: {str(exc).splitlines()[0][:60]}"
    d = mujoco.MjData(m)
    times = []
    for _ in range(repeats):
        mujoco.mj_resetData(m, d)
        if name == "cartpole":
            d.qpos[1] = 0.3
        if name == "billiards":
            d.qvel[0] = 2.0
        for _ in range(20):
            mujoco.mj_step(m, d)
        t0 = time.perf_counter()
        for _ in range(steps):
            mujoco.mj_step(m, d)
        times.append((time.perf_counter() - t0) / steps)
    return float(np.median(times)), f"dt {m.opt.timestep}"


def main(args) -> int:
    names = args.models or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    rows = []
    print(f"{'model':<10} {'nq/nv':>7} {'contacts':>8} {'diffgym us/step':>16} {'MuJoCo us/step':>15} "
          f"{'ratio':>7}  note")
    for name in names:
        path = asset_path(MODELS[name])
        t_ours, n_c, sim = time_diffgym(name, path, args.steps)
        t_mj, note = time_mujoco(name, path, args.steps)
        ratio = f"{t_ours / t_mj:7.1f}" if t_mj else "    n/a"
        mj = f"{t_mj * 1e6:15.1f}" if t_mj else f"{'n/a':>15}"
        print(f"{name:<10} {f'{sim.nq}/{sim.nv}':>7} {n_c:8.1f} {t_ours * 1e6:16.1f} {mj} {ratio}  {note}")
        rows.append((name, t_ours, t_mj))
    print("\nratio = diffgym / MuJoCo forward step time, measured side by side in this run "
          "(MuJoCo: soft contacts, default solver; diffgym: unrelaxed NCP to 1e-9 m/s).")
    return 0
