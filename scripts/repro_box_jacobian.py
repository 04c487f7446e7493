"""Reproduce the dq/dv (41, 42) disagreement on an 8-box pile (seed 4, first state) and show why.

Scene: ``bench_scaling.boxes_mjcf(8)`` (two columns of four 10 cm boxes). State: as
tests/test_deriv_islands.py builds rollouts, ``rng = default_rng(4)``, forces ``0.5 N(0, 1)``
(8, nv), start ``(q0, 0.05 N(0, 1) nv)``, cold warm start; the first step.

dof 41 = box b6's angular z (free-flyer v: linear then angular, local frame), dof 42 = box
b7's linear x. Column 2 is b4 (on the floor) / b5 / b6 / b7. Prints: the analytic entry, central
and one-sided differences at h = 1e-7..1e-4 (fixed warm start), the contacts of b4..b7 (mode,
distance, impulse), the solver stage, then the evidence that the step's velocity is not unique
at this state: the mode system's null directions that move the velocity, which contacts they
load, and the step and its differences from other warm starts (other members of the family).

Run: ``python scripts/repro_box_jacobian.py`` (a few seconds once kernels are compiled).
"""
import warnings

import numpy as np
import pinocchio as pin

import diffgym
from diffgym.bench_scaling import boxes_mjcf
from diffgym.gradcheck import _sim_signature, velocity_indeterminacy
from diffgym.sim import derivatives as D

warnings.simplefilter("ignore")
I, J = 41, 42


