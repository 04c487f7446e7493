"""Compiled kernels of the step derivatives (``derivatives.step_jacobian``, compiled route).

Two kernels around pinocchio's ABA derivatives, written as plain loops over floats (numba,
``diffgym.sim.jit.njit``), each the arithmetic of the numpy reference in ``derivatives.py``:

* ``contact_terms`` (after ``computeForwardKinematicsDerivatives`` at (q, v1), before the ABA
  derivatives): the contact impulses as external joint forces (written into pinocchio's own
  ``fext`` vector), the joints' Jacobians and velocity derivatives read from ``data.J``,
  ``data.oMi``, ``data.ov`` (``getJointJacobian`` / ``getJointVelocityDerivatives`` in WORLD,
  restricted to each joint's support), the closed-form geometry of shapes on a static plane
  (sphere, capsule, box, mesh) and of two spheres, the contact frames' derivatives, ``corr``
  (d(J^T lam)/dq minus its body-fixed part) and ``Dq_extra`` (d(J(q) w)/dq at w = v1 and the
  Baumgarte terms);
* ``dynamics_terms`` (after the ABA derivatives and ``dIntegrate``): the fixed-impulse
  sensitivities, the mode system (A, W), the minimum-norm solve and the chain rule back to
  (q1, v1). The reference solves ``A dlam = -W D`` by LU where A is well conditioned (singular
  values sv[-1] > 1e-8 sv[0]), else by least squares with rcond 1e-12 (four coplanar contacts
  make A rank deficient). Here a pivoted QR of A^T settles the clear cases (|r_mm| > 1e-6 |r_11|:
  full rank; else a rank r with every trailing |r_kk| < 1e-14 |r_11|: the minimum-norm solution by
  a complete orthogonal decomposition) and solves for ``M^-1 J^T A^+`` (nv right-hand sides)
  rather than ``dlam`` (3 nv); anything in between is handed back to the reference's LAPACK
  solve in numpy (ill-conditioned states, e.g. a sliding contact with almost no slip).

Array conventions: ``oM`` (njoints, 12) rows are pinocchio SE3 placements (rotation column-major
then translation), ``ov`` and ``fext`` (njoints, 6) rows are (linear, angular).
"""
from __future__ import annotations

import numpy as np

from .solver_kernels import _uf_find
from .constraint import MAX_DEPENETRATION_SPEED, _push_gain, contact_gain
from .jit import njit
from .solver import BREAKING, STICKING



