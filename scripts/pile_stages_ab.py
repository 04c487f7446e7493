"""Issue 16, pushed box piles: which solver stage solves each step, and the forward step's CPU
time, on the box piles of tests/test_pile_stages.py (``bench_scaling.boxes_mjcf``), pushed by
random forces (the rollout of tests/test_deriv_islands.py) and at rest.

    python scripts/pile_stages_ab.py [--steps 60] [--scenes 4p 16p 4r 16r] [--json out.json]

Per scene: steps per method (``sim.last.method``), unconverged steps, mean iterations a step,
and the CPU time (``time.process_time``) of the rollout's steps (the first step, which may
compile, is excluded from the time). For A/B runs of two code versions run it alternately in
separate processes under the same load and compare CPU times."""
import argparse
import collections
import json
import time
import warnings

import numpy as np

import diffgym
from diffgym.bench_scaling import boxes_mjcf


def run(n_boxes, steps, push, seed=1, budget=None, rounds=None):
    sim = diffgym.Simulator.from_string(boxes_mjcf(n_boxes))
    if budget:
        sim.solver.settings.newton_budget = budget
    if rounds:
        sim.solver.settings.mode_rounds = rounds
    rng = np.random.default_rng(seed)
    q = sim.q0
    v = 0.05 * rng.normal(size=sim.nv) if push else np.zeros(sim.nv)
    methods = collections.Counter()
    unconv = 0
    its = 0
    cpu = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(steps):
            tau = 0.3 * rng.normal(size=sim.nv) if push else np.zeros(sim.nv)
            t0 = time.process_time()
            q, v = sim.step(q, v, tau)
            t1 = time.process_time()
            if k:
                cpu += t1 - t0
            methods[sim.last.method] += 1
            unconv += not bool(sim.last.converged)
            its += sim.last.iterations
    return dict(methods=dict(methods), unconverged=unconv, its_per_step=its / steps,
                cpu_ms_per_step=1e3 * cpu / max(steps - 1, 1), vmax=float(np.abs(v).max()))


SCENES = {"3p": (3, True), "4p": (4, True), "16p": (16, True), "64p": (64, True),
          "3r": (3, False), "4r": (4, False), "16r": (16, False)}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--scenes", nargs="+", default=["4p", "16p", "4r", "16r"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--budget", type=int, help="SolverSettings.newton_budget (default: as set)")
    ap.add_argument("--rounds", type=int, help="SolverSettings.mode_rounds (default: as set)")
    a = ap.parse_args()
    out = {}
    for s in a.scenes:
        n, push = SCENES[s]
        r = run(n, a.steps, push, a.seed, a.budget, a.rounds)
        out[s] = r
        print(f"{s:>4}: {r['methods']} unconverged {r['unconverged']} its/step "
              f"{r['its_per_step']:.0f} cpu {r['cpu_ms_per_step']:.2f} ms/step", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
