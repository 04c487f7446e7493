"""Compiled kernels of the long_range gradient mode (``diffgym.sim.long_range``), plain loops (numba).

``evaluate_pairs`` walks the bounding-sphere hierarchies of every candidate geom pair with an
explicit stack (the paper's Algorithm 1: a node pair farther apart than ``d2`` is one centred
term, a pair of leaves too; otherwise the sum over the children's pairs, blended with the centred
term between ``d1`` and ``d2``). It records one *row* per node pair visited (the two centres,
their distance, the unit direction) with the derivative of the total potential in that distance
(``grad``) and the second derivatives as a sparse list of entries (``hi``, ``hj``, ``hv``;
repeated entries add). Rows are created in depth-first pre-order, so the descendants of a row are
the contiguous block after it: a blend scales that block's first derivatives and the second
derivatives entered while visiting it, and couples the block to its own row.

``assemble`` maps the rows to generalized coordinates through the world-frame joint Jacobians,
touching only the dofs that move each row's two geoms (the union of their joints' supports):
the generalized force ``-dP/dq`` and its derivative (nv, nv, pinocchio's tangent space). Its cost
is the rows times the square of that support, not the square of the scene.
"""
from __future__ import annotations

import numpy as np

from .jit import njit


@njit
def _grow_f(a, n):
    b = np.empty(max(2 * a.shape[0], n), dtype=a.dtype)
    b[:a.shape[0]] = a
    return b


@njit
def _grow_2(a, n):
    b = np.empty((max(2 * a.shape[0], n), a.shape[1]), dtype=a.dtype)
    b[:a.shape[0]] = a
    return b


@njit
def _centred(r, scale):
    s = r ** -0.5
    p = scale * (1.0 + s) ** 2
    dp = -scale * (1.0 + s) * s ** 3
    ddp = scale * (0.5 * s ** 6 + 1.5 * (1.0 + s) * s ** 5)
    return p, dp, ddp


@njit
def _smoothstep(s):
    if s <= 0.0:
        return 0.0, 0.0, 0.0
    if s >= 1.0:
        return 1.0, 0.0, 0.0
    s2 = s * s
    return (s2 * s * (10.0 - 15.0 * s + 6.0 * s2), 30.0 * s2 * (1.0 - s) ** 2,
            60.0 * s * (1.0 - s) * (1.0 - 2.0 * s))


