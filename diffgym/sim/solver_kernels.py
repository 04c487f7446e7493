"""Compiled stage 1 of the NCP solve (``diffgym/sim/solver.py``): the warm-started active-set Newton.

Its one implementation (``NCPSolver.solve`` calls ``solve_stage1`` under any settings, the
step's fused call runs it, the later stages polish with ``active_set``; ``DIFFGYM_JIT=0`` runs
it as plain Python): ``active_set`` with ``_prepare``, ``_newton`` (linear and sliding
branches, line search, iterative refinement, anchored / minimum-norm least-squares steps),
``_tols``, ``_violations`` with its quick test, ``_finish``, ``natres``, ``_rank_deficient``,
``_lin_solve`` and the elimination of rows with a zero Delassus diagonal, the solve's
preamble (``solve_stage1``), and stages 1b and 1c (``proximal``, ``compliance_limit``: both
run ``active_set`` on regularized problems). The linear algebra is written out: matrix-vector
products as loops, LU with partial pivoting (LAPACK ``dgetf2``'s order: reciprocal pivot,
row-oriented rank-1 updates), Cholesky (``dpotrf``) for the rank test, and a Jacobi SVD or numba's
``np.linalg.lstsq`` (LAPACK ``dgelsd``: minimum norm, ``rcond = 1e-11``) for rank-deficient
systems. Tested against independent oracles (tests/test_solver_kernels.py, tests/test_solver.py).

Arrays: ``modes`` int64 (nc), ``lim_act`` bool (nl), everything else float64; kernels allocate
their own outputs and return tuples (``found`` first).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.linalg.lapack import dpotrf as _dpotrf

from .jit import ENABLED, njit

BREAKING, STICKING, SLIDING = 0, 1, 2
_INF = math.inf
_NO_J = np.zeros((0, 0))
_NO_I = np.zeros(0, np.int64)


# -- small helpers ---------------------------------------------------------------------------
@njit
def _maxabs(F):
    """``float(np.abs(F).max())`` (NaN propagates); F is not empty."""
    mx = abs(F[0])
    for i in range(1, F.shape[0]):
        a = abs(F[i])
        if a > mx or a != a:
            mx = a
        if mx != mx:
            break
    return mx


@njit
def _matvec(A, x, b, out):
    """out = A @ x + b."""
    n = A.shape[0]
    c = A.shape[1]
    for i in range(n):
        s = 0.0
        for j in range(c):
            s += A[i, j] * x[j]
        out[i] = s + b[i]


@njit
def _csr_matvec_build(A, x, b, out):
    """``out = A @ x + b`` (``_matvec``) and the nonzeros of A by rows (ptr, col, val), for
    ``_csr_matvec``: a large island's Delassus block is mostly zeros (rows of bodies that share
    no tree), and the body-space Newton steps multiply by it several times. (Row by row: a scan
    that counts, then one that stores, from the cache; the storage grows between rows only.)"""
    n = A.shape[0]
    c = A.shape[1]
    ptr = np.empty(n + 1, np.int64)
    col = np.empty(16 * n + 16, np.int64)
    val = np.empty(16 * n + 16)
    k = 0
    ptr[0] = 0
    for i in range(n):
        s = 0.0
        cnt = 0
        for j in range(c):
            a = A[i, j]
            s += a * x[j]
            cnt += a != 0.0
        out[i] = s + b[i]
        if k + cnt > col.shape[0]:
            col, val = _csr_grow(col, val, k, 2 * (k + cnt))
        _csr_row(A, i, col, val, k)
        k += cnt
        ptr[i + 1] = k
    return ptr, col, val


@njit
def _csr_matvec_trees(A, x, b, out, Jb, act, tlo):
    """``_csr_matvec_build`` (the same ``out`` and the same nonzeros, columns increasing) of a
    Delassus block ``A = Ja M^-1 Ja^T`` whose rows are ``Jb[act]`` (``island_body``'s pair;
    ``tlo``: each local dof's tree by its first dof), reading only the entries of rows that
    share a tree: M^-1 couples only a tree's dofs, so every other entry is an exact zero
    (``constraint.assemble_sparse`` does not compute them) and the terms it would add to
    ``out`` (``0 * x``) change no sum. The scan of every entry cost ~0.3 ms at a 528-row rack
    of 64 balls; this one the work of A's nonzeros."""
    na = act.shape[0]
    n = tlo.shape[0]
    Jv, Jc = Jb
    kb = Jc.shape[1]
    # the distinct trees of each row (by root dof), and the rows of each tree (ascending)
    roots = np.empty((na, kb), np.int64)
    nrt = np.zeros(na, np.int64)
    tptr = np.zeros(n + 1, np.int64)
    for a in range(na):
        ra = act[a]
        k = 0
        for t in range(kb):
            c = Jc[ra, t]
            if c >= 0 and Jv[ra, t] != 0.0:
                r = tlo[c]
                new = True
                for u in range(k):
                    if roots[a, u] == r:
                        new = False
                if new:
                    roots[a, k] = r
                    k += 1
                    tptr[r + 1] += 1
        nrt[a] = k
    for r in range(n):
        tptr[r + 1] += tptr[r]
    trow = np.empty(tptr[n], np.int64)
    fill = tptr[:n].copy()
    for a in range(na):
        for u in range(nrt[a]):
            r = roots[a, u]
            trow[fill[r]] = a
            fill[r] += 1
    cap = 0
    for a in range(na):
        for u in range(nrt[a]):
            r = roots[a, u]
            cap += tptr[r + 1] - tptr[r]
    ptr = np.empty(na + 1, np.int64)
    col = np.empty(cap, np.int64)
    val = np.empty(cap)
    cand = np.empty(cap if cap < na else na, np.int64)
    mark = np.full(na, -1, np.int64)
    k = 0
    ptr[0] = 0
    for a in range(na):
        # the rows sharing a tree with row a, ascending (a merge of its trees' row lists)
        nca = 0
        if nrt[a] == 1:
            r = roots[a, 0]
            for e in range(tptr[r], tptr[r + 1]):
                cand[nca] = trow[e]
                nca += 1
        elif nrt[a] == 2:
            r0 = roots[a, 0]
            r1 = roots[a, 1]
            e0, f0 = tptr[r0], tptr[r0 + 1]
            e1, f1 = tptr[r1], tptr[r1 + 1]
            while e0 < f0 or e1 < f1:
                if e1 >= f1 or (e0 < f0 and trow[e0] < trow[e1]):
                    cand[nca] = trow[e0]
                    e0 += 1
                elif e0 >= f0 or trow[e1] < trow[e0]:
                    cand[nca] = trow[e1]
                    e1 += 1
                else:
                    cand[nca] = trow[e0]
                    e0 += 1
                    e1 += 1
                nca += 1
        elif nrt[a] > 2:
            for u in range(nrt[a]):
                r = roots[a, u]
                for e in range(tptr[r], tptr[r + 1]):
                    c = trow[e]
                    if mark[c] != a:
                        mark[c] = a
                        cand[nca] = c
                        nca += 1
            cand[:nca] = np.sort(cand[:nca])
        s = 0.0
        for e in range(nca):
            j = cand[e]
            v = A[a, j]
            s += v * x[j]
            if v != 0.0:
                col[k] = j
                val[k] = v
                k += 1
        out[a] = s + b[a]
        ptr[a + 1] = k
    return ptr, col, val


@njit
def _csr_grow(col, val, k, cap):
    """CSR column and value buffers of capacity ``cap`` holding the first ``k`` entries of
    ``col``/``val`` (the rest uninitialized)."""
    col2 = np.empty(cap, np.int64)
    val2 = np.empty(cap)
    col2[:k] = col[:k]
    val2[:k] = val[:k]
    return col2, val2


@njit
def _csr_row(A, i, col, val, k):
    """Stores row i's nonzeros of A at ``col[k:]``, ``val[k:]``."""
    for j in range(A.shape[1]):
        a = A[i, j]
        if a != 0.0:
            col[k] = j
            val[k] = a
            k += 1


@njit
def _csr_matvec(ptr, col, val, x, b, out):
    """``out = A @ x + b`` over A's nonzeros (``_csr_matvec_build``), in the order of
    ``_matvec``: the terms it skips are exact zeros (``0 * x`` adds nothing to a finite sum), so
    the result is the same to the bit for finite x."""
    for i in range(ptr.shape[0] - 1):
        s = 0.0
        for t in range(ptr[i], ptr[i + 1]):
            s += val[t] * x[col[t]]
        out[i] = s + b[i]


@njit
def _dot(a):
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i] * a[i]
    return s


@njit
def _cone(x0, x1, xn, mu):
    """``project_cone`` of one (t1, t2, n) vector."""
    nt = math.sqrt(x0 * x0 + x1 * x1)
    if nt <= mu * xn and xn >= 0.0:       # (mu = 0: the cone is the ray xn >= 0)
        return x0, x1, xn
    alpha = (mu * nt + xn) / (mu * mu + 1.0)
    if alpha < 0.0:                       # np.maximum(alpha, 0): NaN stays NaN
        alpha = 0.0
    f = mu * alpha / (nt if nt > 0.0 else 1.0)
    return x0 * f, x1 * f, alpha


# -- linear algebra --------------------------------------------------------------------------
def rank_deficient_reference(A) -> bool:
    """Whether the (PSD) Delassus block A of the active rows is numerically singular: its
    Cholesky factorization (scipy's LAPACK dpotrf, lower) breaks down or its diagonal spans
    more than sqrt(1e11). ``_rank_deficient`` without JIT (the compiled one calls the same
    LAPACK routine through numba's binding)."""
    L, info = _dpotrf(A, lower=1, clean=0)
    if info:
        return True
    dl = np.diagonal(L)
    lo, hi = float(dl.min()), float(dl.max())
    return not (lo * lo > 1e-11 * hi * hi)


if ENABLED:
    # scipy's LAPACK dpotrf (the routine rank_deficient_reference calls through scipy), through
    # numba's own binding (numba.np.linalg, as np.linalg.cholesky uses it): the same factorization
    # of the same numbers, so the same decision where it is decided by rounding (a nearly
    # singular block whose last pivot is a difference of nearly equal numbers)
    from numba import types as _nbt
    from numba.np.linalg import _LAPACK, ensure_lapack

    ensure_lapack()
    _xxpotrf = _LAPACK().numba_xxpotrf(_nbt.float64)

    @njit
    def _rank_deficient(A):
        """Whether the PSD block is numerically singular: its Cholesky factorization (LAPACK
        dpotrf, lower) breaks down or its diagonal spans more than sqrt(1e11)."""
        n = A.shape[0]
        L = np.empty((n, n))
        for i in range(n):                  # Fortran order (as f2py passes A to dpotrf)
            for j in range(n):
                L[j, i] = A[i, j]
        info = _xxpotrf(100, 76, n, L.ctypes, n)    # ord('d'), ord('L')
        if info != 0:
            return True
        lo = L[0, 0]
        hi = L[0, 0]
        for j in range(1, n):
            d = L[j, j]
            if d < lo or d != d:
                lo = d
            if d > hi or d != d:
                hi = d
        return not (lo * lo > 1e-11 * hi * hi)
else:                                       # DIFFGYM_JIT=0: plain Python
    _rank_deficient = rank_deficient_reference


