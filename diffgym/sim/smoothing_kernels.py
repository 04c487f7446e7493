"""Compiled kernel of the smooth gradient mode (``diffgym.sim.smoothing``): damped Newton steps on
the relaxed contact problem's central-path conditions, written as plain loops (numba).

Unknowns ``z = (l, s, eta)``: scaled impulses ``l = d lam`` (m), constraint velocities ``s`` (m)
and one auxiliary cone variable per frictional contact (nf). Conditions (``Gs = G diag(1/d)``):

* ``s - Gs l - g = 0`` (linear rows, eliminated from each Newton system: ``ds = Gs dl - r_eq``);
* contact ``i`` (rows t1, t2, n): ``l_n s_n = rho``; with friction (``x0 = mu l_n``)
  ``x0 s_t + eta l_t = 0`` (t = t1, t2) and ``x0 eta + l_t . s_t = rho`` (the cone product
  ``(x0, l_T) o (eta, s_T) = rho e``); frictionless ``l_t = 0``;
* limit row ``k``: ``l_k s_k = rho``.

Each step solves the reduced ``(m + nf)`` system by Gaussian elimination with partial pivoting
and is shortened (halved) until the iterate is interior and its error decreased.
"""
from __future__ import annotations

import numpy as np

from .jit import njit


@njit
def _errors(Gs, g, nc, mu, eta_of, rho, z, r, scale_eq):
    """Fills the residual r (2m + nf) and returns the error measure."""
    m = Gs.shape[0]
    e_eq = 0.0
    for a in range(m):
        acc = z[m + a] - g[a]
        for b in range(m):
            acc -= Gs[a, b] * z[b]
        r[a] = acc
        e_eq = max(e_eq, abs(acc))
    e_c = 0.0
    for i in range(nc):
        n = 3 * i + 2
        r[m + n] = z[n] * z[m + n] - rho
        k = eta_of[i]
        if k < 0:
            r[m + n - 2] = z[n - 2]
            r[m + n - 1] = z[n - 1]
        else:
            x0 = mu[i] * z[n]
            eta = z[2 * m + k]
            dot = 0.0
            for t in range(n - 2, n):
                r[m + t] = x0 * z[m + t] + eta * z[t]
                dot += z[t] * z[m + t]
            r[2 * m + k] = x0 * eta + dot - rho
            e_c = max(e_c, abs(r[2 * m + k]))
        for t in range(n - 2, n + 1):
            e_c = max(e_c, abs(r[m + t]))
    for a in range(3 * nc, m):
        r[m + a] = z[a] * z[m + a] - rho
        e_c = max(e_c, abs(r[m + a]))
    return max(e_eq / scale_eq * 1e3, e_c / rho)


@njit
def _interior(nc, mu, eta_of, z, m):
    for i in range(nc):
        n = 3 * i + 2
        if not (z[n] > 0.0 and z[m + n] > 0.0):
            return False
        k = eta_of[i]
        if k >= 0:
            if not (mu[i] * z[n] > np.sqrt(z[n - 2] ** 2 + z[n - 1] ** 2)):
                return False
            if not (z[2 * m + k] > np.sqrt(z[m + n - 2] ** 2 + z[m + n - 1] ** 2)):
                return False
    for a in range(3 * nc, m):
        if not (z[a] > 0.0 and z[m + a] > 0.0):
            return False
    return True


@njit
def _gauss_solve(K, x):
    """K x_new = x in place (partial pivoting); False on a zero pivot."""
    n = K.shape[0]
    for c in range(n):
        p = c
        big = abs(K[c, c])
        for a in range(c + 1, n):
            if abs(K[a, c]) > big:
                big = abs(K[a, c])
                p = a
        if not big > 0.0:
            return False
        if p != c:
            for b in range(n):
                K[c, b], K[p, b] = K[p, b], K[c, b]
            x[c], x[p] = x[p], x[c]
        piv = K[c, c]
        for a in range(c + 1, n):
            f = K[a, c] / piv
            if f != 0.0:
                for b in range(c, n):
                    K[a, b] -= f * K[c, b]
                x[a] -= f * x[c]
    for c in range(n - 1, -1, -1):
        acc = x[c]
        for b in range(c + 1, n):
            acc -= K[c, b] * x[b]
        x[c] = acc / K[c, c]
    return True


