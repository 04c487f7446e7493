"""Hashes of random rollouts (issue 14: a change to the step's plumbing must leave every result
bit for bit): the five environments with random actions, with and without Jacobians, and the
bench's hopper and Go1 scenarios; per run a SHA-256 of every observation, reward, state, Jacobian
block and ``sim.last`` field (contacts, impulses, modes, iterations, residual, method).

    python scripts/step_hashes.py [--steps 200] > hashes.txt      (then diff two such files)
"""
from __future__ import annotations

import argparse
import hashlib
import warnings

import numpy as np


def _feed(h, x):
    if x is None:
        h.update(b"None")
    elif isinstance(x, np.ndarray):
        h.update(str(x.shape).encode() + str(x.dtype).encode())
        h.update(np.ascontiguousarray(x).tobytes())
    elif isinstance(x, (list, tuple)):
        for y in x:
            _feed(h, y)
    elif hasattr(x, "toarray"):
        _feed(h, x.toarray())
    else:
        h.update(repr(x).encode())


def _last(h, sim):
    L = sim.last
    for f in ("contact_points", "contact_normals", "contact_distances", "contact_impulses",
              "contact_impulses_world", "contact_modes", "contact_geoms", "limit_joints",
              "limit_impulses", "limit_active", "iterations", "residual", "converged", "method",
              "islands"):
        _feed(h, getattr(L, f))


def env_run(env_id, steps, jac, seed=0):
    import gymnasium as gym
    import diffgym  # noqa: F401
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    h = hashlib.sha256()
    obs, _ = env.reset(seed=seed)
    _feed(h, obs)
    u = env.unwrapped
    for i in range(steps):
        a = rng.uniform(-1, 1, env.action_space.shape)
        if jac:
            obs, r, te, tr, info, J = u.step_with_jacobian(a)
            for k in ("state_state", "state_action", "reward_state", "reward_action", "obs_state"):
                _feed(h, getattr(J, k))
        else:
            obs, r, te, tr, info = env.step(a)
        _feed(h, [obs, float(r), te, tr, u.get_state()])
        sim = getattr(u, "sim", None)
        if sim is not None:
            _last(h, sim)
        if te or tr:
            obs, _ = env.reset(seed=seed + i + 1)
            _feed(h, obs)
    return h.hexdigest()


def sim_run(name, steps, jac):
    from diffgym import bench
    sc = bench.scenario(name, bench.asset_path(bench.MODELS[name]))
    sim = sc.sim
    rng = np.random.default_rng(1)
    h = hashlib.sha256()
    q, v = sc.q0.copy(), sc.v0.copy()
    for i in range(steps):
        tau = (sc.control(q, v) if sc.control else np.zeros(sim.nv)) + rng.normal(0, 5, sim.nv)
        out = sim.step(q, v, tau, jacobian=jac)
        q, v = out[0], out[1]
        _feed(h, [q, v])
        if jac:
            j = out[2]
            for k in ("dq_dq", "dq_dv", "dq_dtau", "dv_dq", "dv_dv", "dv_dtau"):
                _feed(h, getattr(j, k))
        _last(h, sim)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    runs = []
    for e in ("DiffHopper-v0", "DiffCartPole-v0", "DiffGo1-v0", "DiffPush-v0", "DiffBilliards-v0"):
        for jac in (False, True):
            runs.append((f"{e} jac={jac}", lambda e=e, jac=jac: env_run(e, args.steps, jac)))
    for name in ("hopper", "go1"):
        for jac in (False, True):
            runs.append((f"sim {name} jac={jac}",
                         lambda n=name, jac=jac: sim_run(n, args.steps, jac)))
    for label, fn in runs:
        if args.only and not any(s in label for s in args.only.split(",")):
            continue
        print(label, fn(), flush=True)


if __name__ == "__main__":
    main()