@njit
def _lu_solve(A, F):
    """``np.linalg.solve(A, F)`` by LU with partial pivoting; (ok, x), ok False where a pivot is
    exactly zero (LAPACK's info > 0) or the solution is not finite."""
    n = A.shape[0]
    M = A.copy()
    b = F.copy()
    for k in range(n):
        p = k
        amax = abs(M[k, k])
        for i in range(k + 1, n):
            a = abs(M[i, k])
            if a > amax:
                p = i
                amax = a
        if M[p, k] == 0.0:
            return False, b
        if p != k:
            for j in range(n):
                t = M[k, j]
                M[k, j] = M[p, j]
                M[p, j] = t
            t = b[k]
            b[k] = b[p]
            b[p] = t
        piv = M[k, k]
        if abs(piv) >= 2.2250738585072014e-308:
            r = 1.0 / piv
            for i in range(k + 1, n):
                M[i, k] *= r
        else:
            for i in range(k + 1, n):
                M[i, k] /= piv
        for i in range(k + 1, n):
            li = M[i, k]
            if li != 0.0:
                for j in range(k + 1, n):
                    M[i, j] -= li * M[k, j]
    # forward (unit lower), then backward substitution, column oriented (dtrsm)
    for k in range(n):
        bk = b[k]
        if bk != 0.0:
            for i in range(k + 1, n):
                b[i] -= bk * M[i, k]
    for k in range(n - 1, -1, -1):
        if b[k] != 0.0:
            b[k] /= M[k, k]
            bk = b[k]
            for i in range(k):
                b[i] -= bk * M[i, k]
    for i in range(n):
        if not math.isfinite(b[i]):
            return False, b
    return True, b


_JACOBI_MAX = 32    # up to this many unknowns least squares by one-sided Jacobi SVD, else dgelsd


@njit
def _lstsq(A, F):
    """Minimum-norm least squares ``np.linalg.lstsq(A, F, rcond=1e-11)[0]``: SVD based, singular
    values ``<= 1e-11 s_max`` treated as zero. Small systems by one-sided (Hestenes) Jacobi SVD
    (accurate singular values, no LAPACK call and workspace query: the planar models' sliding
    steps need one per Newton step); larger ones by LAPACK dgelsd, as the reference."""
    n = A.shape[0]
    c = A.shape[1]
    if n > _JACOBI_MAX or c > _JACOBI_MAX:
        return np.linalg.lstsq(A, F, rcond=1e-11)[0]
    W = np.empty((c, n))                    # W[j]: column j of A, rotated to A V
    for i in range(n):
        for j in range(c):
            W[j, i] = A[i, j]
    V = np.zeros((c, c))                    # V[j]: column j of V
    for j in range(c):
        V[j, j] = 1.0
    for _sweep in range(60):
        rotated = False
        for p in range(c - 1):
            for q in range(p + 1, c):
                alpha = 0.0
                beta = 0.0
                gamma = 0.0
                for i in range(n):
                    wp = W[p, i]
                    wq = W[q, i]
                    alpha += wp * wp
                    beta += wq * wq
                    gamma += wp * wq
                if not abs(gamma) > 1e-15 * math.sqrt(alpha * beta):
                    continue
                rotated = True
                zeta = (beta - alpha) / (2.0 * gamma)
                t = math.copysign(1.0, zeta) / (abs(zeta) + math.sqrt(1.0 + zeta * zeta))
                cs = 1.0 / math.sqrt(1.0 + t * t)
                sn = cs * t
                for i in range(n):
                    wp = W[p, i]
                    wq = W[q, i]
                    W[p, i] = cs * wp - sn * wq
                    W[q, i] = sn * wp + cs * wq
                for i in range(c):
                    vp = V[p, i]
                    vq = V[q, i]
                    V[p, i] = cs * vp - sn * vq
                    V[q, i] = sn * vp + cs * vq
        if not rotated:
            break
    sv = np.empty(c)
    smax = 0.0
    for j in range(c):
        t = 0.0
        for i in range(n):
            t += W[j, i] * W[j, i]
        sv[j] = math.sqrt(t)
        if sv[j] > smax:
            smax = sv[j]
    x = np.zeros(c)
    for j in range(c):
        if sv[j] > 1e-11 * smax:
            t = 0.0
            for i in range(n):
                t += W[j, i] * F[i]
            t /= sv[j] * sv[j]               # (u_j . F) / s_j with u_j = W[j] / s_j
            for i in range(c):
                x[i] += t * V[j, i]
    return x


@njit
def _lin_solve(A, F, x, deficient, anchored):
    """The Newton step ``delta`` with ``A delta = F``; least squares
    when rank deficient (minimum-norm new iterate, or minimum-norm step when ``anchored``)."""
    if not deficient:
        ok, d = _lu_solve(A, F)
        if ok:
            return d
    if anchored:
        return _lstsq(A, F)
    n = A.shape[0]
    r = np.empty(n)
    for i in range(n):
        s = 0.0
        for j in range(n):
            s += A[i, j] * x[j]
        r[i] = s - F[i]
    y = _lstsq(A, r)
    out = np.empty(n)
    for i in range(n):
        out[i] = x[i] - y[i]
    return out


# -- mode bookkeeping --------------------------------------------------------------------------
@njit
def _prepare(lam, nc, mu, modes, lim_act):
    """The start of a Newton run (in place): eliminated rows cleared, sliding contacts on their cone
    boundary (radially when the normal impulse pushes, else the projection)."""
    k = 3 * nc
    for i in range(nc):
        md = modes[i]
        j = 3 * i
        if md == BREAKING:
            lam[j] = 0.0
            lam[j + 1] = 0.0
            lam[j + 2] = 0.0
        elif md == SLIDING:
            l0 = lam[j]
            l1 = lam[j + 1]
            ln = lam[j + 2]
            if ln > 0.0:
                nlt = math.sqrt(l0 * l0 + l1 * l1)
                f = mu[i] * ln / nlt if nlt > 0.0 else 0.0
                lam[j] = l0 * f
                lam[j + 1] = l1 * f
            else:
                a, b, c = _cone(l0, l1, ln, mu[i])
                lam[j] = a
                lam[j + 1] = b
                lam[j + 2] = c
    for j in range(lam.shape[0] - k):
        if not lim_act[j]:
            lam[k + j] = 0.0


@njit
def _tols(lam, vscale, mode_tol):
    """The mode tests' tolerances: (tol_v, tol_l)."""
    mx = abs(lam[0]) if lam.shape[0] else 0.0
    for i in range(1, lam.shape[0]):
        a = abs(lam[i])
        if a > mx:
            mx = a
    if 1e-300 > mx:
        mx = 1e-300
    return mode_tol * vscale, mode_tol * mx


@njit
def natres(lam, sigma, nc, mu, dc, dG):
    """The natural-map residual in velocity units."""
    r2max = 0.0
    for i in range(nc):
        j = 3 * i
        m = mu[i]
        d = dc[i]
        l0 = lam[j]
        l1 = lam[j + 1]
        ln = lam[j + 2]
        s0 = sigma[j]
        s1 = sigma[j + 1]
        sn = sigma[j + 2] + m * math.sqrt(s0 * s0 + s1 * s1)
        y0 = l0 - s0 / d
        y1 = l1 - s1 / d
        yn = ln - sn / d
        p0, p1, pn = _cone(y0, y1, yn, m)
        r0 = l0 - p0
        r1 = l1 - p1
        rn = ln - pn
        r2 = (r0 * r0 + r1 * r1 + rn * rn) * (d * d)
        if i == 0 or r2 > r2max or r2 != r2:
            r2max = r2
        if r2max != r2max:
            break
    res = math.sqrt(r2max) if nc else 0.0
    k = 3 * nc
    for j in range(k, lam.shape[0]):
        d = dG[j]
        ll = lam[j]
        t = ll - sigma[j] / d
        if t < 0.0:
            t = 0.0
        t = abs(d * (ll - t))
        if t > res or t != t:
            res = t
    return res


@njit
def _bad(lam, sigma, nc, mu, modes, lim_act, tol_v, tol_l):
    """Whether any mode condition fails (the quick test)."""
    for i in range(nc):
        j = 3 * i
        md = modes[i]
        if md == BREAKING:
            if sigma[j + 2] < -tol_v:
                return True
            continue
        l0 = lam[j]
        l1 = lam[j + 1]
        ln = lam[j + 2]
        if ln < -tol_l:
            return True
        nlt = math.sqrt(l0 * l0 + l1 * l1)
        if md == STICKING:
            if nlt - mu[i] * ln > tol_l:
                return True
        elif nlt > tol_l and (l0 * sigma[j] + l1 * sigma[j + 1]) / (nlt if nlt > 0.0 else _INF) > tol_v:
            return True
    k = 3 * nc
    for j in range(lam.shape[0] - k):
        if lim_act[j]:
            if lam[k + j] < -tol_l:
                return True
        elif sigma[k + j] < -tol_v:
            return True
    return False


@njit
def _violations(lam, sigma, nc, mu, modes, lim_act, dc, dG, tol_v, tol_l):
    """The mode conditions that fail: (found, new_modes, new_lim_act, viol) with viol the contact
    violations then the limit violations (velocity units)."""
    m = lam.shape[0]
    k = 3 * nc
    nl = m - k
    new_modes = modes.copy()
    new_lim = lim_act.copy()
    v = np.zeros(nc + nl)
    if not _bad(lam, sigma, nc, mu, modes, lim_act, tol_v, tol_l):
        return False, new_modes, new_lim, v
    anyv = False
    for i in range(nc):
        j = 3 * i
        md = modes[i]
        l0 = lam[j]
        l1 = lam[j + 1]
        ln = lam[j + 2]
        s0 = sigma[j]
        s1 = sigma[j + 1]
        sn = sigma[j + 2]
        nlt = math.sqrt(l0 * l0 + l1 * l1)
        mi = mu[i]
        if md == BREAKING:
            # must not approach: sticking, or sliding when the slip is fast
            if sn < -tol_v:
                v[i] = -sn
                slip = math.sqrt(s0 * s0 + s1 * s1)
                new_modes[i] = SLIDING if slip > -mi * sn else STICKING
        else:
            over = nlt - mi * ln
            if ln < -tol_l and (md == SLIDING or (md == STICKING and mi * nlt + ln <= 0.0)):
                a = -ln
                if over > a or over != over:      # np.maximum (NaN propagates)
                    a = over
                v[i] = a * dc[i]
                new_modes[i] = BREAKING
            elif md == STICKING and over > tol_l:
                v[i] = over * dc[i]
                new_modes[i] = SLIDING
            elif md == SLIDING:
                wdot = (l0 * s0 + l1 * s1) / (nlt if nlt > 0.0 else _INF)
                if wdot > tol_v and nlt > tol_l:
                    v[i] = wdot
                    new_modes[i] = STICKING
        if v[i] != 0.0:
            anyv = True
    for j in range(nl):
        ll = lam[k + j]
        sg = sigma[k + j]
        if lim_act[j]:
            if ll < -tol_l:
                v[nc + j] = -ll * dG[k + j]
                new_lim[j] = False
        elif sg < -tol_v:
            v[nc + j] = -sg
            new_lim[j] = True
        if v[nc + j] != 0.0:
            anyv = True
    return anyv, new_modes, new_lim, v


# -- Newton on one active set --------------------------------------------------------------
@njit
def _slide_residual(Gaa, ga, x, i1s, mu_s, d_s, F, aux):
    """F(x) of the mode equations with sliding contacts (rows i1s: ||lam_T|| = mu lam_N, the
    next: slip parallel to the impulse); aux[:, j] = (w1, w2, nl, ns, s1, s2, l1, l2, rho)."""
    _matvec(Gaa, x, ga, F)
    for q in range(i1s.shape[0]):
        a = i1s[q]
        b = a + 1
        l1 = x[a]
        l2 = x[b]
        s1 = F[a]
        s2 = F[b]
        d = d_s[q]
        nl = math.sqrt(l1 * l1 + l2 * l2)
        ns = math.sqrt(s1 * s1 + s2 * s2)
        if nl > 0.0:
            w1 = l1 / nl
            w2 = l2 / nl
        elif ns > 0.0:
            w1 = -s1 / ns
            w2 = -s2 / ns
        else:
            w1 = 1.0
            w2 = 0.0
        F[a] = d * (nl - mu_s[q] * x[a + 2])
        rho = nl + ns / d
        if not rho > 0.0:
            rho = 1.0
        F[b] = (l1 * s2 - l2 * s1) / rho
        aux[0, q] = w1
        aux[1, q] = w2
        aux[2, q] = nl
        aux[3, q] = ns
        aux[4, q] = s1
        aux[5, q] = s2
        aux[6, q] = l1
        aux[7, q] = l2
        aux[8, q] = rho