@njit
def contact_terms(JT, oM, ov, fext, supp, dof_joint, parents, gjoint, static_plane, roll_radius,
                  python_geometry, gplace, geom1, geom2, pos, normal, dist, cdist, frames, lam, v1,
                  dt, erp, skin, geo_given, dp_in, dn_in, dd_in, lim_idx, lim_dist, lim_v,
                  lim_sign, v0, rest, cap=MAX_DEPENETRATION_SPEED):
    """JT: ``data.J.T`` (nv, 6), WORLD joint Jacobian columns after
    ``computeForwardKinematicsDerivatives`` at (q, v1), as are ``oM`` and ``ov``.

    Writes the joint forces of the contact impulses into ``fext`` (zeroed first) and returns
    ``(corr (nv, nv), Dq_extra (m, nv), True)``. The closed forms here: a shape on a static
    plane and two spheres (``_kernel_geometry``; ``gplace`` (ngeom, 12): the geoms' world
    placements, rotation column-major then translation). ``geo_given``: dp/dn/dd computed in
    Python (``dp_in`` ...) for the contacts whose geom pair has no closed form here
    (``python_geometry[g1, g2]``); the kernel writes the other rows of these arrays itself
    (``derivatives.geometry_derivatives(..., skip=)`` leaves them zero), so they hold every
    contact's geometry on return. Where such a pair exists and the geometry is not given, returns
    ``(.., .., False)`` at once: the caller computes it and calls again.
    ``rest`` (nc,): the coefficient of the contacts whose normal row carries Newton's impact law
    (``b = e u + erp min(d, 0) / dt`` + its gravity term, u the normal velocity at the pre-step
    ``v0``), 0 elsewhere: their rows get ``e du/dq`` and the gain of that ``b``; negative: an
    impact-law contact closing short of contact (``b = d / rem``, gain 1/rem, given as
    ``-rem / dt``: -1 where ``rem = dt``)."""
    nv = JT.shape[0]
    nj = oM.shape[0]
    nc = pos.shape[0]
    nl = lim_idx.shape[0]
    m = 3 * nc + nl
    corr = np.zeros((nv, nv))
    Dq = np.zeros((m, nv))
    if not geo_given:
        for k in range(nc):
            if python_geometry[geom1[k], geom2[k]]:
                return corr, Dq, False
    for j in range(nj):
        for i in range(6):
            fext[j, i] = 0.0
    for jl in range(nl):
        gain = 1.0 / dt if lim_dist[jl] > skin else erp / dt
        li = lim_idx[jl]
        Dq[3 * nc + jl, lim_v[li]] += gain * lim_sign[li]
    if nc == 0:
        return corr, Dq, True

    # joints carrying contacts: LOCAL_WORLD_ALIGNED Jacobian and WORLD velocity derivative
    need = np.zeros(nj, dtype=np.bool_)
    for k in range(nc):
        need[gjoint[geom1[k]]] = True
        need[gjoint[geom2[k]]] = True
    need[0] = False
    slot = np.zeros(nj, dtype=np.int64)      # row of joint j in Jl, dV
    ns = 0
    for j in range(1, nj):
        if need[j]:
            slot[j] = ns
            ns += 1
    Jl = np.zeros((ns, 6, nv))
    dV = np.zeros((ns, 6, nv))
    for j in range(1, nj):
        if not need[j]:
            continue
        sj = slot[j]
        o0, o1, o2 = oM[j, 9], oM[j, 10], oM[j, 11]
        vj = ov[j]
        for c in range(nv):
            if not supp[j, c]:
                continue
            l0, l1, l2 = JT[c, 0], JT[c, 1], JT[c, 2]
            a0, a1, a2 = JT[c, 3], JT[c, 4], JT[c, 5]
            # translateJointJacobian: linear -= o x angular
            Jl[sj, 0, c] = l0 - (o1 * a2 - o2 * a1)
            Jl[sj, 1, c] = l1 - (o2 * a0 - o0 * a2)
            Jl[sj, 2, c] = l2 - (o0 * a1 - o1 * a0)
            Jl[sj, 3, c] = a0
            Jl[sj, 4, c] = a1
            Jl[sj, 5, c] = a2
            # getJointVelocityDerivatives (WORLD): (ov[parent] - ov[j]) x JT[c]
            p = parents[dof_joint[c]]
            if p > 0:
                t0, t1, t2 = ov[p, 0] - vj[0], ov[p, 1] - vj[1], ov[p, 2] - vj[2]
                w0, w1, w2 = ov[p, 3] - vj[3], ov[p, 4] - vj[4], ov[p, 5] - vj[5]
            else:
                t0, t1, t2 = -vj[0], -vj[1], -vj[2]
                w0, w1, w2 = -vj[3], -vj[4], -vj[5]
            dV[sj, 0, c] = (w1 * l2 - w2 * l1) + (t1 * a2 - t2 * a1)
            dV[sj, 1, c] = (w2 * l0 - w0 * l2) + (t2 * a0 - t0 * a2)
            dV[sj, 2, c] = (w0 * l1 - w1 * l0) + (t0 * a1 - t1 * a0)
            dV[sj, 3, c] = w1 * a2 - w2 * a1
            dV[sj, 4, c] = w2 * a0 - w0 * a2
            dV[sj, 5, c] = w0 * a1 - w1 * a0

    # contact impulses in world axes
    lamc = np.empty((nc, 3))
    fw = np.empty((nc, 3))
    for k in range(nc):
        for i in range(3):
            lamc[k, i] = lam[3 * k + i]
        for i in range(3):
            fw[k, i] = frames[k, i, 0] * lamc[k, 0] + frames[k, i, 1] * lamc[k, 1] \
                + frames[k, i, 2] * lamc[k, 2]

    # external joint forces (local frames), side 1 (-) then side 2 (+)
    sums = np.zeros((nj, 6))
    touched = np.zeros(nj, dtype=np.bool_)
    for side in range(2):
        sgn = -1.0 if side == 0 else 1.0
        s = sgn / dt
        sums[:, :] = 0.0
        touched[:] = False
        for k in range(nc):
            j = gjoint[geom1[k]] if side == 0 else gjoint[geom2[k]]
            if j == 0:
                continue
            touched[j] = True
            f0, f1, f2 = s * fw[k, 0], s * fw[k, 1], s * fw[k, 2]
            r0, r1, r2 = pos[k, 0] - oM[j, 9], pos[k, 1] - oM[j, 10], pos[k, 2] - oM[j, 11]
            sums[j, 0] += f0
            sums[j, 1] += f1
            sums[j, 2] += f2
            sums[j, 3] += r1 * f2 - r2 * f1
            sums[j, 4] += r2 * f0 - r0 * f2
            sums[j, 5] += r0 * f1 - r1 * f0
        for j in range(1, nj):
            if not touched[j]:
                continue
            for b in range(3):       # R^T x: column b of R (oM[j, 3b:3b+3]) dotted with x
                fext[j, b] += oM[j, 3 * b] * sums[j, 0] + oM[j, 3 * b + 1] * sums[j, 1] \
                    + oM[j, 3 * b + 2] * sums[j, 2]
                fext[j, 3 + b] += oM[j, 3 * b] * sums[j, 3] + oM[j, 3 * b + 1] * sums[j, 4] \
                    + oM[j, 3 * b + 2] * sums[j, 5]

    # collision geometry: dp/dq, dn/dq, d dist/dq
    if geo_given:
        dp = dp_in
        dn = dn_in
        dd = dd_in
    else:
        dp = np.zeros((nc, 3, nv))
        dn = np.zeros((nc, 3, nv))
        dd = np.zeros((nc, nv))
    for k in range(nc):
        if not python_geometry[geom1[k], geom2[k]]:
            _kernel_geometry(k, Jl, slot, oM, supp, gjoint, static_plane, roll_radius, gplace,
                             geom1, geom2, pos, normal, dist, dp, dn, dd)

    # frame derivatives where the normal moves: dR (3, 3, nv) [component, column, dof]
    moving = np.zeros(nc, dtype=np.bool_)
    for k in range(nc):
        for i in range(3):
            for c in range(nv):
                if dn[k, i, c] != 0.0:
                    moving[k] = True
    nmov = 1 if moving.any() else 0
    dR = np.zeros((nc * nmov, 3, 3, nv))
    df = np.zeros((nc * nmov, 3, nv))
    for k in range(nc):
        if not moving[k]:
            continue
        n0, n1, n2 = normal[k, 0], normal[k, 1], normal[k, 2]
        use_x = abs(n0) < 0.9
        if use_x:
            c0, c1, c2 = 0.0, -n2, n1
        else:
            c0, c1, c2 = n2, 0.0, -n0
        ncn = np.sqrt(c0 * c0 + c1 * c1 + c2 * c2)
        t0, t1, t2 = c0 / ncn, c1 / ncn, c2 / ncn
        for c in range(nv):
            e0, e1, e2 = dn[k, 0, c], dn[k, 1, c], dn[k, 2, c]
            if use_x:
                q0, q1, q2 = 0.0, -e2, e1
            else:
                q0, q1, q2 = e2, 0.0, -e0
            tdc = t0 * q0 + t1 * q1 + t2 * q2
            u0 = (q0 - t0 * tdc) / ncn
            u1 = (q1 - t1 * tdc) / ncn
            u2 = (q2 - t2 * tdc) / ncn
            # dt2 = n x dt1 - t1 x dn
            s0 = (n1 * u2 - n2 * u1) - (t1 * e2 - t2 * e1)
            s1 = (n2 * u0 - n0 * u2) - (t2 * e0 - t0 * e2)
            s2 = (n0 * u1 - n1 * u0) - (t0 * e1 - t1 * e0)
            dR[k, 0, 0, c] = u0
            dR[k, 1, 0, c] = u1
            dR[k, 2, 0, c] = u2
            dR[k, 0, 1, c] = s0
            dR[k, 1, 1, c] = s1
            dR[k, 2, 1, c] = s2
            dR[k, 0, 2, c] = e0
            dR[k, 1, 2, c] = e1
            dR[k, 2, 2, c] = e2
            for i in range(3):
                df[k, i, c] = dR[k, i, 0, c] * lamc[k, 0] + dR[k, i, 1, c] * lamc[k, 1] \
                    + dR[k, i, 2, c] * lamc[k, 2]

    # corr, relative point velocity and its derivative
    vrel = np.zeros((nc, 3))
    dvrel = np.zeros((nc, 3, nv))
    Jp = np.empty((3, nv))
    X = np.empty((3, nv))
    Y = np.empty((3, nv))
    ia = np.empty(nv, dtype=np.int64)
    ib = np.empty(nv, dtype=np.int64)
    for side in range(2):
        sgn = -1.0 if side == 0 else 1.0
        for k in range(nc):
            j = gjoint[geom1[k]] if side == 0 else gjoint[geom2[k]]
            if j == 0:
                continue
            sj = slot[j]
            p0, p1, p2 = pos[k, 0], pos[k, 1], pos[k, 2]
            r0, r1, r2 = p0 - oM[j, 9], p1 - oM[j, 10], p2 - oM[j, 11]
            fs0, fs1, fs2 = sgn * fw[k, 0], sgn * fw[k, 1], sgn * fw[k, 2]
            w0, w1, w2 = ov[j, 3], ov[j, 4], ov[j, 5]
            for c in range(nv):
                a0, a1, a2 = Jl[sj, 3, c], Jl[sj, 4, c], Jl[sj, 5, c]
                Jp[0, c] = Jl[sj, 0, c] - (r1 * a2 - r2 * a1)
                Jp[1, c] = Jl[sj, 1, c] - (r2 * a0 - r0 * a2)
                Jp[2, c] = Jl[sj, 2, c] - (r0 * a1 - r1 * a0)
                x0 = fs1 * a2 - fs2 * a1
                x1 = fs2 * a0 - fs0 * a2
                x2 = fs0 * a1 - fs1 * a0
                if moving[k]:
                    x0 = sgn * df[k, 0, c] + x0
                    x1 = sgn * df[k, 1, c] + x1
                    x2 = sgn * df[k, 2, c] + x2
                X[0, c] = x0
                X[1, c] = x1
                X[2, c] = x2
                e0 = dp[k, 0, c] - Jp[0, c]
                e1 = dp[k, 1, c] - Jp[1, c]
                e2 = dp[k, 2, c] - Jp[2, c]
                Y[0, c] = fs1 * e2 - fs2 * e1
                Y[1, c] = fs2 * e0 - fs0 * e2
                Y[2, c] = fs0 * e1 - fs1 * e0
                # d(point velocity)/dq + w x dp
                b0, b1, b2 = dV[sj, 3, c], dV[sj, 4, c], dV[sj, 5, c]
                g0, g1, g2 = dp[k, 0, c], dp[k, 1, c], dp[k, 2, c]
                dvrel[k, 0, c] += sgn * ((dV[sj, 0, c] - (p1 * b2 - p2 * b1)) + (w1 * g2 - w2 * g1))
                dvrel[k, 1, c] += sgn * ((dV[sj, 1, c] - (p2 * b0 - p0 * b2)) + (w2 * g0 - w0 * g2))
                dvrel[k, 2, c] += sgn * ((dV[sj, 2, c] - (p0 * b1 - p1 * b0)) + (w0 * g1 - w1 * g0))
            for i in range(3):
                acc = 0.0
                for c in range(nv):
                    acc += Jp[i, c] * v1[c]
                vrel[k, i] += sgn * acc
            # only the dofs that move this body (rows) and that its terms read (columns): the
            # others add exact zeros (O(nc nv^2) dense on a scene of many trees)
            na = 0
            nb = 0
            for c in range(nv):
                if Jp[0, c] != 0.0 or Jp[1, c] != 0.0 or Jp[2, c] != 0.0 or \
                        Jl[sj, 3, c] != 0.0 or Jl[sj, 4, c] != 0.0 or Jl[sj, 5, c] != 0.0:
                    ia[na] = c
                    na += 1
                if X[0, c] != 0.0 or X[1, c] != 0.0 or X[2, c] != 0.0 or \
                        Y[0, c] != 0.0 or Y[1, c] != 0.0 or Y[2, c] != 0.0:
                    ib[nb] = c
                    nb += 1
            for ai in range(na):
                a = ia[ai]
                for bi in range(nb):
                    b = ib[bi]
                    acc = 0.0
                    for i in range(3):
                        acc += Jp[i, a] * X[i, b] - Jl[sj, 3 + i, a] * Y[i, b]
                    corr[a, b] += acc

    # Dq_extra: R^T d vrel (+ dR^T vrel), Baumgarte on the normal rows
    for k in range(nc):
        gain = contact_gain(cdist[k], dt, erp, skin, cap)
        if rest[k] > 0.0:                    # impact law: b = e u + erp min(d, 0) / dt
            gain = _push_gain(cdist[k], dt, erp, cap) if cdist[k] < 0.0 else 0.0
        elif rest[k] < 0.0:                  # closing, short of contact: b = d / rem (d > 0),
            gain = -1.0 / (rest[k] * dt)     # rest = -rem / dt (-1: rem = dt, gain 1 / dt)
        for i in range(3):
            for c in range(nv):
                acc = frames[k, 0, i] * dvrel[k, 0, c] + frames[k, 1, i] * dvrel[k, 1, c] \
                    + frames[k, 2, i] * dvrel[k, 2, c]
                if moving[k]:
                    acc = (dR[k, 0, i, c] * vrel[k, 0] + dR[k, 1, i, c] * vrel[k, 1]
                           + dR[k, 2, i, c] * vrel[k, 2]) + acc
                Dq[3 * k + i, c] = acc
        for c in range(nv):
            Dq[3 * k + 2, c] += gain * dd[k, c]
    for k in range(nc):
        if rest[k] > 0.0:
            _restitution_dq(JT, slot, supp, dof_joint, parents, gjoint, geom1, geom2, pos,
                            frames, dp, dR, moving, v0, rest, Dq)
            break
    return corr, Dq, True


