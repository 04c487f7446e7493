"""The smooth gradient mode (``gradient_modes.Smooth``): the contact problem relaxed at
complementarity level ``rho``.

The forward step stays the exact one. Its derivative is taken instead on the relaxed contact
problem (the interior-point central path of the single-level / Dojo papers, ``a o b = rho e``),
whose solution map is smooth: impacts, breaking and separated contacts within the contact margin
(they get a small impulse ``rho / sigma_N``), friction (stick/slip) and joint limits all
contribute derivatives that vary continuously with the state.

The relaxed problem, in the scaled impulses ``l = d * lam`` (``d`` the Delassus diagonal of the
contact's normal row, or of the limit row: the solver's own scaling, so that ``rho`` is in
(m/s)^2 whatever the masses and time step; ``d`` is evaluated at the step's state and held
fixed in the derivative, i.e. the relaxation level of each row is a constant of the step), with ``sigma = G lam + g``:

- each contact: ``l_N sigma_N = rho`` (Signorini) and, for ``mu > 0``, the second-order-cone
  complementarity ``(mu l_N, l_T) o (eta, sigma_T) = rho e`` (Jordan product
  ``x o y = (x . y, x0 y1 + y0 x1)``, both in the Lorentz cone), ``eta`` an auxiliary variable
  (at ``rho = 0``, ``eta = |sigma_T|``: the maximum-dissipation form of Coulomb's law, which
  selects the same solutions as the De Saxce NCP the forward step solves); a frictionless contact
  has ``l_T = 0``;
- each joint-limit row: ``l sigma = rho``.

:func:`relaxed_solve` reaches that point from the exact solution (centered starting point built
from the exact impulses, velocities and contact modes; damped Newton steps that stay in the
interior; a continuation in rho if they stall). ``derivatives.step_jacobian`` then linearizes
the relaxed conditions there (``derivative_kernels.relaxed_system``: the alternative to the exact
mode system) and chains it, through the same stages as the exact mode (ABA derivatives with the
relaxed impulses as external forces, the motion of the contact frames, dIntegrate at the relaxed
velocity), so the result is the Jacobian of the relaxed step map at the current state; as
``rho -> 0`` it tends to the exact Jacobian wherever the exact mode is not degenerate.

Contact normals are those of the collision geometry (no smoothing of sharp shapes' normals).
The Newton steps are a compiled kernel (``smoothing_kernels.relaxed_newton``: the linear rows
eliminated, an ``m + n_friction`` system per step); the linearized system
(``derivative_kernels.relaxed_system``) and the chain are compiled kernels as in the exact route.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .smoothing_kernels import relaxed_newton, relaxed_start
from .solver import BREAKING, STICKING


@dataclass
class RelaxedSolution:
    lam: np.ndarray         # (m,) impulses of the relaxed problem (unscaled, solver order)
    sigma: np.ndarray       # (m,) constraint velocities G lam + g
    eta: np.ndarray         # (nc,) auxiliary cone variable per contact (0 when frictionless)
    scale: np.ndarray       # (m,) row scaling d (l = d lam)
    iterations: int
    residual: float         # largest relaxed-complementarity residual / rho
    converged: bool


def row_scale(G: np.ndarray, nc: int) -> np.ndarray:
    """Per row: the Delassus diagonal of the contact's normal row (all three rows of a contact)
    or of the limit row."""
    diag = np.diag(G).copy()
    d = diag.copy()
    if nc:
        d[:3 * nc] = np.repeat(diag[2:3 * nc:3], 3)
    bad = ~(d > 1e-300)
    if bad.any():
        d[bad] = 1.0
    return d


class _Problem:
    """The relaxed problem's data in the scaled unknowns z = (l, s, eta) and its starting
    points (the Newton steps: ``smoothing_kernels.relaxed_newton``)."""

    def __init__(self, G, g, nc, mu, rho, scale=None):
        self.m = m = G.shape[0]
        self.nc = nc
        self.mu = np.ascontiguousarray(mu, dtype=float) if nc else np.zeros(0)
        self.d = row_scale(G, nc) if scale is None else np.asarray(scale, dtype=float)
        self.Gs = np.ascontiguousarray(G / self.d)     # s = Gs l + g (columns scaled)
        self.g = np.ascontiguousarray(g, dtype=float)
        self.rho = rho
        fr = self.mu > 0.0
        self.fric = np.flatnonzero(fr)
        self.nf = len(self.fric)
        self.eta_of = np.where(fr, np.cumsum(fr) - 1, -1).astype(np.int64)
        self.N = slice(2, 3 * nc, 3)
        self.L = slice(3 * nc, m)

    def split(self, z):
        m = self.m
        return z[:m], z[m:2 * m], z[2 * m:]

    def start(self, lam, sigma, modes, rho):
        """A centred interior point near the exact solution (``smoothing_kernels.relaxed_start``)."""
        modes = np.asarray(modes)
        return relaxed_start(self.d * lam, np.ascontiguousarray(sigma, dtype=float),
                             modes == BREAKING, modes == STICKING, self.nc, self.mu,
                             self.eta_of, self.nf, float(rho))

    def cold_start(self):
        m = self.m
        l = np.zeros(m)
        s = np.zeros(m)
        l[self.N] = 1.0
        s[self.N] = 1.0
        l[self.L] = 1.0
        s[self.L] = 1.0
        return np.concatenate([l, s, np.ones(self.nf) * 1.0])


def _newton(P: _Problem, z, rho, max_iter, tol):
    """Damped Newton on the relaxed conditions at level rho from the interior point z
    (``smoothing_kernels.relaxed_newton``)."""
    z, e, it = relaxed_newton(P.Gs, P.g, P.nc, P.mu, P.eta_of, P.nf, float(rho), z, float(tol),
                              int(max_iter))
    return z, float(e), int(it)


def relaxed_solve(G, g, nc, mu, rho, lam=None, sigma=None, modes=None, cold: bool = False,
                  scale=None, tol: float = 1e-10, max_iter: int = 60) -> RelaxedSolution:
    """The relaxed problem's solution at level ``rho``: from the exact solution (``lam``,
    ``sigma``, ``modes``), or from a fixed interior point by a continuation in rho (``cold``:
    the test oracle's route, which does not see the exact solution).

    ``scale``: the row scaling (default ``row_scale(G, nc)``). The smooth Jacobian holds it
    fixed at the step's state (a choice of units for rho, not part of the dynamics), so a
    finite-difference oracle of the relaxed step map passes the unperturbed state's scale."""
    P = _Problem(G, g, nc, mu, rho, scale)
    its = 0
    if not cold:
        z, e, its = _newton(P, P.start(lam, sigma, modes, rho), rho, max_iter, tol)
    if cold or e > tol:
        # continuation: rho_k from a large level down to rho, each from the previous solution
        z = P.cold_start() if cold else P.start(lam, sigma, modes, max(rho, 1.0))
        levels = np.geomspace(max(1.0, rho), rho, 13 + max(0, int(np.log10(max(1.0, rho) / rho))))
        for rk in levels:
            z, e, k = _newton(P, z, rk, max_iter, tol if rk == rho else 1e-3)
            its += k
    l, s, eta_f = P.split(z)
    eta = np.zeros(nc)
    if P.nf:
        eta[P.fric] = eta_f
    lam_r = l / P.d
    return RelaxedSolution(lam=lam_r, sigma=G @ lam_r + g, eta=eta, scale=P.d, iterations=its,
                           residual=float(e), converged=bool(e <= tol * 10))


def relaxed_view(sim, rho: float):
    """``(cache, system)`` for the smooth Jacobian: the step's cache with the exact impulses,
    constraint velocities and new velocity replaced by the relaxed ones, and the relaxed linear
    system ``(A, W)`` there (``None`` without constraint rows)."""
    from . import derivative_kernels as K

    C = sim.cache
    cons, res = C["cons"], C["res"]
    if cons is None or not cons.m:
        return C, None
    G, g = C["G"], C["g"]
    sol = relaxed_solve(G, g, cons.nc, cons.mu, rho, res.lam, res.sigma, res.modes)
    if not sol.converged:
        import warnings

        from .forward import SolverWarning
        warnings.warn(f"smooth gradient: the relaxed contact problem (rho = {rho:g}) did not converge "
                      f"(residual {sol.residual:.3g} of rho after {sol.iterations} Newton steps); "
                      "the Jacobian is that of the last iterate", SolverWarning, stacklevel=3)
    Minv = C["Minv"]
    Minv = np.triu(Minv) + np.triu(Minv, 1).T
    v1 = C["v1"] + Minv @ (cons.J.T @ (sol.lam - res.lam))
    res_r = dataclasses.replace(res, lam=sol.lam, sigma=sol.sigma)
    A, W = K.relaxed_system(sol.lam, sol.sigma, sol.eta, sol.scale, G, cons.nc,
                            np.ascontiguousarray(cons.mu, dtype=float))
    C["relaxed"] = sol                 # (for inspection: the point the derivative was taken at)
    view = dict(C, res=res_r, v1=v1)
    return view, (A, W)