@njit
def _newton(G, g, nc, mu, modes, lim_act, lam, dc, vscale, max_its, anchored, min_steps,
            zero, haszero, tol, Jb, Mb, tlo, thi):
    """Newton on the mode equations of the active set of ``modes`` / ``lim_act``: (lam,
    sigma, ok, steps) (``max_its`` already resolved). ``Jb`` (m, n), ``Mb``, ``tlo``, ``thi``: the
    problem's rows and mass matrix in body space (``island_body``: the rows' nonzeros as a
    (values, columns) pair, M by tree blocks; no rows: not given), with
    which a large linear active set takes its steps by ``body_pinv``. ``Jb`` ... None (all four):
    no body-space steps, and numba compiles that variant without ``body_factor``,
    ``body_pinv`` and what they call (the branches on ``Jb is not None`` are pruned), so the
    small problems' chain (``solve_stage1``, ``active_set``, ``_finish``, ``proximal``, all
    passing the four through) does not link and optimize code only large islands run."""
    m = G.shape[0]
    k = 3 * nc
    nl = m - k
    anybrk = False
    linear = True
    for i in range(nc):
        if modes[i] == BREAKING:
            anybrk = True
        elif modes[i] == SLIDING:
            linear = False
    usezero = haszero and linear
    allact = True
    for j in range(nl):
        if not lim_act[j]:
            allact = False
    full = (not usezero) and (not anybrk) and allact
    act = np.empty(m, np.int64)
    na = 0
    if full:
        for i in range(m):
            act[i] = i
        na = m
        Gaa = G
        ga = g
        x = lam.copy()
    else:
        for i in range(nc):
            if modes[i] != BREAKING:
                for r in range(3):
                    row = 3 * i + r
                    if not (usezero and zero[row]):
                        act[na] = row
                        na += 1
        for j in range(nl):
            if lim_act[j] and not (usezero and zero[k + j]):
                act[na] = k + j
                na += 1
        if na == 0:
            return np.zeros(m), g.copy(), True, 0
        Gaa = np.empty((na, na))
        ga = np.empty(na)
        x = np.empty(na)
        for a in range(na):
            ra = act[a]
            ga[a] = g[ra]
            x[a] = lam[ra]
            for b in range(na):
                Gaa[a, b] = G[ra, act[b]]
    ftol = 1e-14 * vscale
    stall = 1e-11 * vscale
    if 0.1 * tol > stall:
        stall = 0.1 * tol
    deficient = -1
    its = 0
    ok = False
    F = np.empty(na)
    # a large problem's Delassus block by its nonzeros (the body-space steps below): its
    # products are then the work of its nonzeros, not of na^2 entries (_csr_matvec)
    sparse = linear and Jb is not None and Jb[0].shape[0] > 0 and na >= BODY_MIN_ROWS
    if sparse:
        if Jb is not None:      # (always here; None: the branch numba prunes, _newton's doc)
            sp_ptr, sp_col, sp_val = _csr_matvec_trees(Gaa, x, ga, F, Jb, act[:na], tlo)
        else:
            sp_ptr, sp_col, sp_val = _csr_matvec_build(Gaa, x, ga, F)
    else:
        sp_ptr, sp_col, sp_val = np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0)
    if linear:
        if not sparse:
            _matvec(Gaa, x, ga, F)
        fn = _maxabs(F)
        body = False
        if Jb is not None:      # (None: compiled without the body-space path, see _newton's doc)
            if Jb[0].shape[0] and na >= BODY_MIN_ROWS and fn > ftol:
                (body, perm, first, lptr, Lv, drop, nd, klo, khi, noff, Nv, bptr, bcol, aoff,
                 Av, nz_ptr, nz, nzv) = body_factor_rows(Jb, act[:na], Mb, tlo, thi)
        while True:
            if fn <= ftol and its >= min_steps:
                ok = True
                break
            if its >= max_its:
                ok = fn <= stall
                break
            its += 1
            if Jb is not None and body:
                # the minimum-norm least-squares step (or new iterate) by Gaa^+ in body space
                r = np.empty(na)
                for a in range(na):
                    r[a] = F[a] if anchored else -ga[a]      # (Gaa x - F = -ga)
                y = body_pinv(Jb, Mb, tlo, thi, perm, first, lptr, Lv, drop, nd, klo, khi,
                              noff, Nv, bptr, bcol, aoff, Av, nz_ptr, nz, nzv, r)
                # checked: the normal equations Ja^T (Gaa y - r) = 0 must hold (else the dense
                # path: a dependent dof decided by rounding, an ill-conditioned K)
                e = np.empty(na)
                _csr_matvec(sp_ptr, sp_col, sp_val, y, r, e)       # Gaa y + r
                if _normal_ok_e(e, Mb.shape[0], nz_ptr, nz, nzv, r):
                    if anchored:
                        d = y
                    else:
                        d = np.empty(na)
                        for a in range(na):
                            d[a] = x[a] - y[a]
                else:
                    body = False
            if not body:
                if deficient < 0:
                    deficient = 1 if _rank_deficient(Gaa) else 0
                d = _lin_solve(Gaa, F, x, deficient == 1, anchored)
            for a in range(na):
                x[a] -= d[a]
            if sparse:
                _csr_matvec(sp_ptr, sp_col, sp_val, x, ga, F)
            else:
                _matvec(Gaa, x, ga, F)
            fn_new = _maxabs(F)
            if fn_new > 0.5 * fn and its > min_steps:
                ok = fn_new <= stall
                break
            fn = fn_new
    else:
        # sliding contacts among the active ones (every active contact has its 3 rows first)
        nsl = 0
        for i in range(nc):
            if modes[i] == SLIDING:
                nsl += 1
        i1s = np.empty(nsl, np.int64)
        mu_s = np.empty(nsl)
        d_s = np.empty(nsl)
        p = 0
        q = 0
        for i in range(nc):
            if modes[i] == BREAKING:
                continue
            if modes[i] == SLIDING:
                i1s[q] = 3 * p
                mu_s[q] = mu[i]
                d_s[q] = dc[i]
                q += 1
            p += 1
        aux = np.empty((9, nsl))
        aux_new = np.empty((9, nsl))
        F_new = np.empty(na)
        x_new = np.empty(na)
        _slide_residual(Gaa, ga, x, i1s, mu_s, d_s, F, aux)
        phi = _dot(F)
        fn = _maxabs(F)
        A = np.empty((na, na))
        while True:
            if fn <= ftol and its >= min_steps:
                ok = True
                break
            if its >= max_its:
                ok = fn <= stall
                break
            if deficient < 0:
                deficient = 1 if _rank_deficient(Gaa) else 0
            its += 1
            A[:, :] = Gaa
            for q in range(nsl):
                a = i1s[q]
                for c in range(na):
                    A[a, c] = 0.0
            for q in range(nsl):
                a = i1s[q]
                b = a + 1
                d = d_s[q]
                w1 = aux[0, q]
                w2 = aux[1, q]
                ns = aux[3, q]
                s1 = aux[4, q]
                s2 = aux[5, q]
                l1 = aux[6, q]
                l2 = aux[7, q]
                rho = aux[8, q]
                A[a, a] = d * w1
                A[a, b] = d * w2
                A[a, a + 2] = -d * mu_s[q]
                # dF2 = (d(lam_T x s_T) - F2 d rho) / rho
                f2 = F[b] / rho
                safe_s = ns if ns > 0.0 else _INF
                u1 = s1 / safe_s
                u2 = s2 / safe_s
                c1 = l1 / rho - f2 * u2 / d
                c2 = -l2 / rho - f2 * u1 / d
                for c in range(na):
                    A[b, c] = c2 * Gaa[a, c] + c1 * Gaa[b, c]
                A[b, a] += s2 / rho - f2 * w1
                A[b, b] += -s1 / rho - f2 * w2
            delta = _lin_solve(A, F, x, deficient == 1, anchored)
            # backtracking line search on ||F||^2
            t = 1.0
            while True:
                for c in range(na):
                    x_new[c] = x[c] - t * delta[c]
                _slide_residual(Gaa, ga, x_new, i1s, mu_s, d_s, F_new, aux_new)
                phi_new = _dot(F_new)
                if phi_new <= (1.0 - 1e-4 * t) * phi or phi_new <= ftol * ftol or its <= min_steps:
                    break
                t *= 0.5
                if t < 1e-3:
                    break
            fn_new = _maxabs(F_new)
            if t < 1e-3:
                # no descent: converged at the arithmetic's precision, or stuck
                mn = fn_new if fn_new < fn else fn
                ok = mn <= stall
                if fn_new < fn:
                    x, x_new = x_new, x
                break
            x, x_new = x_new, x
            F, F_new = F_new, F
            aux, aux_new = aux_new, aux
            phi = phi_new
            if fn_new > 0.5 * fn and fn_new <= stall and its > min_steps:
                ok = True
                break
            fn = fn_new
    # scatter: the full (lam, sigma)
    sigma = np.empty(m)
    if full:
        if sparse:                  # (Gaa is G)
            _csr_matvec(sp_ptr, sp_col, sp_val, x, g, sigma)
        else:
            _matvec(G, x, g, sigma)
        return x, sigma, ok, its
    out = np.zeros(m)
    for a in range(na):
        out[act[a]] = x[a]
    # sigma = G out + g over the active columns only (act ascending: the terms of _matvec's
    # sums in their order, less the exact zeros of the inactive rows' impulses)
    for i in range(m):
        t = 0.0
        for a in range(na):
            t += G[i, act[a]] * x[a]
        sigma[i] = t + g[i]
    return out, sigma, ok, its


# -- accepting a solution ------------------------------------------------------------------
@njit(inline="always")      # (a few comparisons: inlined, no call)
def _maxabs3(x, j):
    """max(|x[j]|, |x[j+1]|, |x[j+2]|): the largest impulse component of the contact whose
    rows start at j (NaN-blind as the comparisons it stands for)."""
    a = abs(x[j])
    b = abs(x[j + 1])
    if b > a:
        a = b
    b = abs(x[j + 2])
    if b > a:
        a = b
    return a