@njit
def frame_jacobians(JT, oM, supp, js):
    """The joints js' Jacobians (len(js), 6, nv), LOCAL_WORLD_ALIGNED (linear part l - o x a
    from the WORLD columns JT (nv, 6), zero off each joint's supporting dofs ``supp[j]``), and
    their origins (len(js), 3) from ``oM`` (``derivatives._FrameKin``; the arithmetic of
    ``contact_terms``, the bits of pinocchio's ``getJointJacobian``)."""
    nv = JT.shape[0]
    k = js.shape[0]
    J = np.zeros((k, 6, nv))
    o = np.empty((k, 3))
    for i in range(k):
        j = js[i]
        o0, o1, o2 = oM[j, 9], oM[j, 10], oM[j, 11]
        o[i, 0], o[i, 1], o[i, 2] = o0, o1, o2
        for c in range(nv):
            if not supp[j, c]:
                continue
            a0, a1, a2 = JT[c, 3], JT[c, 4], JT[c, 5]
            J[i, 0, c] = JT[c, 0] - (o1 * a2 - o2 * a1)
            J[i, 1, c] = JT[c, 1] - (o2 * a0 - o0 * a2)
            J[i, 2, c] = JT[c, 2] - (o0 * a1 - o1 * a0)
            J[i, 3, c] = a0
            J[i, 4, c] = a1
            J[i, 5, c] = a2
    return J, o


@njit
def _kernel_geometry(k, Jl, slot, oM, supp, gjoint, static_plane, roll_radius, gplace, geom1,
                     geom2, pos, normal, dist, dp, dn, dd):
    """dp/dq, dn/dq, d dist/dq of contact k (rows of dp (nc, 3, nv), dn, dd written) for the
    pairs ``contact_terms`` closes: a shape on a static plane (``derivatives._plane_contacts``:
    the witness point moves with its centre, segment point or vertex, dn = 0) or two spheres
    (``derivatives.geometry_derivatives``: the centres move with their bodies; with r = c2 - c1,
    L = |r|, dn = (I - n n^T) dr / L, dd = n . dr, dp = (dc1 + dc2) / 2 + (r1 - r2) / 2 dn), in
    the reference's order of operations (the same bits)."""
    nv = dp.shape[2]
    g1 = geom1[k]
    g2 = geom2[k]
    if not (static_plane[g1] or static_plane[g2]):        # two spheres
        j1 = gjoint[g1]
        j2 = gjoint[g2]
        s1 = slot[j1]
        s2 = slot[j2]
        c10, c11, c12 = gplace[g1, 9], gplace[g1, 10], gplace[g1, 11]
        c20, c21, c22 = gplace[g2, 9], gplace[g2, 10], gplace[g2, 11]
        e0, e1, e2 = c20 - c10, c21 - c11, c22 - c12
        L = np.sqrt(e0 * e0 + e1 * e1 + e2 * e2)
        n0, n1, n2 = normal[k, 0], normal[k, 1], normal[k, 2]
        h = 0.5 * (roll_radius[g1] - roll_radius[g2])
        # centres relative to their joints' origins
        x0, x1, x2 = (c10 - oM[j1, 9], c11 - oM[j1, 10], c12 - oM[j1, 11]) if j1 else \
            (c10, c11, c12)
        y0, y1, y2 = (c20 - oM[j2, 9], c21 - oM[j2, 10], c22 - oM[j2, 11]) if j2 else \
            (c20, c21, c22)
        for c in range(nv):
            a0 = a1 = a2 = b0 = b1 = b2 = 0.0
            if j1:
                w0, w1, w2 = Jl[s1, 3, c], Jl[s1, 4, c], Jl[s1, 5, c]
                a0 = Jl[s1, 0, c] - (x1 * w2 - x2 * w1)
                a1 = Jl[s1, 1, c] - (x2 * w0 - x0 * w2)
                a2 = Jl[s1, 2, c] - (x0 * w1 - x1 * w0)
            if j2:
                w0, w1, w2 = Jl[s2, 3, c], Jl[s2, 4, c], Jl[s2, 5, c]
                b0 = Jl[s2, 0, c] - (y1 * w2 - y2 * w1)
                b1 = Jl[s2, 1, c] - (y2 * w0 - y0 * w2)
                b2 = Jl[s2, 2, c] - (y0 * w1 - y1 * w0)
            r0, r1, r2 = b0 - a0, b1 - a1, b2 - a2
            ddk = n0 * r0 + n1 * r1 + n2 * r2
            m0 = (r0 - n0 * ddk) / L
            m1 = (r1 - n1 * ddk) / L
            m2 = (r2 - n2 * ddk) / L
            dd[k, c] = ddk
            dn[k, 0, c] = m0
            dn[k, 1, c] = m1
            dn[k, 2, c] = m2
            dp[k, 0, c] = 0.5 * (a0 + b0) + h * m0
            dp[k, 1, c] = 0.5 * (a1 + b1) + h * m1
            dp[k, 2, c] = 0.5 * (a2 + b2) + h * m2
        return
    first = static_plane[g1]
    sg = 1.0 if first else -1.0
    gx = g2 if first else g1
    jx = gjoint[gx]
    if jx == 0:
        return                                 # dx = 0
    sx = slot[jx]
    n0, n1, n2 = sg * normal[k, 0], sg * normal[k, 1], sg * normal[k, 2]
    h = dist[k]
    rr = roll_radius[gx]
    # witness point x on the shape, then its centre / segment point / vertex
    ax0 = (pos[k, 0] + h * n0) + rr * n0 - oM[jx, 9]
    ax1 = (pos[k, 1] + h * n1) + rr * n1 - oM[jx, 10]
    ax2 = (pos[k, 2] + h * n2) + rr * n2 - oM[jx, 11]
    for c in range(nv):
        if not supp[jx, c]:
            continue
        a0, a1, a2 = Jl[sx, 3, c], Jl[sx, 4, c], Jl[sx, 5, c]
        d0 = Jl[sx, 0, c] - (ax1 * a2 - ax2 * a1)
        d1 = Jl[sx, 1, c] - (ax2 * a0 - ax0 * a2)
        d2 = Jl[sx, 2, c] - (ax0 * a1 - ax1 * a0)
        ddist = n0 * d0 + n1 * d1 + n2 * d2
        dd[k, c] = ddist
        dp[k, 0, c] = d0 - n0 * ddist
        dp[k, 1, c] = d1 - n1 * ddist
        dp[k, 2, c] = d2 - n2 * ddist
    for c in range(nv):
        if not supp[jx, c]:
            dd[k, c] = 0.0
            dp[k, 0, c] = 0.0
            dp[k, 1, c] = 0.0
            dp[k, 2, c] = 0.0
    for i in range(3):
        for c in range(nv):
            dn[k, i, c] = 0.0


