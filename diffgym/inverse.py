"""Inverse problems on step Jacobians: Gauss-Newton / Levenberg-Marquardt and rollout Jacobians.

Two pieces, used by ``scripts/inverse_cube.py``, ``scripts/inverse_go1_standing.py`` and
``tests/test_inverse.py``:

* :func:`least_squares` minimizes ``0.5 ||r(x)||^2`` for a residual ``r`` whose Jacobian comes
  with it (``fun(x) -> (r, J)``). Each iteration solves the linearized problem in the
  **minimum-norm least-squares** sense (``numpy.linalg.lstsq``): when ``J`` has fewer
  independent rows than columns (more unknowns than the residual can see, e.g. joint torques
  whose effect sticking contacts absorb) the step is the smallest one that zeroes the linear
  model, so the iterate moves as little as possible. ``method="gauss-newton"`` takes the full
  step and halves it while ``||r||`` does not decrease; ``method="levenberg-marquardt"``
  solves ``[J; sqrt(mu) I] dx = [-r; 0]`` (``mu`` starts at ``mu0`` times the largest diagonal
  entry of ``J^T J``) and adapts it (divided by 10 after a step that lowers ``||r||``, multiplied by 10
  and the step retried otherwise; on these piecewise-smooth rollouts this simple rule did better
  than Nielsen's gain-ratio update); it keeps steps in weakly observable directions small where Gauss-Newton overshoots. The variable lives on a manifold when ``retract(x, dx)`` is given (default
  ``x + dx``).

* :func:`rollout_jacobian` runs ``len(taus)`` steps from ``(q0, v0)`` and chains the step
  Jacobians in forward mode, returning the final state and ``d(q_N, v_N) / d(q0, v0)`` (tangent
  coordinates); :func:`fd_rollout_jacobian` is the same matrix by central differences of the
  whole rollout (``2 * 2nv`` rollouts), for comparison. Every rollout starts from an empty
  solver warm start, so a rollout is a deterministic function of its inputs.

A hard-contact rollout is piecewise smooth: its Jacobian is the one of the contact-mode
sequence the rollout went through (``diffgym.sim.derivatives``). Gauss-Newton converges
quadratically where the solution lies inside one such piece (for a zero-residual problem,
like the ones here, the Gauss-Newton model is exact to first order).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pinocchio as pin

METHODS = ("gauss-newton", "levenberg-marquardt")


@dataclass
class LeastSquaresResult:
    """Outcome of :func:`least_squares`. Histories have one entry per iterate, x0 first."""

    x: np.ndarray
    converged: bool
    iterations: int
    method: str
    residual_norms: list = field(default_factory=list)     # ||r|| (2-norm) per iterate
    residual_max: list = field(default_factory=list)       # max |r_i| per iterate
    step_norms: list = field(default_factory=list)         # ||dx|| of the accepted step (0 for x0)
    damping: list = field(default_factory=list)            # LM mu / GN step fraction per iterate
    ranks: list = field(default_factory=list)              # numerical rank of J per iterate
    evaluations: int = 0                                   # calls of fun
    seconds: float = 0.0
    message: str = ""
    iterates: list = field(default_factory=list)           # x per iterate (copies)


def least_squares(fun: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], x0, *,
                  method: str = "gauss-newton", tol: float = 1e-8, max_iter: int = 30,
                  retract: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                  mu0: float = 1e-6, max_halvings: int = 40, rcond: float = 1e-12,
                  callback: Callable[[int, np.ndarray, np.ndarray], None] | None = None
                  ) -> LeastSquaresResult:
    """Minimize ``0.5 ||r(x)||^2``; stop when ``||r||_2 <= tol``.

    ``fun(x)`` returns ``(r, J)`` with ``J = dr/dx`` (``(m, n)``, in the coordinates of ``dx``).
    ``callback(k, x, r)`` is called at every accepted iterate (k = 0 for x0).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    if int(max_iter) < 0:
        raise ValueError(f"max_iter must be >= 0, got {max_iter!r}")
    retract = retract or (lambda x, dx: x + dx)
    t0 = time.perf_counter()
    x = np.array(x0, dtype=float, copy=True)
    r, J = fun(x)
    r, J = np.asarray(r, float), np.asarray(J, float)
    if J.ndim != 2 or J.shape[0] != r.shape[0]:
        raise ValueError(f"fun must return r (m,) and J (m, n); got shapes {r.shape} and {J.shape}")
    res = LeastSquaresResult(x=x, converged=False, iterations=0, method=method, evaluations=1)

    def record(x, r, J, step, damp):
        res.residual_norms.append(float(np.linalg.norm(r)))
        res.residual_max.append(float(np.max(np.abs(r))) if r.size else 0.0)
        res.step_norms.append(float(step))
        res.damping.append(float(damp))
        res.ranks.append(int(np.linalg.matrix_rank(J)) if J.size else 0)
        res.iterates.append(x.copy())
        if callback is not None:
            callback(len(res.residual_norms) - 1, x, r)

    # LM damping: mu0 relative to the largest diagonal entry of J^T J unless given absolutely
    mu = float(mu0) * max(1.0, float(np.max(np.sum(J * J, axis=0)))) if J.size else float(mu0)
    record(x, r, J, 0.0, mu if method != "gauss-newton" else 1.0)
    n = J.shape[1]
    for k in range(1, int(max_iter) + 1):
        if res.residual_norms[-1] <= tol:
            break
        cost = res.residual_norms[-1]
        accepted = False
        if method == "gauss-newton":
            dx = -np.linalg.lstsq(J, r, rcond=rcond)[0]
            frac = 1.0
            for _ in range(max_halvings + 1):
                x_new = retract(x, frac * dx)
                r_new, J_new = fun(x_new)
                res.evaluations += 1
                if np.all(np.isfinite(r_new)) and np.linalg.norm(r_new) < cost:
                    accepted = True
                    break
                frac *= 0.5
            step, damp = frac * np.linalg.norm(dx), frac
        else:
            for _ in range(max_halvings + 1):
                A = np.vstack([J, np.sqrt(mu) * np.eye(n)])
                b = np.concatenate([-r, np.zeros(n)])
                dx = np.linalg.lstsq(A, b, rcond=rcond)[0]
                x_new = retract(x, dx)
                r_new, J_new = fun(x_new)
                res.evaluations += 1
                if np.all(np.isfinite(r_new)) and np.linalg.norm(r_new) < cost:
                    accepted = True
                    damp = mu
                    mu = max(mu / 10.0, 1e-15)
                    break
                mu *= 10.0
            step = np.linalg.norm(dx)
        if not accepted:
            res.message = (f"no decrease of ||r|| = {cost:.3e} along the step at iteration {k} "
                           "(a contact-mode boundary, or the residual is at its floor)")
            break
        x, r, J = x_new, np.asarray(r_new, float), np.asarray(J_new, float)
        res.iterations = k
        record(x, r, J, step, damp)
    res.x = x
    res.converged = res.residual_norms[-1] <= tol
    if res.converged:
        res.message = f"||r|| = {res.residual_norms[-1]:.3e} <= {tol:g} after {res.iterations} iterations"
    elif not res.message:
        res.message = f"||r|| = {res.residual_norms[-1]:.3e} > {tol:g} after {res.iterations} iterations"
    res.seconds = time.perf_counter() - t0
    return res