@njit
def _finish(G, g, nc, mu, modes, lim_act, lam, sigma, dG, dc, vscale, zero, haszero, tol,
            mode_tol, newton_iter, Jb, Mb, tlo, thi):
    """The end of one active set's Newton run, accepted or not: (found, lam, sigma, modes, its, residual)."""
    its = 0
    no = nc < 0                 # False / 1 as runtime values (numba compiles a callee once per
    one = its + 1               # literal argument otherwise)
    k = 3 * nc
    if nc:
        tol_v, tol_l = _tols(lam, vscale, mode_tol)
        any_tiny = False
        for i in range(nc):
            if modes[i] != BREAKING:
                j = 3 * i
                a = _maxabs3(lam, j)
                if a <= tol_l and sigma[j + 2] >= -tol_v:
                    if not any_tiny:
                        modes = modes.copy()
                        lam = lam.copy()
                        any_tiny = True
                    modes[i] = BREAKING
                    lam[j] = 0.0
                    lam[j + 1] = 0.0
                    lam[j + 2] = 0.0
        if any_tiny:
            sigma = np.empty(G.shape[0])
            _matvec(G, lam, g, sigma)
        nbrk = 0
        for i in range(nc):
            if modes[i] == BREAKING:
                nbrk += 1
        if nbrk:
            touch = np.zeros(nc, np.bool_)
            ntouch = 0
            for i in range(nc):
                if modes[i] == BREAKING and abs(sigma[3 * i + 2]) <= 10.0 * tol_v:
                    touch[i] = True
                    ntouch += 1
            if ntouch and nbrk < nc:
                modes2 = modes.copy()
                for i in range(nc):
                    if touch[i]:
                        s0 = sigma[3 * i]
                        s1 = sigma[3 * i + 1]
                        slip = math.sqrt(s0 * s0 + s1 * s1)
                        modes2[i] = SLIDING if slip > tol_v else STICKING
                lam2 = lam.copy()
                _prepare(lam2, nc, mu, modes2, lim_act)
                # (at least one minimum-norm step: the current impulses may already solve the
                # equations with the re-activated contacts unloaded)
                lam2, sigma2, ok, n2 = _newton(G, g, nc, mu, modes2, lim_act, lam2, dc, vscale,
                                               newton_iter, no, one, zero, haszero, tol,
                                               Jb, Mb, tlo, thi)
                its += n2
                tv, tl = _tols(lam2, vscale, mode_tol)
                carried = True
                for i in range(nc):
                    if touch[i]:
                        a = _maxabs3(lam2, 3 * i)
                        if not a > tl:
                            carried = False
                if ok and carried:
                    found, _m, _l, _v = _violations(lam2, sigma2, nc, mu, modes2, lim_act, dc, dG,
                                                    tv, tl)
                    if not found:
                        lam = lam2
                        sigma = sigma2
                        modes = modes2
                        tol_v = tv
                        tol_l = tl
        nslow = 0
        for i in range(nc):
            if modes[i] == SLIDING:
                s0 = sigma[3 * i]
                s1 = sigma[3 * i + 1]
                if math.sqrt(s0 * s0 + s1 * s1) <= tol_v:
                    nslow += 1
        if nslow:
            modes2 = modes.copy()
            for i in range(nc):
                if modes[i] == SLIDING:
                    s0 = sigma[3 * i]
                    s1 = sigma[3 * i + 1]
                    if math.sqrt(s0 * s0 + s1 * s1) <= tol_v:
                        modes2[i] = STICKING
            lam2, sigma2, ok, n2 = _newton(G, g, nc, mu, modes2, lim_act, lam, dc, vscale,
                                           newton_iter, not no, one - 1, zero, haszero, tol,
                                           Jb, Mb, tlo, thi)
            its += n2
            tv, tl = _tols(lam2, vscale, mode_tol)
            if ok:
                found, _m, _l, _v = _violations(lam2, sigma2, nc, mu, modes2, lim_act, dc, dG,
                                                tv, tl)
                if not found:
                    lam = lam2
                    sigma = sigma2
                    modes = modes2
    res = natres(lam, sigma, nc, mu, dc, dG)
    return res <= tol, lam, sigma, modes, its, res


# -- the active-set iteration ----------------------------------------------------------------
@njit
def _infeasible_sticking(lam, sigma, nc, mu, modes, new_modes, tol):
    """After a Newton step that stalled with no mode violation: the sticking contacts whose slip
    is still above ``tol`` (their equations had no solution) become sliding, with the friction
    impulse (in ``lam``, in place) on the cone opposite that slip. Whether any did. (The
    Python stage 1 of solver.py has no such rule.)"""
    anysw = False
    for i in range(nc):
        if modes[i] != STICKING:
            continue
        j = 3 * i
        s0 = sigma[j]
        s1 = sigma[j + 1]
        sl = math.sqrt(s0 * s0 + s1 * s1)
        ln = lam[j + 2]
        if sl > tol and ln > 0.0:
            new_modes[i] = SLIDING
            f = mu[i] * ln / sl
            lam[j] = -s0 * f
            lam[j + 1] = -s1 * f
            anysw = True
    return anysw


@njit
def _separating_row(lam, sigma, nc, modes, tol, vscale):
    """After a Newton run that did not converge: the loaded contact to break when the normal
    equations are inconsistent by a small amount, -1 otherwise. That is: every contact not
    breaking carries a nonnegative normal impulse (no mode is wrong by its sign), the largest
    residual is in a normal row, above ``tol`` but below ``1e-6 vscale`` (the rounding scale
    of the drift offsets, not a wrong set of modes), and that contact separates (positive normal
    velocity) while loaded. Among such contacts, the one with the smallest normal impulse (the
    cheapest load to move to the others)."""
    best = -1
    nres = 0.0
    slip = 0.0
    for i in range(nc):
        if modes[i] == BREAKING:
            continue
        j = 3 * i
        if lam[j + 2] < 0.0:
            return -1
        if modes[i] == STICKING:
            s0 = sigma[j]
            s1 = sigma[j + 1]
            sl = math.sqrt(s0 * s0 + s1 * s1)
            if sl > slip:
                slip = sl
        sn = abs(sigma[j + 2])
        if sn > nres:
            nres = sn
        if sigma[j + 2] > tol and lam[j + 2] > 0.0 and (best < 0 or lam[j + 2] < lam[3 * best + 2]):
            best = i
    if nres < slip or nres > 1e-6 * vscale:
        return -1
    return best


@njit
def _seen_index(seen_m, seen_l, n, modes, lim_act):
    """Row of (modes, lim_act) among the first n recorded sets, or -1."""
    for r in range(n):
        same = True
        for i in range(modes.shape[0]):
            if seen_m[r, i] != modes[i]:
                same = False
                break
        if same:
            for j in range(lim_act.shape[0]):
                if seen_l[r, j] != lim_act[j]:
                    same = False
                    break
        if same:
            return r
    return -1


@njit
def active_set(G, g, nc, mu, modes_in, lim_in, lam_in, dG, dc, zero, haszero, vscale, budget,
               tol, mode_tol, newton_iter, mode_rounds, Jb, Mb, tlo, thi):
    """Stage 1, the active-set Newton from the given modes: (found, lam, sigma, modes, lim_act, iterations, residual).
    ``zero``: rows with a zero Delassus diagonal (used where ``haszero``)."""
    m = G.shape[0]
    k = 3 * nc
    nl = m - k
    total = 0
    R = max(mode_rounds, 1)
    seen_m = np.empty((R, nc), np.int64)
    seen_l = np.empty((R, nl), np.bool_)
    seen_c = np.zeros(R, np.int64)
    nseen = 0
    modes = modes_in.copy()
    lim_act = lim_in.copy()
    lam = lam_in.copy()
    _prepare(lam, nc, mu, modes, lim_act)
    single = False
    first = True
    for _ in range(mode_rounds):
        r = _seen_index(seen_m, seen_l, nseen, modes, lim_act)
        if r < 0:
            seen_m[nseen] = modes
            seen_l[nseen] = lim_act
            seen_c[nseen] = 1
            nseen += 1
        else:
            seen_c[r] += 1
        if total >= budget:
            break
        max_its = newton_iter if newton_iter < budget - total else budget - total
        lam_n, sigma, ok, its = _newton(G, g, nc, mu, modes, lim_act, lam, dc, vscale,
                                        max(1, max_its), first, total - total, zero, haszero, tol,
                                        Jb, Mb, tlo, thi)
        first = False
        total += its
        ib = -1 if ok else _separating_row(lam_n, sigma, nc, modes, tol, vscale)
        if ib >= 0:
            # Newton stalled on inconsistent normal equations: a loaded contact keeps a
            # separating normal velocity at the least-squares point (four corners of a box whose
            # offsets straddle the skin's kink, b(d) not affine over them: drop #71, 3.6e-8
            # m/s). In the rigid problem that contact breaks (its load goes to the others): that
            # mode next (before the other rows' violations, which the stalled point leaves
            # uncertain and whose rounds would spend the budget on the same inconsistency)
            nm = modes.copy()
            nm[ib] = BREAKING
            if _seen_index(seen_m, seen_l, nseen, nm, lim_act) < 0:
                modes = nm
                lam = lam_n.copy()
                lam[3 * ib] = 0.0
                lam[3 * ib + 1] = 0.0
                lam[3 * ib + 2] = 0.0
                _prepare(lam, nc, mu, modes, lim_act)
                continue
        tol_v, tol_l = _tols(lam_n, vscale, mode_tol)
        found, new_modes, new_lim, v = _violations(lam_n, sigma, nc, mu, modes, lim_act, dc, dG,
                                                   tol_v, tol_l)
        if not found:
            done, lam_f, sigma_f, modes_f, its_f, res = _finish(
                G, g, nc, mu, modes, lim_act, lam_n, sigma, dG, dc, vscale, zero, haszero, tol,
                mode_tol, newton_iter, Jb, Mb, tlo, thi)
            if (not done and not ok
                    and _infeasible_sticking(lam_n, sigma, nc, mu, modes, new_modes, tol)
                    and _seen_index(seen_m, seen_l, nseen, new_modes, new_lim) < 0):
                # Newton stalled without a mode violation and the solution is not accepted:
                # the sticking equations are inconsistent (a least-squares point whose sticking
                # rows keep a slip; e.g. a rod holding a box by friction against the 1e-8 m/s
                # the table's drift correction lifts it by). In the rigid problem such a contact
                # slides, its friction on the cone opposite that slip: those modes next.
                total += its_f
                modes = new_modes
                lam = lam_n
                _prepare(lam, nc, mu, modes, lim_act)
                continue
            return done, lam_f, sigma_f, modes_f, lim_act, total + its_f, res
        if (not ok) or single or _seen_index(seen_m, seen_l, nseen, new_modes, new_lim) >= 0:
            # Newton failed or the modes cycled: from now on switch one row at a time
            single = True
            jm = 0
            best = v[0]
            for j in range(1, v.shape[0]):
                if best != best:
                    break
                if v[j] > best or v[j] != v[j]:
                    best = v[j]
                    jm = j
            cand_m = new_modes
            cand_l = new_lim
            new_modes = modes.copy()
            new_lim = lim_act.copy()
            if jm < nc:
                new_modes[jm] = cand_m[jm]
            else:
                new_lim[jm - nc] = cand_l[jm - nc]
            r = _seen_index(seen_m, seen_l, nseen, new_modes, new_lim)
            if r >= 0 and seen_c[r] >= 2:
                break       # (a set of modes may come back once, from other impulses)
        modes = new_modes
        lim_act = new_lim
        lam = lam_n
        _prepare(lam, nc, mu, modes, lim_act)
    return False, lam_in, lam_in, modes_in, lim_in, total, _INF


@njit
def solve_stage1(G, g, nc, mu, lam0, modes0, has_modes, tol, mode_tol, newton_iter,
                 mode_rounds, budget, Jb, Mb, tlo, thi, b=None, keep=None, limit=True):
    """Stage 1 of the NCP solve (``_stage1``: the active set from the warm and cold starts,
    stage 1b; then stage 1c, ``compliance_stage``) for every caller (the compiled step's
    islands, the per-island storage of ``island_step``, ``NCPSolver.solve``). With the rows'
    drift offsets ``b`` (``g = J v_free + b``) and ``keep`` (the rows whose offset is a drift correction that may be projected:
    ``constraint._bias_row_ok``; ``SolverSettings.realizable_bias``): where stage 1 fails, once
    more with those offsets projected onto the range of their rows of J (``project_block``:
    the closest correction one generalized velocity realizes; redundant contacts can ask for
    corrections no motion produces, and the mode equations then have no solution). Where that
    succeeds ``b`` and ``g`` hold the projected offsets (in place) and its solution is returned;
    else they are unchanged. Where stage 1 (and the retry) failed, with ``limit`` stage 1c
    (``compliance_stage``) on the problem with its own offsets (the rows' mixed solve,
    ``equality_kernels``, passes False: its rounds hand a failed reduced problem to their own
    later stages); where that fails too the first
    attempt's (failed) tuple is returned, the iterations of all counted. Returns ``_stage1``'s
    tuple. ``keep`` is the record of what the step did
    (in place): the projected rows where the retry's solution is returned, else cleared (the
    derivatives read it: ``Constraints.projected``)."""
    out = _stage1(G, g, nc, mu, lam0, modes0, has_modes, tol, mode_tol, newton_iter,
                  mode_rounds, budget, Jb, Mb, tlo, thi)
    if out[0]:
        if b is not None and keep is not None:
            keep[:] = False
        return out
    if not limit:
        if b is None or keep is None:
            return out
    elif b is None or keep is None:
        return compliance_stage(G, g, nc, mu, out, tol, mode_tol, newton_iter, mode_rounds,
                                Jb, Mb, tlo, thi)
    changed, nb = project_block(G, b, keep)
    if not changed:
        keep[:] = False
        if not limit:
            return out
        return compliance_stage(G, g, nc, mu, out, tol, mode_tol, newton_iter, mode_rounds,
                                Jb, Mb, tlo, thi)
    m = G.shape[0]
    g2 = g.copy()
    t = 0
    for a in range(m):
        if keep[a]:
            g2[a] += nb[t] - b[a]
            t += 1
    out2 = _stage1(G, g2, nc, mu, lam0, modes0, has_modes, tol, mode_tol, newton_iter,
                   mode_rounds, budget, Jb, Mb, tlo, thi)
    its = out[5] + out2[5]
    if not out2[0]:
        keep[:] = False
        if not limit:
            return False, out[1], out[2], out[3], out[4], its, out[6], out[7]
        # (stage 1c on the raw offsets: its selection is the problem's own)
        return compliance_stage(G, g, nc, mu, (False, out[1], out[2], out[3], out[4], its,
                                               out[6], out[7]), tol, mode_tol, newton_iter,
                                mode_rounds, Jb, Mb, tlo, thi)
    t = 0
    for a in range(m):
        g[a] = g2[a]
        if keep[a]:
            b[a] = nb[t]
            t += 1
    return True, out2[1], out2[2], out2[3], out2[4], its, out2[6], out2[7]