@njit
def _joint_velocities(JT, supp, w):
    """Each joint's WORLD spatial velocity at the generalized velocity ``w``: the sum over its
    supporting dofs ``c`` (``supp[j, c]``) of ``JT[c] w[c]`` (row 0, the universe, zero)."""
    nj, nv = supp.shape[0], JT.shape[0]
    ov = np.zeros((nj, 6))
    for j in range(1, nj):
        for c in range(nv):
            if supp[j, c]:
                for i in range(6):
                    ov[j, i] += JT[c, i] * w[c]
    return ov


@njit
def _dof_velocity_derivative(JT, c, ov, pp, vj):
    """The derivative along dof ``c`` (WORLD axis ``JT[c]`` = (l, a)) of a joint's WORLD spatial
    velocity ``vj`` with respect to that dof's parent joint ``pp`` (velocity ``ov[pp]``):
    (e, b), with (t, x) = ov[pp] - vj, e = x x l + t x a (linear part at the origin) and
    b = x x a (angular part). Shared by the restitution and projection terms."""
    l0, l1, l2 = JT[c, 0], JT[c, 1], JT[c, 2]
    a0, a1, a2 = JT[c, 3], JT[c, 4], JT[c, 5]
    t0, t1, t2 = ov[pp, 0] - vj[0], ov[pp, 1] - vj[1], ov[pp, 2] - vj[2]
    x0, x1, x2 = ov[pp, 3] - vj[3], ov[pp, 4] - vj[4], ov[pp, 5] - vj[5]
    return ((x1 * l2 - x2 * l1) + (t1 * a2 - t2 * a1),
            (x2 * l0 - x0 * l2) + (t2 * a0 - t0 * a2),
            (x0 * l1 - x1 * l0) + (t0 * a1 - t1 * a0),
            x1 * a2 - x2 * a1, x2 * a0 - x0 * a2, x0 * a1 - x1 * a0)


@njit
def _restitution_dq(JT, slot, supp, dof_joint, parents, gjoint, geom1, geom2, pos, frames,
                    dp, dR, moving, v0, rest, Dq):
    """Adds ``e du/dq`` to the normal rows of the impact-law contacts (``rest > 0``): u = n .
    (relative velocity of the contact point at the pre-step v0), differentiated as the
    relative velocity at v1 is in ``contact_terms``, with the joints' spatial velocities at v0
    (``ov0[j] = sum over its supporting dofs of JT[c] v0[c]``, WORLD) in place of ``data.ov``."""
    nv = JT.shape[0]
    nc = pos.shape[0]
    ov0 = _joint_velocities(JT, supp, v0)
    dvr = np.zeros((3, nv))
    vr = np.zeros(3)
    for k in range(nc):
        if not rest[k] > 0.0:
            continue
        dvr[:, :] = 0.0
        vr[:] = 0.0
        p0, p1, p2 = pos[k, 0], pos[k, 1], pos[k, 2]
        for side in range(2):
            sgn = -1.0 if side == 0 else 1.0
            j = gjoint[geom1[k]] if side == 0 else gjoint[geom2[k]]
            if j == 0:
                continue
            vj = ov0[j]
            # (linear part of a joint's WORLD velocity is that of the point at the origin)
            vr[0] += sgn * (vj[0] - (p1 * vj[5] - p2 * vj[4]))
            vr[1] += sgn * (vj[1] - (p2 * vj[3] - p0 * vj[5]))
            vr[2] += sgn * (vj[2] - (p0 * vj[4] - p1 * vj[3]))
            w0, w1, w2 = vj[3], vj[4], vj[5]
            for c in range(nv):
                # (the velocity derivative of joint j: only its supporting dofs; the point's
                # own motion dp: every dof)
                d0 = d1 = d2 = b0 = b1 = b2 = 0.0
                if supp[j, c]:
                    d0, d1, d2, b0, b1, b2 = _dof_velocity_derivative(
                        JT, c, ov0, parents[dof_joint[c]], vj)
                g0, g1, g2 = dp[k, 0, c], dp[k, 1, c], dp[k, 2, c]
                dvr[0, c] += sgn * ((d0 - (p1 * b2 - p2 * b1)) + (w1 * g2 - w2 * g1))
                dvr[1, c] += sgn * ((d1 - (p2 * b0 - p0 * b2)) + (w2 * g0 - w0 * g2))
                dvr[2, c] += sgn * ((d2 - (p0 * b1 - p1 * b0)) + (w0 * g1 - w1 * g0))
        e = rest[k]
        for c in range(nv):
            acc = frames[k, 0, 2] * dvr[0, c] + frames[k, 1, 2] * dvr[1, c] \
                + frames[k, 2, 2] * dvr[2, c]
            if moving[k]:
                acc = (dR[k, 0, 2, c] * vr[0] + dR[k, 1, 2, c] * vr[1]
                       + dR[k, 2, 2, c] * vr[2]) + acc
            Dq[3 * k + 2, c] += e * acc


@njit
def mode_system(lam, sigma, modes, limit_active, G, nc, mu):
    """A = dF/dlam and the weights W of d sigma in dF (``derivatives._mode_system``)."""
    m = G.shape[0]
    A = np.zeros((m, m))
    W = np.zeros((m, m))
    for i in range(nc):
        r = 3 * i
        mode = modes[i]
        if mode == BREAKING:
            for a in range(3):
                A[r + a, r + a] = 1.0
        elif mode == STICKING:
            for a in range(3):
                for b in range(m):
                    A[r + a, b] = G[r + a, b]
                W[r + a, r + a] = 1.0
        else:
            for b in range(m):
                A[r + 2, b] = G[r + 2, b]
            W[r + 2, r + 2] = 1.0
            s0, s1 = sigma[r], sigma[r + 1]
            nst = np.sqrt(s0 * s0 + s1 * s1)
            if mu[i] == 0.0 or nst < 1e-14:
                A[r, r] = 1.0
                A[r + 1, r + 1] = 1.0
                continue
            u0, u1 = s0 / nst, s1 / nst
            f = mu[i] * lam[r + 2] / nst
            # the two rows divided by 1 + f (an equivalent system): at a small slip f is huge
            # and, unscaled, these rows would set the rank cut-off of the solve (see
            # derivatives._mode_system)
            e = 1.0 / (1.0 + f)
            P00 = e * f * (1.0 - u0 * u0)
            P01 = e * f * (0.0 - u0 * u1)
            P10 = e * f * (0.0 - u1 * u0)
            P11 = e * f * (1.0 - u1 * u1)
            A[r, r] = e
            A[r + 1, r + 1] = e
            A[r, r + 2] = e * mu[i] * u0
            A[r + 1, r + 2] = e * mu[i] * u1
            for b in range(m):
                A[r, b] += P00 * G[r, b] + P01 * G[r + 1, b]
                A[r + 1, b] += P10 * G[r, b] + P11 * G[r + 1, b]
            W[r, r] = P00
            W[r, r + 1] = P01
            W[r + 1, r] = P10
            W[r + 1, r + 1] = P11
    for jl in range(m - 3 * nc):
        k = 3 * nc + jl
        if limit_active[jl]:
            for b in range(m):
                A[k, b] = G[k, b]
            W[k, k] = 1.0
        else:
            A[k, k] = 1.0
    return A, W