# -- rollouts -----------------------------------------------------------------------------------
def _taus(sim, taus) -> np.ndarray:
    taus = np.asarray(taus, dtype=float)
    if taus.ndim != 2 or taus.shape[1] != sim.nv:
        raise ValueError(f"taus must have shape (T, nv={sim.nv}), got {taus.shape}")
    return taus


def rollout(sim, q0, v0, taus) -> tuple[np.ndarray, np.ndarray]:
    """Final (q_N, v_N) of ``len(taus)`` steps from (q0, v0), from an empty warm start."""
    sim.reset_warmstart()
    q, v = np.asarray(q0, float), np.asarray(v0, float)
    for tau in _taus(sim, taus):
        q, v = sim.step(q, v, tau)
    return q, v


def rollout_jacobian(sim, q0, v0, taus) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Final (q_N, v_N) and ``d(q_N, v_N)/d(q0, v0)`` ((2nv, 2nv), tangent coordinates),
    chained from the analytical step Jacobians."""
    sim.reset_warmstart()
    q, v = np.asarray(q0, float), np.asarray(v0, float)
    S = np.eye(2 * sim.nv)
    for tau in _taus(sim, taus):
        q, v, jac = sim.step(q, v, tau, jacobian=True)
        S = jac.state @ S
    return q, v, S


def fd_rollout_jacobian(sim, q0, v0, taus, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same as :func:`rollout_jacobian` by central differences of the whole rollout
    (tangent perturbations of q0, ``2 * 2nv`` rollouts, step ``eps``)."""
    nv, model = sim.nv, sim.model
    q0, v0 = np.asarray(q0, float), np.asarray(v0, float)
    taus = _taus(sim, taus)
    qN, vN = rollout(sim, q0, v0, taus)
    S = np.zeros((2 * nv, 2 * nv))
    for i in range(2 * nv):
        outs = []
        for sgn in (1.0, -1.0):
            e = np.zeros(nv)
            e[i % nv] = sgn * eps
            if i < nv:
                outs.append(rollout(sim, pin.integrate(model, q0, e), v0, taus))
            else:
                outs.append(rollout(sim, q0, v0 + e, taus))
        (qa, va), (qb, vb) = outs
        S[:nv, i] = pin.difference(model, qb, qa) / (2 * eps)
        S[nv:, i] = (va - vb) / (2 * eps)
    return qN, vN, S


def state_residual(sim, q, v, q_target, v_target) -> tuple[np.ndarray, np.ndarray]:
    """``r = [q_target (-) q ; v - v_target]`` (2nv) and ``dr/d(q, v)`` in tangent coordinates."""
    model = sim.model
    r = np.concatenate([pin.difference(model, q_target, q), v - v_target])
    D = np.eye(2 * sim.nv)
    D[:sim.nv, :sim.nv] = pin.dDifference(model, q_target, q, pin.ArgumentPosition.ARG1)
    return r, D
