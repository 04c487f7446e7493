"""Joint torques that hold the Go1 still on the ground: Gauss-Newton on one step's dv/dtau.

The Unitree Go1 (example-robot-data's URDF, 12 actuated joints, free-floating base) is put in
its SRDF ``standing`` pose, lowered onto its four feet with a PD hold (``--settle`` steps), and
then placed exactly on the ground: the four foot spheres are brought to zero distance by a
minimum-norm Gauss-Newton correction of the pose (so the Baumgarte term ``erp * d / dt``
vanishes and ``v = 0`` is reachable; a foot 2e-8 m into the ground would ask for a
2e-6 m/s correction). From that state, at rest, the script finds joint torques ``u`` (the base
is not actuated: ``tau = [0_6, u]``) such that the velocity after one step is zero,

    r(u) = v_1(q, 0, [0_6, u]) = 0            (18 equations, 12 unknowns)

with :func:`diffgym.inverse.least_squares` on ``J = jac.dv_dtau[:, 6:]`` from
``sim.step(..., jacobian=True)``, starting from ``u = 0`` (the robot would sag).

With four sticking feet the contact impulses absorb every torque pattern that only squeezes
the feet against the ground (internal forces): ``J`` has rank 6, and the solution set is a
6-dimensional affine family. Each Gauss-Newton step is the minimum-norm least-squares step, so
from ``u = 0`` the iteration lands on the minimum-norm holding torques. While the contact modes
stay the same, ``v_1`` is affine in ``u`` (sticking rows are linear), so Gauss-Newton needs one
step plus the iterations needed for round-off. The script then checks the answer: holding ``u``
for ``--hold`` steps must keep the robot still.

Writes ``inverse_go1.csv`` (method, iteration, ||r||, max |r|, step, rank, torques) and
``inverse_go1.png`` (residual against iteration, for Gauss-Newton and Levenberg-Marquardt) to
``--out`` (default ``runs/inverse_go1_standing``). The PNG needs matplotlib (``pip install
diffgym[train]``).

    python scripts/inverse_go1_standing.py          # about 3 s
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np
import pinocchio as pin

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import diffgym  # noqa: E402
from diffgym import inverse  # noqa: E402
from diffgym.resources import asset_path  # noqa: E402

KP, KD = 100.0, 2.0           # PD used only to lower the robot onto its feet
FOOT_CLEARANCE = 0.002        # feet start this far above the ground (m)


def foot_geoms(sim) -> list[int]:
    return [i for i, g in enumerate(sim.sm.geoms) if g.kind == "sphere" and "foot" in g.name]


def foot_heights(sim, q, feet) -> tuple[np.ndarray, np.ndarray]:
    """Signed distances of the foot spheres to the ground z = 0 and their Jacobian (tangent)."""
    model, data = sim.model, sim.data
    pin.forwardKinematics(model, data, q)
    pin.computeJointJacobians(model, data, q)
    pin.updateGeometryPlacements(model, data, sim.geom_model, sim.geom_data)
    d = np.zeros(len(feet))
    D = np.zeros((len(feet), sim.nv))
    for k, g in enumerate(feet):
        p = sim.geom_data.oMg[g].translation
        j = sim.geom_model.geometryObjects[g].parentJoint
        Jj = pin.getJointJacobian(model, data, j, pin.LOCAL_WORLD_ALIGNED)
        r = p - data.oMi[j].translation
        d[k] = p[2] - sim.sm.geoms[g].size[0]
        D[k] = Jj[2] - (np.cross(r, Jj[3:].T).T)[2]          # z row of J_lin - [r]x J_ang
    return d, D


def standing_state(sim, settle: int = 300) -> np.ndarray:
    """The SRDF standing pose lowered onto the feet by a PD hold, then placed exactly on the
    ground (all four foot distances zero to round-off)."""
    q = sim.q0.copy()
    feet = foot_geoms(sim)
    if len(feet) != 4:
        raise RuntimeError(f"expected 4 foot spheres in the Go1 model, found {len(feet)}")
    q[2] += FOOT_CLEARANCE - foot_heights(sim, q, feet)[0].min()
    v = np.zeros(sim.nv)
    q_ref = sim.q0[7:]
    sim.reset_warmstart()
    for _ in range(settle):
        tau = np.zeros(sim.nv)
        tau[6:] = KP * (q_ref - q[7:]) - KD * v[6:]
        q, v = sim.step(q, v, tau)
    for _ in range(10):                                  # touchdown: min-norm pose correction
        d, D = foot_heights(sim, q, feet)
        if np.abs(d).max() < 1e-15:
            break
        q = pin.integrate(sim.model, q, -np.linalg.lstsq(D, d, rcond=None)[0])
    return q


class Standing:
    """r(u) = v1 after one step from (q, 0) with tau = [0_6, u], and dr/du."""

    def __init__(self, settle: int = 300):
        self.sim = diffgym.Simulator.from_file(asset_path("go1.urdf"), ignore_unsupported=("joint.frictionloss",))
        self.q = standing_state(self.sim, settle)
        self.v = np.zeros(self.sim.nv)
        self.nu = self.sim.nv - 6

    def tau(self, u) -> np.ndarray:
        return np.concatenate([np.zeros(6), u])

    def __call__(self, u):
        self.sim.reset_warmstart()
        _, v1, jac = self.sim.step(self.q, self.v, self.tau(u), jacobian=True)
        return v1, jac.dv_dtau[:, 6:]

    def hold(self, u, steps: int) -> tuple[float, float]:
        """Max |v| and base drift (m) while holding tau = [0, u] for ``steps`` steps."""
        sim = self.sim
        sim.reset_warmstart()
        q, v, vmax = self.q, self.v, 0.0
        for _ in range(steps):
            q, v = sim.step(q, v, self.tau(u))
            vmax = max(vmax, float(np.abs(v).max()))
        return vmax, float(np.linalg.norm(pin.difference(sim.model, self.q, q)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settle", type=int, default=300, help="PD steps to lower the robot (default 300)")
    p.add_argument("--tol", type=float, default=1e-8, help="stop at ||v1|| <= tol (m/s, rad/s)")
    p.add_argument("--max-iter", type=int, default=20)
    p.add_argument("--hold", type=int, default=500, help="steps to hold the torques found (check)")
    p.add_argument("--out", default=os.path.join("runs", "inverse_go1_standing"))
    args = p.parse_args(argv)
    if args.settle < 0 or args.hold < 1 or args.tol <= 0:
        p.error("--settle must be >= 0, --hold >= 1 and --tol > 0")
    prob = Standing(args.settle)
    sim = prob.sim
    d, _ = foot_heights(sim, prob.q, foot_geoms(sim))
    r0, J0 = prob(np.zeros(prob.nu))
    print(f"Go1 standing: base height {prob.q[2]:.4f} m, foot distances {np.array2string(d, precision=2)} m, "
          f"{sim.last.num_contacts} contacts {sorted(set(sim.last.contact_modes))}, dt {sim.dt} s")
    print(f"u = 0: ||v1|| = {np.linalg.norm(r0):.3e}; rank of dv1/du = {np.linalg.matrix_rank(J0)} of {prob.nu} "
          f"(the rest is absorbed by the contact impulses)\n")
    results = {}
    for method in inverse.METHODS:
        results[method] = inverse.least_squares(prob, np.zeros(prob.nu), method=method, tol=args.tol,
                                                max_iter=args.max_iter)
    print(f"{'iter':>4}  " + "  ".join(f"{m + ' ||v1||':>28}" for m in results))
    for k in range(max(len(r.residual_norms) for r in results.values())):
        print(f"{k:>4}  " + "  ".join(f"{r.residual_norms[k]:>28.3e}" if k < len(r.residual_norms)
                                      else " " * 28 for r in results.values()))
    ok = True
    for method, res in results.items():
        vmax, drift = prob.hold(res.x, args.hold)
        modes = sorted(set(sim.last.contact_modes))
        ok &= res.converged
        print(f"{method}: {res.message} ({res.seconds * 1e3:.0f} ms, {res.evaluations} steps with "
              f"Jacobian); |u| = {np.linalg.norm(res.x):.4f} N m; holding u for {args.hold} steps: "
              f"max |v| {vmax:.2e}, pose drift {drift:.2e}, modes {modes}")
    u = results["gauss-newton"].x
    print("torques (N m): " + ", ".join(f"{n}={t:.4f}" for n, t in zip(list(sim.model.names)[2:], u)))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "inverse_go1.csv")
    names = list(sim.model.names)[2:]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "iteration", "residual_norm", "residual_max", "step_norm", "rank", *names])
        for method, res in results.items():
            for k, x in enumerate(res.iterates):
                w.writerow([method, k, f"{res.residual_norms[k]:.6e}", f"{res.residual_max[k]:.6e}",
                            f"{res.step_norms[k]:.6e}", res.ranks[k], *[f"{c:.12g}" for c in x]])
    print(f"wrote {path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install diffgym[train]): no PNG written")
        return 0 if ok else 1
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for (method, res), style in zip(results.items(), ("-o", "--s")):
        ax.semilogy(range(len(res.residual_norms)), np.maximum(res.residual_norms, 1e-17), style, ms=4,
                    label=method)
    ax.axhline(args.tol, color="gray", lw=0.8, ls=":", label=f"tol {args.tol:g}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("||v1|| after one step")
    ax.set_title("Go1: holding torques on analytical dv/dtau")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = os.path.join(args.out, "inverse_go1.png")
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
