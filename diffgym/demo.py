"""``make demo`` / ``diffgym demo``: simulate a few scenes and print what happened.

Until training lands this is the project's main job: it exercises the whole pipeline (model
loading, collision, the unrelaxed NCP, integration and the step Jacobian) on a sliding box,
Gymnasium's hopper and the Unitree Go1, and prints closed-form checks beside the results.
"""
from __future__ import annotations

import time

import numpy as np

from .sim.forward import Simulator
from .resources import asset_path

SLIDING_BOX = """<mujoco><option timestep="0.002"/><worldbody>
<geom type="plane" size="5 5 .1" friction="0.16"/>
<body name="box" pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1" friction="0.16"/></body>
</worldbody></mujoco>"""


def _line(name: str, steps: int, wall: float, text: str) -> None:
    print(f"  {name:<12s} {steps:6d} steps  {wall / steps * 1e6:8.1f} us/step   {text}")


def run_demo(seconds: float = 2.0) -> int:
    print("diffgym demo: unrelaxed frictional contact on pinocchio + coal\n")
    # 1. sliding box against the closed form
    sim = Simulator.from_string(SLIDING_BOX)
    q, v = sim.q0, np.array([2.0, 0, 0, 0, 0, 0])
    n = int(round(seconds / sim.dt))
    t0 = time.perf_counter()
    stop_step = None
    for i in range(n):
        q, v = sim.step(q, v, np.zeros(6))
        if stop_step is None and abs(v[0]) < 1e-12:
            stop_step = i + 1
    wall = time.perf_counter() - t0
    t_stop = 2.0 / (0.16 * 9.81)
    _line("sliding box", n, wall,
          f"stopped after {stop_step * sim.dt if stop_step else float('nan'):.3f} s "
          f"(closed form 2/(mu g) = {t_stop:.3f} s), slid {q[0]:.4f} m "
          f"(closed form {2.0 ** 2 / (2 * 0.16 * 9.81):.4f} m)")
    # 2. hopper dropped with zero torque
    sim = Simulator.from_file(asset_path("hopper_gymnasium.xml"), ignore_unsupported=("option.integrator",))
    q, v = sim.q0, np.zeros(sim.nv)
    n = int(round(seconds / sim.dt))
    t0 = time.perf_counter()
    min_d = 0.0
    for _ in range(n):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        if sim.last.num_contacts:
            min_d = min(min_d, float(sim.last.contact_distances.min()))
    wall = time.perf_counter() - t0
    _line("hopper", n, wall, f"torso height {q[1]:.4f} m, deepest penetration {max(0.0, -min_d):.2e} m, "
          f"last step: {sim.last}")
    # 3. Go1 holding its standing pose with a PD controller, and one step Jacobian
    sim = Simulator.from_file(asset_path("go1.urdf"), ignore_unsupported=("joint.frictionloss",))
    q, v = sim.q0, np.zeros(sim.nv)
    q_ref = sim.q0
    n = int(round(min(seconds, 1.0) / sim.dt))
    t0 = time.perf_counter()
    for _ in range(n):
        tau = np.zeros(sim.nv)
        tau[6:] = 40.0 * (q_ref[7:] - q[7:]) - 1.0 * v[6:]
        q, v = sim.step(q, v, tau)
    wall = time.perf_counter() - t0
    _line("go1", n, wall, f"base height {q[2]:.4f} m, |v| {np.linalg.norm(v):.2e}, last step: {sim.last}")
    t0 = time.perf_counter()
    _, _, jac = sim.step(q, v, tau, jacobian=True)
    wall = time.perf_counter() - t0
    print(f"\n  go1 step Jacobian: d(q1, v1)/d(q, v) is {jac.state.shape}, "
          f"computed analytically in {wall * 1e3:.2f} ms; "
          f"spectral radius {np.max(np.abs(np.linalg.eigvals(jac.state))):.4f}")
    return 0