@njit
def project_block(Gs, bs, keep):
    """The offsets ``bs`` of one problem's rows (its Delassus block ``Gs``) with the part of
    those flagged in ``keep`` projected onto the range of their Delassus block (= the range of
    their rows of J): ``b_S <- G_SS G_SS^+ b_S``, the least-squares realizable correction, by the
    solver's own minimum-norm least squares (``_lstsq``, singular values below 1e-11 of the
    largest are null) where the block is rank deficient (``_rank_deficient``); elsewhere
    (independent rows: every offset is realizable) nothing changes. Blocks with
    ``BODY_MIN_ROWS`` flagged rows or more (the body-space solves' size; a dense rank test and
    SVD there would cost more than the step) are left as they are.
    Returns (changed, the new offsets of the flagged rows, in order)."""
    ms = bs.shape[0]
    n = 0
    for a in range(ms):
        if keep[a]:
            n += 1
    if n < 2 or n >= BODY_MIN_ROWS:
        return False, np.zeros(0)
    idx = np.empty(n, np.int64)
    n = 0
    for a in range(ms):
        if keep[a]:
            idx[n] = a
            n += 1
    A = np.empty((n, n))
    y = np.empty(n)
    for a in range(n):
        y[a] = bs[idx[a]]
        for c in range(n):
            A[a, c] = Gs[idx[a], idx[c]]
    if not _rank_deficient(A):
        return False, np.zeros(0)
    x = _lstsq(A, y)
    out = np.empty(n)
    for a in range(n):
        t = 0.0
        for c in range(n):
            t += A[a, c] * x[c]
        out[a] = t
    return True, out


@njit
def _preamble(G, g, nc, tol):
    """The solve's scales (``_stage1``, ``compliance_stage``): the Delassus diagonal with its
    floor ``dG``, each contact's mean ``dc``, the rows with a zero diagonal (``zero``, and
    whether any) and the velocity scale ``vscale``."""
    m = G.shape[0]
    dmax = G[0, 0]
    for i in range(1, m):
        if G[i, i] > dmax or G[i, i] != G[i, i]:
            dmax = G[i, i]
    floor = 1e-12 * (dmax if dmax > 1.0 else 1.0)
    zlim = 1e-14 * dmax
    dG = np.empty(m)
    zero = np.zeros(m, np.bool_)
    nzero = 0
    for i in range(m):
        d = G[i, i]
        dG[i] = d if (d >= floor or d != d) else floor
        if d <= zlim:
            zero[i] = True
            nzero += 1
    # (a computed bool: a literal False here made numba compile active_set, _newton and _finish
    # a second time, for Literal[bool](False), next to the bool of the Python-side call)
    haszero = nzero > 0
    dc = np.empty(nc)
    for i in range(nc):
        dc[i] = (dG[3 * i] + dG[3 * i + 1] + dG[3 * i + 2]) / 3.0
    vscale = abs(g[0])
    for i in range(1, m):
        a = abs(g[i])
        if a > vscale:
            vscale = a
    if 1e-3 * tol > vscale:
        vscale = 1e-3 * tol
    return dG, dc, zero, haszero, vscale


@njit
def compliance_stage(G, g, nc, mu, out, tol, mode_tol, newton_iter, mode_rounds, Jb, Mb, tlo,
                     thi):
    """Stage 1c: where stage 1 and 1b failed (``out``, ``_stage1``'s failed tuple, returned as
    it is where this fails too, its iterations added), ``compliance_limit`` on the problem
    (islands of fewer than ``BODY_MIN_ROWS`` rows: its subproblems are dense). Returns
    ``_stage1``'s tuple (its last entry 1 where this solved it: reported as ``prox+newton``)."""
    m = G.shape[0]
    if m >= BODY_MIN_ROWS:
        return out
    dG, dc, zero, haszero, vscale = _preamble(G, g, nc, tol)
    c = compliance_limit(G, g, nc, mu, dG, dc, zero, haszero, vscale, tol, mode_tol,
                         newton_iter, mode_rounds, Jb, Mb, tlo, thi)
    if c[0]:
        return True, c[1], c[2], c[3], c[4], out[5] + c[5], c[6], 1
    return False, out[1], out[2], out[3], out[4], out[5] + c[5], out[6], out[7]


@njit
def _stage1(G, g, nc, mu, lam0, modes0, has_modes, tol, mode_tol, newton_iter,
            mode_rounds, budget, Jb, Mb, tlo, thi):
    """The preamble of ``NCPSolver.solve`` (dG, dc, vscale, zero-diagonal rows, the warm start)
    and stage 1: the active set from the warm start, then (a warm start given, where
    ``COLD_RESTART``) from the cold start, then stage 1b (``proximal``) from three starts (the
    warm start, a cold all-sticking one, an all-sliding one). ``lam0`` empty: no warm start;
    ``has_modes`` False: no ``modes0``; ``Jb``... (``island_body``; no rows: none) for the
    body-space steps. Returns ``active_set``'s tuple and 1 if stage 1b
    solved it (else 0)."""
    m = G.shape[0]
    k = 3 * nc
    nl = m - k
    dG, dc, zero, haszero, vscale = _preamble(G, g, nc, tol)
    lam = np.zeros(m)
    if lam0.shape[0]:
        t = 0.0
        for i in range(m):
            t += lam0[i]
        if t - t == 0.0:
            lam[:] = lam0
    modes = np.empty(nc, np.int64)
    lim0 = np.empty(nl, np.bool_)
    if not has_modes:
        for i in range(nc):
            modes[i] = BREAKING if g[3 * i + 2] >= 0.0 else STICKING
        for j in range(nl):
            lim0[j] = g[k + j] < 0.0
    else:
        if modes0.shape[0] < nc or (modes0.shape[0] > nc and modes0.shape[0] != nc + nl):
            raise ValueError("modes0: nc contact modes, then optionally one 0/1 per limit")
        bad = False
        for i in range(nc):
            modes[i] = modes0[i]
            if modes0[i] < BREAKING or modes0[i] > SLIDING:
                bad = True
        if bad:
            for i in range(nc):
                modes[i] = BREAKING if modes[i] == BREAKING else STICKING
        if modes0.shape[0] > nc:
            for j in range(nl):
                lim0[j] = modes0[nc + j] != 0
        else:
            for j in range(nl):
                lim0[j] = g[k + j] < 0.0
    out = active_set(G, g, nc, mu, modes, lim0, lam, dG, dc, zero, haszero, vscale, budget,
                     tol, mode_tol, newton_iter, mode_rounds, Jb, Mb, tlo, thi)
    if out[0]:
        return out[0], out[1], out[2], out[3], out[4], out[5], out[6], 0
    its = budget            # (a failed attempt counts its whole budget)
    # a warm start whose modes lead the iteration into a cycle (a contact switching back and
    # forth between the previous step's mode and another): stage 1 again from the cold start
    # (approaching contacts sticking, zero impulses; given a warm start). (A cold start with
    # the approaching contacts sliding may end on a sliding contact that does not slip: its
    # modes are not canonical; stage 1b's sliding start handles those.)
    for start in range(0 if (COLD_RESTART and (lam0.shape[0] or has_modes)) else 1, 1):
        mc = np.empty(nc, np.int64)
        for i in range(nc):
            mc[i] = BREAKING if g[3 * i + 2] >= 0.0 else (STICKING if start == 0 else SLIDING)
        lc = np.empty(nl, np.bool_)
        for j in range(nl):
            lc[j] = g[k + j] < 0.0
        oc = active_set(G, g, nc, mu, mc, lc, np.zeros(m), dG, dc, zero, haszero, vscale, budget,
                        tol, mode_tol, newton_iter, mode_rounds, Jb, Mb, tlo, thi)
        if oc[0]:
            return True, oc[1], oc[2], oc[3], oc[4], its + oc[5], oc[6], 0
        its += budget
    # stage 1b (proximal): from the warm start, a cold all-sticking start and an
    # all-sliding start (approaching contacts; limits whose free velocity closes them)
    for start in range(3):
        if start == 0:
            m0 = modes
            l0 = lim0
            x0 = lam
        else:
            m0 = np.empty(nc, np.int64)
            for i in range(nc):
                m0[i] = (STICKING if start == 1 else SLIDING) if g[3 * i + 2] < 0.0 else BREAKING
            l0 = np.empty(nl, np.bool_)
            for j in range(nl):
                l0[j] = g[k + j] < 0.0
            x0 = np.zeros(m)
        p = proximal(G, g, nc, mu, m0, l0, x0, dG, dc, zero, haszero, vscale, budget, tol,
                     mode_tol, newton_iter, mode_rounds, Jb, Mb, tlo, thi)
        if p[0]:
            return True, p[1], p[2], p[3], p[4], its + p[5], p[6], 1
        its += budget
    return False, out[1], out[2], out[3], out[4], its, out[6], 0


COLD_RESTART = False    # (off: it changed the Go1 trajectory of tests/test_solver.py into a state
                        # whose problem our own later stages label inconsistently; see README)
PROX_RHO = 1e-6         # stage 1b's proximal weight, relative to the mean Delassus diagonal
PROX_OUTER = 8          # its outer (proximal-point) iterations at most