@njit
def relaxed_system(lam, sigma, eta, scale, G, nc, mu):
    """The smooth gradient's linear system ``A dlam = -W D`` (``diffgym.sim.smoothing``): the
    relaxed complementarity conditions at a point of the central path, linearized, with
    ``d sigma = G dlam + D``. In the scaled impulses ``l = scale * lam`` (velocity units), per
    contact: ``l_N s_N = rho`` and, with friction, the second-order-cone pair
    ``(mu l_N, l_T) o (eta, s_T) = rho e`` whose auxiliary ``eta`` is eliminated here (through
    the first row of the cone product, ``mu l_N > 0`` in the interior); a frictionless contact
    keeps ``d l_T = 0``; a joint limit row ``l s = rho``. ``A = F_l diag(scale) + F_s G``,
    ``W = F_s``; each row is divided by its largest entry of A (an equivalent system)."""
    m = G.shape[0]
    Fl = np.zeros((m, m))
    Fs = np.zeros((m, m))
    for i in range(nc):
        r = 3 * i
        d = scale[r + 2]
        lN = d * lam[r + 2]
        Fl[r + 2, r + 2] = sigma[r + 2]
        Fs[r + 2, r + 2] = lN
        if mu[i] == 0.0:
            Fl[r, r] = 1.0
            Fl[r + 1, r + 1] = 1.0
            continue
        x0 = mu[i] * lN
        a = 1.0 / x0
        et = eta[i]
        for p in range(2):
            lp = d * lam[r + p]
            Fl[r + p, r + 2] = mu[i] * (sigma[r + p] - a * et * lp)
            for k in range(2):
                Fl[r + p, r + k] = (et if p == k else 0.0) - a * lp * sigma[r + k]
                Fs[r + p, r + k] = (x0 if p == k else 0.0) - a * lp * (d * lam[r + k])
    for k in range(3 * nc, m):
        Fl[k, k] = sigma[k]
        Fs[k, k] = scale[k] * lam[k]
    A = np.empty((m, m))
    for i in range(m):
        for j in range(m):
            A[i, j] = Fl[i, j] * scale[j]
    # F_s is block diagonal (3 x 3 per contact, 1 x 1 per limit row)
    for i in range(m):
        lo = i - (i % 3) if i < 3 * nc else i
        hi = lo + 3 if i < 3 * nc else i + 1
        for c in range(lo, hi):
            f = Fs[i, c]
            if f != 0.0:
                for j in range(m):
                    A[i, j] += f * G[c, j]
    for i in range(m):
        big = 0.0
        for j in range(m):
            big = max(big, abs(A[i, j]))
        if big > 0.0:
            for j in range(m):
                A[i, j] /= big
                Fs[i, j] /= big
    return A, Fs


@njit
def _all_finite(x):
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            if not np.isfinite(x[i, k]):
                return False
    return True


@njit
def _mm(A, B):
    """A @ B (plain loops, C-ordered result), skipping the zeros of A and of B (the same sums for
    a finite B: the callers check that their inputs are finite). B's rows are read through the
    list of their nonzero columns where they are sparse (the contact rows of a scene of many
    trees touch a few dofs), else densely."""
    n, k = A.shape
    m = B.shape[1]
    C = np.zeros((n, m))
    if k * m <= 4096:                       # small (a robot): dense rows, no index lists
        for i in range(n):
            for l in range(k):
                a = A[i, l]
                if a == 0.0:
                    continue
                for j in range(m):
                    C[i, j] += a * B[l, j]
        return C
    nzc = np.empty(k * m, dtype=np.int64)   # per row of B, its nonzero columns (when sparse)
    start = np.zeros(k + 1, dtype=np.int64)
    dense = np.zeros(k, dtype=np.bool_)
    p = 0
    for l in range(k):
        start[l] = p
        cnt = 0
        for j in range(m):
            if B[l, j] != 0.0:
                cnt += 1
        if 2 * cnt > m:
            dense[l] = True
        else:
            for j in range(m):
                if B[l, j] != 0.0:
                    nzc[p] = j
                    p += 1
    start[k] = p
    for i in range(n):
        for l in range(k):
            a = A[i, l]
            if a == 0.0:
                continue
            if dense[l]:
                for j in range(m):
                    C[i, j] += a * B[l, j]
            else:
                for t in range(start[l], start[l + 1]):
                    j = nzc[t]
                    C[i, j] += a * B[l, j]
    return C


@njit
def _householder(R, k, col, B, vv, acc):
    """Reflect rows k: of R (columns col+1:) and of B so that R[k:, col] becomes (alpha, 0, ...);
    returns alpha. vv: the reflector (scratch, R.shape[0]); acc: scratch (max of the widths)."""
    m = R.shape[0]
    nrm2 = 0.0
    for i in range(k, m):
        nrm2 += R[i, col] * R[i, col]
    x0 = R[k, col]
    nrm = np.sqrt(nrm2)
    alpha = -nrm if x0 >= 0.0 else nrm
    v0 = x0 - alpha
    vtv = nrm2 - x0 * x0 + v0 * v0
    vv[k] = v0
    for i in range(k + 1, m):
        vv[i] = R[i, col]
        R[i, col] = 0.0
    R[k, col] = alpha
    if vtv == 0.0:
        return alpha
    _reflect(R, k, col + 1, vv, vtv, acc)
    if B.shape[1]:
        _reflect(B, k, 0, vv, vtv, acc)
    return alpha


@njit
def _reflect(B, k, c0, vv, vtv, acc):
    """B[k:, c0:] -= (2 / vtv) vv[k:] (vv[k:]^T B[k:, c0:]) (row-wise loops; acc: scratch of at
    least B.shape[1])."""
    m, n = B.shape
    if n <= c0:
        return
    acc[c0:n] = 0.0
    for i in range(k, m):
        a = vv[i]
        for c in range(c0, n):
            acc[c] += a * B[i, c]
    for c in range(c0, n):
        acc[c] *= 2.0 / vtv
    for i in range(k, m):
        a = vv[i]
        for c in range(c0, n):
            B[i, c] -= acc[c] * a


@njit
def _qr_min_norm(A, B):
    """(X, status) for square A: QR with column pivoting; status 0: X solves A X = B (full
    rank, |r_mm| > 1e-6 |r_11|) or is the minimum-norm least-squares solution of the clear rank
    r (trailing |r_kk| < 1e-14 |r_11|, complete orthogonal decomposition); status 1: neither
    (a rank that is not clear), X unset."""
    X, status, _ = _qr_min_norm_rank(A, B)
    return X, status


@njit
def _qr_min_norm_rank(A, B):
    """``_qr_min_norm`` and the rank it found (A's size where A has full rank)."""
    m, n = A.shape
    nb = B.shape[1]
    R = A.copy()
    Bt = B.copy()
    piv = np.arange(n)
    vv = np.zeros(max(m, n))
    acc = np.zeros(max(n, nb))
    d = np.zeros(n)
    cn = np.zeros(n)
    for k in range(n):
        cn[k:] = 0.0
        for i in range(k, m):
            for c in range(k, n):
                cn[c] += R[i, c] * R[i, c]
        best = -1.0
        jb = k
        for c in range(k, n):
            if cn[c] > best:
                best = cn[c]
                jb = c
        if jb != k:
            for i in range(m):
                t = R[i, k]
                R[i, k] = R[i, jb]
                R[i, jb] = t
            t2 = piv[k]
            piv[k] = piv[jb]
            piv[jb] = t2
        if best == 0.0:
            break
        d[k] = abs(_householder(R, k, k, Bt, vv, acc))
    X = np.zeros((n, nb))
    d0 = d[0]
    if d0 == 0.0:
        return X, 0, 0                                # A = 0: the minimum-norm solution is 0
    if d[n - 1] > 1e-6 * d0:                          # full rank: back substitution
        Y = np.zeros((n, nb))
        for i in range(n - 1, -1, -1):
            for c in range(nb):
                Y[i, c] = Bt[i, c]
            for l in range(i + 1, n):
                a = R[i, l]
                for c in range(nb):
                    Y[i, c] -= a * Y[l, c]
            for c in range(nb):
                Y[i, c] /= R[i, i]
        for i in range(n):
            for c in range(nb):
                X[piv[i], c] = Y[i, c]
        return X, 0, n
    r = 0
    while r < n and d[r] > 1e-6 * d0:
        r += 1
    for k in range(r, n):
        if d[k] >= 1e-14 * d0:
            return X, 1, r
    # rank r: R1 = R[:r] (r x n) = T^T Q2^T with R1^T = Q2 [T; 0]; y = Q2 [T^-T c; 0]
    R1t = np.ascontiguousarray(R[:r].T)               # (n, r)
    vs = np.zeros((r, n))
    nrm = np.zeros(r)
    vn = np.zeros(n)
    noB = np.zeros((n, 0))
    for k in range(r):
        _householder(R1t, k, k, noB, vn, acc)
        for i in range(k, n):
            vs[k, i] = vn[i]
        s2 = 0.0
        for i in range(k, n):
            s2 += vn[i] * vn[i]
        nrm[k] = s2
    Z = np.zeros((n, nb))
    for i in range(r):                                # T^T z = c (T^T lower triangular)
        for c in range(nb):
            Z[i, c] = Bt[i, c]
        for l in range(i):
            a = R1t[l, i]
            for c in range(nb):
                Z[i, c] -= a * Z[l, c]
        for c in range(nb):
            Z[i, c] /= R1t[i, i]
    for k in range(r - 1, -1, -1):                    # y = H_1 ... H_r z
        if nrm[k] != 0.0:
            _reflect(Z, k, 0, vs[k], nrm[k], acc)
    for i in range(n):
        for c in range(nb):
            X[piv[i], c] = Z[i, c]
    return X, 0, r


