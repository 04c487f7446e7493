"""The NCP solve: unrelaxed Coulomb friction, Signorini and joint limits, to tolerance.

Problem (impulse form, see ``shared/notes/gradients.md``)::

    sigma = G lam + g
    contact i:  lam_i in K_mu,  sigma_i + Gamma(sigma_i) in K_mu^*,  lam_i . (sigma_i + Gamma) = 0
                (Gamma(sigma) = (0, 0, mu ||sigma_T||): De Saxce's correction)
    limit j:    0 <= lam_j  _|_  sigma_j >= 0

Two stages:

1. **Active-set Newton** on the mode equations (breaking ``lam_i = 0``; sticking ``sigma_i = 0``;
   sliding ``sigma_N = 0, lam_T = -mu lam_N sigma_T/||sigma_T||``), starting from the modes
   and impulses of the previous step (warm start). A contact whose solution violates its mode's
   conditions switches mode and Newton runs again. Converges to machine precision in a few
   iterations when the modes are right, which is also what the implicit gradients need.
2. If that fails, **ADMM** on the cone complementarity problem with the De Saxce shift updated
   every iteration (as pinocchio's ``ADMMConstraintSolver`` with ``solve_ncp``), then its modes
   seed stage 1 again (polishing). If neither reaches the tolerance, the ADMM iterate is
   returned with ``converged = False``.

Convergence is measured by the natural-map residual in velocity units (m/s),
``max_i || D_i (lam_i - P_K(lam_i - D_i^-1 (sigma_i + Gamma(sigma_i)))) ||`` with ``D_i`` the
diagonal of the Delassus block, which is zero exactly at an NCP solution.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BREAKING, STICKING, SLIDING = 0, 1, 2
MODE_NAMES = ("breaking", "sticking", "sliding")


@dataclass
class SolverSettings:
    tol: float = 1e-9            # natural-map residual (m/s) for convergence
    max_iter: int = 2000         # ADMM iterations
    newton_iter: int = 20        # Newton iterations per active set
    mode_rounds: int = 8         # active-set repairs
    mode_tol: float = 1e-10      # tolerance of the mode conditions (relative)


@dataclass
class SolverResult:
    lam: np.ndarray              # (m,) impulses: 3 per contact (t1, t2, n) then limits
    sigma: np.ndarray            # (m,) constraint velocities after the step
    modes: np.ndarray            # (nc,) BREAKING / STICKING / SLIDING
    limit_active: np.ndarray     # (nl,) bool
    iterations: int
    residual: float
    converged: bool
    method: str                  # "none", "newton", "admm+newton", "admm"


def project_cone(x: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """Projection of (k, 3) vectors (t1, t2, n) onto the cones ||x_T|| <= mu x_N."""
    out = x.copy()
    xt = x[:, :2]
    xn = x[:, 2]
    nt = np.linalg.norm(xt, axis=1)
    inside = nt <= mu * xn
    polar = mu * nt <= -xn
    mid = ~(inside | polar)
    out[polar] = 0.0
    if np.any(mid):
        m, t, n = mu[mid], nt[mid], xn[mid]
        alpha = (m * t + n) / (m * m + 1.0)
        out[mid, 2] = alpha
        out[mid, :2] = (m * alpha / np.maximum(t, 1e-300))[:, None] * xt[mid]
    return out


def desaxce(sigma_c: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """sigma + Gamma(sigma) for (k, 3) contact velocities."""
    s = sigma_c.copy()
    s[:, 2] += mu * np.linalg.norm(sigma_c[:, :2], axis=1)
    return s


def natural_residual(lam: np.ndarray, sigma: np.ndarray, nc: int, mu: np.ndarray,
                     dG: np.ndarray) -> float:
    res = 0.0
    if nc:
        lc = lam[:3 * nc].reshape(nc, 3)
        sc = desaxce(sigma[:3 * nc].reshape(nc, 3), mu)
        d = dG[:3 * nc].reshape(nc, 3).mean(axis=1)
        r = d[:, None] * (lc - project_cone(lc - sc / d[:, None], mu))
        res = float(np.max(np.linalg.norm(r, axis=1)))
    if lam.size > 3 * nc:
        ll, sl, d = lam[3 * nc:], sigma[3 * nc:], dG[3 * nc:]
        res = max(res, float(np.max(np.abs(d * (ll - np.maximum(0.0, ll - sl / d))))))
    return res


class NCPSolver:
    def __init__(self, settings: SolverSettings | None = None):
        self.settings = settings or SolverSettings()

    # -- stage 1: active-set Newton ------------------------------------------------------
    def _newton(self, G, g, nc, mu, modes, lim_act, lam):
        """Newton on the mode equations. Returns lam or None if it does not converge."""
        m = G.shape[0]
        s = self.settings
        scale = max(float(np.max(np.abs(np.diag(G)))), 1e-300)
        for it in range(s.newton_iter):
            sigma = G @ lam + g
            F = np.empty(m)
            A = np.zeros((m, m))
            for i in range(nc):
                r = slice(3 * i, 3 * i + 3)
                mode = modes[i]
                if mode == BREAKING:
                    F[r] = lam[r] * scale
                    A[r, r] = np.eye(3) * scale
                elif mode == STICKING:
                    F[r] = sigma[r]
                    A[r] = G[r]
                else:
                    st = sigma[3 * i:3 * i + 2]
                    nst = np.linalg.norm(st)
                    ln = lam[3 * i + 2]
                    F[3 * i + 2] = sigma[3 * i + 2]
                    A[3 * i + 2] = G[3 * i + 2]
                    if nst < 1e-14 or mu[i] == 0.0:
                        # no slip direction (or no friction): tangential impulse zero
                        F[3 * i:3 * i + 2] = lam[3 * i:3 * i + 2] * scale
                        A[3 * i:3 * i + 2, 3 * i:3 * i + 2] = np.eye(2) * scale
                        if mu[i] != 0.0:
                            return None
                        continue
                    u = st / nst
                    F[3 * i:3 * i + 2] = (lam[3 * i:3 * i + 2] + mu[i] * ln * u) * scale
                    rows = np.zeros((2, m))
                    rows[:, 3 * i:3 * i + 2] = np.eye(2)
                    rows[:, 3 * i + 2] = mu[i] * u
                    rows += (mu[i] * ln / nst) * (np.eye(2) - np.outer(u, u)) @ G[3 * i:3 * i + 2]
                    A[3 * i:3 * i + 2] = rows * scale
            for j in range(m - 3 * nc):
                k = 3 * nc + j
                if lim_act[j]:
                    F[k] = sigma[k]
                    A[k] = G[k]
                else:
                    F[k] = lam[k] * scale
                    A[k, k] = scale
            err = float(np.max(np.abs(F))) if m else 0.0
            if err <= 1e-14 * max(1.0, float(np.max(np.abs(g))) if m else 1.0):
                return lam, it
            delta = np.linalg.lstsq(A, -F, rcond=1e-13)[0]
            lam = lam + delta
            if not np.all(np.isfinite(lam)):
                return None
        return lam, s.newton_iter

    def _check_modes(self, G, g, nc, mu, modes, lim_act, lam, tol_v, tol_l):
        """Return (ok, new_modes, new_lim_act): mode repairs for every violated condition."""
        sigma = G @ lam + g
        ok = True
        modes = modes.copy()
        lim_act = lim_act.copy()
        for i in range(nc):
            l = lam[3 * i:3 * i + 3]
            sg = sigma[3 * i:3 * i + 3]
            if modes[i] == BREAKING:
                if sg[2] < -tol_v:
                    modes[i] = STICKING
                    ok = False
            elif modes[i] == STICKING:
                if l[2] < -tol_l:
                    modes[i] = BREAKING
                    ok = False
                elif np.linalg.norm(l[:2]) > mu[i] * l[2] + tol_l:
                    modes[i] = SLIDING
                    ok = False
            else:
                if l[2] < -tol_l:
                    modes[i] = BREAKING
                    ok = False
                elif mu[i] > 0 and np.linalg.norm(sg[:2]) <= tol_v:
                    modes[i] = STICKING
                    ok = False
        for j in range(len(lim_act)):
            k = 3 * nc + j
            if lim_act[j] and lam[k] < -tol_l:
                lim_act[j] = False
                ok = False
            elif not lim_act[j] and sigma[k] < -tol_v:
                lim_act[j] = True
                ok = False
        return ok, modes, lim_act

    def _active_set(self, G, g, nc, mu, modes, lim_act, lam, dG):
        s = self.settings
        tol_v = s.mode_tol * max(1.0, float(np.max(np.abs(g))))
        lam_scale = max(1e-12, float(np.max(np.abs(lam))) if lam.size else 1.0)
        total = 0
        seen = set()
        for _ in range(s.mode_rounds):
            key = (tuple(modes), tuple(lim_act))
            if key in seen:
                return None
            seen.add(key)
            out = self._newton(G, g, nc, mu, modes, lim_act, lam)
            if out is None:
                return None
            lam_new, its = out
            total += its + 1
            tol_l = s.mode_tol * max(lam_scale, float(np.max(np.abs(lam_new))))
            ok, modes2, lim2 = self._check_modes(G, g, nc, mu, modes, lim_act, lam_new, tol_v, tol_l)
            if ok:
                sigma = G @ lam_new + g
                res = natural_residual(lam_new, sigma, nc, mu, dG)
                if res <= s.tol:
                    return lam_new, sigma, modes, lim_act, total, res
                return None
            modes, lim_act = modes2, lim2
            # restart from the last iterate, with impulses of broken rows cleared
            lam = lam_new.copy()
            for i in range(nc):
                if modes[i] == BREAKING or lam[3 * i + 2] < 0:
                    lam[3 * i:3 * i + 3] = 0.0
            lam[3 * nc:] = np.where(lim_act, np.maximum(lam[3 * nc:], 0.0), 0.0)
        return None

    # -- stage 2: ADMM -------------------------------------------------------------------
    def _admm(self, G, g, nc, mu, lam0, dG, tol, max_iter):
        m = G.shape[0]
        scale = float(np.mean(dG))
        rho = scale
        eta = 1e-6 * scale
        A_inv = np.linalg.inv(G + (rho + eta) * np.eye(m))
        z = self._project(lam0, nc, mu)
        x = z.copy()
        y = -(G @ z + g)
        y = -self._project_dual(-y, nc, mu)
        res = np.inf
        best, best_res = z.copy(), natural_residual(z, G @ z + g, nc, mu, dG)
        it = 0
        for it in range(1, max_iter + 1):
            sigma = G @ z + g
            shift = np.zeros(m)
            if nc:
                sc = sigma[:3 * nc].reshape(nc, 3)
                shift[2:3 * nc:3] = mu * np.linalg.norm(sc[:, :2], axis=1)
            x = A_inv @ (rho * z - y - g - shift + eta * x)
            z_old = z
            z = self._project(x + y / rho, nc, mu)
            y = y + rho * (x - z)
            if it % 10 == 0 or it == max_iter:
                sigma = G @ z + g
                res = natural_residual(z, sigma, nc, mu, dG)
                if res < best_res:
                    best, best_res = z.copy(), res
                if res <= tol:
                    break
                if not np.isfinite(res) or res > 1e6 * max(best_res, tol):
                    break                               # diverging: keep the best iterate
                primal = float(np.max(np.abs(x - z))) * scale
                dual = float(np.max(np.abs(z - z_old))) * rho
                if primal > 10 * dual:
                    rho *= 2.0
                    A_inv = np.linalg.inv(G + (rho + eta) * np.eye(m))
                elif dual > 10 * primal:
                    rho /= 2.0
                    A_inv = np.linalg.inv(G + (rho + eta) * np.eye(m))
        sigma = G @ best + g
        return best, sigma, it, best_res

    def _pgs(self, G, g, nc, mu, lam0, dG, tol, max_sweeps):
        """Projected block Gauss-Seidel with the De Saxce shift: slow but robust fallback."""
        lam = self._project(np.nan_to_num(lam0), nc, mu)
        m = G.shape[0]
        w = np.array([np.linalg.eigvalsh(G[3 * i:3 * i + 3, 3 * i:3 * i + 3])[-1] for i in range(nc)])
        res = np.inf
        sweep = 0
        for sweep in range(1, max_sweeps + 1):
            for i in range(nc):
                r = slice(3 * i, 3 * i + 3)
                sg = G[r] @ lam + g[r]
                sg[2] += mu[i] * np.hypot(sg[0], sg[1])
                lam[r] = project_cone((lam[r] - sg / w[i])[None], mu[i:i + 1])[0]
            for k in range(3 * nc, m):
                lam[k] = max(0.0, lam[k] - (G[k] @ lam + g[k]) / dG[k])
            if sweep % 10 == 0:
                res = natural_residual(lam, G @ lam + g, nc, mu, dG)
                if res <= tol:
                    break
        sigma = G @ lam + g
        return lam, sigma, sweep, natural_residual(lam, sigma, nc, mu, dG)

    @staticmethod
    def _project(x, nc, mu):
        out = x.copy()
        if nc:
            out[:3 * nc] = project_cone(x[:3 * nc].reshape(nc, 3), mu).reshape(-1)
        out[3 * nc:] = np.maximum(0.0, x[3 * nc:])
        return out

    @staticmethod
    def _project_dual(x, nc, mu):
        """Projection on the dual cones K* = {||x_T|| <= x_N / mu}."""
        out = x.copy()
        if nc:
            inv = np.where(mu > 0, 1.0 / np.maximum(mu, 1e-300), np.inf)
            xc = x[:3 * nc].reshape(nc, 3)
            pc = np.empty_like(xc)
            fin = np.isfinite(inv)
            pc[fin] = project_cone(xc[fin], inv[fin])
            pc[~fin] = np.column_stack([xc[~fin, :2], np.maximum(0.0, xc[~fin, 2])])
            out[:3 * nc] = pc.reshape(-1)
        out[3 * nc:] = np.maximum(0.0, x[3 * nc:])
        return out

    @staticmethod
    def classify(lam, sigma, nc, mu, tol_v, tol_l):
        modes = np.empty(nc, dtype=np.int64)
        for i in range(nc):
            if lam[3 * i + 2] <= tol_l:
                modes[i] = BREAKING
            elif mu[i] == 0 or np.linalg.norm(sigma[3 * i:3 * i + 2]) > tol_v:
                modes[i] = SLIDING
            else:
                modes[i] = STICKING
        lim_act = lam[3 * nc:] > tol_l
        return modes, lim_act

    def _polish(self, G, g, nc, mu, lam, sigma, dG, scale_v):
        """Active-set Newton seeded with the modes of an approximate solution (3 thresholds)."""
        scale_l = max(1e-12, float(np.max(np.abs(lam))))
        for f in (1e-5, 1e-3, 1e-7):
            modes, lim_act = self.classify(lam, sigma, nc, mu, f * scale_v, f * scale_l)
            out = self._active_set(G, g, nc, mu, modes, lim_act, lam, dG)
            if out is not None:
                return out
        return None

    # -- entry point -----------------------------------------------------------------------
    def solve(self, G: np.ndarray, g: np.ndarray, nc: int, mu: np.ndarray,
              lam0: np.ndarray | None = None, modes0: np.ndarray | None = None) -> SolverResult:
        m = G.shape[0]
        nl = m - 3 * nc
        s = self.settings
        if m == 0:
            return SolverResult(np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64),
                                np.zeros(0, dtype=bool), 0, 0.0, True, "none")
        dG = np.maximum(np.diag(G).copy(), 1e-12 * max(1.0, float(np.max(np.diag(G)))))
        lam = np.zeros(m) if lam0 is None else np.asarray(lam0, float).copy()
        if modes0 is None:
            # a contact whose free velocity already separates it starts as breaking
            modes0 = np.where(g[2:3 * nc:3] >= 0.0, BREAKING, STICKING).astype(np.int64)
            lim0 = g[3 * nc:] < 0.0
        else:
            given = np.asarray(modes0, dtype=np.int64)
            modes0 = given[:nc]
            lim0 = given[nc:].astype(bool) if len(given) > nc else g[3 * nc:] < 0.0
        lim0 = np.asarray(lim0, dtype=bool).reshape(nl)
        out = self._active_set(G, g, nc, mu, modes0, lim0, lam, dG)
        if out is not None:
            lam, sigma, modes, lim_act, its, res = out
            return SolverResult(lam, sigma, modes, lim_act, its, res, True, "newton")
        # stage 2: ADMM, then polish its modes; if ADMM stalls, projected Gauss-Seidel
        lam_a, sigma_a, its, res_a = self._admm(G, g, nc, mu, lam, dG, max(s.tol, 1e-7), s.max_iter)
        scale_v = max(1e-12, float(np.max(np.abs(g))))
        out = self._polish(G, g, nc, mu, lam_a, sigma_a, dG, scale_v)
        if out is not None:
            return SolverResult(*out[:4], its + out[4], out[5], True, "admm+newton")
        if res_a > s.tol:
            lam_p, sigma_p, its3, res_p = self._pgs(G, g, nc, mu, lam_a, dG, max(s.tol, 1e-7), 500)
            its += its3
            if res_p < res_a:
                lam_a, sigma_a, res_a = lam_p, sigma_p, res_p
                out = self._polish(G, g, nc, mu, lam_a, sigma_a, dG, scale_v)
                if out is not None:
                    return SolverResult(*out[:4], its + out[4], out[5], True, "pgs+newton")
        scale_l = max(1e-12, float(np.max(np.abs(lam_a))))
        modes, lim_act = self.classify(lam_a, sigma_a, nc, mu, 1e-6 * scale_v, 1e-6 * scale_l)
        return SolverResult(lam_a, sigma_a, modes, lim_act, its, res_a, res_a <= s.tol,
                            "pgs" if its > s.max_iter else "admm")