@njit
def proximal(G, g, nc, mu, modes, lim_act, lam, dG, dc, zero, haszero, vscale, budget, tol,
             mode_tol, newton_iter, mode_rounds, Jb, Mb, tlo, thi):
    """Stage 1b (``NCPSolver._proximal`` calls it): proximal-point iterations whose subproblems are the
    NCPs of ``G + rho I`` and ``g - rho lam_k`` (unique impulses where contacts are redundant),
    each solved by ``active_set`` from the previous modes; once the natural residual of the
    original problem is within ``tol``, ``active_set`` on the original problem from those
    modes (else ``_finish``). Returns ``active_set``'s tuple (found first)."""
    m = G.shape[0]
    k = 3 * nc
    nl = m - k
    rounds = nc + nl + 2
    if mode_rounds > rounds:
        rounds = mode_rounds
    bud = 4 * rounds
    if budget > bud:
        bud = budget
    s = 0.0
    for i in range(m):
        s += dG[i]
    rho = PROX_RHO * s / m
    Gr = G.copy()
    dGr = np.empty(m)
    for i in range(m):
        Gr[i, i] += rho
        dGr[i] = dG[i] + rho
    dcr = np.empty(nc)
    for i in range(nc):
        dcr[i] = dc[i] + rho
    gr = np.empty(m)
    total = 0
    lam = lam.copy()
    # (the body-space step is for the singular original problem; the regularized one is
    # not of the form J M^-1 J^T: its subproblems take the dense path)
    for _ in range(PROX_OUTER):
        for i in range(m):
            gr[i] = g[i] - rho * lam[i]
        out = active_set(Gr, gr, nc, mu, modes, lim_act, lam, dGr, dcr, zero, haszero, vscale,
                         bud, tol, mode_tol, newton_iter, rounds, None, None, None, None)
        total += out[5]
        if not out[0]:
            return False, lam, lam, modes, lim_act, total, _INF
        lam = out[1]
        modes = out[3]
        lim_act = out[4]
        sigma = np.empty(m)
        _matvec(G, lam, g, sigma)
        res = natres(lam, sigma, nc, mu, dc, dG)
        if res <= tol:
            o2 = active_set(G, g, nc, mu, modes, lim_act, lam, dG, dc, zero, haszero, vscale,
                            bud, tol, mode_tol, newton_iter, rounds, Jb, Mb, tlo, thi)
            if o2[0]:
                return True, o2[1], o2[2], o2[3], o2[4], total + o2[5], o2[6]
            f = _finish(G, g, nc, mu, modes, lim_act, lam, sigma, dG, dc, vscale, zero, haszero,
                        tol, mode_tol, newton_iter, Jb, Mb, tlo, thi)
            if f[0]:
                return True, f[1], f[2], f[3], lim_act, total + f[4], f[5]
            return True, lam, sigma, modes, lim_act, total, res
    return False, lam, lam, modes, lim_act, total, _INF


LIMIT_RHO0 = 1.0        # stage 1c (compliance_limit): its first weight (of the mean diagonal)
LIMIT_RHO_MIN = 1e-8    # its last weight (then the original problem from the modes found)
LIMIT_FACTOR = 0.1      # the weight's step down (halved in log where a subproblem fails)
LIMIT_SUBS = 40         # subproblems at most
LIMIT_BUDGET = 100      # Newton iterations of each subproblem's active set
LIMIT_RAISE = 3         # the first weight raised by 1 / LIMIT_FACTOR at most this often
LIMIT_SMALLEST = 1.0 / 16.0   # a step down halved below this part of LIMIT_FACTOR: stop there


@njit
def compliance_limit(G, g, nc, mu, dG, dc, zero, haszero, vscale, tol, mode_tol, newton_iter,
                     mode_rounds, Jb, Mb, tlo, thi):
    """Stage 1c (issue 16: pushed box piles; ``compliance_stage``), the solution the solver
    selects where stages 1 and 1b fail: the limit, as the weight ``rho`` goes to zero, of the
    solutions of the NCPs of ``G + rho I`` (the same contacts, each made uniformly compliant:
    their impulses are unique, and the selection does not depend on the warm start). Computed
    by continuation: from a cold start (zero impulses, approaching contacts sticking, limits
    whose free velocity closes them active) the problem of ``rho = LIMIT_RHO0`` times the mean
    Delassus diagonal is solved by ``active_set``, then ``rho`` steps down by ``LIMIT_FACTOR``
    (the step halved in log where a subproblem is not solved, doubled back after a success; a
    first problem not solved: ``rho`` raised by ``1 / LIMIT_FACTOR``, at most ``LIMIT_RAISE``
    times), each subproblem warm-started from the last, to ``LIMIT_RHO_MIN`` (or to the last one
    solved where the step had to be halved below ``LIMIT_SMALLEST``); from that solution's modes
    and impulses ``active_set`` on the original problem (its minimum-norm steps move the
    impulses by O(rho); else ``_finish``; else the point itself where its natural residual is
    within ``tol``). Where a redundant face's corners slide the discrete Coulomb problem has a
    continuum of solutions with different velocities; this is the one the solver returns where
    stages 1 and 1b fail (measured on the island problems stage 1 failed on along the pushed
    piles of tests/test_pile_stages.py, 3, 4 and 16 boxes: from the warm start instead of the
    cold one the velocity agrees to 6e-8 m/s; ending at 1e-8 against 1e-11 or 1e-10, to 4e-7
    m/s;
    proximal-point iterations pick other solutions, up to 6e-3 m/s away; solver.py's docstring
    states the rule). Returns ``active_set``'s tuple (found first)."""
    m = G.shape[0]
    k = 3 * nc
    nl = m - k
    rounds = nc + nl + 2
    if mode_rounds > rounds:
        rounds = mode_rounds
    s = 0.0
    for i in range(m):
        s += dG[i]
    s /= m
    modes = np.empty(nc, np.int64)
    for i in range(nc):
        modes[i] = STICKING if g[3 * i + 2] < 0.0 else BREAKING
    lim_act = np.empty(nl, np.bool_)
    for j in range(nl):
        lim_act[j] = g[k + j] < 0.0
    lam = np.zeros(m)
    Gr = G.copy()
    dGr = np.empty(m)
    dcr = np.empty(nc)
    lmin = math.log(LIMIT_RHO_MIN)
    lf = math.log(LIMIT_FACTOR)
    cur = math.log(LIMIT_RHO0)
    prev = cur
    solved = False
    step = lf
    total = 0
    raised = 0
    for _ in range(LIMIT_SUBS):
        rho = s * math.exp(cur)
        for i in range(m):
            Gr[i, i] = G[i, i] + rho
            dGr[i] = dG[i] + rho
        for i in range(nc):
            dcr[i] = dc[i] + rho
        out = active_set(Gr, g, nc, mu, modes, lim_act, lam, dGr, dcr, zero, haszero, vscale,
                         LIMIT_BUDGET, tol, mode_tol, newton_iter, rounds, None, None, None,
                         None)
        total += out[5]
        if not out[0]:
            if not solved:          # the first problem: a larger weight (at most 3 times)
                if raised == LIMIT_RAISE:
                    break
                raised += 1
                cur -= lf
                continue
            if step > LIMIT_SMALLEST * lf:
                break               # (the step halved to 1/16: the original from prev's)
            step *= 0.5
            cur = prev + step
            continue
        lam = out[1]
        modes = out[3]
        lim_act = out[4]
        prev = cur
        solved = True
        if cur <= lmin:
            break
        if step > lf:
            step = 2.0 * step if 2.0 * step > lf else lf
        cur = cur + step if cur + step > lmin else lmin
    if not solved:
        return False, lam, lam, modes, lim_act, total, _INF
    # the original problem from the last subproblem's solution (rho = LIMIT_RHO_MIN unless its
    # steps down stalled above it)
    sigma = np.empty(m)
    _matvec(G, lam, g, sigma)
    o2 = active_set(G, g, nc, mu, modes, lim_act, lam, dG, dc, zero, haszero, vscale,
                    LIMIT_BUDGET, tol, mode_tol, newton_iter, rounds, Jb, Mb, tlo, thi)
    if o2[0]:
        return True, o2[1], o2[2], o2[3], o2[4], total + o2[5], o2[6]
    f = _finish(G, g, nc, mu, modes, lim_act, lam, sigma, dG, dc, vscale, zero, haszero,
                tol, mode_tol, newton_iter, Jb, Mb, tlo, thi)
    if f[0]:
        return True, f[1], f[2], f[3], lim_act, total + o2[5] + f[4], f[5]
    res = natres(lam, sigma, nc, mu, dc, dG)
    if res <= tol:
        return True, lam, sigma, modes, lim_act, total + o2[5], res
    return False, lam, lam, modes, lim_act, total, _INF


# -- the Newton step of a large linear active set, in body space -----------------------------
# For the rows ``Ja`` (na, n) of an island whose dofs have the (block diagonal over the trees)
# mass matrix ``M``, the active-set Newton's linear systems are ``Gaa d = r`` with
# ``Gaa = Ja M^-1 Ja^T``, singular as soon as the contacts are redundant (a box on its face, a
# rack of balls: more rows than dofs). Its minimum-norm least-squares solution ``lam = Gaa^+ r``
# is the ``lam`` in range(Ja) (= range(Gaa)) with ``Ja^T (Gaa lam - r) = 0`` (the normal
# equations: null(Gaa) = null(Ja^T)), i.e. ``lam = Ja y`` with ``K M^-1 K y = Ja^T r``,
# ``K = Ja^T Ja``. With a generalized inverse K^g of K (K K^g K = K) and N a basis of null(K)
# (dofs no active row holds, e.g. a rack's counter-rotating "gear" spins):
#     w = K^g Ja^T r + N c,  c such that N^T M w = 0   (then M w is in range(K)),
#     y = K^g M w,           lam = Ja y.
# K is n x n (n dofs, not m rows) and as sparse as the bodies' contact graph: it is factored by an
# envelope Cholesky in reverse Cuthill-McKee order (cost ~ n b^2, b the envelope width: one row of
# a rack, one column of a pile) whose vanishing pivots are dropped (K^g: the inverse of the kept
# block, zero on the dropped dofs; each dropped dof d gives the null vector e_d - K^g K e_d),
# instead of the dense LU, rank test and SVD of the m x m Gaa. Storage grows with K's
# nonzeros (``body_factor_rows``): K in CSR, the Cholesky in row envelopes, each null vector
# over its component of K (K^g is block diagonal over them) and N^T M N block by block over
# the components of K joined by the trees (M couples only a tree's dofs).
BODY_MIN_ROWS = 256     # islands and active sets at least this large use it (see the README)
BODY_DROP = 1e-13       # a pivot^2 below this times K's diagonal entry: a dependent dof
BODY_MAX_NULL = 1024    # more dependent dofs than this coupled in one block of N^T M N: the dense path


@njit
def _rcm(adj_ptr, adj, deg, n):
    """Reverse Cuthill-McKee order of a graph (CSR adjacency), component by component, each
    from a pseudo-peripheral node (the last level of a BFS from a node of least degree)."""
    order = np.empty(n, np.int64)
    placed = np.zeros(n, np.bool_)
    level = np.empty(n, np.int64)
    queue = np.empty(n, np.int64)
    nord = 0
    while nord < n:
        s = -1
        for i in range(n):
            if not placed[i] and (s < 0 or deg[i] < deg[s]):
                s = i
        for _rep in range(2):
            for i in range(n):
                level[i] = -1
            level[s] = 0
            h = 0
            t = 1
            queue[0] = s
            while h < t:
                u = queue[h]
                h += 1
                for e in range(adj_ptr[u], adj_ptr[u + 1]):
                    w = adj[e]
                    if level[w] < 0 and not placed[w]:
                        level[w] = level[u] + 1
                        queue[t] = w
                        t += 1
            far = s
            for e in range(t):
                u = queue[e]
                if level[u] > level[far] or (level[u] == level[far] and deg[u] < deg[far]):
                    far = u
            s = far
        h = nord
        order[nord] = s
        placed[s] = True
        nord += 1
        while h < nord:
            u = order[h]
            h += 1
            first = nord
            for e in range(adj_ptr[u], adj_ptr[u + 1]):
                w = adj[e]
                if not placed[w]:
                    placed[w] = True
                    order[nord] = w
                    nord += 1
            for a in range(first + 1, nord):        # neighbours by increasing degree
                w = order[a]
                c = a - 1
                while c >= first and deg[order[c]] > deg[w]:
                    order[c + 1] = order[c]
                    c -= 1
                order[c + 1] = w
    out = np.empty(n, np.int64)
    for i in range(n):
        out[i] = order[n - 1 - i]
    return out


