"""Recover the initial velocity of a thrown cube from its state after N steps (Gauss-Newton / LM).

A 0.2 m cube, tilted so that one of its diagonals is nearly vertical, is thrown from 2 cm
above the floor (its lowest corner) with a linear and an angular velocity; it lands on that
corner and slides on it (friction 0.1) while it starts to tip. Given only the state it reaches
after ``--steps`` steps (default 14 of ``dt = 0.01`` s), the script recovers the
initial velocity ``v0`` (6 numbers: linear, world axes, and angular, body axes; see the README
on free joints) by solving

    r(v0) = [ q_target (-) q_N(v0) ;  v_N(v0) - v_target ] = 0          (12 equations)

with :func:`diffgym.inverse.least_squares` (Gauss-Newton with step halving by default,
``--method levenberg-marquardt`` for the damped variant) twice from the same guess:

* ``analytic``: ``dr/dv0`` chained from the simulator's analytical step Jacobians
  (:func:`diffgym.inverse.rollout_jacobian`, one rollout with ``jacobian=True``);
* ``finite-diff``: ``dr/dv0`` by central differences of the whole rollout, ``--fd-eps``
  (12 extra rollouts per Jacobian).

The target is produced by the hidden ``v_true``; the guess is ``v_true`` plus ``--perturb``
times a fixed unit direction. The rollout is piecewise smooth (one smooth piece per sequence of
contact modes); from 0.3 m/s away the iterates stay on the piece of ``v_true`` and converge
quadratically. (Throws that land on an edge or a face are harder: the inelastic impact wipes
out the roll rate, the smallest singular value of ``dr/dv0`` drops to 1e-3 of the largest and
the iterates drift into other mode sequences.) Prints a table, writes ``inverse_cube.csv`` (per method and
iteration: residual, error to ``v_true``, step, damping, v0) and ``inverse_cube.png`` (both
error curves) to ``--out`` (default ``runs/inverse_cube``). The PNG needs matplotlib (``pip
install diffgym[train]``); without it the CSV is still written.

    python scripts/inverse_cube.py                      # about 3 s
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import diffgym  # noqa: E402
from diffgym import inverse  # noqa: E402

CUBE = """<mujoco><option timestep="{dt}"/><worldbody>
<geom name="floor" type="plane" size="20 20 .1" friction="0.1"/>
<body name="cube" pos="0 0 0.19" euler="45 35.26 0"><freejoint name="cube"/>
<geom name="cube" type="box" size="0.1 0.1 0.1" friction="0.1" density="1000"/></body>
</worldbody></mujoco>"""

V_TRUE = np.array([2.0, 0.2, -0.2, 0.1, 0.0, 0.2])      # linear (world), angular (body)
DIRECTION = np.array([-1.0, 0.6, -0.8, 0.7, 1.0, -0.5]) / np.sqrt(3.74)     # unit


class CubeThrow:
    """The forward map v0 -> (q_N, v_N) and the residual r(v0) with either Jacobian."""

    def __init__(self, steps: int = 14, dt: float = 0.01, v_true=V_TRUE, fd_eps: float = 1e-6):
        self.sim = diffgym.Simulator.from_string(CUBE.format(dt=dt))
        self.q0 = self.sim.q0
        self.taus = np.zeros((steps, self.sim.nv))
        self.v_true = np.asarray(v_true, float)
        self.fd_eps = fd_eps
        self.q_target, self.v_target = inverse.rollout(self.sim, self.q0, self.v_true, self.taus)

    def modes(self, v0) -> list[str]:
        """Contact modes per step (b/t/s letters per contact point), for the record."""
        sim = self.sim
        sim.reset_warmstart()
        q, v, out = self.q0, np.asarray(v0, float), []
        for tau in self.taus:
            q, v = sim.step(q, v, tau)
            out.append("".join({"breaking": "b", "sticking": "t", "sliding": "s"}[m]
                               for m in sim.last.contact_modes))
        return out

    def analytic(self, v0):
        nv = self.sim.nv
        qN, vN, S = inverse.rollout_jacobian(self.sim, self.q0, v0, self.taus)
        r, D = inverse.state_residual(self.sim, qN, vN, self.q_target, self.v_target)
        return r, D @ S[:, nv:]

    def finite_diff(self, v0):
        nv = self.sim.nv
        qN, vN = inverse.rollout(self.sim, self.q0, v0, self.taus)
        r = inverse.state_residual(self.sim, qN, vN, self.q_target, self.v_target)[0]
        J = np.zeros((2 * nv, nv))
        for i in range(nv):
            e = np.zeros(nv)
            e[i] = self.fd_eps
            rp = inverse.state_residual(self.sim, *inverse.rollout(self.sim, self.q0, v0 + e, self.taus),
                                        self.q_target, self.v_target)[0]
            rm = inverse.state_residual(self.sim, *inverse.rollout(self.sim, self.q0, v0 - e, self.taus),
                                        self.q_target, self.v_target)[0]
            J[:, i] = (rp - rm) / (2 * self.fd_eps)
        return r, J


def solve(problem: CubeThrow, v_guess, method: str = "gauss-newton", tol: float = 1e-10,
          max_iter: int = 20) -> dict:
    """Both solvers from the same guess; returns {'analytic': result, 'finite-diff': result}."""
    out = {}
    for name, fun in (("analytic", problem.analytic), ("finite-diff", problem.finite_diff)):
        res = inverse.least_squares(fun, v_guess, method=method, tol=tol, max_iter=max_iter)
        res.errors = [float(np.linalg.norm(x - problem.v_true)) for x in res.iterates]
        out[name] = res
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=14, help="rollout length N (default 14)")
    p.add_argument("--dt", type=float, default=0.01, help="time step (s)")
    p.add_argument("--perturb", type=float, default=0.3, help="|v_guess - v_true| (default 0.3)")
    p.add_argument("--method", choices=inverse.METHODS, default="gauss-newton")
    p.add_argument("--tol", type=float, default=1e-10, help="stop at ||r|| <= tol")
    p.add_argument("--max-iter", type=int, default=20)
    p.add_argument("--fd-eps", type=float, default=1e-6, help="central-difference step")
    p.add_argument("--out", default=os.path.join("runs", "inverse_cube"))
    args = p.parse_args(argv)
    if args.steps < 1 or args.dt <= 0 or args.perturb < 0:
        p.error("--steps must be >= 1, --dt > 0 and --perturb >= 0")
    problem = CubeThrow(args.steps, args.dt, fd_eps=args.fd_eps)
    v_guess = problem.v_true + args.perturb * DIRECTION
    modes = problem.modes(problem.v_true)
    landing = next((k for k, m in enumerate(modes) if m), None)
    print(f"cube thrown with v0 = {np.round(problem.v_true, 3).tolist()}, {args.steps} steps of "
          f"{args.dt} s; first contact at step {landing}; modes per step (b/t/s = breaking/"
          f"sticking/sliding) at v_true:\n  {' '.join(m or '-' for m in modes)}")
    print(f"final state: position {np.round(problem.q_target[:3], 4).tolist()}, "
          f"velocity {np.round(problem.v_target, 4).tolist()}")
    print(f"guess v0 = {np.round(v_guess, 3).tolist()} (|error| {np.linalg.norm(v_guess - problem.v_true):.3g})\n")
    results = solve(problem, v_guess, args.method, args.tol, args.max_iter)
    a, f = results["analytic"], results["finite-diff"]
    print(f"{args.method}: |r| and |v0 - v_true| per iteration")
    print(f"{'iter':>4}  {'|r| analytic':>13}  {'|err| analytic':>14}  {'|r| finite-diff':>15}  {'|err| finite-diff':>17}")
    for k in range(max(len(a.errors), len(f.errors))):
        cells = []
        for res in (a, f):
            cells += ([f"{res.residual_norms[k]:.3e}", f"{res.errors[k]:.3e}"] if k < len(res.errors)
                      else ["", ""])
        print(f"{k:>4}  {cells[0]:>13}  {cells[1]:>14}  {cells[2]:>15}  {cells[3]:>17}")
    for name, res in results.items():
        rollouts = res.evaluations * (1 if name == "analytic" else 1 + 2 * problem.sim.nv)
        print(f"{name:>11}: {res.message}; {res.evaluations} residual+Jacobian evaluations = "
              f"{rollouts} rollouts, {res.seconds:.2f} s; v0 = {np.array2string(res.x, precision=10)}")
    print(f"analytic vs finite-diff solutions differ by {np.linalg.norm(a.x - f.x):.2e}; "
          f"singular values of dr/dv0 at v_true: "
          f"{np.array2string(np.linalg.svd(problem.analytic(problem.v_true)[1], compute_uv=False), precision=3)}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "inverse_cube.csv")
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "iteration", "residual_norm", "error_norm", "step_norm",
                    "step_fraction", "vx", "vy", "vz", "wx", "wy", "wz"])
        for name, res in results.items():
            for k, x in enumerate(res.iterates):
                w.writerow([name, k, f"{res.residual_norms[k]:.6e}", f"{res.errors[k]:.6e}",
                            f"{res.step_norms[k]:.6e}", f"{res.damping[k]:.3g}", *[f"{c:.12g}" for c in x]])
    print(f"wrote {path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install diffgym[train]): no PNG written")
        return 0 if a.converged else 1
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    floor = 1e-16
    for name, res, style in (("analytic Jacobians", a, "-o"), ("finite-difference Jacobians", f, "--s")):
        axes[0].semilogy(range(len(res.errors)), np.maximum(res.errors, floor), style, ms=4, label=name)
        axes[1].semilogy(range(len(res.errors)), np.maximum(res.residual_norms, floor), style, ms=4, label=name)
    axes[0].set_ylabel("|v0 - v_true|")
    axes[1].set_ylabel("|r| (final-state residual)")
    for ax in axes:
        ax.set_xlabel(f"{args.method} iteration")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"thrown cube: initial velocity from the state after {args.steps} steps")
    fig.tight_layout()
    png = os.path.join(args.out, "inverse_cube.png")
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")
    return 0 if a.converged else 1


if __name__ == "__main__":
    sys.exit(main())
