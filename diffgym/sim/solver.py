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

   Systems are solved by LU
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
1b. If that fails, **proximal active-set Newton** (``solver_kernels.proximal``): proximal-point
   iterations whose subproblems are the NCPs of ``G + rho I`` and ``g - rho lam_k`` (``rho =
   1e-6`` of the mean Delassus diagonal), each solved by the same active-set kernel from the
   previous modes, then the active-set Newton on the original problem from the modes found;
   tried from the warm start, a cold all-sticking start and an all-sliding start. (Where these
   fail and the rows' drift offsets are not realizable, stages 1 and 1b once more with them
   made realizable: ``SolverSettings.realizable_bias``.)
1c. If that fails, the **limit of the uniformly compliant problems**
   (``solver_kernels.compliance_limit``, islands of fewer than ``BODY_MIN_ROWS`` rows): the
   NCPs of ``G + rho I`` (every contact and limit made equally compliant; their impulses are
   unique) are solved by the same active-set kernel from a cold start at ``rho`` = the mean
   Delassus diagonal, then with ``rho`` stepped down by 10x (less where a subproblem is not
   solved), each from the last solution, to ``1e-8`` of the mean diagonal; from that
   solution's modes and impulses the active-set Newton on the original problem (its
   minimum-norm steps move the impulses by O(rho)). Stages 1b and 1c are reported as
   ``prox+newton``. Redundant contacts (a face on a face) make the impulses non-unique and the
   plain iteration can wander between equivalent impulses and modes: on box piles pushed by
   random forces (tests/test_pile_stages.py) stages 1 and 1b fail on most steps, which reached
   the later stages before stage 1c and now all converge in it.

   **Which solution a step returns where more than one is valid.** Where a redundant face's
   contacts slide (a box pushed over a box or the floor, turning) not only the impulses but the
   velocity is not unique: the split of the normal impulse among the face's corners is free,
   and it changes the friction torque (two solutions of one problem with natural residual
   <= 1e-11 differed by up to 4.4e-3 m/s). The step returns
   - where stage 1 or 1b converges: its solution, the one Newton reaches from the previous
     step's impulses and modes (it may depend on that warm start);
   - else (stage 1c) the limit of the uniformly compliant problems as rho -> 0, the rigid limit
     of contacts that are all equally stiff: a function of the step's problem alone, not of
     the warm start (measured on the problems stage 1 failed on along the pushed piles: from
     the warm start instead of the cold one the velocity agrees to 6e-8 m/s; stopped at
     rho = 1e-10 or 1e-11 instead of 1e-8, to 4e-7 m/s);
   - else the later stages' solution (path-dependent).
   Where the velocity is unique (faces sticking, or sliding without turning; every
   non-redundant problem) all of these are the same solution. The step Jacobian is taken at
   the returned solution by its contact modes (``derivatives``: the minimum-norm solution of
   the linearized mode equations). Where the velocity is not unique that is not the derivative
   of the selection rule above (which also moves the split of the impulses), and it does not
   match central differences of the step (``gradcheck`` reports such columns as
   indeterminate).
2. If that fails (many contacts changing between stick and slip at once), approximate solutions
   seed stage 1 again ("polish", modes classified at three thresholds): a short run of
   pinocchio's ``ADMMConstraintSolver`` (C++, ``solve_ncp``; limits are embedded as frictionless
   point contacts), then a semismooth Newton method on the natural map (ours), then longer
   pinocchio ADMM runs, then our ADMM and projected Gauss-Seidel. If nothing reaches the
   tolerance, the best iterate is returned with ``converged = False``.

Stages 1, 1b and 1c have one implementation each, compiled with numba (``solver_kernels.py``:
``active_set``, ``proximal`` and ``compliance_limit``, with a hand-written LU, LAPACK's Cholesky for the rank test and
a Jacobi SVD for the minimum-norm least squares of up to 32 unknowns; ``DIFFGYM_JIT=0`` runs
them as plain Python), and run in one call (``solver_kernels.solve_stage1``) for every caller:
the step's fused compiled call, ``NCPSolver.solve`` (any ``SolverSettings``, user subclasses,
the stage-by-stage path of ``SolverSettings(compiled=False)``); the polish of stages 2-4
calls ``active_set`` (``_aset``). ``tests/test_solver.py`` and ``tests/test_solver_kernels.py`` check them against
independent oracles: the NCP's defining conditions, pinocchio's ADMM on the same problems and
closed forms. Stages 2-4 are Python (rare).

Convergence is measured by the natural-map residual in velocity units (m/s),
``max_i || D_i (lam_i - P_K(lam_i - D_i^-1 (sigma_i + Gamma(sigma_i)))) ||`` with ``D_i`` the
mean diagonal of the Delassus block, which is zero exactly at an NCP solution. Where Newton
converges, the mode equations hold to machine precision; only where the data themselves are
inconsistent (redundant constraints whose ``g`` is not in the range of ``G``, at the level of
the tolerance) is a solution accepted on the natural residual with the equations holding to
that level.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import solver_kernels as _sk

BREAKING, STICKING, SLIDING = 0, 1, 2
MODE_NAMES = ("breaking", "sticking", "sliding")

_EMPTY_F = np.zeros(0)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_EMPTY_I = np.zeros(0, dtype=np.int64)