@njit
def _solve_block(A, JM, idx, n, cols, nvc):
    """``_qr_min_norm_rank`` of B^T, B = A[idx[:n], idx[:n]], on the columns ``cols[:nvc]`` of
    JM: (X, status, rank)."""
    As = np.empty((n, n))
    Bs = np.empty((n, nvc))
    for a in range(n):
        for b in range(n):
            As[b, a] = A[idx[a], idx[b]]
        for c in range(nvc):
            Bs[a, c] = JM[idx[a], cols[c]]
    return _qr_min_norm_rank(As, Bs)


@njit
def _block_columns(JM, idx, n, cols):
    """The columns of JM where the rows idx[:n] are nonzero, into cols; returns their count."""
    nb = 0
    for c in range(JM.shape[1]):
        for a in range(n):
            if JM[idx[a], c] != 0.0:
                cols[nb] = c
                nb += 1
                break
    return nb


@njit
def g_rows(modes, limit_active, nc, m):
    """The rows of ``mode_system`` whose equation is the row of G itself (A's row = G's row,
    W's row = e_k): a sticking contact's three rows, a sliding contact's normal row, an active
    limit's row."""
    g = np.zeros(m, dtype=np.bool_)
    for i in range(nc):
        if modes[i] == STICKING:
            g[3 * i] = g[3 * i + 1] = g[3 * i + 2] = True
        elif modes[i] != BREAKING:
            g[3 * i + 2] = True
    for jl in range(m - 3 * nc):
        if limit_active[jl]:
            g[3 * nc + jl] = True
    return g


# _rows_pinv: a block is taken as of full column rank where every pivot of the Cholesky
# factor of J^T J keeps at least this part of its column's squared norm (the squared sine of
# the angle between the column and the span of the earlier ones); else the QR route runs
PINV_MIN_PIVOT = 1e-6


@njit
def _rows_pinv(Jc, idx, n, cols, nvc):
    """``(X, ok)``: X (n, nvc) = J_S (J_S^T J_S)^-1 = (J_S^+)^T for J_S = Jc[idx[:n]] on the
    columns ``cols[:nvc]``, by the Cholesky factor of J_S^T J_S; ok False (X unset) where J_S
    has a nonzero outside those columns or is not clearly of full column rank
    (``PINV_MIN_PIVOT``)."""
    X = np.zeros((n, nvc))
    if n < nvc:
        return X, False
    nv = Jc.shape[1]
    loc = np.full(nv, -1, dtype=np.int64)
    for c in range(nvc):
        loc[cols[c]] = c
    Js = np.zeros((n, nvc))
    nz = np.empty(nvc, dtype=np.int64)
    N = np.zeros((nvc, nvc))
    for a in range(n):
        row = idx[a]
        cnt = 0
        for c in range(nv):
            x = Jc[row, c]
            if x != 0.0:
                lc = loc[c]
                if lc < 0:
                    return X, False
                Js[a, lc] = x
                nz[cnt] = lc
                cnt += 1
        for s in range(cnt):              # N += J_a^T J_a (lower triangle)
            i = nz[s]
            x = Js[a, i]
            for t in range(cnt):
                k = nz[t]
                if k <= i:
                    N[i, k] += x * Js[a, k]
    L = np.zeros((nvc, nvc))
    for k in range(nvc):                  # Cholesky N = L L^T
        d = N[k, k]
        for l in range(k):
            d -= L[k, l] * L[k, l]
        if not d > PINV_MIN_PIVOT * N[k, k]:
            return X, False
        lk = np.sqrt(d)
        L[k, k] = lk
        for i in range(k + 1, nvc):
            s = N[i, k]
            for l in range(k):
                s -= L[i, l] * L[k, l]
            L[i, k] = s / lk
    for a in range(n):                    # X[a] = N^-1 J_a: L z = J_a, L^T x = z
        for i in range(nvc):
            s = Js[a, i]
            for l in range(i):
                s -= L[i, l] * X[a, l]
            X[a, i] = s / L[i, i]
        for i in range(nvc - 1, -1, -1):
            s = X[a, i]
            for l in range(i + 1, nvc):
                s -= L[l, i] * X[a, l]
            X[a, i] = s / L[i, i]
    return X, True


@njit
def _island_min_norm(A, W, JM):
    """``_island_min_norm_rows`` with no row known to be a row of G."""
    return _island_min_norm_rows(A, W, JM, JM, np.zeros(A.shape[0], dtype=np.bool_))


@njit
def _island_min_norm_rows(A, W, JM, Jc, grow):
    """``(YT, status)`` with ``YT^T W D = M^-1 J^T A^+ W D`` for ``M^-1 J^T d lam`` of the mode
    system ``A d lam = -W D`` (``JM = J M^-1``), solved island by island of the active rows.

    Rows whose equation is ``a d lam_k = 0`` (A's row a multiple of e_k, W's row zero: breaking
    contacts, frictionless tangents, inactive limits) fix ``d lam_k = 0`` and add nothing to
    ``W D``; they are dropped, with their columns. The other rows fall into the connected
    components of A's nonzeros (contacts of different islands, and contacts of one island linked
    only through a breaking contact, never share one), and each component's block B is solved on
    its own with ``_qr_min_norm_range`` of B^T, on the columns of JM its rows touch (the dofs of
    its trees): O(sum m_i^3) instead of O(m^3). This is the minimum-norm solution of the whole
    system where B has full rank (the solution is unique) or reads no dropped column (B is then
    a diagonal block of A). A rank-deficient block that reads a dropped column (its minimum-norm
    least-squares solution is the whole system's only where its right-hand side lies in B's
    range, which rounding cannot tell near a small singular value), or a block whose rank is not
    clear, is solved within the component of the whole system it belongs to (linked through the
    dropped rows too: an exact diagonal block of A), as the dense path does. Status 1: a rank
    that is not clear there either (the caller solves the whole system with LAPACK).

    A component whose rows are all rows of G (``grow``: ``g_rows``; ``Jc``: the rows J) with
    J_S = J[rows] of full column rank on its columns C (and zero outside them) needs no solve of
    the mode system: its block is G_S = J_S M_C^-1 J_S^T (M^-1 is block diagonal by trees and C
    holds the columns M^-1 J_S^T touches), G_S^+ = (J_S^+)^T M_C J_S^+ when J_S has full column
    rank, so M_C^-1 J_S^T G_S^+ = J_S^+ = (J_S^T J_S)^-1 J_S^T, M's weight gone (``_rows_pinv``:
    a Cholesky factor of |C| x |C| instead of a pivoted QR of the rows' square block and its
    complete orthogonal decomposition). This is the whole system's minimum-norm solution also
    where G_S is rank deficient (redundant contacts, a box on its face) and reads dropped
    columns: G_S's columns on the dropped rows, J_S M^-1 J_B^T, lie in range(J_S) = range(G_S),
    so the least-squares solution leaves those impulses at zero, as the rows' own equations
    ask (exact arithmetic; the QR route agrees to rounding)."""
    m = A.shape[0]
    nv = JM.shape[1]
    triv = np.zeros(m, dtype=np.bool_)
    for k in range(m):
        t = A[k, k] != 0.0
        if t:
            for j in range(m):
                if (j != k and A[k, j] != 0.0) or W[k, j] != 0.0:
                    t = False
                    break
        triv[k] = t
    parent = np.arange(m)                      # components of the active rows
    whole = np.arange(m)                       # components of all rows (exact blocks of A)
    linked = np.zeros(m, dtype=np.bool_)       # an active row reading a dropped column
    for i in range(m):
        for j in range(m):
            if i != j and A[i, j] != 0.0:
                a = _uf_find(whole, i)
                b = _uf_find(whole, j)
                if a != b:
                    if a < b:
                        whole[b] = a
                    else:
                        whole[a] = b
                if triv[i]:
                    continue
                if triv[j]:
                    linked[i] = True
                    continue
                a = _uf_find(parent, i)
                b = _uf_find(parent, j)
                if a != b:
                    if a < b:
                        parent[b] = a
                    else:
                        parent[a] = b
    root = np.empty(m, dtype=np.int64)
    wroot = np.empty(m, dtype=np.int64)
    for i in range(m):
        root[i] = -1 if triv[i] else _uf_find(parent, i)
        wroot[i] = _uf_find(whole, i)
    YT = np.zeros((m, nv))
    idx = np.empty(m, dtype=np.int64)
    cols = np.empty(nv, dtype=np.int64)
    redo = np.zeros(m, dtype=np.bool_)         # whole components to solve as one
    for r in range(m):
        if root[r] != r or redo[wroot[r]]:
            continue
        n = 0
        link = False
        for i in range(r, m):
            if root[i] == r:
                idx[n] = i
                n += 1
                link = link or linked[i]
        nb = _block_columns(JM, idx, n, cols)
        allg = n >= nb
        for a in range(n):
            allg = allg and grow[idx[a]]
        if allg:
            Xs, ok = _rows_pinv(Jc, idx, n, cols, nb)
            if ok:
                for a in range(n):
                    for c in range(nb):
                        YT[idx[a], cols[c]] = Xs[a, c]
                continue
        Xs, status, rank = _solve_block(A, JM, idx, n, cols, nb)
        if status != 0 or (link and rank < n):
            redo[wroot[r]] = True
            continue
        for a in range(n):
            for c in range(nb):
                YT[idx[a], cols[c]] = Xs[a, c]
    for r in range(m):
        if not redo[r]:
            continue
        n = 0
        for i in range(m):
            if wroot[i] == r:
                idx[n] = i
                n += 1
        nb = _block_columns(JM, idx, n, cols)
        Xs, status, rank = _solve_block(A, JM, idx, n, cols, nb)
        if status != 0:
            return YT, status
        for a in range(n):
            for c in range(nb):
                YT[idx[a], cols[c]] = Xs[a, c]
    return YT, 0