@njit
def evaluate_pairs(node_c, node_r, node_k, roots, pair_a, pair_b, pair_plane,
                   geom_R, geom_t, scale, margin):
    """The potential of every pair (a, b) of ``pair_a``/``pair_b`` (geom indices; ``pair_plane``:
    b is a static plane, its normal the third column of ``geom_R[b]``). Node arrays: centres in
    the geom frame (N, 3), radii (N,), children (N, 2; -1 for a leaf); ``roots[g]`` the root
    node of geom g. Returns (P, nrows, row_pair, ca, cb, e, dist, grad, nh, hi, hj, hv)."""
    cap = 64
    row_pair = np.empty(cap, dtype=np.int64)
    ca = np.empty((cap, 3))
    cb = np.empty((cap, 3))
    e = np.empty((cap, 3))
    dist = np.empty(cap)
    grad = np.empty(cap)
    hcap = 64
    hi = np.empty(hcap, dtype=np.int64)
    hj = np.empty(hcap, dtype=np.int64)
    hv = np.empty(hcap)
    nrows = 0
    nh = 0
    # the stack of node pairs being summed: I, J, row, first hessian entry, children, next child
    smax = 256
    sI = np.empty(smax, dtype=np.int64)
    sJ = np.empty(smax, dtype=np.int64)
    srow = np.empty(smax, dtype=np.int64)
    sh = np.empty(smax, dtype=np.int64)
    sch = np.empty((smax, 8), dtype=np.int64)
    snch = np.empty(smax, dtype=np.int64)
    snext = np.empty(smax, dtype=np.int64)
    sS = np.empty(smax)
    total = 0.0
    pa = np.empty(3)
    pb = np.empty(3)
    for p in range(pair_a.shape[0]):
        a = pair_a[p]
        b = pair_b[p]
        plane = pair_plane[p]
        nrm = np.empty(3)
        off = 0.0
        if plane:
            for k in range(3):
                nrm[k] = geom_R[b, k, 2]
            off = nrm[0] * geom_t[b, 0] + nrm[1] * geom_t[b, 1] + nrm[2] * geom_t[b, 2]
        depth = 0
        pend_I = roots[a]
        pend_J = roots[b] if not plane else -1
        while True:
            # enter the pending node pair (I, J): its row, and its value if it ends the descent
            I = pend_I
            J = pend_J
            for k in range(3):
                pa[k] = (geom_R[a, k, 0] * node_c[I, 0] + geom_R[a, k, 1] * node_c[I, 1]
                         + geom_R[a, k, 2] * node_c[I, 2] + geom_t[a, k])
            if plane:
                r = nrm[0] * pa[0] + nrm[1] * pa[1] + nrm[2] * pa[2] - off
                d1 = node_r[I]
                for k in range(3):
                    pb[k] = pa[k] - r * nrm[k]
            else:
                for k in range(3):
                    pb[k] = (geom_R[b, k, 0] * node_c[J, 0] + geom_R[b, k, 1] * node_c[J, 1]
                             + geom_R[b, k, 2] * node_c[J, 2] + geom_t[b, k])
                r = np.sqrt((pa[0] - pb[0]) ** 2 + (pa[1] - pb[1]) ** 2 + (pa[2] - pb[2]) ** 2)
                d1 = node_r[I] + node_r[J]
            if not r > 0.0:
                raise FloatingPointError("long_range potential: a bounding-sphere centre "
                                         "reached the other shape's centre or plane (the "
                                         "shapes interpenetrate)")
            if nrows == row_pair.shape[0]:
                row_pair = _grow_f(row_pair, nrows + 1)
                ca = _grow_2(ca, nrows + 1)
                cb = _grow_2(cb, nrows + 1)
                e = _grow_2(e, nrows + 1)
                dist = _grow_f(dist, nrows + 1)
                grad = _grow_f(grad, nrows + 1)
            m = nrows
            nrows += 1
            row_pair[m] = p
            for k in range(3):
                ca[m, k] = pa[k]
                cb[m, k] = pb[k]
                e[m, k] = nrm[k] if plane else (pa[k] - pb[k]) / r
            dist[m] = r
            grad[m] = 0.0
            leaf_a = node_k[I, 0] < 0
            leaf_b = plane or node_k[J, 0] < 0
            has_val = False
            val = 0.0
            if (leaf_a and leaf_b) or r >= (1.0 + margin) * d1:
                val, dp, ddp = _centred(r, scale)
                grad[m] = dp
                if nh == hi.shape[0]:
                    hi = _grow_f(hi, nh + 1)
                    hj = _grow_f(hj, nh + 1)
                    hv = _grow_f(hv, nh + 1)
                hi[nh] = m
                hj[nh] = m
                hv[nh] = ddp
                nh += 1
                has_val = True
            else:
                if depth == sI.shape[0]:
                    sI = _grow_f(sI, depth + 1)
                    sJ = _grow_f(sJ, depth + 1)
                    srow = _grow_f(srow, depth + 1)
                    sh = _grow_f(sh, depth + 1)
                    sch = _grow_2(sch, depth + 1)
                    snch = _grow_f(snch, depth + 1)
                    snext = _grow_f(snext, depth + 1)
                    sS = _grow_f(sS, depth + 1)
                sI[depth] = I
                sJ[depth] = J
                srow[depth] = m
                sh[depth] = nh
                n = 0
                na = 1 if leaf_a else 2
                nb = 1 if leaf_b else 2
                for x in range(na):
                    for y in range(nb):
                        sch[depth, 2 * n] = I if leaf_a else node_k[I, x]
                        sch[depth, 2 * n + 1] = J if leaf_b else node_k[J, y]
                        n += 1
                snch[depth] = n
                snext[depth] = 0
                sS[depth] = 0.0
                depth += 1
            # hand values up and close finished frames until a child is pending or all is done
            done = False
            while True:
                if has_val:
                    if depth == 0:
                        total += val
                        done = True
                        break
                    sS[depth - 1] += val
                    has_val = False
                d = depth - 1
                if snext[d] < snch[d]:
                    c = snext[d]
                    snext[d] += 1
                    pend_I = sch[d, 2 * c]
                    pend_J = sch[d, 2 * c + 1]
                    break
                # frame d is complete: the children's sum, blended with its centred term
                m = srow[d]
                S = sS[d]
                r = dist[m]
                I = sI[d]
                J = sJ[d]
                d1 = node_r[I] if plane else node_r[I] + node_r[J]
                depth -= 1
                has_val = True
                if r <= d1:
                    val = S
                    continue
                w = margin * d1
                f, f1, f2 = _smoothstep((r - d1) / w)
                f1 = f1 / w
                f2 = f2 / (w * w)
                pv, dp, ddp = _centred(r, scale)
                for k in range(sh[d], nh):
                    hv[k] *= 1.0 - f
                need = nh + 2 * (nrows - m - 1) + 1
                if need > hi.shape[0]:
                    hi = _grow_f(hi, need)
                    hj = _grow_f(hj, need)
                    hv = _grow_f(hv, need)
                for k in range(m + 1, nrows):
                    gk = grad[k]
                    if gk != 0.0:
                        hi[nh] = m
                        hj[nh] = k
                        hv[nh] = -f1 * gk
                        hi[nh + 1] = k
                        hj[nh + 1] = m
                        hv[nh + 1] = -f1 * gk
                        nh += 2
                    grad[k] = (1.0 - f) * gk
                grad[m] = f1 * (pv - S) + f * dp
                hi[nh] = m
                hj[nh] = m
                hv[nh] = f2 * (pv - S) + 2.0 * f1 * dp + f * ddp
                nh += 1
                val = (1.0 - f) * S + f * pv
            if done:
                break
    return total, nrows, row_pair, ca, cb, e, dist, grad, nh, hi, hj, hv