@dataclass
class SolverSettings:
    tol: float = 1e-9            # natural-map residual (m/s) for convergence
    max_iter: int = 2000         # ADMM iterations
    newton_iter: int = 20        # Newton iterations per active set
    mode_rounds: int = 12        # active-set repairs
    mode_tol: float = 1e-10      # tolerance of the mode conditions (relative)
    newton_budget: int = 30      # Newton iterations of the warm-started active-set stage
    pin_fallback: bool = True    # use pinocchio's ADMM (C++) as the first fallback
    realizable_bias: bool = True   # where stage 1 fails on an island, solve it once more with
    #                              the drift correction of its touching rows made realizable
    #                              (constraint.realizable_bias) and keep that where stage 1 then
    #                              succeeds: redundant contacts (the steady push of DiffPush-v0)
    #                              converge in stage 1 instead of the slow later stages. The
    #                              step Jacobian includes the projection's derivative
    #                              (derivatives._realizable_terms; the step records what it
    #                              projected, Constraints.projected). False: the raw offsets
    compiled: bool = True        # a step's constrained part (limits, assembly, warm start and
    #                              stage 1) in one compiled call (forward._constrained_step);
    #                              False: stage by stage (ConstraintBuilder.assemble, then
    #                              solve(), whose stage 1 is the same kernel either way)
    max_depenetration_speed: float = field(default_factory=lambda: _default_depenetration())
    #                              m/s: the fastest push-out of a penetrating contact, its
    #                              Baumgarte offset max(erp d / dt, -this) (constraint module
    #                              docstring; inf: no cap). Default
    #                              constraint.MAX_DEPENETRATION_SPEED (1 m/s) at construction;
    #                              a value that is not a speed > 0 is refused (ValueError)

    def __setattr__(self, name, value):
        if name == "max_depenetration_speed":
            from .constraint import check_depenetration_speed
            value = check_depenetration_speed(value)
        object.__setattr__(self, name, value)


def _default_depenetration() -> float:
    from . import constraint
    return constraint.MAX_DEPENETRATION_SPEED


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
    #                              step's check of the final velocity failed, converged=False);
    #                              with equality/friction rows (ExtraRows.solve, sim.last gets
    #                              "+rows") also "elimination", "mixedprox" (converged) and
    #                              "soft" (no stage solved it: converged=False)


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
    """Natural-map residual (velocity units) of an NCP iterate; zero exactly at a solution
    (``solver_kernels.natres``, the residual stage 1 accepts its solutions on)."""
    nc = int(nc)
    k = 3 * nc
    f64 = np.float64
    dG = np.ascontiguousarray(dG, dtype=f64)
    dc = (dG[0:k:3] + dG[1:k:3] + dG[2:k:3]) / 3.0
    return float(_sk.natres(np.ascontiguousarray(lam, dtype=f64),
                            np.ascontiguousarray(sigma, dtype=f64), nc,
                            np.ascontiguousarray(mu, dtype=f64).reshape(nc), dc, dG))


class NCPSolver:
    def __init__(self, settings: SolverSettings | None = None):
        self.settings = settings or SolverSettings()

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
            A = wv[:, None] * J
            if not (np.isfinite(A).all() and np.isfinite(F).all()):
                # (LAPACK's dgelsd prints "DLASCL parameter number 4 had an illegal value" on a
                # non-finite matrix before failing: refused here, as an error of the step)
                raise np.linalg.LinAlgError(
                    f"the semismooth Newton iterate became non-finite at iteration {it}")
            delta = np.linalg.lstsq(A, -(wv * F), rcond=1e-12)[0]
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
        """Stage 1's active-set Newton from the given modes (``solver_kernels.active_set``, its
        one implementation): (lam, sigma, modes, lim_act, iterations, residual) or None.
        ``budget`` bounds the Newton iterations of all rounds, ``rounds`` the mode switches.
        Uses ``self._zero_rows`` set by ``_solve``."""
        s = self.settings
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
              lam0: np.ndarray | None = None, modes0: np.ndarray | None = None,
              bias: tuple | None = None) -> SolverResult:
        """Solve the NCP ``sigma = G lam + g`` for ``nc`` contacts (3 rows each, ordered (t1, t2,
        n), friction ``mu``) followed by 1-row joint limits. ``lam0``/``modes0`` warm start it
        (modes0: nc contact modes, then optionally one 0/1 per limit). ``bias``: ``(b, keep)``,
        the rows' drift offsets (``g = J v_free + b``; float64 (m,)) and the rows whose offset
        stage 1 may make realizable where it fails (bool (m,); ``solve_stage1``'s retry,
        ``SolverSettings.realizable_bias``): where the retry succeeds ``b`` and ``g`` hold the
        realizable offsets (in place; ``g`` then must be the caller's float64 array).

        Stages 1, 1b and 1c, preamble included, are one compiled call
        (``solver_kernels.solve_stage1``, whatever ``settings.compiled`` says); stages 2-4 (rare)
        run here in Python."""
        s = self.settings
        # The step's own arrays (C-contiguous float64) go to the kernel as they are.
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
                None, None, None, None, *((None, None) if bias is None else bias))
            if out[0]:
                return SolverResult(out[1], out[2], out[3], out[4], out[5], out[6], True,
                                    "prox+newton" if out[7] else "newton")
        return self._solve(G, g, nc, mu, lam0, modes0, stage1=False)

    def _solve(self, G, g, nc, mu, lam0, modes0, stage1=True):
        """Stages 2-4 of ``solve`` (stages 1, 1b and 1c failed); ``stage1`` True: the whole of
        ``solve``, stage 1 first."""
        if stage1:
            return self.solve(G, g, nc, mu, lam0, modes0)
        m = G.shape[0]
        nc = int(nc)
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
        # the budgets of solve_stage1's attempts, as it counts them: the warm start, the cold
        # restart (given a warm start, where enabled) and stage 1b's three starts
        cold = _sk.COLD_RESTART and (lam0 is not None or modes0 is not None)
        its = s.newton_budget * (1 + int(cold) + 3)
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