@njit
def dynamics_terms(ddq_dq, ddq_dv, Minv_u, kstiff, has_stiff, damping, damped, dt,
                   Jc, G, corr, Dq, lam, sigma, modes, limit_active, mu, nc, dI_dq, dI_dv,
                   bias_v):
    """``(status, dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau)`` from the ABA derivatives
    (Minv_u: only its upper triangle is read), the contact terms and pinocchio's dIntegrate.

    status 0: done. 1: non-finite data (the caller takes the reference route). 2: the pivoted QR
    leaves the rank of the mode system in doubt; the six arrays are then ``(A, W D, J M^-1, Vq,
    Vv, Vt)`` and the caller finishes with the reference's LAPACK solve (numpy). ``bias_v`` (m,):
    rows whose offset b depends on the pre-step v as ``bias_v[i] J[i] v`` (Newton's impact law;
    empty: none)."""
    m = Jc.shape[0]
    if m and _all_finite(G):
        A, W = mode_system(lam, sigma, modes, limit_active, G, nc, mu)
    else:
        A = W = np.zeros((m, m))
    return _dynamics_terms(ddq_dq, ddq_dv, Minv_u, kstiff, has_stiff, damping, damped, dt,
                           Jc, G, corr, Dq, A, W, dI_dq, dI_dv, bias_v,
                           g_rows(modes, limit_active, nc, m))


@njit
def dynamics_terms_system(ddq_dq, ddq_dv, Minv_u, kstiff, has_stiff, damping, damped, dt,
                          Jc, G, corr, Dq, A, W, dI_dq, dI_dv, bias_v):
    """``dynamics_terms`` with the linear system ``A dlam = -W D`` given: the exact mode system
    (``mode_system``) or the relaxed one of the smooth gradient (``relaxed_system``)."""
    return _dynamics_terms(ddq_dq, ddq_dv, Minv_u, kstiff, has_stiff, damping, damped, dt,
                           Jc, G, corr, Dq, A, W, dI_dq, dI_dv, bias_v,
                           np.zeros(Jc.shape[0], dtype=np.bool_))


@njit
def _dynamics_terms(ddq_dq, ddq_dv, Minv_u, kstiff, has_stiff, damping, damped, dt,
                    Jc, G, corr, Dq, A, W, dI_dq, dI_dv, bias_v, grow):
    """``dynamics_terms_system``; ``grow``: the rows of A that are rows of G (``g_rows``; none
    for a relaxed system)."""
    nv = ddq_dq.shape[0]
    m = Jc.shape[0]
    if not (_all_finite(ddq_dq) and _all_finite(ddq_dv) and _all_finite(Minv_u)
            and _all_finite(corr) and _all_finite(Dq) and _all_finite(Jc) and _all_finite(G)
            and _all_finite(dI_dq) and _all_finite(dI_dv)):
        z = np.zeros((0, 0))
        return 1, z, z, z, z, z, z
    M = np.empty((nv, nv))
    for i in range(nv):
        for k in range(nv):
            M[i, k] = Minv_u[i, k] if k >= i else Minv_u[k, i]
    Vq = np.empty((nv, nv))
    Vv = np.empty((nv, nv))
    Vt = np.empty((nv, nv))
    for i in range(nv):
        for k in range(nv):
            if has_stiff:
                Vq[i, k] = dt * (ddq_dq[i, k] + M[i, k] * kstiff[k])
            else:
                Vq[i, k] = dt * ddq_dq[i, k]
            e = 1.0 if i == k else 0.0
            if damped:
                Vv[i, k] = e + dt * (ddq_dv[i, k] - M[i, k] * damping[k])
            else:
                Vv[i, k] = e + dt * ddq_dv[i, k]
            Vt[i, k] = dt * M[i, k]
    if m:
        Vq = Vq + _mm(M, corr)
        JM = _mm(Jc, M)                   # J M^-1 = (M^-1 J^T)^T
        JVq = _mm(Jc, Vq)
        JVv = _mm(Jc, Vv)
        D = np.empty((m, 3 * nv))         # [J Vq + Dq_extra, J Vv, J Vt]
        for i in range(m):
            for c in range(nv):
                D[i, c] = JVq[i, c] + Dq[i, c]
                D[i, nv + c] = JVv[i, c]
                if bias_v.shape[0]:
                    D[i, nv + c] += bias_v[i] * Jc[i, c]
                D[i, 2 * nv + c] = dt * JM[i, c]
        WD = _mm(W, D)
        if not (_all_finite(A) and _all_finite(WD)):
            z = np.zeros((0, 0))
            return 1, z, z, z, z, z, z
        # M^-1 J^T d lam with d lam = A^+ (-W D): where the pivoted QR of A^T settles the rank,
        # (A^+)^T (M^-1 J^T)^T = (A^T)^+ (J M^-1) is solved (nv right-hand sides instead of
        # 3 nv) and applied to W D; else d lam as the reference computes it (LAPACK)
        YT, status = _island_min_norm_rows(A, W, JM, Jc, grow)
        if status != 0:
            return 2, A, WD, JM, Vq, Vv, Vt
        if not _all_finite(YT):
            z = np.zeros((0, 0))
            return 1, z, z, z, z, z, z
        MJd = _mm(YT.T, WD)               # = -M^-1 J^T d lam
        dv_dq = Vq - MJd[:, :nv]
        dv_dv = Vv - MJd[:, nv:2 * nv]
        dv_dtau = Vt - MJd[:, 2 * nv:]
    else:
        dv_dq, dv_dv, dv_dtau = Vq, Vv, Vt
    Iv = dt * dI_dv
    dq_dq = dI_dq + _mm(Iv, dv_dq)
    dq_dv = _mm(Iv, dv_dv)
    dq_dtau = _mm(Iv, dv_dtau)
    return 0, dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau


# margin kinds of ``mode_margins`` (``derivatives.JacobianDiagnostics.margin_kinds``)
MARGIN_IMPULSE, MARGIN_SLIP, MARGIN_CONE, MARGIN_GAP = 0, 1, 2, 3