def main():
    rng = np.random.default_rng(4)
    sim = diffgym.Simulator.from_string(boxes_mjcf(8))
    acts = 0.5 * rng.normal(size=(8, sim.nv))
    q, v = sim.q0.copy(), 0.05 * rng.normal(size=sim.nv)
    tau = acts[0]
    sim.reset_warmstart()
    warm = sim.warm_start_state()            # cold (None)

    def step(vv, w):
        sim.set_warm_start_state(w)
        return sim.step(q, vv, tau)

    q1, v1, jac = (lambda r: r)(sim.step(q, v, tau, jacobian=True))
    base = _sim_signature(sim)
    L = sim.last
    print(f"nv {sim.nv}; dof {I} = b6 angular z, dof {J} = b7 linear x")
    print(f"analytic dq_dv[{I},{J}] = {jac.dq_dv[I, J]:.9g}   dv_dv = {jac.dv_dv[I, J]:.9g}")
    print(f"solver: {L.method}, {L.iterations} iterations, residual {L.residual:.1e}, "
          f"converged {L.converged}; restitution {sim.cache['cons'].restitution}; "
          f"diagnostics {jac.diagnostics}; realizable_bias retry "
          f"{getattr(getattr(sim.solver, 'settings', None), 'realizable_bias', '?')}; impact "
          f"times {sim.cache.get('impact_times')}")

    def diffs(w):
        out = []
        for h in (1e-7, 1e-6, 1e-5, 1e-4):
            e = np.zeros(sim.nv)
            e[J] = h
            qp, _ = step(v + e, w)
            sp = _sim_signature(sim)
            qm, _ = step(v - e, w)
            sm = _sim_signature(sim)
            q0w, _ = step(v, w)
            p, m = pin.difference(sim.model, q0w, qp)[I], pin.difference(sim.model, q0w, qm)[I]
            out.append((h, (p - m) / (2 * h), p / h, -m / h, sp == base, sm == base))
        return out

    print("\n(modes same: the perturbed step has the same contact pairs, point counts and modes)")
    print("h        central        forward        backward       modes+ same  modes- same")
    for h, c, f, b, sp, sm in diffs(warm):
        print(f"{h:<8g} {c:<14.9g} {f:<14.9g} {b:<14.9g} {sp!s:<12} {sm}")
        if h == 1e-6:
            print(f"         rel. error of analytic vs central: "
                  f"{abs(jac.dq_dv[I, J] - c) / abs(c):.2e}")

    step(v, warm)                            # back at the audited step
    print("\ncontacts of column 2 (b4..b7); skin", sim.constraints.skin)
    for k, ((g1, g2), m, d) in enumerate(zip(L.contact_geoms, L.contact_modes,
                                             L.contact_distances)):
        if {g1, g2} & {"g4", "g5", "g6", "g7"}:
            print(f"  {k:2d} {g1}/{g2} {m:9s} d={d:+.1e} lam={np.round(L.contact_impulses[k], 5)}")
    print("v1 b4..b7 (vx vy vz wx wy wz):")
    for b in range(4, 8):
        print("  ", np.round(v1[6 * b:6 * b + 6], 6))

    # the family of solutions: null directions of the mode system that move the velocity
    C = sim.cache
    cons, res, G = C["cons"], C["res"], C["G"]
    print("\nvelocity_indeterminacy:", velocity_indeterminacy(sim) or "(determinate)")
    A, _ = D._mode_system(res, G, cons.nc, cons.mu)
    rn = np.sqrt(np.einsum("ij,ij->i", A, A))
    A = A / np.where(rn > 0, rn, 1.0)[:, None]
    _, s, Vt = np.linalg.svd(A)
    N = Vt[s <= 1e-10 * s[0]]
    # the direction of the null space that moves b6's spin (dof I) most
    MJ = C["Minv"] @ cons.J.T
    w = (MJ @ N.T)[I]
    z = N.T @ (w / np.linalg.norm(w))
    z /= np.abs(z).max()
    dv = MJ @ z
    print(f"{len(N)} null directions; the one moving dof {I} most "
          f"(|G z| / |G| = {np.abs(G @ z).max() / np.abs(G).max():.1e}) loads contacts:")
    for k in range(cons.nc):
        zk = z[3 * k:3 * k + 3]
        if np.abs(zk).max() > 1e-3:
            g1, g2 = L.contact_geoms[k]
            print(f"  {k:2d} {g1}/{g2} {L.contact_modes[k]:9s} (t1, t2, n) {np.round(zk, 4)}")
    print(f"  its velocity change M^-1 J^T z (unit max |z|): dof {I} {dv[I]:+.3e}, "
          f"b5..b7 wz {np.round(dv[[35, 41, 47]], 4)}, b4 wz {dv[29]:+.1e}")

    # other members of the family: the same step from other warm starts
    print("\nthe same step from other warm starts (hidden solver state):")
    e = np.zeros(sim.nv)
    e[J] = 1e-3
    others = {"cold": warm}
    step(v, warm)
    others["its own solution"] = sim.warm_start_state()
    step(v + 50 * e, warm)
    others["step at v + 0.05 e42"] = sim.warm_start_state()
    step(v - 50 * e, warm)
    others["step at v - 0.05 e42"] = sim.warm_start_state()
    for name, w in others.items():
        qa, va = step(v, w)
        conv = sim.last.converged
        modes = [m for (g1, g2), m in zip(sim.last.contact_geoms, sim.last.contact_modes)
                 if {g1, g2} & {"g4", "g5", "g6", "g7"}]
        same = modes == [m for (g1, g2), m in zip(L.contact_geoms, L.contact_modes)
                         if {g1, g2} & {"g4", "g5", "g6", "g7"}]
        lam = sim.last.contact_impulses[20:24, 2]
        c = [d[1] for d in diffs(w)]
        print(f"  {name:22s}: v1[{I}] = {va[I]:.9f} (cold: {v1[I]:.9f}), converged {conv}, "
              f"column-2 modes as cold {same}, g4/g5 normal impulses {np.round(lam, 5)};\n"
              f"      central dq[{I}]/dv[{J}] at h = 1e-7..1e-4: " + " ".join(f"{x:.9f}" for x in c))


if __name__ == "__main__":
    main()
