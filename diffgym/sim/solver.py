"""The NCP solve: unrelaxed Coulomb friction, Signorini and joint limits, to tolerance.

Problem (impulse form, see ``shared/notes/gradients.md``)::

    sigma = G lam + g
    contact i:  lam_i in K_mu,  sigma_i + Gamma(sigma_i) in K_mu^*,  lam_i . (sigma_i + Gamma) = 0
                (Gamma(sigma) = (0, 0, mu ||sigma_T||): De Saxce's correction)
    limit j:    0 <= lam_j  _|_  sigma_j >= 0

Stages:

1. **Active-set Newton** on the mode equations, starting from the modes and impulses of the
   previous step (warm start). Breaking contacts and inactive limits are eliminated
   (``lam = 0``); the remaining unknowns solve

   - sticking contact, active limit:  ``sigma_i = 0``
   - sliding contact:  ``sigma_N = 0``,  ``||lam_T|| - mu lam_N = 0``  and
     ``(lam_T x sigma_T) / (||lam_T|| + ||sigma_T|| / d) = 0`` (slip parallel to the friction
     impulse). This is ``lam_T = -mu lam_N sigma_T / ||sigma_T||`` written without the
     ``1/||sigma_T||`` singularity: Newton stays well conditioned for slow slip (a contact at the
     stick-slip transition) and for negligible impulses. The sign (slip against the impulse)
     is a mode condition checked afterwards.

   The Jacobian is assembled with numpy over contacts grouped by mode. Systems are solved by LU
   unless the Delassus block of the active rows is rank deficient (detected by a Cholesky
   factorization: e.g. four coplanar points of a resting box, or a robot lying on its thighs
   and feet with joint limits), in which case a least-squares solution is used: the minimum-
   norm step from the warm start (the impulses of redundant contacts stay where they were), or,
   after a mode switch, the minimum-norm solution (the load is shared evenly). Rows with a zero
   Delassus diagonal (out of the plane of a planar model) are dropped. Sliding makes the
   equations nonlinear; a backtracking line search on ``||F||^2`` globalizes Newton.
   A contact or limit whose solution violates its mode's inequalities switches mode (all at
   once; one at a time, the most violated first, once a set of modes repeats or Newton fails)
   and Newton runs again, within a budget of Newton iterations. Accepted solutions are made
   canonical: contacts with negligible impulses are breaking; touching redundant contacts are
   re-activated when they can share the load; a sliding contact whose slip is below the mode
   tolerance is re-labelled sticking (its impulse is on the cone boundary, its velocity zero:
   both sets of mode equations hold), so the modes given to the implicit gradients are well
   conditioned. (A restart from the cold start where the warm start's modes cycle exists behind
   ``solver_kernels.COLD_RESTART``, off; see the README.)

   In a step (``forward._solve_islands``) an island of at least ``BODY_MIN_ROWS`` rows also
   passes its rows ``J`` and mass matrix ``M`` in body space, and the compiled kernel takes the
   linear steps of its large active sets as ``Gaa^+ r = J K^g M K^g J^T r`` with ``K = J^T J``
   over the island's dofs (sparse envelope Cholesky, dependent dofs deflated; see
   ``solver_kernels.body_factor``): the same minimum-norm least-squares solution as the dense
   LU / rank test / SVD path, at the cost of the bodies' contact graph instead of O(m^3).
1b. If that fails, **proximal active-set Newton** (``solver_kernels.proximal``): proximal-point iterations
   whose subproblems are the NCPs of ``G + rho I`` and ``g - rho lam_k`` (``rho = 1e-6`` of the
   mean Delassus diagonal), each solved by the same active-set kernel from the previous modes,
   then the active-set Newton on the original problem from the modes found. Redundant contacts
   (a face on a face) make the impulses non-unique and the plain iteration can wander between
   equivalent impulses and modes; the subproblems have unique impulses, the velocity solution
   is unique, and the outer iteration converges (the error in the range of G shrinks by
   ``rho / (rho + eig)`` per outer step). Tried from the warm start, a cold all-sticking start
   and an all-sliding start; typically 2-5 outer steps of a few Newton solves each.
2. If that fails (many contacts changing between stick and slip at once), approximate solutions
   seed stage 1 again ("polish", modes classified at three thresholds): a short run of
   pinocchio's ``ADMMConstraintSolver`` (C++, ``solve_ncp``; limits are embedded as frictionless
   point contacts), then a semismooth Newton method on the natural map (ours), then longer
   pinocchio ADMM runs, then our ADMM and projected Gauss-Seidel. If nothing reaches the
   tolerance, the best iterate is returned with ``converged = False``.

Stages 1 and 1b run compiled in one call (``solver_kernels.solve_stage1``). Stage 1b has one
implementation, ``solver_kernels.proximal`` (``_proximal`` below calls it; under
``DIFFGYM_JIT=0`` it runs as plain Python); ``tests/test_solver.py`` checks it against pinocchio's
ADMM and the NCP conditions. Stage 1 runs compiled (``solver_kernels.py``,
numba: a faithful port of ``_active_set`` and everything it calls, with a hand-written LU, LAPACK's Cholesky for the rank test, and a Jacobi
SVD for the minimum-norm least squares of up to 32 unknowns); ``SolverSettings(compiled=False)``
runs the Python stage 1 below (still a twin of the kernel, which ``tests/test_solver_kernels.py``
compares it with on recorded and random problems; both stage-1 paths share the compiled stage
1b). Stages 2-4 are Python (rare).

Convergence is measured by the natural-map residual in velocity units (m/s),
``max_i || D_i (lam_i - P_K(lam_i - D_i^-1 (sigma_i + Gamma(sigma_i)))) ||`` with ``D_i`` the
mean diagonal of the Delassus block, which is zero exactly at an NCP solution. Where Newton
converges, the mode equations hold to machine precision; only where the data themselves are
inconsistent (redundant constraints whose ``g`` is not in the range of ``G``, at the level of
the tolerance) is a solution accepted on the natural residual with the equations holding to
that level.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from math import sqrt as _sqrt

from . import solver_kernels as _sk

try:      # numpy's own LAPACK solve without np.linalg.solve's Python wrapper (same numbers)
    from numpy.linalg import _umath_linalg as _ul
    _solve1 = _ul.solve1
except (ImportError, AttributeError):   # pragma: no cover - another numpy
    _solve1 = None



def _lstsq(A: np.ndarray, F: np.ndarray, rcond: float) -> np.ndarray:
    """``np.linalg.lstsq(A, F, rcond)[0]`` for a vector F (the same LAPACK call, less wrapper)."""
    if _solve1 is not None:
        with np.errstate(all="ignore"):
            x = _ul.lstsq(A, F[:, None], rcond, signature="ddd->ddid")[0][:, 0]
        if np.isfinite(x).all():
            return x
    return np.linalg.lstsq(A, F, rcond=rcond)[0]


BREAKING, STICKING, SLIDING = 0, 1, 2
MODE_NAMES = ("breaking", "sticking", "sliding")

_R3 = np.arange(3)
_EMPTY_F = np.zeros(0)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_EMPTY_I = np.zeros(0, dtype=np.int64)
_LinAlgError = np.linalg.LinAlgError


@dataclass
class SolverSettings:
    tol: float = 1e-9            # natural-map residual (m/s) for convergence
    max_iter: int = 2000         # ADMM iterations
    newton_iter: int = 20        # Newton iterations per active set
    mode_rounds: int = 12        # active-set repairs
    mode_tol: float = 1e-10      # tolerance of the mode conditions (relative)
    newton_budget: int = 30      # Newton iterations of the warm-started active-set stage
    pin_fallback: bool = True    # use pinocchio's ADMM (C++) as the first fallback
    compiled: bool = True        # stage 1 (active-set Newton) as numba kernels (solver_kernels);
    #                              False: the Python reference implementation below


@dataclass
class SolverResult:
    lam: np.ndarray              # (m,) impulses: 3 per contact (t1, t2, n) then limits
    sigma: np.ndarray            # (m,) constraint velocities after the step
    modes: np.ndarray            # (nc,) BREAKING / STICKING / SLIDING
    limit_active: np.ndarray     # (nl,) bool
    iterations: int
    residual: float
    converged: bool
    method: str                  # "none", "newton", "prox+newton", "pinadmm+newton", "ssn+newton",
    #                              "admm+newton", "pgs+newton", "admm", "pgs" ("+unverified": the
    #                              step's check of the final velocity failed, converged=False)


def project_cone(x: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """Projection of (k, 3) vectors (t1, t2, n) onto the cones ||x_T|| <= mu x_N."""
    x = np.asarray(x, dtype=float)
    mu = np.asarray(mu, dtype=float)
    xn = x[:, 2]
    nt = np.sqrt(x[:, 0] * x[:, 0] + x[:, 1] * x[:, 1])
    # boundary projection (normal component alpha); alpha <= 0 is the polar cone (-> 0)
    alpha = np.maximum((mu * nt + xn) / (mu * mu + 1.0), 0.0)
    f = mu * alpha / np.where(nt > 0.0, nt, 1.0)
    out = np.empty_like(x)
    out[:, :2] = x[:, :2] * f[:, None]
    out[:, 2] = alpha
    inside = (nt <= mu * xn) & (xn >= 0.0)     # (mu = 0: the cone is the ray xn >= 0)
    if inside.any():
        out[inside] = x[inside]
    return out


def desaxce(sigma_c: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """sigma + Gamma(sigma) for (k, 3) contact velocities."""
    s = np.array(sigma_c, dtype=float)
    s[:, 2] += mu * np.sqrt(s[:, 0] * s[:, 0] + s[:, 1] * s[:, 1])
    return s


def natural_residual(lam: np.ndarray, sigma: np.ndarray, nc: int, mu: np.ndarray,
                     dG: np.ndarray) -> float:
    """Natural-map residual (velocity units) of an NCP iterate; zero exactly at a solution."""
    k = 3 * nc
    dc = (dG[0:k:3] + dG[1:k:3] + dG[2:k:3]) / 3.0
    return _natres(lam, sigma, nc, np.asarray(mu, dtype=float), dc, dG[k:])


_INF = float("inf")
_SMALL = 8            # up to this many contacts, per-contact tests run on Python floats


def _natres_small(lam, sigma, nc, mu, dc, dl) -> float:
    """``_natres`` on Python floats (the same elementwise arithmetic; small problems)."""
    L = lam.tolist()
    S = sigma.tolist()
    M = mu.tolist()
    D = dc.tolist()
    r2max = None
    for i in range(nc):
        j = 3 * i
        m, d = M[i], D[i]
        l0, l1, ln = L[j], L[j + 1], L[j + 2]
        s0, s1 = S[j], S[j + 1]
        sn = S[j + 2] + m * _sqrt(s0 * s0 + s1 * s1)          # De Saxce
        y0, y1, yn = l0 - s0 / d, l1 - s1 / d, ln - sn / d
        nt = _sqrt(y0 * y0 + y1 * y1)
        if not nt <= m * yn:                                    # outside: project on the cone
            alpha = (m * nt + yn) / (m * m + 1.0)
            alpha = alpha if alpha > 0.0 or alpha != alpha else 0.0
            f = m * alpha / (nt if nt > 0.0 else 1.0)
            y0, y1, yn = y0 * f, y1 * f, alpha
        r0, r1, rn = l0 - y0, l1 - y1, ln - yn
        r2 = (r0 * r0 + r1 * r1 + rn * rn) * (d * d)
        if r2max is None or r2 > r2max or r2 != r2:
            r2max = r2
    res = _sqrt(r2max) if nc else 0.0
    k = 3 * nc
    if len(L) > k:
        for ll, sg, d in zip(L[k:], S[k:], dl.tolist()):
            t = ll - sg / d
            t = abs(d * (ll - (t if t > 0.0 or t != t else 0.0)))
            if t > res or t != t:
                res = t
    return float(res)


def _bad_small(lam, sigma, nc, mu, modes, lim_act, tol_v, tol_l) -> bool:
    """Whether any mode condition fails (``_violations``' quick test on Python floats)."""
    L = lam.tolist()
    S = sigma.tolist()
    M = mu.tolist()
    for i, md in enumerate(modes.tolist()):
        j = 3 * i
        if md == BREAKING:
            if S[j + 2] < -tol_v:
                return True
            continue
        l0, l1, ln = L[j], L[j + 1], L[j + 2]
        if ln < -tol_l:
            return True
        nlt = _sqrt(l0 * l0 + l1 * l1)
        if md == STICKING:
            if nlt - M[i] * ln > tol_l:
                return True
        elif nlt > tol_l and (l0 * S[j] + l1 * S[j + 1]) / (nlt if nlt > 0.0 else _INF) > tol_v:
            return True
    k = 3 * nc
    for act, ll, sg in zip(lim_act.tolist(), L[k:], S[k:]):
        if (ll < -tol_l) if act else (sg < -tol_v):
            return True
    return False


def _natres(lam, sigma, nc, mu, dc, dl) -> float:
    if nc <= _SMALL:
        return _natres_small(lam, sigma, nc, mu, dc, dl)
    res = 0.0
    k = 3 * nc
    if nc:
        lc = lam[:k].reshape(nc, 3)
        y = lc - desaxce(sigma[:k].reshape(nc, 3), mu) / dc[:, None]
        y0, y1, yn = y[:, 0], y[:, 1], y[:, 2]
        if ((np.sqrt(y0 * y0 + y1 * y1) <= mu * yn) & (yn >= 0.0)).all():
            r = lc - y                     # every y inside its cone: P(y) = y
        else:
            r = lc - project_cone(y, mu)
        r2 = np.einsum("ij,ij->i", r, r) * (dc * dc)
        res = float(np.sqrt(r2.max()))
    if lam.size > k:
        ll = lam[k:]
        res = max(res, float(np.abs(dl * (ll - np.maximum(0.0, ll - sigma[k:] / dl))).max()))
    return res


def _key(modes, lim_act) -> bytes:
    return modes.tobytes() + lim_act.tobytes()


class NCPSolver:
    def __init__(self, settings: SolverSettings | None = None):
        self.settings = settings or SolverSettings()

    # -- linear algebra ----------------------------------------------------------------------
    # whether the Delassus block of the active rows is (numerically) singular
    _rank_deficient = staticmethod(_sk.rank_deficient_reference)

    @staticmethod
    def _lin_solve(A: np.ndarray, F: np.ndarray, x: np.ndarray, deficient: bool,
                   anchored: bool = False, spd: bool = False) -> np.ndarray:
        """The Newton step ``delta`` with ``A delta = F`` (then ``x - delta`` is the new iterate).
        When the system is rank deficient, the new iterate is the minimum-norm solution of the
        linearized equations ``A x_new = A x - F``: the impulses of redundant contacts (four
        coplanar points) are shared as evenly as possible and do not depend on the warm start;
        ``anchored``: the minimum-norm step instead (the iterate stays next to ``x``).
        ``spd``: A is a Delassus block that passed the rank test (LU cannot break down)."""
        if not deficient and spd and _solve1 is not None:
            d = _solve1(A, F, signature="dd->d")
            if np.isfinite(d).all():
                return d
        if not deficient:
            try:
                d = np.linalg.solve(A, F)
                if np.isfinite(d).all():
                    return d
            except _LinAlgError:
                pass
        if anchored:
            return _lstsq(A, F, 1e-11)
        return x - _lstsq(A, A @ x - F, 1e-11)

    # -- stage 1: active-set Newton ----------------------------------------------------------
    def _newton(self, G, g, nc, mu, modes, lim_act, lam, dc, vscale, max_its=None,
                anchored=False, min_steps=0):
        """Newton on the mode equations of one active set.

        Returns ``(lam, sigma, ok, steps)``; lam is zero on eliminated rows, ``steps`` counts the
        Newton steps (linear solves) taken."""
        m = G.shape[0]
        ml = modes.tolist()
        anybrk = BREAKING in ml
        linear = SLIDING not in ml
        # rows with a zero Delassus diagonal (directions a constraint cannot act in, e.g. out of
        # the plane of a planar model) carry no impulse: eliminated from the linear systems
        zero = self.__dict__.get("_zero_rows") if linear else None
        if zero is None and not anybrk and all(lim_act.tolist()):
            act_c = np.arange(nc)
            act = None                     # every row is active
            Gaa, ga, x = G, g, lam.copy()
        else:
            # index sets of the active rows (cached: the same sets come back step after step)
            key = (modes.tobytes(), lim_act.tobytes(), None if zero is None else zero.tobytes())
            cache = self.__dict__.setdefault("_act_cache", {})
            hit = cache.get(key)
            if hit is None:
                brk = modes == BREAKING
                rows = np.concatenate((np.repeat(~brk, 3), lim_act))
                if zero is not None:
                    rows &= ~zero
                if len(cache) > 256:
                    cache.clear()
                hit = cache[key] = (np.flatnonzero(~brk), np.flatnonzero(rows))
            act_c, act = hit
            if act.size == 0:
                return np.zeros(m), g.copy(), True, 0
            Gaa = G.take(act, 0).take(act, 1)
            ga = g.take(act)
            x = lam.take(act)              # a copy
        ftol = 1e-14 * vscale              # F is in velocity units
        # no progress below this: the precision of the arithmetic, or of the data (redundant
        # constraints whose g is inconsistent at that level); the result is then accepted if its
        # natural residual is within tolerance
        stall = max(1e-11 * vscale, 0.1 * self.settings.tol)
        deficient = None
        its = 0
        max_its = self.settings.newton_iter if max_its is None else max(1, int(max_its))
        if linear:
            # linear: one solve, then iterative refinement to machine precision
            F = Gaa @ x + ga
            fn = float(np.abs(F).max())
            while True:
                if fn <= ftol and its >= min_steps:
                    ok = True
                    break
                if its >= max_its:
                    ok = fn <= stall
                    break
                if deficient is None:
                    deficient = self._rank_deficient(Gaa)
                its += 1
                x -= self._lin_solve(Gaa, F, x, deficient, anchored, True)
                F = Gaa @ x + ga
                fn_new = float(np.abs(F).max())
                if fn_new > 0.5 * fn and its > min_steps:
                    # no more progress: at the arithmetic's precision, or an inconsistent
                    # (rank-deficient) system that has no solution with these modes
                    ok = fn_new <= stall
                    break
                fn = fn_new
            return self._scatter(x, act, G, g, m) + (ok, its)

        sl = np.flatnonzero(modes[act_c] == SLIDING)
        i1 = 3 * sl
        i2 = i1 + 1
        i3 = i1 + 2
        ci = act_c[sl]
        mu_s = mu[ci]
        d_s = dc[ci]

        def residual(x):
            sa = Gaa @ x + ga
            F = sa.copy()
            l1, l2 = x[i1], x[i2]
            s1, s2 = sa[i1], sa[i2]
            nl = np.sqrt(l1 * l1 + l2 * l2)
            ns = np.sqrt(s1 * s1 + s2 * s2)
            pos = nl > 0.0
            if pos.all():
                w1, w2 = l1 / nl, l2 / nl
            else:
                # no friction impulse yet: take the direction opposite to the slip
                safe_l = np.where(pos, nl, 1.0)
                safe_s = np.where(ns > 0.0, ns, 1.0)
                w1 = np.where(pos, l1 / safe_l, np.where(ns > 0.0, -s1 / safe_s, 1.0))
                w2 = np.where(pos, l2 / safe_l, np.where(ns > 0.0, -s2 / safe_s, 0.0))
            # ||lam_T|| = mu lam_N
            F[i1] = d_s * (nl - mu_s * x[i3])
            # slip parallel to the impulse: (lam_T x s_T) / rho, rho = ||lam_T|| + ||s_T|| / d,
            # which is w x s_T for a slow slip and d (lam_T x u) for a small impulse: bounded
            # derivatives in both limits
            rho = nl + ns / d_s
            rho = np.where(rho > 0.0, rho, 1.0)
            F[i2] = (l1 * s2 - l2 * s1) / rho
            return F, (w1, w2, nl, ns, s1, s2, l1, l2, rho)

        F, aux = residual(x)
        phi = float(F @ F)
        fn = float(np.abs(F).max())
        A = np.empty_like(Gaa)
        while True:
            if fn <= ftol and its >= min_steps:
                ok = True
                break
            if its >= max_its:
                ok = fn <= stall
                break
            if deficient is None:
                deficient = self._rank_deficient(Gaa)
            its += 1
            w1, w2, nl, ns, s1, s2, l1, l2, rho = aux
            A[:] = Gaa
            A[i1] = 0.0
            A[i1, i1] = d_s * w1
            A[i1, i2] = d_s * w2
            A[i1, i3] = -d_s * mu_s
            # dF2 = (d(lam_T x s_T) - F2 d rho) / rho,  d rho = w . d lam_T + u . d s_T / d
            f2 = F[i2] / rho
            safe_s = np.where(ns > 0.0, ns, np.inf)
            u1, u2 = s1 / safe_s, s2 / safe_s
            c1 = l1 / rho - f2 * u2 / d_s         # coefficient of d s2
            c2 = -l2 / rho - f2 * u1 / d_s        # coefficient of d s1
            A[i2] = c2[:, None] * Gaa[i1] + c1[:, None] * Gaa[i2]
            A[i2, i1] += s2 / rho - f2 * w1
            A[i2, i2] += -s1 / rho - f2 * w2
            delta = self._lin_solve(A, F, x, deficient, anchored)
            # backtracking line search on ||F||^2
            t = 1.0
            while True:
                x_new = x - t * delta
                F_new, aux_new = residual(x_new)
                phi_new = float(F_new @ F_new)
                if phi_new <= (1.0 - 1e-4 * t) * phi or phi_new <= ftol * ftol or its <= min_steps:
                    break
                t *= 0.5
                if t < 1e-3:
                    break
            fn_new = float(np.abs(F_new).max())
            if t < 1e-3:
                # no descent: converged at the arithmetic's precision, or stuck
                ok = min(fn, fn_new) <= stall
                if fn_new < fn:
                    x = x_new
                break
            x, F, aux, phi = x_new, F_new, aux_new, phi_new
            if fn_new > 0.5 * fn and fn_new <= stall and its > min_steps:
                ok = True
                break
            fn = fn_new
        return self._scatter(x, act, G, g, m) + (ok, its)

    @staticmethod
    def _scatter(x, act, G, g, m):
        """Full (lam, sigma) from the active unknowns."""
        if act is None:
            return x, G @ x + g
        out = np.zeros(m)
        out[act] = x
        return out, G @ out + g

    @staticmethod
    def _violations(lam, sigma, nc, mu, modes, lim_act, dc, dl, tol_v, tol_l):
        """Mode conditions. Returns (new_modes, new_lim_act, contact_viol, limit_viol):
        a positive violation (velocity units) marks a row whose mode must change; None when
        every condition holds."""
        k = 3 * nc
        # quick test first (the common case: the modes are right)
        bad = False
        if nc <= _SMALL:
            bad = _bad_small(lam, sigma, nc, mu, modes, lim_act, tol_v, tol_l)
        elif nc:
            lc = lam[:k].reshape(nc, 3)
            sc = sigma[:k].reshape(nc, 3)
            l0, l1, ln = lc[:, 0], lc[:, 1], lc[:, 2]
            nlt = np.sqrt(l0 * l0 + l1 * l1)
            mx = int(modes.max())
            if mx == STICKING and modes.min() == STICKING:       # every contact sticking
                bad = bool(((ln < -tol_l) | (nlt - mu * ln > tol_l)).any())
            elif mx <= STICKING:                                  # no sliding contact
                bad = bool(np.where(modes == BREAKING, sc[:, 2] < -tol_v,
                                    (ln < -tol_l) | (nlt - mu * ln > tol_l)).any())
            else:
                wdot = (l0 * sc[:, 0] + l1 * sc[:, 1]) / np.where(nlt > 0.0, nlt, np.inf)
                brk = modes == BREAKING
                bad = bool(np.where(brk, sc[:, 2] < -tol_v,
                                    (ln < -tol_l) | np.where(modes == STICKING, nlt - mu * ln > tol_l,
                                                             (wdot > tol_v) & (nlt > tol_l))).any())
        if not bad and lim_act.size and nc > _SMALL:
            ll, sg = lam[k:], sigma[k:]
            bad = bool(np.where(lim_act, ll < -tol_l, sg < -tol_v).any())
        if not bad:
            return None
        new_modes = modes.copy()
        new_lim = lim_act.copy()
        vc = np.zeros(nc)
        if nc:
            lc = lam[:k].reshape(nc, 3)
            sc = sigma[:k].reshape(nc, 3)
            ln, sn = lc[:, 2], sc[:, 2]
            nlt = np.sqrt(lc[:, 0] ** 2 + lc[:, 1] ** 2)
            wdot = (lc[:, 0] * sc[:, 0] + lc[:, 1] * sc[:, 1]) / np.where(nlt > 0.0, nlt, np.inf)
            brk = modes == BREAKING
            stk = modes == STICKING
            sld = modes == SLIDING
            # breaking: the contact must not approach; it becomes sticking, or sliding when its
            # slip is fast enough that stopping it would need an impulse outside the cone (a
            # diagonal estimate: ||sigma_T|| > mu |sigma_N|)
            m1 = brk & (sn < -tol_v)
            vc[m1] = -sn[m1]
            slip = np.sqrt(sc[:, 0] ** 2 + sc[:, 1] ** 2)
            new_modes[m1] = np.where(slip[m1] > -mu[m1] * sn[m1], SLIDING, STICKING)
            # sliding with a pulling normal impulse, or sticking with an impulse in the polar
            # cone (its projection on the cone is zero): breaking
            over = nlt - mu * ln
            m2 = (ln < -tol_l) & (sld | (stk & (mu * nlt + ln <= 0.0)))
            vc[m2] = np.maximum(-ln[m2], over[m2]) * dc[m2]
            new_modes[m2] = BREAKING
            # sticking outside the friction cone (projection on the boundary): sliding
            m3 = stk & ~m2 & (over > tol_l)
            vc[m3] = over[m3] * dc[m3]
            new_modes[m3] = SLIDING
            # sliding along the friction impulse (wrong direction): sticking (the direction of a
            # negligible impulse means nothing)
            m4 = sld & ~m2 & (wdot > tol_v) & (nlt > tol_l)
            vc[m4] = wdot[m4]
            new_modes[m4] = STICKING
        vl = np.zeros(lim_act.size)
        if lim_act.size:
            ll, sg = lam[k:], sigma[k:]
            m5 = lim_act & (ll < -tol_l)
            vl[m5] = -ll[m5] * dl[m5]
            new_lim[m5] = False
            m6 = ~lim_act & (sg < -tol_v)
            vl[m6] = -sg[m6]
            new_lim[m6] = True
        if not (vc.any() or vl.any()):
            return None
        return new_modes, new_lim, vc, vl

    def _tols(self, lam, vscale):
        mt = self.settings.mode_tol
        if lam.size <= 3 * _SMALL:
            return mt * vscale, mt * max(max(map(abs, lam.tolist()), default=0.0), 1e-300)
        return mt * vscale, mt * max(float(np.abs(lam).max()), 1e-300)

    def _active_set(self, G, g, nc, mu, modes, lim_act, lam, dG, dc, vscale, budget=None,
                    rounds=None):
        """Active-set Newton from the given modes; ``budget`` bounds the Newton iterations of
        all rounds together, ``rounds`` the mode switches (default ``settings.mode_rounds``).
        Returns (lam, sigma, modes, lim_act, iterations, residual) or None."""
        s = self.settings
        budget = s.mode_rounds * s.newton_iter if budget is None else budget
        mode_rounds = s.mode_rounds if rounds is None else int(rounds)
        dl = dG[3 * nc:]
        total = 0
        seen: dict[bytes, int] = {}
        modes = np.asarray(modes, dtype=np.int64).copy()
        lim_act = np.asarray(lim_act, dtype=bool).copy()
        lam = self._prepare(np.asarray(lam, dtype=float).copy(), nc, mu, modes, lim_act)
        single = False
        first = True
        for _ in range(mode_rounds):
            kk = _key(modes, lim_act)
            seen[kk] = seen.get(kk, 0) + 1
            if total >= budget:
                return None
            # the first set of modes from the given impulses (the warm start: minimum-norm steps
            # keep redundant impulses where they were); after a switch, minimum-norm solutions
            lam_n, sigma, ok, its = self._newton(G, g, nc, mu, modes, lim_act, lam, dc, vscale,
                                                 min(s.newton_iter, budget - total),
                                                 anchored=first)
            first = False
            total += its
            tol_v, tol_l = self._tols(lam_n, vscale)
            viol = self._violations(lam_n, sigma, nc, mu, modes, lim_act, dc, dl, tol_v, tol_l)
            if viol is None:
                # (if Newton stopped short, e.g. on redundant constraints whose g is inconsistent
                # at the level of the tolerance, the natural residual decides)
                out = self._finish(G, g, nc, mu, modes, lim_act, lam_n, sigma, dG, dc, vscale)
                if out is None:
                    return None
                lam_n, sigma, modes, lim_act, its, res = out
                return lam_n, sigma, modes, lim_act, total + its, res
            new_modes, new_lim, vc, vl = viol
            if not ok or single or _key(new_modes, new_lim) in seen:
                # Newton failed (the iterate only hints at the modes) or the modes cycled: from
                # now on switch one row at a time
                single = True
                cand_modes, cand_lim = new_modes, new_lim
                new_modes, new_lim = modes.copy(), lim_act.copy()
                viol = np.concatenate((vc, vl))
                j = int(np.argmax(viol))
                if j < nc:
                    new_modes[j] = cand_modes[j]
                else:
                    new_lim[j - nc] = cand_lim[j - nc]
                if seen.get(_key(new_modes, new_lim), 0) >= 2:
                    return None     # (a set of modes may come back once, from other impulses)
            modes, lim_act = new_modes, new_lim
            lam = self._prepare(lam_n, nc, mu, modes, lim_act)
        return None

    @staticmethod
    def _prepare(lam, nc, mu, modes, lim_act):
        """Starting impulses for a set of modes: eliminated rows cleared, sliding contacts on
        their cone boundary with a nonnegative normal impulse."""
        k = 3 * nc
        ml = modes.tolist()
        if nc and (BREAKING in ml or SLIDING in ml):
            lc = lam[:k].reshape(nc, 3)
            brk = modes == BREAKING
            if brk.any():
                lc[brk] = 0.0
            sld = modes == SLIDING
            if sld.any():
                # on the boundary: radially when the normal impulse pushes, else the projection
                # (an impulse that pulls but is not in the polar cone keeps its direction)
                ls = lc[sld]
                ln = ls[:, 2]
                nlt = np.sqrt(ls[:, 0] ** 2 + ls[:, 1] ** 2)
                f = np.where(nlt > 0.0, mu[sld] * ln / np.where(nlt > 0.0, nlt, 1.0), 0.0)
                radial = np.column_stack((ls[:, 0] * f, ls[:, 1] * f, ln))
                lc[sld] = np.where((ln > 0.0)[:, None], radial, project_cone(ls, mu[sld]))
        if lam.size > k and not all(lim_act.tolist()):
            lam[k:][~lim_act] = 0.0
        return lam

    def _finish(self, G, g, nc, mu, modes, lim_act, lam, sigma, dG, dc, vscale):
        """Accept an active-set solution and make its modes canonical:

        - contacts whose impulse is negligible (and that do not approach) are breaking;
        - breaking contacts that touch (zero normal velocity: redundant points, e.g. a corner of
          a sliding box whose load the other corners can carry) are re-activated when a solution
          with them exists: the load is then shared (minimum norm) instead of depending on the
          order of the mode switches;
        - sliding contacts that do not slip are re-labelled sticking (re-solving with those
          modes), which keeps the gradients' sliding terms (``mu lam_N / ||sigma_T||``) finite;

        then check the natural residual."""
        its = 0
        if nc:
            k = 3 * nc
            dl = dG[k:]
            tol_v, tol_l = self._tols(lam, vscale)
            lc = lam[:k].reshape(nc, 3)
            sc = sigma[:k].reshape(nc, 3)
            if nc <= _SMALL:
                L, S = lam.tolist(), sigma.tolist()
                any_tiny = any(md != BREAKING and max(abs(L[3 * i]), abs(L[3 * i + 1]),
                                                       abs(L[3 * i + 2])) <= tol_l
                               and S[3 * i + 2] >= -tol_v for i, md in enumerate(modes.tolist()))
            else:
                any_tiny = True
            if any_tiny:
                tiny = (modes != BREAKING) & (np.abs(lc).max(axis=1) <= tol_l) & (sc[:, 2] >= -tol_v)
            if any_tiny and tiny.any():
                modes = modes.copy()
                modes[tiny] = BREAKING
                lam = lam.copy()
                lam[:k].reshape(nc, 3)[tiny] = 0.0
                sigma = G @ lam + g
                sc = sigma[:k].reshape(nc, 3)
            ml = modes.tolist()
            if BREAKING in ml:
                brk = modes == BREAKING
                touch = brk & (np.abs(sc[:, 2]) <= 10.0 * tol_v)
                if touch.any() and not brk.all():
                    slip = np.sqrt(sc[:, 0] ** 2 + sc[:, 1] ** 2)
                    modes2 = modes.copy()
                    modes2[touch] = np.where(slip[touch] > tol_v, SLIDING, STICKING)
                    lam2 = self._prepare(lam.copy(), nc, mu, modes2, lim_act)
                    # (at least one minimum-norm step: the current impulses may already solve
                    # the equations with the re-activated contacts unloaded)
                    lam2, sigma2, ok, n2 = self._newton(G, g, nc, mu, modes2, lim_act, lam2, dc,
                                                        vscale, min_steps=1)
                    its += n2
                    tv, tl = self._tols(lam2, vscale)
                    carried = np.abs(lam2[:k].reshape(nc, 3)[touch]).max(axis=1) > tl
                    if ok and carried.all() and self._violations(lam2, sigma2, nc, mu, modes2,
                                                                 lim_act, dc, dl, tv, tl) is None:
                        lam, sigma, modes = lam2, sigma2, modes2
                        sc = sigma[:k].reshape(nc, 3)
                        tol_v, tol_l = tv, tl
            if SLIDING in modes.tolist():
                slip = np.sqrt(sc[:, 0] ** 2 + sc[:, 1] ** 2)
                slow = (modes == SLIDING) & (slip <= tol_v)
                if slow.any():
                    modes2 = modes.copy()
                    modes2[slow] = STICKING
                    lam2, sigma2, ok, n2 = self._newton(G, g, nc, mu, modes2, lim_act, lam, dc,
                                                        vscale, anchored=True)
                    its += n2
                    tv, tl = self._tols(lam2, vscale)
                    if ok and self._violations(lam2, sigma2, nc, mu, modes2, lim_act, dc, dl,
                                               tv, tl) is None:
                        lam, sigma, modes = lam2, sigma2, modes2
        res = _natres(lam, sigma, nc, mu, dc, dG[3 * nc:])
        if res <= self.settings.tol:
            return lam, sigma, modes, lim_act, its, res
        return None

    # -- stage 1b: proximal active-set Newton ---------------------------------------------
    def _proximal(self, G, g, nc, mu, modes, lim_act, lam, dG, dc, vscale):
        """Stage 1b from one start: ``solver_kernels.proximal`` (the one implementation; it
        runs as plain Python under ``DIFFGYM_JIT=0``). Proximal-point iterations whose
        subproblems are the NCPs of ``G + rho I`` and ``g - rho lam_k`` (unique impulses where
        contacts are redundant), each solved by the compiled active set from the previous
        modes, then the active set on the original problem. Returns ``_active_set``'s tuple
        or None. Uses ``self._zero_rows`` set by ``_solve``."""
        s = self.settings
        m = G.shape[0]
        zero = self.__dict__.get("_zero_rows")
        f64 = np.float64
        out = _sk.proximal(np.ascontiguousarray(G, dtype=f64), np.ascontiguousarray(g, dtype=f64),
                           int(nc), np.ascontiguousarray(mu, dtype=f64),
                           np.ascontiguousarray(modes, dtype=np.int64),
                           np.ascontiguousarray(lim_act, dtype=np.bool_),
                           np.ascontiguousarray(lam, dtype=f64),
                           np.ascontiguousarray(dG, dtype=f64), np.ascontiguousarray(dc, dtype=f64),
                           np.zeros(m, dtype=np.bool_) if zero is None else zero,
                           zero is not None, float(vscale), int(s.newton_budget), float(s.tol),
                           float(s.mode_tol), int(s.newton_iter), int(s.mode_rounds),
                           None, None, None, None)
        if not out[0]:
            return None
        return out[1:]

    # -- stage 2: semismooth Newton on the natural map ------------------------------------
    def _natural_map(self, G, g, nc, mu, lam, rc, rl):
        """F(lam) = lam - P_K(lam - r (sigma + Gamma(sigma))) (contacts), lam - max(0, lam - r
        sigma) (limits); returns F, sigma and the projection arguments y."""
        k = 3 * nc
        sigma = G @ lam + g
        F = np.empty_like(lam)
        yc = yl = None
        if nc:
            lc = lam[:k].reshape(nc, 3)
            yc = lc - rc[:, None] * desaxce(sigma[:k].reshape(nc, 3), mu)
            F[:k] = (lc - project_cone(yc, mu)).reshape(-1)
        if lam.size > k:
            yl = lam[k:] - rl * sigma[k:]
            F[k:] = lam[k:] - np.maximum(yl, 0.0)
        return F, sigma, yc, yl

    def _ssn(self, G, g, nc, mu, lam, dG, dc, max_iter=60):
        """Semismooth Newton with a backtracking line search on the natural map. Robust where
        the active-set iteration cannot guess the modes (many contacts changing between stick
        and slip at once). Returns (lam, sigma, modes, lim_act, iterations) where the modes are
        the regions of the projections at the last iterate."""
        m = G.shape[0]
        k = 3 * nc
        nl = m - k
        rc = 1.0 / dc
        rl = 1.0 / dG[k:]
        wv = dG.copy()                    # merit in velocity units
        if nc:
            wv[:k] = np.repeat(dc, 3)
        lam = self._project(lam, nc, mu)
        F, sigma, yc, yl = self._natural_map(G, g, nc, mu, lam, rc, rl)
        phi = float(np.sum((wv * F) ** 2))
        tol2 = (1e-3 * self.settings.tol) ** 2
        eye3 = np.eye(3)
        it = 0
        for it in range(1, max_iter + 1):
            if phi <= tol2:
                break
            J = np.zeros((m, m))
            if nc:
                yt = yc[:, :2]
                nt = np.sqrt(yt[:, 0] ** 2 + yt[:, 1] ** 2)
                yn = yc[:, 2]
                inside = (nt <= mu * yn) & (yn >= 0.0)
                polar = ~inside & (mu * nt + yn <= 0.0)
                bnd = ~(inside | polar)
                dP = np.zeros((nc, 3, 3))
                dP[inside] = eye3
                if bnd.any():
                    mb = mu[bnd]
                    ntb = nt[bnd]
                    v = yt[bnd] / ntb[:, None]
                    alpha = (mb * ntb + yn[bnd]) / (1.0 + mb * mb)
                    c = 1.0 / (1.0 + mb * mb)
                    blk = np.zeros((int(bnd.sum()), 3, 3))
                    blk[:, :2, :2] = ((mb * mb * c)[:, None, None] * v[:, :, None] * v[:, None, :]
                                      + (mb * alpha / ntb)[:, None, None]
                                      * (np.eye(2) - v[:, :, None] * v[:, None, :]))
                    blk[:, :2, 2] = (mb * c)[:, None] * v
                    blk[:, 2, :2] = (mb * c)[:, None] * v
                    blk[:, 2, 2] = c
                    dP[bnd] = blk
                # d(sigma + Gamma) = H d sigma,  H = I + e_n mu u^T
                sc = sigma[:k].reshape(nc, 3)
                ns = np.sqrt(sc[:, 0] ** 2 + sc[:, 1] ** 2)
                H = np.broadcast_to(eye3, (nc, 3, 3)).copy()
                H[:, 2, :2] = (mu / np.where(ns > 0.0, ns, np.inf))[:, None] * sc[:, :2]
                M2 = rc[:, None, None] * np.einsum("nij,njk->nik", dP, H)
                Jc = np.einsum("nij,njm->nim", M2, G[:k].reshape(nc, 3, m))
                rows = np.arange(nc)
                for a in range(3):
                    for b in range(3):
                        Jc[rows, a, 3 * rows + b] += eye3[a, b] - dP[:, a, b]
                J[:k] = Jc.reshape(k, m)
            if nl:
                on = yl > 0.0
                J[k:] = np.where(on[:, None], rl[:, None] * G[k:], 0.0)
                J[k + np.flatnonzero(~on), k + np.flatnonzero(~on)] = 1.0
            delta = np.linalg.lstsq(wv[:, None] * J, -(wv * F), rcond=1e-12)[0]
            t = 1.0
            while True:
                lam_new = lam + t * delta
                F_new, sigma_new, yc_new, yl_new = self._natural_map(G, g, nc, mu, lam_new, rc, rl)
                phi_new = float(np.sum((wv * F_new) ** 2))
                if phi_new <= (1.0 - 1e-4 * t) * phi:
                    break
                t *= 0.5
                if t < 1e-4:
                    break
            if t < 1e-4:
                break
            lam, F, sigma, yc, yl, phi = lam_new, F_new, sigma_new, yc_new, yl_new, phi_new
        if nc:
            yt = yc[:, :2]
            nt = np.sqrt(yt[:, 0] ** 2 + yt[:, 1] ** 2)
            inside = (nt <= mu * yc[:, 2]) & (yc[:, 2] >= 0.0)
            polar = ~inside & (mu * nt + yc[:, 2] <= 0.0)
            modes = np.where(polar, BREAKING, np.where(inside, STICKING, SLIDING)).astype(np.int64)
        else:
            modes = np.zeros(0, dtype=np.int64)
        lim_act = yl > 0.0 if nl else np.zeros(0, dtype=bool)
        return lam, sigma, modes, lim_act, it

    # -- stage 2': pinocchio's ADMM (C++), when available ---------------------------------
    def _pin_admm(self, G, g, nc, mu, lam0, tol, max_iter):
        """pinocchio's ``ADMMConstraintSolver`` (``solve_ncp``) on the same problem: a limit row
        is embedded as a frictionless point contact (two decoupled dummy tangential rows).
        Returns (lam, sigma, iterations) or None when pinocchio's solver is not available."""
        try:
            import pinocchio as pin
            pin.ADMMConstraintSolver, pin.PointContactConstraintModel   # noqa: B018
        except (ImportError, AttributeError):
            return None
        m = G.shape[0]
        k = 3 * nc
        nl = m - k
        M = int(k + 3 * nl)
        idx = np.concatenate((np.arange(k), k + 3 * np.arange(nl) + 2))
        Ge = np.zeros((M, M))
        Ge[np.ix_(idx, idx)] = G
        if nl:
            dummy = k + 3 * np.arange(nl)
            dmean = float(np.mean(np.diagonal(G)))
            Ge[dummy, dummy] = dmean
            Ge[dummy + 1, dummy + 1] = dmean
        ge = np.zeros(M)
        ge[idx] = g
        mue = np.concatenate((mu, np.zeros(nl)))
        cache = self.__dict__.setdefault("_pin_cache", {})
        key = mue.tobytes()
        entry = cache.get(key)
        try:
            if entry is None:
                model = cache.get("model")
                if model is None:
                    model = pin.Model()
                    model.addJoint(0, pin.JointModelFreeFlyer(), pin.SE3.Identity(), "body")
                    model.appendBodyToJoint(1, pin.Inertia.FromSphere(1.0, 0.1), pin.SE3.Identity())
                    cache["model"] = model
                models = pin.StdVec_ConstraintModel()
                for f in mue:
                    pc = pin.PointContactConstraintModel(model, 1)
                    pc.setFriction(float(f))
                    models.append(pin.ConstraintModel(pc))
                datas = pin.StdVec_ConstraintData()
                for cm in models:
                    datas.append(cm.createData())
                if len(cache) > 64:
                    cache.clear()
                    cache["model"] = model
                entry = cache[key] = (models, datas)
            models, datas = entry
            st = pin.ADMMSolverSettings()
            st.solve_ncp = True
            st.max_iterations = int(max_iter)
            st.absolute_feasibility_tol = st.absolute_complementarity_tol = tol
            st.relative_feasibility_tol = st.relative_complementarity_tol = tol
            res = pin.ADMMSolverResult()
            res.resize(M)
            guess = np.zeros(M)
            guess[idx] = self._project(lam0, nc, mu)
            res.setConstraintImpulseGuess(guess)
            pin.ADMMConstraintSolver(M).solve(pin.DelassusOperatorDense(Ge), ge, models, datas,
                                              st, res)
            lam = np.asarray(res.retrieveConstraintImpulses(), dtype=float)[idx].copy()
        except Exception:           # pragma: no cover - a pinocchio without this API
            return None
        if not np.isfinite(lam).all():
            return None
        lam = self._project(lam, nc, mu)
        return lam, G @ lam + g, int(res.iterations)

    # -- stage 4: ADMM -------------------------------------------------------------------
    def _admm(self, G, g, nc, mu, lam0, dG, tol, max_iter):
        m = G.shape[0]
        scale = float(np.mean(dG))
        rho = scale
        eta = 1e-6 * scale
        eye = np.eye(m)
        A_inv = np.linalg.inv(G + (rho + eta) * eye)
        z = self._project(lam0, nc, mu)
        x = z.copy()
        y = -(G @ z + g)
        y = -self._project_dual(-y, nc, mu)
        res = np.inf
        best, best_res = z.copy(), natural_residual(z, G @ z + g, nc, mu, dG)
        it = 0
        shift = np.zeros(m)
        for it in range(1, max_iter + 1):
            sigma = G @ z + g
            if nc:
                shift[2:3 * nc:3] = mu * np.hypot(sigma[0:3 * nc:3], sigma[1:3 * nc:3])
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
                    A_inv = np.linalg.inv(G + (rho + eta) * eye)
                elif dual > 10 * primal:
                    rho /= 2.0
                    A_inv = np.linalg.inv(G + (rho + eta) * eye)
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
        """Modes of an (approximate) solution: breaking if lam_N <= tol_l, sliding if the slip
        exceeds tol_v (or mu = 0), else sticking; limits active if lam > tol_l."""
        k = 3 * nc
        lc = lam[:k].reshape(nc, 3)
        sc = sigma[:k].reshape(nc, 3)
        slip = np.sqrt(sc[:, 0] ** 2 + sc[:, 1] ** 2)
        modes = np.where(lc[:, 2] <= tol_l, BREAKING,
                         np.where((mu == 0) | (slip > tol_v), SLIDING, STICKING)).astype(np.int64)
        lim_act = lam[k:] > tol_l
        return modes, lim_act

    def _polish(self, G, g, nc, mu, lam, sigma, dG, dc, vscale, budget=None):
        """Active-set Newton seeded with the modes of an approximate solution (3 thresholds, each
        with ``budget`` Newton iterations). Returns the active-set result or None."""
        scale_l = max(1e-12, float(np.max(np.abs(lam))))
        budget = self.settings.newton_budget if budget is None else budget
        for f in (1e-5, 1e-3, 1e-7):
            modes, lim_act = self.classify(lam, sigma, nc, mu, f * vscale, f * scale_l)
            out = self._aset(G, g, nc, mu, modes, lim_act, lam, dG, dc, vscale, budget)
            if out is not None:
                return out
        return None

    def _aset(self, G, g, nc, mu, modes, lim_act, lam, dG, dc, vscale, budget=None,
              rounds=None):
        """``_active_set``, compiled (``solver_kernels.active_set``) unless
        ``settings.compiled`` is False. Uses ``self._zero_rows`` set by ``solve``."""
        s = self.settings
        if not s.compiled:
            return self._active_set(G, g, nc, mu, modes, lim_act, lam, dG, dc, vscale, budget,
                                    rounds)
        budget = s.mode_rounds * s.newton_iter if budget is None else budget
        rounds = s.mode_rounds if rounds is None else int(rounds)
        m = G.shape[0]
        zero = self.__dict__.get("_zero_rows")
        out = _sk.active_set(np.ascontiguousarray(G, dtype=np.float64),
                             np.ascontiguousarray(g, dtype=np.float64), int(nc),
                             np.ascontiguousarray(mu, dtype=np.float64),
                             np.ascontiguousarray(modes, dtype=np.int64),
                             np.ascontiguousarray(lim_act, dtype=np.bool_),
                             np.ascontiguousarray(lam, dtype=np.float64),
                             np.ascontiguousarray(dG, dtype=np.float64),
                             np.ascontiguousarray(dc, dtype=np.float64),
                             np.zeros(m, dtype=np.bool_) if zero is None else zero,
                             zero is not None, float(vscale), int(budget), float(s.tol),
                             float(s.mode_tol), int(s.newton_iter), int(rounds),
                             None, None, None, None)
        if not out[0]:
            return None
        return out[1:]

    # -- entry point -----------------------------------------------------------------------
    def solve(self, G: np.ndarray, g: np.ndarray, nc: int, mu: np.ndarray,
              lam0: np.ndarray | None = None, modes0: np.ndarray | None = None) -> SolverResult:
        """Solve the NCP ``sigma = G lam + g`` for ``nc`` contacts (3 rows each, ordered (t1, t2,
        n), friction ``mu``) followed by 1-row joint limits. ``lam0``/``modes0`` warm start it
        (modes0: nc contact modes, then optionally one 0/1 per limit)."""
        s = self.settings
        if s.compiled:
            # stage 1 compiled, preamble included: a thin wrapper (the common case). The step's
            # own arrays (C-contiguous float64) go to the kernel as they are.
            if not (type(G) is np.ndarray and G.dtype == _F64 and G.flags.c_contiguous
                    and type(g) is np.ndarray and g.dtype == _F64 and g.flags.c_contiguous
                    and type(mu) is np.ndarray and mu.dtype == _F64 and mu.flags.c_contiguous
                    and G.ndim == 2 and g.ndim == 1 and mu.ndim == 1
                    and (lam0 is None or (type(lam0) is np.ndarray and lam0.dtype == _F64
                                          and lam0.ndim == 1 and lam0.flags.c_contiguous))
                    and (modes0 is None or (type(modes0) is np.ndarray and modes0.dtype == _I64
                                            and modes0.ndim == 1 and modes0.flags.c_contiguous))):
                G = np.ascontiguousarray(G, dtype=np.float64)
                g = np.ascontiguousarray(g, dtype=np.float64).reshape(G.shape[0])
                mu = np.ascontiguousarray(mu, dtype=np.float64).reshape(int(nc))
                if lam0 is not None:
                    lam0 = np.ascontiguousarray(lam0, dtype=np.float64).reshape(G.shape[0])
                if modes0 is not None:
                    modes0 = np.ascontiguousarray(modes0, dtype=np.int64).reshape(-1)
            m = G.shape[0]
            if m:
                nc = int(nc)
                out = _sk.solve_stage1(
                    G, g, nc, mu, _EMPTY_F if lam0 is None else lam0,
                    _EMPTY_I if modes0 is None else modes0, modes0 is not None, s.tol,
                    s.mode_tol, s.newton_iter, s.mode_rounds, s.newton_budget,
                    None, None, None, None)
                if out[0]:
                    return SolverResult(out[1], out[2], out[3], out[4], out[5], out[6], True,
                                        "prox+newton" if out[7] else "newton")
        return self._solve(G, g, nc, mu, lam0, modes0, stage1=not s.compiled)

    def _solve(self, G, g, nc, mu, lam0, modes0, stage1=True):
        """``solve`` in Python; ``stage1`` False: stage 1 already failed (compiled), from
        stage 2 on."""
        m = G.shape[0]
        nc = int(nc)
        nl = m - 3 * nc
        s = self.settings
        if m == 0:
            return SolverResult(np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64),
                                np.zeros(0, dtype=bool), 0, 0.0, True, "none")
        G = np.asarray(G, dtype=float)
        g = np.asarray(g, dtype=float)
        mu = np.asarray(mu, dtype=float).reshape(nc)
        diag = np.diagonal(G)
        dmax = float(diag.max())
        dG = np.maximum(diag, 1e-12 * max(1.0, dmax))
        zero = diag <= 1e-14 * dmax
        self._zero_rows = zero if zero.any() else None
        k = 3 * nc
        dc = (dG[0:k:3] + dG[1:k:3] + dG[2:k:3]) / 3.0
        vscale = max(max(map(abs, g.tolist())), 1e-3 * s.tol)
        lam = np.zeros(m) if lam0 is None else np.array(lam0, dtype=float).reshape(m)
        t = float(lam.sum())
        if t - t != 0.0:                   # not finite
            lam = np.zeros(m)
        if modes0 is None:
            # a contact whose free velocity already separates it starts as breaking
            modes = np.where(g[2:k:3] >= 0.0, BREAKING, STICKING).astype(np.int64)
            lim0 = g[k:] < 0.0
        else:
            given = np.asarray(modes0, dtype=np.int64)
            modes = given[:nc].copy()
            ml = modes.tolist()
            if nc and (min(ml) < BREAKING or max(ml) > SLIDING):
                modes = np.where(modes == BREAKING, BREAKING, STICKING)
            lim0 = given[nc:].astype(bool) if len(given) > nc else g[k:] < 0.0
        lim0 = np.asarray(lim0, dtype=bool).reshape(nl)
        # stage 1: active-set Newton from the warm start
        out = (self._active_set(G, g, nc, mu, modes, lim0, lam, dG, dc, vscale, s.newton_budget)
               if stage1 else None)
        if out is not None:
            lam, sigma, modes, lim_act, its, res = out
            return SolverResult(lam, sigma, modes, lim_act, its, res, True, "newton")
        its = s.newton_budget
        # the warm start's modes led the iteration into a cycle: again from the cold start
        # (given a warm start; solve_stage1 the same)
        cold = ((STICKING,) if _sk.COLD_RESTART and (lam0 is not None or modes0 is not None)
                else ())
        for md in (cold if stage1 else ()):
            out = self._active_set(G, g, nc, mu,
                                   np.where(g[2:k:3] >= 0.0, BREAKING, md).astype(np.int64),
                                   g[k:] < 0.0, np.zeros(m), dG, dc, vscale, s.newton_budget)
            if out is not None:
                lam_c, sigma, modes_c, lim_act, its_c, res = out
                return SolverResult(lam_c, sigma, modes_c, lim_act, its + its_c, res, True,
                                    "newton")
            its += s.newton_budget
        if not stage1 and s.compiled:
            # (solve_stage1 already tried the cold starts and stage 1b: their budgets, counted
            # as here)
            its += s.newton_budget * (len(cold) + 3)
        # stage 1b: proximal active-set Newton (regularized subproblems; see _proximal), from
        # the warm start, then from a cold start (compiled: part of solve_stage1, already run)
        approach = g[2:k:3] < 0.0
        starts = ((modes, lim0, lam),
                  (np.where(approach, STICKING, BREAKING).astype(np.int64), g[k:] < 0.0,
                   np.zeros(m)),
                  (np.where(approach, SLIDING, BREAKING).astype(np.int64), g[k:] < 0.0,
                   np.zeros(m)))
        for start in (starts if stage1 or not s.compiled else ()):
            out = self._proximal(G, g, nc, mu, *start, dG, dc, vscale)
            if out is not None:
                return SolverResult(*out[:4], its + out[4], out[5], True, "prox+newton")
            its += s.newton_budget
        # stage 2: a short run of pinocchio's ADMM (C++, fast), then active-set Newton from its
        # modes; stage 3: semismooth Newton on the natural map, then active-set Newton from its
        # modes; then longer runs of pinocchio's ADMM (only while its polish fails)
        lam_p = lam
        caps = (200, 0, 1000, 2 * s.max_iter) if s.pin_fallback else (0,)
        pin_done = False
        for cap in caps:
            if cap == 0:
                lam_s, sigma_s, modes_s, lim_s, its_s = self._ssn(G, g, nc, mu, lam, dG, dc)
                its += its_s
                out = self._aset(G, g, nc, mu, modes_s, lim_s, lam_s, dG, dc, vscale,
                                 s.newton_budget)
                if out is None:
                    out = self._polish(G, g, nc, mu, lam_s, sigma_s, dG, dc, vscale, 10)
                if out is not None:
                    return SolverResult(*out[:4], its + out[4], out[5], True, "ssn+newton")
                continue
            if pin_done:
                continue
            out_p = self._pin_admm(G, g, nc, mu, lam_p, 1e-11, cap)
            if out_p is None:
                pin_done = True
                continue
            lam_p, sigma_p, its_p = out_p
            its += its_p
            out = self._polish(G, g, nc, mu, lam_p, sigma_p, dG, dc, vscale,
                               s.newton_budget if cap == caps[-1] else 10)
            if out is not None:
                return SolverResult(*out[:4], its + out[4], out[5], True, "pinadmm+newton")
            pin_done = its_p < cap         # converged: more iterations will not help
        # stage 4: our ADMM, then polish its modes; if ADMM stalls, projected Gauss-Seidel
        lam_a, sigma_a, its_a, res_a = self._admm(G, g, nc, mu, lam, dG, max(s.tol, 1e-7),
                                                  s.max_iter)
        its += its_a
        out = self._polish(G, g, nc, mu, lam_a, sigma_a, dG, dc, vscale)
        if out is not None:
            return SolverResult(*out[:4], its + out[4], out[5], True, "admm+newton")
        method = "admm"
        if res_a > s.tol:
            lam_p, sigma_p, its3, res_p = self._pgs(G, g, nc, mu, lam_a, dG, max(s.tol, 1e-7), 500)
            its += its3
            if res_p < res_a:
                method = "pgs"
                lam_a, sigma_a, res_a = lam_p, sigma_p, res_p
                out = self._polish(G, g, nc, mu, lam_a, sigma_a, dG, dc, vscale)
                if out is not None:
                    return SolverResult(*out[:4], its + out[4], out[5], True, "pgs+newton")
        scale_l = max(1e-12, float(np.max(np.abs(lam_a))))
        modes, lim_act = self.classify(lam_a, sigma_a, nc, mu, 1e-6 * vscale, 1e-6 * scale_l)
        return SolverResult(lam_a, sigma_a, modes, lim_act, its, res_a, res_a <= s.tol, method)
