"""Which primitive pairs take the collision finite-difference fallback (issue 16).

For every pair of the primitive kinds diffgym loads (sphere, capsule, box, cylinder, ellipsoid,
convex mesh; plane as a support), a free body of one kind dropped onto a static geom of the
other (upright and tilted), settled by stepping, then one step with its Jacobian in three
states: resting, sliding (tangential velocity) and spinning (about the vertical). Prints per
pair and state the contact rows and those that took ``derivatives._collision_fd``.

    python scripts/pair_census.py [--jac-error] [BASE-TOP ...]

``--jac-error``: also the step Jacobian's error against central differences
(``gradcheck.step_jacobian_errors``), per pair and state (slow).
"""
import sys
import tempfile
import time
import warnings

import numpy as np

from diffgym import pair_scenes
from diffgym.sim import derivatives
from diffgym.gradcheck import SIM_BLOCKS, step_differences
from diffgym.sim.derivatives import step_jacobian

warnings.simplefilter("ignore")
KINDS, EULER = pair_scenes.KINDS, pair_scenes.EULER


def scene(base, top, euler, folder):
    return pair_scenes.load(folder, base, top, euler)


def drop(sim, steps=60):
    """Lowered until it touches, then settled by stepping."""
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    for _ in range(30):
        sim.reset_warmstart()
        sim.step(q, v, np.zeros(sim.nv))
        if sim.last.num_contacts:
            break
        q[2] -= 0.01
    for _ in range(steps):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    return q, v


def states(q, v):
    vs = v.copy()
    vs[0:2] += [0.3, 0.15]
    vw = v.copy()
    vw[5] += 3.0                  # spin about the body z (upright: about the vertical)
    return {"resting": v, "sliding": vs, "spinning": vw}


def jacobian_error(sim, q, v, warm, eps=(1e-5, 1e-6)):
    """Largest error of the step Jacobian against central differences over the blocks, each
    relative to the block's largest entry (at least FLOOR: blocks that vanish), the smallest
    over the step sizes; and the largest disagreement of the one-sided differences on the same
    scale (a mode switch inside the stencil shows there)."""
    sim.set_warm_start_state(warm)
    sim.step(q, v, np.zeros(sim.nv))
    jac = step_jacobian(sim)
    best, one = np.inf, 0.0
    for h in eps:
        c, p, m = step_differences(sim, q, v, np.zeros(sim.nv), h, warm=warm)
        worst = 0.0
        for k in SIM_BLOCKS:
            scale = max(float(np.abs(c[k]).max()), FLOOR)
            worst = max(worst, float(np.abs(getattr(jac, k) - c[k]).max()) / scale)
            one = max(one, float(np.abs(p[k] - m[k]).max()) / scale)
        best = min(best, worst)
    return best, one


FLOOR = 1e-6


def main():
    jac_err = "--jac-error" in sys.argv
    folder = tempfile.mkdtemp()
    print(f"{'base':10s} {'top':10s} {'pose':8s} {'state':9s} rows  fd   kinds" +
          ("   jac-err  one-sided modes" if jac_err else ""))
    t0 = time.perf_counter()
    only = [a.split("-") for a in sys.argv[1:] if not a.startswith("--")]
    for base in KINDS + ("plane",):
        for top in KINDS:
            if only and [base, top] not in only:
                continue
            for pose, euler in EULER.items():
                sim = scene(base, top, euler, folder)
                q, v = drop(sim)
                for state, vv in states(q, v).items():
                    before = sum(derivatives.fallback_counts.values())
                    sim.reset_warmstart()
                    warm = sim.warm_start_state()
                    sim.step(q, vv, np.zeros(sim.nv), jacobian=True)
                    fd = sum(derivatives.fallback_counts.values()) - before
                    kinds = sorted({tuple(sorted(k)) for k in sim.last.contact_geoms})
                    line = f"{base:10s} {top:10s} {pose:8s} {state:9s} {sim.last.num_contacts:4d} {fd:4d}"
                    if jac_err and sim.last.num_contacts:
                        err, one = jacobian_error(sim, q, vv, warm)
                        line += f"   {err:.1e}  {one:.1e}  {','.join(sorted(set(sim.last.contact_modes)))}"
                    print(line, flush=True)
    print("fallback rows by kinds", derivatives.fallback_counts)
    from diffgym.sim import collision_derivatives as CD
    print("fallback rows by reason", CD.fallback_reasons)
    print(f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