@njit
def assemble(nrows, row_pair, ca, cb, e, dist, grad, nh, hi, hj, hv, pair_ja, pair_jb,
             pair_plane, up_ptr, up_idx, support, sp_ptr, sp_idx, anc_dof, Jw, derivative):
    """The generalized force ``-dP/dq`` (nv,) and, with ``derivative``, its derivative (nv, nv)
    from the rows of ``evaluate_pairs``. ``up_ptr``/``up_idx``: per pair, the dofs that move
    either geom (CSR); ``support[j, k]``: dof k moves joint j (``sp_ptr``/``sp_idx``: the same
    as CSR rows); ``anc_dof[i, k]``: joint(i) is
    joint(k) or one of its ancestors; ``Jw`` the world joint Jacobians (6, nv)."""
    nv = Jw.shape[1]
    nj = support.shape[0]
    tau = np.zeros(nv)
    K = np.zeros((nv, nv)) if derivative else np.zeros((0, 0))
    # dr_m/dq on the pair's dofs, and the centres' relative Jacobian D = J_ca - J_cb (3 x s)
    off = np.empty(nrows + 1, dtype=np.int64)
    off[0] = 0
    for m in range(nrows):
        p = row_pair[m]
        off[m + 1] = off[m] + up_ptr[p + 1] - up_ptr[p]
    U = np.zeros(off[nrows])
    smax = 0
    for p in range(up_ptr.shape[0] - 1):
        smax = max(smax, up_ptr[p + 1] - up_ptr[p])
    D = np.zeros((3, smax))
    G = np.zeros((nj, 3))           # per joint: the sum of the world forces g at its centres,
    X = np.zeros((nj, 3, 3))        # the sum of [g]x [c]x
    W = np.zeros((nj, 6))           # and the wrench (g, c x g) at the world origin
    for m in range(nrows):
        p = row_pair[m]
        ja = pair_ja[p]
        jb = pair_jb[p]
        plane = pair_plane[p]
        s0 = up_ptr[p]
        s = up_ptr[p + 1] - s0
        for t in range(s):
            k = up_idx[s0 + t]
            acc = 0.0
            for x in range(3):
                D[x, t] = 0.0
            if support[ja, k]:
                c0, c1, c2 = ca[m, 0], ca[m, 1], ca[m, 2]
                w0, w1, w2 = Jw[3, k], Jw[4, k], Jw[5, k]
                D[0, t] += Jw[0, k] - (c1 * w2 - c2 * w1)
                D[1, t] += Jw[1, k] - (c2 * w0 - c0 * w2)
                D[2, t] += Jw[2, k] - (c0 * w1 - c1 * w0)
            if not plane and support[jb, k]:
                c0, c1, c2 = cb[m, 0], cb[m, 1], cb[m, 2]
                w0, w1, w2 = Jw[3, k], Jw[4, k], Jw[5, k]
                D[0, t] -= Jw[0, k] - (c1 * w2 - c2 * w1)
                D[1, t] -= Jw[1, k] - (c2 * w0 - c0 * w2)
                D[2, t] -= Jw[2, k] - (c0 * w1 - c1 * w0)
            acc = e[m, 0] * D[0, t] + e[m, 1] * D[1, t] + e[m, 2] * D[2, t]
            U[off[m] + t] = acc
            tau[k] -= grad[m] * acc
        if not derivative or grad[m] == 0.0:
            continue
        a = grad[m]
        # (1) the turning of the direction: a / r D^T (I - e e^T) D (a plane's normal is fixed)
        if not plane:
            wr = a / dist[m]
            for t1 in range(s):
                k1 = up_idx[s0 + t1]
                u1 = U[off[m] + t1]
                for t2 in range(s):
                    k2 = up_idx[s0 + t2]
                    dd = D[0, t1] * D[0, t2] + D[1, t1] * D[1, t2] + D[2, t1] * D[2, t2]
                    K[k1, k2] += wr * (dd - u1 * U[off[m] + t2])
        # (3) world forces g = +-a e at the centres, gathered per joint
        for side in range(2):
            if side == 0:
                j = ja
                sg = a
                c0, c1, c2 = ca[m, 0], ca[m, 1], ca[m, 2]
            else:
                if plane or jb == 0:
                    continue
                j = jb
                sg = -a
                c0, c1, c2 = cb[m, 0], cb[m, 1], cb[m, 2]
            if j == 0:
                continue
            g0, g1, g2 = sg * e[m, 0], sg * e[m, 1], sg * e[m, 2]
            G[j, 0] += g0
            G[j, 1] += g1
            G[j, 2] += g2
            # [g]x [c]x = c g^T - (g . c) I
            gc = g0 * c0 + g1 * c1 + g2 * c2
            gv = (g0, g1, g2)
            cv = (c0, c1, c2)
            for x in range(3):
                for y in range(3):
                    X[j, x, y] += cv[x] * gv[y]
                X[j, x, x] -= gc
            W[j, 0] += g0
            W[j, 1] += g1
            W[j, 2] += g2
            W[j, 3] += c1 * g2 - c2 * g1
            W[j, 4] += c2 * g0 - c0 * g2
            W[j, 5] += c0 * g1 - c1 * g0
    if not derivative:
        return tau, K
    # (2) second derivatives of P in the distances: sum x U_i U_j^T (rows of one pair)
    for h in range(nh):
        i = hi[h]
        j = hj[h]
        x = hv[h]
        p = row_pair[i]
        s0 = up_ptr[p]
        s = up_ptr[p + 1] - s0
        for t1 in range(s):
            u1 = x * U[off[i] + t1]
            if u1 == 0.0:
                continue
            k1 = up_idx[s0 + t1]
            for t2 in range(s):
                K[k1, up_idx[s0 + t2]] += u1 * U[off[j] + t2]
    # (3) per joint: the motion of the centres' Jacobians under fixed world forces,
    #     -Jang^T [g]x J_c summed over the joint's centres, and the motion of the joint's
    #     own Jacobian columns under the wrench W
    for j in range(1, nj):
        if W[j, 0] == 0.0 and W[j, 1] == 0.0 and W[j, 2] == 0.0 and W[j, 3] == 0.0 \
                and W[j, 4] == 0.0 and W[j, 5] == 0.0:
            continue
        cols = sp_idx[sp_ptr[j]:sp_ptr[j + 1]]
        n = cols.shape[0]
        fl0, fl1, fl2 = W[j, 0], W[j, 1], W[j, 2]
        fa0, fa1, fa2 = W[j, 3], W[j, 4], W[j, 5]
        for t2 in range(n):
            k2 = cols[t2]
            v0, v1, v2 = Jw[0, k2], Jw[1, k2], Jw[2, k2]
            w0, w1, w2 = Jw[3, k2], Jw[4, k2], Jw[5, k2]
            # y = [g]x J_c column k2, summed: G x v - X w
            y0 = G[j, 1] * v2 - G[j, 2] * v1 - (X[j, 0, 0] * w0 + X[j, 0, 1] * w1 + X[j, 0, 2] * w2)
            y1 = G[j, 2] * v0 - G[j, 0] * v2 - (X[j, 1, 0] * w0 + X[j, 1, 1] * w1 + X[j, 1, 2] * w2)
            y2 = G[j, 0] * v1 - G[j, 1] * v0 - (X[j, 2, 0] * w0 + X[j, 2, 1] * w1 + X[j, 2, 2] * w2)
            for t1 in range(n):
                k1 = cols[t1]
                K[k1, k2] -= Jw[3, k1] * y0 + Jw[4, k1] * y1 + Jw[5, k1] * y2
        for t1 in range(n):
            i = cols[t1]
            vi0, vi1, vi2 = Jw[0, i], Jw[1, i], Jw[2, i]
            wi0, wi1, wi2 = Jw[3, i], Jw[4, i], Jw[5, i]
            # fl x w_i, fl x v_i, fa x w_i
            a0, a1, a2 = fl1 * wi2 - fl2 * wi1, fl2 * wi0 - fl0 * wi2, fl0 * wi1 - fl1 * wi0
            b0, b1, b2 = fl1 * vi2 - fl2 * vi1, fl2 * vi0 - fl0 * vi2, fl0 * vi1 - fl1 * vi0
            c0, c1, c2 = fa1 * wi2 - fa2 * wi1, fa2 * wi0 - fa0 * wi2, fa0 * wi1 - fa1 * wi0
            for t2 in range(n):
                k = cols[t2]
                if not anc_dof[i, k]:
                    continue
                K[k, i] += (a0 * Jw[0, k] + a1 * Jw[1, k] + a2 * Jw[2, k]
                            + (b0 + c0) * Jw[3, k] + (b1 + c1) * Jw[4, k] + (b2 + c2) * Jw[5, k])
    K *= -1.0
    return tau, K