@njit
def _k_solve(perm, first, lptr, Lv, drop, y, out, lo, hi):
    """out = K^g y (``body_factor``: the kept block's Cholesky, zero on the dropped dofs) on
    the permuted positions ``lo:hi`` (a union of K's components: K^g is block diagonal over
    them; ``out`` is written there only, ``y`` is read there only)."""
    z = np.empty(hi - lo)
    for i in range(lo, hi):
        if drop[i]:
            z[i - lo] = 0.0
            continue
        s = y[perm[i]]
        o = lptr[i] - first[i]
        for k in range(first[i], i):
            s -= Lv[o + k] * z[k - lo]
        z[i - lo] = s / Lv[o + i]
    for i in range(hi - 1, lo - 1, -1):
        if drop[i]:
            continue
        o = lptr[i] - first[i]
        z[i - lo] /= Lv[o + i]
        zi = z[i - lo]
        for k in range(first[i], i):
            z[k - lo] -= Lv[o + k] * zi
    for i in range(lo, hi):
        out[perm[i]] = z[i - lo]


@njit
def _uf_find(parent, a):
    while parent[a] != a:
        parent[a] = parent[parent[a]]
        a = parent[a]
    return a


@njit
def body_factor(Ja, M, tlo, thi):
    """``body_factor_rows`` of all the rows of ``Ja`` (``island_body``'s pair)."""
    return body_factor_rows(Ja, np.arange(Ja[0].shape[0]), M, tlo, thi)


@njit
def _envelope_cholesky(n, perm, inv, first, lptr, kptr, kcol, kval, kdiag, kref, Lv, drop):
    """The envelope Cholesky of ``body_factor_rows`` (its comments) into ``Lv`` (zeros on
    entry; row i holds columns ``first[i]..i``) and ``drop``; returns the number of dropped
    dofs. Column by column (right-looking): column k's pivot, then its entries, then their
    products subtracted from the entries of the later rows holding column k. Entry (i, j)
    thus loses ``L[i, k] L[j, k]`` for k = max(first[i], first[j])..j-1 one by one in
    increasing k and is divided by its pivot last, as a row-by-row forward substitution does
    it: the same factor, bit for bit (up to the sign of an exact zero: a dropped column's zero
    products are not subtracted), where the substitution's chain of divisions along a row set
    the pace (~20% of the time at a rack of 64 balls). A pivot that vanishes against its dof's
    diagonal entry (``BODY_DROP`` times ``kref``) drops its dof: its row and column are zero."""
    for i in range(n):                  # K into the envelope (its permuted lower triangle)
        pi = perm[i]
        oi = lptr[i] - first[i]
        for e in range(kptr[pi], kptr[pi + 1]):
            j = inv[kcol[e]]
            if j < i:
                Lv[oi + j] = kval[e]
        Lv[oi + i] = kdiag[pi]
    # the rows holding each column below its diagonal (CSR, rows increasing)
    cptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        for k in range(first[i], i):
            cptr[k + 1] += 1
    for k in range(n):
        cptr[k + 1] += cptr[k]
    crow = np.empty(cptr[n], np.int64)
    fill = cptr[:n].copy()
    for i in range(n):
        for k in range(first[i], i):
            crow[fill[k]] = i
            fill[k] += 1
    col = np.empty(n)
    nd = 0
    for k in range(n):
        ok_ = lptr[k] - first[k]
        s = Lv[ok_ + k]
        r0 = cptr[k]
        r1 = cptr[k + 1]
        if not s > BODY_DROP * kref[perm[k]]:
            drop[k] = True
            nd += 1
            for j in range(first[k], k + 1):
                Lv[ok_ + j] = 0.0
            for a in range(r0, r1):
                i = crow[a]
                Lv[lptr[i] - first[i] + k] = 0.0
            continue
        d = math.sqrt(s)
        Lv[ok_ + k] = d
        for a in range(r0, r1):
            i = crow[a]
            p = lptr[i] - first[i] + k
            x = Lv[p] / d
            Lv[p] = x
            col[a - r0] = x
        for a in range(r0, r1):
            oi = lptr[crow[a]] - first[crow[a]]
            x = col[a - r0]
            for b in range(r0, a + 1):
                Lv[oi + crow[b]] -= x * col[b - r0]
    return nd


@njit
def body_factor_rows(Jb, act, M, tlo, thi):
    """Factor the body-space step of the rows ``Ja = Jb[act]`` (module comment above; not
    gathered: read in place; ``Jb``, ``M``: ``island_body``'s rows and mass matrix), in storage that
    grows with K's nonzeros, not with n^2: (ok, perm, first, lptr, Lv, drop, nd, klo, khi, noff,
    Nv, bptr, bcol, aoff, Av, nz_ptr, nz, nzv) with

    * the envelope Cholesky of K's kept dofs in permuted indices: row i holds its entries of
      columns ``first[i]..i`` at ``Lv[lptr[i]:lptr[i + 1]]``, ``drop[i]``: dropped;
    * the ``nd`` null vectors (one per dropped dof, in permuted order), column c nonzero only on
      the permuted positions ``klo[c]:khi[c]`` of its component of K (the reverse Cuthill-McKee
      order keeps each component contiguous), stored there at ``Nv[noff[c]:]``;
    * ``N^T M N`` block diagonal over the components of K's graph joined by the trees (M
      couples a tree's dofs only): block b holds the columns ``bcol[bptr[b]:bptr[b + 1]]`` and
      its inverse, row-major, at ``Av[aoff[b]:]``;
    * the nonzeros of each row of Ja (CSR: ``nz_ptr``, columns ``nz``, values ``nzv``).

    ok False when a block of N^T M N has more than BODY_MAX_NULL columns."""
    na = act.shape[0]
    n = M.shape[0]
    Jv, Jc = Jb
    kb = Jv.shape[1]
    nz_ptr = np.zeros(na + 1, np.int64)
    cnt = 0
    for a in range(na):
        ra = act[a]
        for t in range(kb):
            if Jc[ra, t] >= 0 and Jv[ra, t] != 0.0:
                cnt += 1
        nz_ptr[a + 1] = cnt
    nz = np.empty(cnt, np.int64)
    nzv = np.empty(cnt)
    cnt = 0
    for a in range(na):
        ra = act[a]
        for t in range(kb):
            if Jc[ra, t] >= 0 and Jv[ra, t] != 0.0:
                nz[cnt] = Jc[ra, t]
                nzv[cnt] = Jv[ra, t]
                cnt += 1
    # the rows holding each dof (CSR of Ja^T, rows increasing)
    cptr = np.zeros(n + 1, np.int64)
    for s in range(cnt):
        cptr[nz[s] + 1] += 1
    for c in range(n):
        cptr[c + 1] += cptr[c]
    crow = np.empty(cnt, np.int64)
    cval = np.empty(cnt)        # (row crow[e]'s entry in that dof's column)
    cfill = cptr[:n].copy()
    for a in range(na):
        for s in range(nz_ptr[a], nz_ptr[a + 1]):
            crow[cfill[nz[s]]] = a
            cval[cfill[nz[s]]] = nzv[s]
            cfill[nz[s]] += 1
    # K = Ja^T Ja row by row (each entry summed over the rows in increasing order, as a dense
    # accumulation would), its off-diagonal nonzeros as the (sorted) adjacency
    acc = np.zeros(n)
    mark = np.full(n, -1, np.int64)
    lst = np.empty(n, np.int64)
    kdiag = np.zeros(n)
    deg = np.zeros(n, np.int64)
    kcap = 16 * n + 16
    kptr = np.zeros(n + 1, np.int64)
    kcol = np.empty(kcap, np.int64)
    kval = np.empty(kcap)
    for c in range(n):
        nl = 0
        for e in range(cptr[c], cptr[c + 1]):
            a = crow[e]
            x = cval[e]
            for s in range(nz_ptr[a], nz_ptr[a + 1]):
                d = nz[s]
                if mark[d] != c:
                    mark[d] = c
                    acc[d] = 0.0
                    lst[nl] = d
                    nl += 1
                acc[d] += x * nzv[s]
        # (sorted in place by insertion: a few dozen entries, no allocation per column)
        for t in range(1, nl):
            d = lst[t]
            u = t - 1
            while u >= 0 and lst[u] > d:
                lst[u + 1] = lst[u]
                u -= 1
            lst[u + 1] = d
        srt = lst
        k0 = kptr[c]
        if k0 + nl > kcap:
            kcap = 2 * (k0 + nl)
            kcol, kval = _csr_grow(kcol, kval, k0, kcap)
        k = k0
        for t in range(nl):
            d = srt[t]
            if d == c:
                kdiag[c] = acc[d]
            elif acc[d] != 0.0:
                kcol[k] = d
                kval[k] = acc[d]
                k += 1
        kptr[c + 1] = k
        deg[c] = k - k0
    perm = _rcm(kptr, kcol, deg, n)
    inv = np.empty(n, np.int64)
    for i in range(n):
        inv[perm[i]] = i
    first = np.empty(n, np.int64)
    lptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        pi = perm[i]
        f = i
        for e in range(kptr[pi], kptr[pi + 1]):
            j = inv[kcol[e]]
            if j < f:
                f = j
        first[i] = f
        lptr[i + 1] = lptr[i] + i - f + 1
    # envelope Cholesky (fill stays inside the envelope; _envelope_cholesky); a pivot that vanishes
    # against its diagonal entry drops its dof (its column is left out of the later rows)
    Lv = np.zeros(lptr[n])
    drop = np.zeros(n, np.bool_)
    # a pivot is measured against its dof's diagonal entry, but at least against 1e-12 of the
    # largest one of its tree: a dof that only rounding couples to the rows (a ball's spin about
    # its floor normal, entries 1e-35 from its rotation matrix) is dependent, not a pivot that
    # would scale its null vectors by 1e35
    kref = kdiag.copy()
    for c in range(n):
        tm = 0.0
        for j in range(tlo[c], thi[c]):
            if kdiag[j] > tm:
                tm = kdiag[j]
        if 1e-12 * tm > kref[c]:
            kref[c] = 1e-12 * tm
    nd = _envelope_cholesky(n, perm, inv, first, lptr, kptr, kcol, kval, kdiag, kref, Lv, drop)
    # components of K's graph (contiguous in the permuted order): [comp_lo, comp_hi) of each
    # permuted position; and their unions through the trees (union-find over dofs)
    comp_lo = np.empty(n, np.int64)
    comp_hi = np.empty(n, np.int64)
    parent = np.arange(n)
    for c in range(n):
        for e in range(kptr[c], kptr[c + 1]):
            ra = _uf_find(parent, c)
            rb = _uf_find(parent, kcol[e])
            if ra != rb:
                parent[ra] = rb
    kcomp = np.empty(n, np.int64)
    for c in range(n):
        kcomp[c] = _uf_find(parent, c)
    i = 0
    while i < n:
        j = i + 1
        while j < n and kcomp[perm[j]] == kcomp[perm[i]]:
            j += 1
        for t in range(i, j):
            comp_lo[t] = i
            comp_hi[t] = j
        i = j
    for c in range(n):          # join the trees' dofs
        ra = _uf_find(parent, c)
        rb = _uf_find(parent, tlo[c])
        if ra != rb:
            parent[ra] = rb
    klo = np.empty(nd, np.int64)
    khi = np.empty(nd, np.int64)
    noff = np.zeros(nd + 1, np.int64)
    ucomp = np.empty(nd, np.int64)
    c = 0
    for i in range(n):
        if drop[i]:
            klo[c] = comp_lo[i]
            khi[c] = comp_hi[i]
            noff[c + 1] = noff[c] + comp_hi[i] - comp_lo[i]
            ucomp[c] = _uf_find(parent, perm[i])
            c += 1
    Nv = np.zeros(noff[nd])
    if nd:
        col = np.zeros(n)
        sol = np.zeros(n)
        c = 0
        for i in range(n):
            if drop[i]:
                d = perm[i]
                lo = klo[c]
                hi = khi[c]
                for e in range(kptr[d], kptr[d + 1]):
                    col[kcol[e]] = kval[e]
                col[d] = kdiag[d]
                _k_solve(perm, first, lptr, Lv, drop, col, sol, lo, hi)
                for e in range(kptr[d], kptr[d + 1]):
                    col[kcol[e]] = 0.0
                col[d] = 0.0
                o = noff[c] - lo
                for t in range(lo, hi):
                    Nv[o + t] = -sol[perm[t]]
                Nv[o + i] += 1.0
                c += 1
    # the blocks of N^T M N: the null columns grouped by their union component
    order = np.argsort(ucomp, kind="mergesort")
    nb = 0
    for t in range(nd):
        if t == 0 or ucomp[order[t]] != ucomp[order[t - 1]]:
            nb += 1
    bptr = np.zeros(nb + 1, np.int64)
    bcol = order.astype(np.int64)
    b = 0
    for t in range(nd):
        if t > 0 and ucomp[order[t]] != ucomp[order[t - 1]]:
            b += 1
        bptr[b + 1] = t + 1
    aoff = np.zeros(nb + 1, np.int64)
    big = 0
    for b in range(nb):
        w = bptr[b + 1] - bptr[b]
        aoff[b + 1] = aoff[b] + w * w
        if w > big:
            big = w
    ok = big <= BODY_MAX_NULL
    Av = np.zeros(aoff[nb] if ok else 0)
    if nd and ok:
        mn = np.zeros(n)
        nfull = np.zeros(n)
        for b in range(nb):
            w = bptr[b + 1] - bptr[b]
            A = np.empty((w, w))
            for cc in range(w):
                c = bcol[bptr[b] + cc]
                o = noff[c] - klo[c]
                for t in range(klo[c], khi[c]):
                    nfull[perm[t]] = Nv[o + t]
                # (M N)[:, c] on the dofs of the trees the column touches
                for t in range(klo[c], khi[c]):
                    r = perm[t]
                    for rr in range(tlo[r], thi[r]):
                        mn[rr] = 0.0
                for t in range(klo[c], khi[c]):
                    r = perm[t]
                    x = nfull[r]
                    if x != 0.0:
                        for rr in range(tlo[r], thi[r]):
                            mn[rr] += M[rr, r - tlo[rr]] * x
                for aa in range(w):
                    a_ = bcol[bptr[b] + aa]
                    oa = noff[a_] - klo[a_]
                    s = 0.0
                    for t in range(klo[a_], khi[a_]):
                        s += Nv[oa + t] * mn[perm[t]]
                    A[aa, cc] = s
                for t in range(klo[c], khi[c]):
                    r = perm[t]
                    nfull[r] = 0.0
                    for rr in range(tlo[r], thi[r]):
                        mn[rr] = 0.0
            Ai = np.linalg.inv(A)
            for aa in range(w):
                for cc in range(w):
                    Av[aoff[b] + aa * w + cc] = Ai[aa, cc]
    return (ok, perm, first, lptr, Lv, drop, nd, klo, khi, noff, Nv, bptr, bcol, aoff, Av,
            nz_ptr, nz, nzv)