@njit
def mode_margins(lam, sigma, modes, limit_active, G, nc, mu):
    """Per contact then per limit row: the distance to the nearest mode switch (m/s) and its
    kind (``MARGIN_*``), impulses scaled by the Delassus diagonal. Breaking contact or inactive
    limit: the constraint velocity ``sigma_N`` (gap); sticking: ``G_nn lam_N`` (impulse) or
    ``G_tt (mu lam_N - |lam_T|)`` (cone); sliding: ``G_nn lam_N`` or, with friction, the slip
    ``|sigma_T|``; active limit: ``G_ll lam``. Also returns the index of the smallest."""
    m = G.shape[0]
    nl = m - 3 * nc
    out = np.empty(nc + nl)
    kind = np.empty(nc + nl, dtype=np.int64)
    for i in range(nc):
        r = 3 * i
        md = modes[i]
        ln = max(lam[r + 2], 0.0)
        if md == BREAKING:
            out[i] = max(sigma[r + 2], 0.0)
            kind[i] = MARGIN_GAP
            continue
        out[i] = G[r + 2, r + 2] * ln
        kind[i] = MARGIN_IMPULSE
        if md == STICKING:
            cone = 0.5 * (G[r, r] + G[r + 1, r + 1]) * max(
                mu[i] * ln - np.sqrt(lam[r] * lam[r] + lam[r + 1] * lam[r + 1]), 0.0)
            if cone < out[i]:
                out[i] = cone
                kind[i] = MARGIN_CONE
        elif mu[i] > 0.0:
            slip = np.sqrt(sigma[r] * sigma[r] + sigma[r + 1] * sigma[r + 1])
            if slip < out[i]:
                out[i] = slip
                kind[i] = MARGIN_SLIP
    for jl in range(nl):
        r = 3 * nc + jl
        if limit_active[jl]:
            out[nc + jl] = G[r, r] * max(lam[r], 0.0)
            kind[nc + jl] = MARGIN_IMPULSE
        else:
            out[nc + jl] = max(sigma[r], 0.0)
            kind[nc + jl] = MARGIN_GAP
    best = 0
    for i in range(1, nc + nl):
        if out[i] < out[best]:
            best = i
    return out, kind, best


@njit
def projection_terms(JT, supp, dof_joint, parents, j1, j2, pos, frames, dp, dR, moving, w, r):
    """The two contractions of the derivative of contact rows ``J_k = R_k^T (J_p2 - J_p1)(p_k)``
    that the derivative of the realizable drift correction needs (``derivatives.
    _realizable_terms``): ``T1[k] = d(J_k w)/dq`` at fixed ``w`` (nv,), (nk, 3, nv), and
    ``X = d(J^T r)/dq`` at fixed row values ``r`` (nk, 3), (nv, nv) (``X[i, c] = sum_k r_k .
    d J_k[:, i] / dq_c``, the whole derivative: body-fixed part, sliding points ``dp`` and
    turning frames ``dR``/``moving``), for contacts between joints ``j1``/``j2`` (0: the world)
    at world points ``pos`` with frames ``frames``. ``JT``: the WORLD joint Jacobian columns
    (nv, 6, ``data.J.T``), each dof's spatial axis ``S_c = (l_c, a_c)``; the point velocity of a
    dof is ``l_c + a_c x p``, and ``dS_i/dq_c = (S_i [i supports parent(c)] - S_i) x S_c`` on
    the dofs supporting the body (``contact_terms``' velocity derivative, at ``w = e_i``)."""
    nv = JT.shape[0]
    nk = pos.shape[0]
    T1 = np.zeros((nk, 3, nv))
    X = np.zeros((nv, nv))
    ov = _joint_velocities(JT, supp, w)    # joints' WORLD spatial velocities at w
    dvel = np.zeros((3, nv))
    vpt = np.zeros(3)
    f = np.zeros(3)
    gR = np.zeros((3, nv))
    for k in range(nk):
        p0, p1, p2 = pos[k, 0], pos[k, 1], pos[k, 2]
        for i in range(3):                 # f = R r_k (world), gR[:, c] = dR[:, :, c] r_k
            f[i] = frames[k, i, 0] * r[k, 0] + frames[k, i, 1] * r[k, 1] + frames[k, i, 2] * r[k, 2]
        if moving[k]:
            for c in range(nv):
                for i in range(3):
                    gR[i, c] = dR[k, i, 0, c] * r[k, 0] + dR[k, i, 1, c] * r[k, 1] \
                        + dR[k, i, 2, c] * r[k, 2]
        for side in range(2):
            sgn = -1.0 if side == 0 else 1.0
            j = j1[k] if side == 0 else j2[k]
            if j == 0:
                continue
            vj = ov[j]
            wx, wy, wz = vj[3], vj[4], vj[5]
            # --- T1: d(point velocity at w)/dq + w x dp, then R^T (and dR^T v)
            vpt[0] = vj[0] - (p1 * wz - p2 * wy)
            vpt[1] = vj[1] - (p2 * wx - p0 * wz)
            vpt[2] = vj[2] - (p0 * wy - p1 * wx)
            for c in range(nv):
                g0, g1, g2 = dp[k, 0, c], dp[k, 1, c], dp[k, 2, c]
                d0 = wy * g2 - wz * g1
                d1 = wz * g0 - wx * g2
                d2 = wx * g1 - wy * g0
                if supp[j, c]:
                    e0, e1, e2, b0, b1, b2 = _dof_velocity_derivative(
                        JT, c, ov, parents[dof_joint[c]], vj)
                    d0 += e0 - (p1 * b2 - p2 * b1)
                    d1 += e1 - (p2 * b0 - p0 * b2)
                    d2 += e2 - (p0 * b1 - p1 * b0)
                dvel[0, c] = d0
                dvel[1, c] = d1
                dvel[2, c] = d2
            for a in range(3):
                for c in range(nv):
                    acc = frames[k, 0, a] * dvel[0, c] + frames[k, 1, a] * dvel[1, c] \
                        + frames[k, 2, a] * dvel[2, c]
                    if moving[k]:
                        acc += dR[k, 0, a, c] * vpt[0] + dR[k, 1, a, c] * vpt[1] \
                            + dR[k, 2, a, c] * vpt[2]
                    T1[k, a, c] += sgn * acc
            # --- X: r_k . d J_k[:, i] / dq_c for the dofs i moving this body
            for i in range(nv):
                if not supp[j, i]:
                    continue
                li0, li1, li2 = JT[i, 0], JT[i, 1], JT[i, 2]
                ai0, ai1, ai2 = JT[i, 3], JT[i, 4], JT[i, 5]
                # the point velocity of dof i, Jp_i = l_i + a_i x p
                q0 = li0 + (ai1 * p2 - ai2 * p1)
                q1 = li1 + (ai2 * p0 - ai0 * p2)
                q2 = li2 + (ai0 * p1 - ai1 * p0)
                for c in range(nv):
                    g0, g1, g2 = dp[k, 0, c], dp[k, 1, c], dp[k, 2, c]
                    # a_i x dp
                    d0 = ai1 * g2 - ai2 * g1
                    d1 = ai2 * g0 - ai0 * g2
                    d2 = ai0 * g1 - ai1 * g0
                    if supp[j, c] and not supp[parents[dof_joint[c]], i]:
                        # dS_i/dq_c = -S_i x S_c: linear -(a_i x l_c + l_i x a_c), angular
                        # -(a_i x a_c); the point velocity's derivative: lin - p x ang
                        l0, l1, l2 = JT[c, 0], JT[c, 1], JT[c, 2]
                        a0, a1, a2 = JT[c, 3], JT[c, 4], JT[c, 5]
                        e0 = -((ai1 * l2 - ai2 * l1) + (li1 * a2 - li2 * a1))
                        e1 = -((ai2 * l0 - ai0 * l2) + (li2 * a0 - li0 * a2))
                        e2 = -((ai0 * l1 - ai1 * l0) + (li0 * a1 - li1 * a0))
                        b0 = -(ai1 * a2 - ai2 * a1)
                        b1 = -(ai2 * a0 - ai0 * a2)
                        b2 = -(ai0 * a1 - ai1 * a0)
                        d0 += e0 - (p1 * b2 - p2 * b1)
                        d1 += e1 - (p2 * b0 - p0 * b2)
                        d2 += e2 - (p0 * b1 - p1 * b0)
                    acc = f[0] * d0 + f[1] * d1 + f[2] * d2
                    if moving[k]:
                        acc += gR[0, c] * q0 + gR[1, c] * q1 + gR[2, c] * q2
                    X[i, c] += sgn * acc
    return T1, X
