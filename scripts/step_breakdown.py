"""Where a small robot's forward step spends its time (issue 14): the whole ``Simulator.step``
against its two compiled calls (``forward._constrained_step`` and the collision pass's
``detect_closed_form``), the numba crossing of each (an empty compiled function taking the same
arguments, alone and returning three arrays: argument typing/unboxing, and what boxing returned
arrays adds), the pinocchio calls of the step, and the rest (the Python body and wrappers).

    python scripts/step_breakdown.py [hopper go1 ...] [--steps 300] [--reps 10]

Each part replays the arguments recorded over ``--steps`` steps of ``diffgym bench``'s scenario
(after 20 untimed ones), best of ``--reps`` passes, CPU time (``time.process_time``: less
sensitive than wall-clock to other load on a shared machine), microseconds per step. A part a
step does not take (no contact: no constrained call) counts as zero for that step.

Since the fused step (``Simulator._fast_step``, session 12) a small robot's plain step is one
compiled call; the spies this script installs on ``_constrained_step`` and
``detect_closed_form`` send the step to the separate calls, so the table breaks down that path
(which Jacobian steps, narrow-phase pairs and robots with joint friction still take), not the
fused one. For the fused step compare the whole step with and without it (``sim._fused =
False`` turns it off for one simulator, as ``tests/test_fast_paths.py`` does).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))


def breakdown(name: str, steps: int, reps: int) -> dict[str, float]:
    import numba
    import pinocchio as pin

    import diffgym.sim.collision_driver as cd
    import diffgym.sim.forward as fw
    from diffgym.bench import MODELS, scenario
    from diffgym.resources import asset_path

    sc = scenario(name, asset_path(MODELS[name]), name != "go1")   # (Go1: no joint friction)
    sim, ctrl, zero = sc.sim, sc.control, np.zeros(sc.sim.nv)
    rec = {"cs": [], "d": [], "step": []}
    oc, od = fw._constrained_step, cd.detect_closed_form

    def spy_cs(*a):
        rec["cs"].append(a)
        return oc(*a)

    def spy_d(*a):
        rec["d"].append(a)
        return od(*a)
    q, v = sc.q0.copy(), sc.v0.copy()
    fw._constrained_step, cd.detect_closed_form = spy_cs, spy_d
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(20):
                q, v = sim.step(q, v, ctrl(q, v) if ctrl else zero)
            for k in rec:
                rec[k].clear()
            for _ in range(steps):
                tau = ctrl(q, v) if ctrl else zero
                rec["step"].append((q, v, tau))
                q, v = sim.step(q, v, tau)
    finally:
        fw._constrained_step, cd.detect_closed_form = oc, od

    @numba.njit
    def empty(*a):
        return 0

    @numba.njit
    def empty3(*a):
        return 0, np.empty(3), np.empty(3), np.empty(3)

    def per_step(f, calls):
        if not calls:
            return 0.0
        for a in calls:
            f(*a)
        best = float("inf")
        for _ in range(reps):
            t0 = time.process_time()
            for a in calls:
                f(*a)
            best = min(best, time.process_time() - t0)
        return best / steps * 1e6

    model, data, gm, gd, dt = sim.model, sim.data, sim.geom_model, sim.geom_data, sim.dt
    nv = model.nv

    def pinocchio_calls(q, v, tau):
        pin.forwardKinematics(model, data, q, v)
        pin.updateGeometryPlacements(model, data, gm, gd)
        pin.computeJointJacobians(model, data)
        data.J.reshape(6, nv).copy()
        pin.aba(model, data, q, v, tau)
        pin.computeMinverse(model, data, q)
        pin.integrate(model, q, dt * v)

    def whole(q, v, tau):
        sim.step(q, v, tau)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = {"step": per_step(whole, rec["step"])}
    out["constrained"] = per_step(oc, rec["cs"])
    out["constrained crossing"] = per_step(empty, rec["cs"])
    out["constrained crossing +3 arrays"] = per_step(empty3, rec["cs"])
    out["detect kernel"] = per_step(od, rec["d"])
    out["detect crossing"] = per_step(empty, rec["d"])
    out["detect crossing +3 arrays"] = per_step(empty3, rec["d"])
    out["pinocchio"] = per_step(pinocchio_calls, rec["step"])
    out["python"] = out["step"] - out["constrained"] - out["detect kernel"] - out["pinocchio"]
    out["constrained calls"] = len(rec["cs"])
    out["args"] = (len(rec["cs"][0]) if rec["cs"] else 0, len(rec["d"][0]) if rec["d"] else 0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["hopper", "go1"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    for name in args.models:
        r = breakdown(name, args.steps, args.reps)
        s = r["step"]
        print(f"{name}: {s:.1f} us CPU per step ({r['constrained calls']}/{args.steps} steps "
              f"with a constrained call)")
        for label, key in (("compiled constrained step", "constrained"),
                           (f"  of which the crossing ({r['args'][0]} args, empty function)",
                            "constrained crossing"),
                           ("compiled collision (detect_closed_form)", "detect kernel"),
                           (f"  of which the crossing ({r['args'][1]} args, empty function)",
                            "detect crossing"),
                           ("pinocchio calls", "pinocchio"),
                           ("Python body and wrappers (the rest)", "python")):
            print(f"  {label:<52}{r[key]:7.1f} us {100 * r[key] / s:5.1f}%")
        print(f"  (an empty compiled function returning 3 arrays instead of an int: +"
              f"{(r['detect crossing +3 arrays'] - r['detect crossing']) / 3:.2f} us per returned "
              "array)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