@njit
def _normal_ok_e(e, n, nz_ptr, nz, nzv, r):
    """Whether ``Ja^T (Gaa y - r)`` vanishes against ``Ja^T r`` (to 1e-9, relative): the
    least-squares optimality of ``body_pinv``'s solution y, given ``e = Gaa y + r`` (computed
    over Gaa's nonzeros, ``_csr_matvec``; Ja: its CSR ``nz_ptr``, ``nz``, ``nzv``; ``n`` its
    number of columns)."""
    na = e.shape[0]
    t1 = np.zeros(n)
    t2 = np.zeros(n)
    for a in range(na):
        ea = e[a] - 2.0 * r[a]      # Gaa y - r
        ra = r[a]
        for s in range(nz_ptr[a], nz_ptr[a + 1]):
            c = nz[s]
            t1[c] += nzv[s] * ea
            t2[c] += nzv[s] * ra
    m1 = 0.0
    m2 = 0.0
    for c in range(n):
        if abs(t1[c]) > m1 or t1[c] != t1[c]:
            m1 = abs(t1[c])
        if abs(t2[c]) > m2:
            m2 = abs(t2[c])
    return m1 <= 1e-9 * m2 + 1e-300


@njit
def body_pinv(Ja, M, tlo, thi, perm, first, lptr, Lv, drop, nd, klo, khi, noff, Nv, bptr, bcol,
              aoff, Av, nz_ptr, nz, nzv, r):
    """``Gaa^+ r`` (module comment above) from ``body_factor``'s factors (``M``: the island's
    mass matrix by tree blocks, ``island_mass``: dof i couples only with dofs ``tlo[i]:thi[i]``
    of its tree; ``Ja``: not read)."""
    na = nz_ptr.shape[0] - 1
    n = M.shape[0]
    y = np.zeros(n)
    for a in range(na):
        ra = r[a]
        if ra != 0.0:
            for s in range(nz_ptr[a], nz_ptr[a + 1]):
                y[nz[s]] += nzv[s] * ra
    w = np.empty(n)
    _k_solve(perm, first, lptr, Lv, drop, y, w, 0, n)
    if nd:
        # w += N c with N^T M (w + N c) = 0, block by block of N^T M N
        Mw = np.empty(n)
        for i in range(n):
            s = 0.0
            for j in range(tlo[i], thi[i]):
                s += M[i, j - tlo[i]] * w[j]
            Mw[i] = s
        t = np.empty(nd)
        for c in range(nd):
            o = noff[c] - klo[c]
            s = 0.0
            for i in range(klo[c], khi[c]):
                s += Nv[o + i] * Mw[perm[i]]
            t[c] = s
        for b in range(bptr.shape[0] - 1):
            b0 = bptr[b]
            wb = bptr[b + 1] - b0
            for aa in range(wb):
                s = 0.0
                for cc in range(wb):
                    s += Av[aoff[b] + aa * wb + cc] * t[bcol[b0 + cc]]
                c = bcol[b0 + aa]
                o = noff[c] - klo[c]
                for i in range(klo[c], khi[c]):
                    w[perm[i]] -= Nv[o + i] * s
    for i in range(n):
        s = 0.0
        for j in range(tlo[i], thi[i]):
            s += M[i, j - tlo[i]] * w[j]
        y[i] = s
    _k_solve(perm, first, lptr, Lv, drop, y, w, 0, n)
    out = np.empty(na)
    for a in range(na):
        s = 0.0
        for t in range(nz_ptr[a], nz_ptr[a + 1]):
            s += nzv[t] * w[nz[t]]
        out[a] = s
    return out


@njit
def island_mass(used, tree_lo, tree_hi, Minv, Mb, moff):
    """The local numbering ``loc`` (-1 elsewhere) of the dofs of the trees whose root dof is
    marked in ``used``, their count ``n``, the mass matrix of those dofs by tree blocks (the
    inverse of each tree's block of M^-1, upper triangle filled: read from the dense ``Minv``,
    or where that is empty from the packed row-major blocks ``Mb`` at ``moff[root]``) and each
    local dof's tree range (tlo, thi); for ``island_body`` and
    ``island_step.island_body_blocks``. M couples only a tree's dofs: its entry (i, j) (j in
    ``tlo[i]:thi[i]``) is held at ``M[i, j - tlo[i]]``, M (n, widest tree) (a dense (n, n) M was
    288 MB at 1,000 free bodies)."""
    nv = used.shape[0]
    loc = np.full(nv, -1, np.int64)
    n = 0
    for d in range(nv):
        if used[tree_lo[d]]:
            loc[d] = n
            n += 1
    dense = Minv.shape[0] > 0
    wmax = 1
    d = 0
    while d < nv:
        if loc[d] >= 0 and tree_hi[d] - tree_lo[d] > wmax:
            wmax = tree_hi[d] - tree_lo[d]
        d += 1
    M = np.zeros((n, wmax))
    tlo = np.empty(n, np.int64)
    thi = np.empty(n, np.int64)
    d = 0
    while d < nv:
        if loc[d] < 0:
            d += 1
            continue
        lo = tree_lo[d]
        hi = tree_hi[d]
        w = hi - lo
        B = np.empty((w, w))
        for i in range(w):
            for j in range(i, w):
                if dense:
                    B[i, j] = B[j, i] = Minv[lo + i, lo + j]
                else:
                    B[i, j] = B[j, i] = Mb[moff[lo] + i * w + j]
        Bi = np.linalg.inv(B)
        l0 = loc[lo]
        for i in range(w):
            tlo[l0 + i] = l0
            thi[l0 + i] = l0 + w
            for j in range(w):
                M[l0 + i, j] = Bi[i, j]
        d = hi
    return loc, n, M, tlo, thi


@njit
def _row_dofs(rt, r, nv, tree_hi):
    """The dof ranges where row r of the step's J may be nonzero: (lo1, hi1, lo2, hi2), its
    (at most two) trees in increasing order (``rt``: each row's trees by their first dof, -1
    where none, ``constraint.assemble_sparse``), or all nv dofs where ``rt`` is None."""
    if rt is None:
        return 0, nv, 0, 0
    a = rt[r, 0]
    b = rt[r, 1]
    if a < 0 or (b >= 0 and b < a):
        a, b = b, a
    if b == a:
        b = -1
    if a < 0:
        a, b = b, -1
    if a < 0:
        return 0, 0, 0, 0
    if b < 0:
        return a, tree_hi[a], 0, 0
    return a, tree_hi[a], b, tree_hi[b]


@njit
def island_body(J, Minv, tree_lo, tree_hi, rows, rt=None):
    """The body-space data of an island (rows ``rows`` of the step's J): its rows restricted to
    the n dofs they touch, by their nonzeros ``Jb = (values, columns)`` (each (len(rows), most
    nonzeros in a row); row a's k-th nonzero, columns increasing, at ``[a, k]``; column -1
    past its last), the mass matrix ``M`` of those dofs by tree blocks (``island_mass``: the
    inverse of each tree's block of ``Minv``, pinocchio's computeMinverse with its upper
    triangle filled; an island holds whole trees) and each local dof's tree range (tlo, thi).
    (A dense (len(rows), n) Jb was 420 MB for a rack of 1,000 balls.) ``rt``: each row's
    trees (``constraint.assemble_sparse``, whose rows are nonzero only there): only those dofs
    are read (the scan of every dof cost ~0.25 ms at a rack of 64 balls); None: all."""
    nv = J.shape[1]
    used = np.zeros(nv, np.bool_)
    kmax = 1
    for r in rows:
        k = 0
        lo1, hi1, lo2, hi2 = _row_dofs(rt, r, nv, tree_hi)
        for d in range(lo1, hi1):
            if J[r, d] != 0.0:
                used[tree_lo[d]] = True
                k += 1
        for d in range(lo2, hi2):
            if J[r, d] != 0.0:
                used[tree_lo[d]] = True
                k += 1
        if k > kmax:
            kmax = k
    loc, n, M, tlo, thi = island_mass(used, tree_lo, tree_hi, Minv, np.zeros(0),
                                      np.zeros(0, np.int64))
    Jv = np.zeros((rows.shape[0], kmax))
    Jc = np.full((rows.shape[0], kmax), -1, np.int64)
    for a in range(rows.shape[0]):
        k = 0
        lo1, hi1, lo2, hi2 = _row_dofs(rt, rows[a], nv, tree_hi)
        for d in range(lo1, hi1):
            x = J[rows[a], d]
            if x != 0.0:
                Jv[a, k] = x
                Jc[a, k] = loc[d]        # (loc increases with d; the trees in order)
                k += 1
        for d in range(lo2, hi2):
            x = J[rows[a], d]
            if x != 0.0:
                Jv[a, k] = x
                Jc[a, k] = loc[d]
                k += 1
    return (Jv, Jc), M, tlo, thi


@njit
def no_body():
    """The body-space data of a problem below ``BODY_MIN_ROWS`` rows: no rows (``island_body``'s
    types, for the compiled variant that carries the body-space path)."""
    return ((np.zeros((0, 1)), np.zeros((0, 1), np.int64)), np.zeros((0, 1)),
            np.zeros(0, np.int64), np.zeros(0, np.int64))
