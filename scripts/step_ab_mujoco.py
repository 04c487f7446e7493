"""Two diffgym source trees and MuJoCo side by side, alternating block by block in one run:
the forward step of ``diffgym bench``'s hopper and Go1 scenarios against ``mj_step`` on the same
file and state, the step with ``jacobian=True`` against MuJoCo's centered ``mjd_transitionFD``
(plus one ``mj_step`` per state; Euler where the file asks for RK4, as ``diffgym bench`` does),
and environment steps of DiffHopper-v0 against Gymnasium's Hopper-v5 (and DiffGo1-v0).

    python scripts/step_ab_mujoco.py OLD_TREE NEW_TREE [--blocks 21] [--only "hopper sim,go1 sim"]

A tree is a directory holding ``diffgym/`` with ``diffgym/envs``, ``diffgym/assets`` and
``diffgym/configs`` inside it (as installed: for a ``git archive`` export, symlink ``envs``,
``assets`` and ``configs`` into its ``diffgym/``). Each tree runs in its own worker process
(MuJoCo in the OLD tree's); the table gives medians over the blocks and ratios.
``--cpu`` times each block in CPU time of its worker (``time.process_time``) instead of wall
time: on a loaded machine a worker that waits for a core is not charged for the wait.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

WORKER = r'''
import os, sys, time, warnings
import numpy as np
clock = time.process_time if os.environ.get("STEP_AB_CPU") == "1" else time.perf_counter
warnings.simplefilter("ignore")
from diffgym import bench
sims, mjs, envs = {}, {}, {}

def scenario(name):
    if name not in sims:
        sims[name] = bench.scenario(name, bench.asset_path(bench.MODELS[name]))
    return sims[name]

def run(sc, n, warm, jacobian=False):
    sim, ctrl, z = sc.sim, sc.control, np.zeros(sc.sim.nv)
    sim.reset_warmstart()
    q, v = sc.q0.copy(), sc.v0.copy()
    for _ in range(warm):
        q, v = sim.step(q, v, ctrl(q, v) if ctrl else z)
    t = clock()
    for _ in range(n):
        out = sim.step(q, v, ctrl(q, v) if ctrl else z, jacobian=jacobian)
        q, v = out[0], out[1]
    return (clock() - t) / n

def sim_block(name, n):
    return run(scenario(name), n, 20)

def jac_block(name, n):
    return run(scenario(name), n, 200, jacobian=True)

def mujoco_for(name, euler=False):
    import mujoco
    key = (name, euler)
    if key not in mjs:
        sc = scenario(name)
        m, _ = bench.mujoco_model(mujoco, sc)
        if euler and m.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4:
            m.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
        mjs[key] = (m, mujoco.MjData(m)) + tuple(bench.mujoco_state(mujoco, m, sc))
    return mujoco, mjs[key]

def mj_block(name, n):
    mujoco, (m, d, qpos, qvel, ctrl) = mujoco_for(name)
    mujoco.mj_resetData(m, d)
    d.qpos[:], d.qvel[:], d.ctrl[:] = qpos, qvel, ctrl
    for _ in range(20):
        mujoco.mj_step(m, d)
    t = clock()
    for _ in range(n):
        mujoco.mj_step(m, d)
    return (clock() - t) / n

def mjd_block(name, n):
    mujoco, (m, d, qpos, qvel, ctrl) = mujoco_for(name, euler=True)
    nx = 2 * m.nv + m.na
    A, B = np.zeros((nx, nx)), np.zeros((nx, m.nu))
    mujoco.mj_resetData(m, d)
    d.qpos[:], d.qvel[:], d.ctrl[:] = qpos, qvel, ctrl
    for _ in range(200):
        mujoco.mj_step(m, d)
    t = clock()
    for _ in range(n):
        mujoco.mjd_transitionFD(m, d, 1e-6, True, A, B, None, None)
        mujoco.mj_step(m, d)
    return (clock() - t) / n

def env_block(env_id, n):
    import gymnasium as gym
    if env_id not in envs:
        if env_id.startswith("Diff"):
            import diffgym  # noqa: F401  (registers the environments)
        env = gym.make(env_id)
        acts = np.random.default_rng(0).uniform(-1, 1, (n,) + env.action_space.shape)
        env.reset(seed=0)
        for i in range(20):
            env.step(acts[i])
        envs[env_id] = (env, acts)
    env, acts = envs[env_id]
    env.reset(seed=0)
    t = clock()
    for i in range(n):
        _, _, te, tr, _ = env.step(acts[i % len(acts)])
        if te or tr:
            env.reset(seed=0)
    return (clock() - t) / n

KINDS = {"sim": sim_block, "jac": jac_block, "mj": mj_block, "mjd": mjd_block, "env": env_block}
print("ready", flush=True)
for line in sys.stdin:
    kind, name, n = line.split()
    print(KINDS[kind](name, int(n)), flush=True)
'''

# (label, command for both trees, MuJoCo's command or None)
ROWS = [("hopper sim", "sim hopper 300", "mj hopper 1000"),
        ("go1 sim", "sim go1 300", "mj go1 1000"),
        ("DiffHopper env", "env DiffHopper-v0 100", "env Hopper-v5 300"),
        ("DiffGo1 env", "env DiffGo1-v0 60", None),
        ("hopper jac", "jac hopper 100", "mjd hopper 100"),
        ("go1 jac", "jac go1 100", "mjd go1 100")]


def worker(tree: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), DIFFGYM_QUIET_COMPILE="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd="/")
    if p.stdout.readline().strip() != "ready":
        raise SystemExit(f"{tree}: worker failed")
    return p


def ask(p: subprocess.Popen, cmd: str) -> float:
    p.stdin.write(cmd + "\n")
    p.stdin.flush()
    return float(p.stdout.readline())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--blocks", type=int, default=21)
    ap.add_argument("--only", default="", help="comma-separated row labels")
    ap.add_argument("--cpu", action="store_true", help="CPU time per block, not wall time")
    args = ap.parse_args()
    rows = [r for r in ROWS if not args.only or r[0] in args.only.split(",")]
    if args.cpu:
        os.environ["STEP_AB_CPU"] = "1"
    ws = {"old": worker(args.old), "new": worker(args.new)}
    print(f"median of {args.blocks} alternating blocks; {'CPU' if args.cpu else 'wall'} times in us per step "
          "(MuJoCo: mj_step, mjd_transitionFD + mj_step, Hopper-v5 env step)")
    for label, cmd, mjcmd in rows:
        t = {"old": [], "new": [], "mj": []}
        for blk in range(args.blocks):
            for k in (("old", "new") if blk % 2 == 0 else ("new", "old")):
                t[k].append(ask(ws[k], cmd))
            if mjcmd:
                t["mj"].append(ask(ws["old"], mjcmd))
        med = {k: statistics.median(v) * 1e6 for k, v in t.items() if v}
        line = (f"{label:15s} old {med['old']:8.1f}  new {med['new']:8.1f}  "
                f"new/old {med['new'] / med['old']:.3f}")
        if "mj" in med:
            line += (f"  MuJoCo {med['mj']:8.1f}  old/MuJoCo {med['old'] / med['mj']:.2f}x  "
                     f"new/MuJoCo {med['new'] / med['mj']:.2f}x")
        print(line, flush=True)
    for p in ws.values():
        p.stdin.close()
        p.wait()


if __name__ == "__main__":
    main()