@njit
def relaxed_newton(Gs, g, nc, mu, eta_of, nf, rho, z, tol, max_iter):
    """Damped Newton from the interior point z (copied): ``(z, error, iterations)``; the error
    is the largest relaxed-complementarity residual over rho (and the linear rows' over
    ``1e-3 (1 + max |g|)``)."""
    m = Gs.shape[0]
    z = z.copy()
    n = m + nf
    r = np.empty(2 * m + nf)
    rt = np.empty(2 * m + nf)
    scale_eq = 1.0
    for a in range(m):
        scale_eq = max(scale_eq, 1.0 + abs(g[a]))
    e = _errors(Gs, g, nc, mu, eta_of, rho, z, r, scale_eq)
    K = np.empty((n, n))
    x = np.empty(n)
    dz = np.empty(2 * m + nf)
    zt = np.empty(2 * m + nf)
    it = 0
    while it < max_iter and e > tol:
        it += 1
        K[:, :] = 0.0
        # rows: the complementarity conditions (m, by constraint row) then the cone rows (nf)
        for i in range(nc):
            nn = 3 * i + 2
            lN, sN = z[nn], z[m + nn]
            for b in range(m):
                K[nn, b] = lN * Gs[nn, b]
            K[nn, nn] += sN
            x[nn] = lN * r[nn] - r[m + nn]
            k = eta_of[i]
            if k < 0:
                for t in range(nn - 2, nn):
                    K[t, t] = 1.0
                    x[t] = -r[m + t]
                continue
            x0 = mu[i] * lN
            eta = z[2 * m + k]
            ke = m + k
            for t in range(nn - 2, nn):
                for b in range(m):
                    K[t, b] = x0 * Gs[t, b]
                    K[ke, b] += z[t] * Gs[t, b]
                K[t, nn] += mu[i] * z[m + t]
                K[t, t] += eta
                K[t, ke] = z[t]
                x[t] = x0 * r[t] - r[m + t]
                K[ke, t] += z[m + t]
            K[ke, nn] += mu[i] * eta
            K[ke, ke] = x0
            x[ke] = z[nn - 2] * r[nn - 2] + z[nn - 1] * r[nn - 1] - r[2 * m + k]
        for a in range(3 * nc, m):
            for b in range(m):
                K[a, b] = z[a] * Gs[a, b]
            K[a, a] += z[m + a]
            x[a] = z[a] * r[a] - r[m + a]
        if not _gauss_solve(K, x):
            break
        for a in range(m):
            dz[a] = x[a]
        for a in range(m):
            acc = -r[a]
            for b in range(m):
                acc += Gs[a, b] * x[b]
            dz[m + a] = acc
        for k in range(nf):
            dz[2 * m + k] = x[m + k]
        ok = True
        for a in range(2 * m + nf):
            if not np.isfinite(dz[a]):
                ok = False
        if not ok:
            break
        alpha = 1.0
        accepted = False
        for _ in range(60):
            for a in range(2 * m + nf):
                zt[a] = z[a] + alpha * dz[a]
            if _interior(nc, mu, eta_of, zt, m):
                et = _errors(Gs, g, nc, mu, eta_of, rho, zt, rt, scale_eq)
                if et < e or alpha < 1e-3:
                    accepted = True
                    break
            alpha *= 0.5
        if not accepted:
            break
        for a in range(2 * m + nf):
            z[a] = zt[a]
            r[a] = rt[a]
        e = et
    return z, e, it


@njit
def relaxed_start(l, s, breaking, sticking, nc, mu, eta_of, nf, rho):
    """A centred interior point near the exact solution (scaled impulses ``l``, velocities
    ``s``, per contact ``breaking`` / ``sticking``): of each scalar pair (normal row, limit row)
    the dominant member is kept (at least sqrt(rho)) and the other is rho over it (a contact's
    normal pair is passive when breaking, a limit's when its velocity dominates); a sticking
    contact keeps its friction inside the cone and takes the slip of the centred cone pair; any
    other keeps its slip and takes the opposing friction of the centred pair."""
    m = l.shape[0]
    z = np.zeros(2 * m + nf)
    sr = np.sqrt(rho)
    for a in range(m):
        z[m + a] = s[a]
    for a in range(m):
        if a < 3 * nc and a % 3 != 2:
            continue
        la = max(l[a], 0.0)
        sa = max(s[a], 0.0)
        passive = breaking[a // 3] if a < 3 * nc else sa > la
        big = max(sa if passive else la, sr)
        small = rho / big
        z[a] = small if passive else big
        z[m + a] = big if passive else small
    for i in range(nc):
        k = eta_of[i]
        if k < 0:
            continue
        r = 3 * i
        x0 = mu[i] * z[r + 2]
        l0, l1 = l[r], l[r + 1]
        s0, s1 = s[r], s[r + 1]
        if sticking[i] and np.sqrt(l0 * l0 + l1 * l1) < 0.999 * x0:
            det = x0 * x0 - (l0 * l0 + l1 * l1)
            z[r], z[r + 1] = l0, l1
            z[m + r], z[m + r + 1] = -rho * l0 / det, -rho * l1 / det
            z[2 * m + k] = rho * x0 / det
        else:
            sn = np.sqrt(s0 * s0 + s1 * s1)
            u0 = s0 / sn if sn > 0.0 else 0.0
            u1 = s1 / sn if sn > 0.0 else 0.0
            root = np.sqrt(rho * rho + 4.0 * x0 * x0 * sn * sn)
            c = 2.0 * x0 * x0 * sn / (rho + root)
            z[r], z[r + 1] = -c * u0, -c * u1
            z[2 * m + k] = (rho + root) / (2.0 * x0)
    return z
