"""Issue 12: the step Jacobian at the states that exposed its three defects, before and after
the fixes, against central differences of the whole step.

"Before" is the same code with the two fixes undone in place (the limit impulses left out of
the ABA derivatives' joint torques; frictionless touching contacts left as the solver labelled
them), so both columns come from one run at the same states. The error of a state is the
largest over the six blocks of the best relative error over the difference steps 1e-5, 1e-6,
1e-7 (tau perturbed 100x that for the legged models), counted only where the one-sided
differences agree (no mode switch inside the stencil); states where they disagree are counted
separately.

    python scripts/issue12_jacobian_defects.py
"""
from __future__ import annotations

import sys
import warnings

import numpy as np
import gymnasium as gym

import diffgym
from diffgym import gradcheck
from diffgym.sim import derivatives as D, forward as F
from diffgym.envs import ENV_IDS  # noqa: F401

_ORIG = (D._joint_torques, F._label_frictionless)


def fixes(on: bool) -> None:
    if on:
        D._joint_torques, F._label_frictionless = _ORIG
    else:
        D._joint_torques = lambda sim, cons, res: sim.cache["tau_total"]
        F._label_frictionless = lambda res, mu: (res, None)


def _run(sim, warm, q, v, tau):
    sim.set_warm_start_state(warm)
    return sim.step(q, v, tau)


def errors(sim, warm, q, v, tau, tau_scale, eps_list=(1e-5, 1e-6, 1e-7), skip_q=()):
    """(error, one-sided disagreement, worst block) as in the module doc
    (gradcheck.step_jacobian_errors); ``skip_q``: q columns left out of dq_dq and dv_dq."""
    _, best, one = gradcheck.step_jacobian_errors(sim, q, v, tau, warm=warm, tau_scale=tau_scale,
                                                  eps=eps_list, skip_q=skip_q)
    worst = max(best, key=best.get)
    return best[worst], max(one.values()), worst


def record(env, steps, seed, policy=None):
    """Every simulator sub-step (q, v, tau, warm start) of a seeded episode."""
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    with gradcheck.record_substeps(env.sim) as subs:
        for t in range(steps):
            a = policy(env, t, rng) if policy else rng.uniform(-1, 1, env.action_space.shape)
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                break
    return [s[:4] for s in subs]


def table(name, sim, states, select, tau_scale, skip_q=()):
    rows = {True: [], False: []}
    switch = 0
    n = 0
    for q, v, tau, warm in states:
        fixes(True)
        _run(sim, warm, q, v, tau)
        if not select(sim.last):
            continue
        n += 1
        res = {}
        for on in (False, True):
            fixes(on)
            res[on] = errors(sim, warm, q, v, tau, tau_scale, skip_q=skip_q)
        fixes(True)
        if max(res[True][1], res[False][1]) > 1e-3:
            switch += 1                  # a mode switch inside the stencil: not counted
            continue
        for on in (False, True):
            rows[on].append(res[on][0])
    b, a = np.array(rows[False]), np.array(rows[True])
    fmt = lambda x: f"{x.min():.1e} .. {x.max():.1e}" if len(x) else "-"  # noqa: E731
    print(f"| {name} | {n} ({switch} with a switch in the stencil) | {fmt(b)} | "
          f"{fmt(a)} | {int(np.sum(b > 1e-6))} -> {int(np.sum(a > 1e-6))} |")


def head_on_push(seed, steps=20, speed=0.4, lateral=0.0, yaw=0.0):
    """DiffPush-v0, velocity control: the rod square to a box face, pushing through its centre."""
    env = gym.make("DiffPush-v0", control="velocity").unwrapped
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    x = env.get_state()
    qz, qw = x[8], x[9]
    nf = 2 * np.arctan2(qz, qw) + np.round((rng.uniform(-np.pi, np.pi) - 2 * np.arctan2(qz, qw))
                                           / (np.pi / 2)) * np.pi / 2
    d = -np.array([np.cos(nf), np.sin(nf)])
    x[0:2] = x[3:5] - 0.072 * d + lateral * np.array([-d[1], d[0]]) - env._rod_offset
    x[2] = np.arctan2(d[1], d[0]) + yaw
    env.set_state(x)
    a = np.array([speed * d[0] / 0.5, speed * d[1] / 0.5, 0.0])
    return env, record_from(env, steps, a)


def record_from(env, steps, a):
    with gradcheck.record_substeps(env.sim) as subs:
        for _ in range(steps):
            env.step(a)
    return [s[:4] for s in subs]


def main() -> int:
    warnings.simplefilter("ignore", diffgym.SolverWarning)
    print("| defect / scene | states | before | after | states > 1e-6 |")
    print("| --- | --- | --- | --- | --- |")
    env = gym.make("DiffCartPole-v0").unwrapped
    table("1: DiffCartPole-v0 at a rail stop (seed-0 random episode, 240 steps)", env.sim,
          record(env, 240, 0), lambda last: np.any(last.limit_active), 100.0)
    env = gym.make("DiffHopper-v0").unwrapped
    table("1: DiffHopper-v0 with a joint limit in reach (seed-0 random episode, 200 steps)",
          env.sim, record(env, 200, 0), lambda last: np.any(last.limit_active), 100.0)
    sim = diffgym.Simulator.from_string(BALLS)
    table("2: two frictionless balls, a pushed into b at rest", sim, balls_states(sim),
          lambda last: last.num_contacts == 3, 1.0)
    states = []
    for seed in range(2):
        env, st = head_on_push(seed, steps=6)
        states += st
    sel = lambda last: any("rod" in g for g in last.contact_geoms)  # noqa: E731
    table("2+3: DiffPush-v0 head-on flush push (velocity control, seeds 0-1), every column",
          env.sim, states, sel, 1.0)
    # exactly flush, the two points of coal's capsule-box contact patch share one depth, which
    # turning the rod or the box either way decreases: the q columns of the rod's yaw (2) and
    # the box's (8) sit on a kink; the other columns
    table("2: the same states without the rod-yaw and box-yaw q columns", env.sim, states, sel,
          1.0, skip_q=(2, 8))
    states = []
    rng = np.random.default_rng(5)
    for seed in range(10):
        lat, yaw, sp = rng.uniform(-0.04, 0.04), rng.uniform(-3e-3, 3e-3), rng.uniform(0.1, 0.5)
        env, st = head_on_push(seed, steps=10, speed=sp, lateral=lat, yaw=yaw)
        states += st
    table("3: DiffPush-v0 near-flush pushes (yaw off by U(-3, 3) mrad, lateral U(-4, 4) cm), "
          "two rod-box points sliding", env.sim, states,
          lambda last: sum("rod" in g for g, m in zip(last.contact_geoms, last.contact_modes)
                           if m == "sliding") == 2, 1.0)
    return 0


BALLS = """<mujoco><option timestep="0.01"/><default><geom friction="0 0 0"/></default><worldbody>
<geom type="plane" size="5 5 .1"/>
<body name="a" pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.1" mass="0.1"/></body>
<body name="b" pos="0.3 0 0.1"><freejoint/><geom type="sphere" size="0.1" mass="0.1"/></body>
</worldbody></mujoco>"""


def balls_states(sim):
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(30):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    tau = np.zeros(sim.nv)
    tau[0] = 0.5
    out = []
    for _ in range(60):
        out.append((q, v, tau, sim.warm_start_state()))
        q, v = sim.step(q, v, tau)
    return out[-12:]


if __name__ == "__main__":
    sys.exit(main())
