"""Compiled kernels of the long_range gradient mode (``diffgym.sim.long_range``), plain loops (numba).

``evaluate`` walks two levels of bounding-sphere hierarchy with one explicit stack:

- the *scene tree*: a binary tree over the scene's *units* (the non-plane geoms of the candidate
  pairs; a unit's sphere is its geom tree's root sphere, in the world). A scene node's centre is
  the mean of its units' centres (linear in their positions, so smooth); its radius is fixed when
  the tree is built (the bound at that configuration with slack; ``long_range`` rebuilds the tree
  between steps when a unit leaves it). The walk starts from the root's self pair; a self pair
  sums its children's pairs; two disjoint scene nodes farther apart than ``d2 = (1 + margin) d1``
  (``d1 = R_I + R_J``) are one centred term times the number of candidate pairs between them
  (``count``, from 2-D prefix sums of the candidate matrix in leaf order), otherwise the sum over
  their children's pairs blended with that term between ``d1`` and ``d2`` (the paper's eqs. 4, 8);
  node pairs without a candidate pair are skipped. Two units (leaves) that form candidate pair p
  enter the second level;
- each candidate pair's *geom trees* (leaf spheres inside the shapes), as before: a node pair
  beyond ``d2`` or a pair of leaves is one centred term, otherwise the blended children's sum.
  Pairs with a static plane are walked at this level directly (the plane is a half-space; the
  height of a node's centre above it is its distance).

With ``open_all`` no scene node pair is approximated (every candidate pair is walked: the
per-pair sum, for comparisons). It records one *row* per node pair visited (its two centres,
their distance, the unit direction), the derivative of the total potential in that distance
(``grad``) and the second derivatives as a sparse list of entries (``hi``, ``hj``, ``hv``;
repeated entries add), and the row's *attachments*: the points whose motion moves the row's
centres (geom index, world point, weight; a geom-level row has its two centres, weights +1 and
-1; a scene row each unit of either node with weight +-1/n). Rows are created in depth-first
pre-order, so the descendants of a row are the contiguous block after it: a blend scales that
block's first derivatives and the second derivatives entered while visiting it, and couples the
block to its own row.

``assemble`` maps the rows to generalized coordinates through the world-frame joint Jacobians,
touching only the dofs that move each row's attachments (the union of their joints' supports):
the generalized force ``-dP/dq`` and its derivative (nv, nv, pinocchio's tangent space).
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


# the columns of ``evaluate``'s stack of frames (node pairs being summed): I, J, pair (-1: scene
# level), row (-1: a scene self pair, never blended), first hessian entry, number of children,
# next child, then the children (I, J, pair) x 4
_S_I, _S_J, _S_P, _S_ROW, _S_H, _S_NCH, _S_NEXT, _S_CH = 0, 1, 2, 3, 4, 5, 6, 7


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
def unit_centres(node_c, roots, units, geom_R, geom_t):
    """World centres (U, 3) of the units' root spheres."""
    U = units.shape[0]
    x = np.empty((U, 3))
    for u in range(U):
        g = units[u]
        c = node_c[roots[g]]
        for k in range(3):
            x[u, k] = (geom_R[g, k, 0] * c[0] + geom_R[g, k, 1] * c[1] + geom_R[g, k, 2] * c[2]
                       + geom_t[g, k])
    return x


@njit
def scene_centres(x, sc_lo, sc_hi):
    """Scene nodes' centres: the mean of the centres ``x`` (leaf order) of their units."""
    U = x.shape[0]
    S = np.zeros((U + 1, 3))
    for u in range(U):
        for k in range(3):
            S[u + 1, k] = S[u, k] + x[u, k]
    n = sc_lo.shape[0]
    c = np.empty((n, 3))
    for i in range(n):
        m = sc_hi[i] - sc_lo[i]
        for k in range(3):
            c[i, k] = (S[sc_hi[i], k] - S[sc_lo[i], k]) / m
    return c


@njit
def scene_bounds_hold(x, ur, sc_lo, sc_hi, sc_r):
    """Whether every scene node's radius still bounds its units' spheres (centres ``x``, radii
    ``ur``, leaf order) around its centre (single units: their own spheres, always)."""
    c = scene_centres(x, sc_lo, sc_hi)
    for i in range(sc_lo.shape[0]):
        if sc_hi[i] - sc_lo[i] < 2:
            continue                     # a unit's own sphere always bounds it
        for u in range(sc_lo[i], sc_hi[i]):
            d = np.sqrt((x[u, 0] - c[i, 0]) ** 2 + (x[u, 1] - c[i, 1]) ** 2
                        + (x[u, 2] - c[i, 2]) ** 2)
            if d + ur[u] > sc_r[i]:
                return False
    return True


@njit
def _count(cum, lo1, hi1, lo2, hi2):
    return cum[hi1, hi2] - cum[lo1, hi2] - cum[hi1, lo2] + cum[lo1, lo2]


@njit
def evaluate(node_c, node_r, node_k, roots, pair_a, pair_b, pair_plane, geom_R, geom_t,
             scale, margin, plane_pairs, sc_k, sc_lo, sc_hi, sc_r, sc_root, leaf_geom, x,
             cand_cum, leaf_pair, open_all):
    """The potential of the scene (see the module docstring). Geom-tree nodes: centres in the
    geom frame (N, 3), radii (N,), children (N, 2; -1 for a leaf); ``roots[g]`` the root node of
    geom g; candidate pairs ``pair_a``/``pair_b`` (``pair_plane``: b is a static plane, its
    normal the third column of ``geom_R[b]``), ``plane_pairs`` the indices of those. Scene tree:
    children ``sc_k`` (-1 for a leaf), leaf-order unit ranges ``sc_lo``/``sc_hi``, radii
    ``sc_r``, root ``sc_root`` (-1: none); ``leaf_geom[u]`` the geom of unit u (leaf order),
    ``x`` the units' world centres (leaf order), ``cand_cum`` the (U+1, U+1) prefix sums of the
    candidate matrix, ``leaf_pair[u, v]`` the pair index of units u, v (-1: none).
    Returns (P, nrows, fixed, ca, cb, e, dist, grad, nh, hi, hj, hv, att_ptr, att_g, att_p,
    att_w)."""
    cap = 64
    fixed = np.empty(cap, dtype=np.bool_)
    ca = np.empty((cap, 3))
    cb = np.empty((cap, 3))
    e = np.empty((cap, 3))
    dist = np.empty(cap)
    grad = np.empty(cap)
    att_ptr = np.zeros(cap + 1, dtype=np.int64)
    acap = 128
    att_g = np.empty(acap, dtype=np.int64)
    att_p = np.empty((acap, 3))
    att_w = np.empty(acap)
    na = 0
    hcap = 64
    hi = np.empty(hcap, dtype=np.int64)
    hj = np.empty(hcap, dtype=np.int64)
    hv = np.empty(hcap)
    nrows = 0
    nh = 0
    # the stack of node pairs being summed: a row of ``stk`` a frame (columns _S_*), its sum in sS
    smax = 256
    stk = np.empty((smax, _S_CH + 12), dtype=np.int64)
    sS = np.empty(smax)
    total = 0.0
    pa = np.empty(3)
    pb = np.empty(3)
    nrm = np.empty(3)
    sc_c = scene_centres(x, sc_lo, sc_hi) if sc_root >= 0 else np.zeros((0, 3))
    nstart = plane_pairs.shape[0] + (1 if sc_root >= 0 else 0)
    for st in range(nstart):
        if st < plane_pairs.shape[0]:
            p0 = plane_pairs[st]
            pend_I = roots[pair_a[p0]]
            pend_J = -1
            pend_P = p0
        else:
            if sc_k[sc_root, 0] < 0 or _count(cand_cum, sc_lo[sc_root], sc_hi[sc_root],
                                                sc_lo[sc_root], sc_hi[sc_root]) == 0:
                break
            pend_I = sc_root
            pend_J = sc_root
            pend_P = -1
        depth = 0
        while True:
            I = pend_I
            J = pend_J
            p = pend_P
            has_val = False
            val = 0.0
            self_pair = p < 0 and I == J
            m = -1
            if not self_pair:
                plane = False
                cnt = 1.0
                if p >= 0:
                    a = pair_a[p]
                    b = pair_b[p]
                    plane = pair_plane[p]
                    for k in range(3):
                        pa[k] = (geom_R[a, k, 0] * node_c[I, 0] + geom_R[a, k, 1] * node_c[I, 1]
                                 + geom_R[a, k, 2] * node_c[I, 2] + geom_t[a, k])
                    if plane:
                        for k in range(3):
                            nrm[k] = geom_R[b, k, 2]
                        off = nrm[0] * geom_t[b, 0] + nrm[1] * geom_t[b, 1] + nrm[2] * geom_t[b, 2]
                        r = nrm[0] * pa[0] + nrm[1] * pa[1] + nrm[2] * pa[2] - off
                        d1 = node_r[I]
                        for k in range(3):
                            pb[k] = pa[k] - r * nrm[k]
                    else:
                        for k in range(3):
                            pb[k] = (geom_R[b, k, 0] * node_c[J, 0] + geom_R[b, k, 1] * node_c[J, 1]
                                     + geom_R[b, k, 2] * node_c[J, 2] + geom_t[b, k])
                        r = np.sqrt((pa[0] - pb[0]) ** 2 + (pa[1] - pb[1]) ** 2
                                    + (pa[2] - pb[2]) ** 2)
                        d1 = node_r[I] + node_r[J]
                    if not r > 0.0:
                        raise FloatingPointError("long_range potential: a bounding-sphere centre "
                                                 "reached the other shape's centre or plane (the "
                                                 "shapes interpenetrate)")
                else:
                    for k in range(3):
                        pa[k] = sc_c[I, k]
                        pb[k] = sc_c[J, k]
                    r = np.sqrt((pa[0] - pb[0]) ** 2 + (pa[1] - pb[1]) ** 2 + (pa[2] - pb[2]) ** 2)
                    d1 = sc_r[I] + sc_r[J]
                    cnt = float(_count(cand_cum, sc_lo[I], sc_hi[I], sc_lo[J], sc_hi[J]))
                # the row, its attachments
                if nrows == fixed.shape[0]:
                    fixed = _grow_f(fixed, nrows + 1)
                    ca = _grow_2(ca, nrows + 1)
                    cb = _grow_2(cb, nrows + 1)
                    e = _grow_2(e, nrows + 1)
                    dist = _grow_f(dist, nrows + 1)
                    grad = _grow_f(grad, nrows + 1)
                    att_ptr = _grow_f(att_ptr, nrows + 2)
                m = nrows
                nrows += 1
                fixed[m] = plane
                for k in range(3):
                    ca[m, k] = pa[k]
                    cb[m, k] = pb[k]
                    if plane:
                        e[m, k] = nrm[k]
                    else:
                        e[m, k] = (pa[k] - pb[k]) / r if r > 0.0 else 0.0
                dist[m] = r
                grad[m] = 0.0
                if p >= 0:
                    leaf_a = node_k[I, 0] < 0
                    leaf_b = plane or node_k[J, 0] < 0
                    terminal = (leaf_a and leaf_b) or r >= (1.0 + margin) * d1
                    nnew = 2
                else:
                    terminal = (not open_all) and r >= (1.0 + margin) * d1
                    # a scene row needs its units only if it ends with a value of its own: a
                    # centred term, or a blend (r > d1); an opened row within d1 never has one
                    nnew = (sc_hi[I] - sc_lo[I] + sc_hi[J] - sc_lo[J]
                            if terminal or (not open_all and r > d1) else 0)
                if na + nnew > att_g.shape[0]:
                    att_g = _grow_f(att_g, na + nnew)
                    att_p = _grow_2(att_p, na + nnew)
                    att_w = _grow_f(att_w, na + nnew)
                if p >= 0:
                    att_g[na] = pair_a[p]
                    att_w[na] = 1.0
                    for k in range(3):
                        att_p[na, k] = pa[k]
                    na += 1
                    if not plane:
                        att_g[na] = pair_b[p]
                        att_w[na] = -1.0
                        for k in range(3):
                            att_p[na, k] = pb[k]
                        na += 1
                elif nnew > 0:
                    wI = 1.0 / (sc_hi[I] - sc_lo[I])
                    for u in range(sc_lo[I], sc_hi[I]):
                        att_g[na] = leaf_geom[u]
                        att_w[na] = wI
                        for k in range(3):
                            att_p[na, k] = x[u, k]
                        na += 1
                    wJ = -1.0 / (sc_hi[J] - sc_lo[J])
                    for u in range(sc_lo[J], sc_hi[J]):
                        att_g[na] = leaf_geom[u]
                        att_w[na] = wJ
                        for k in range(3):
                            att_p[na, k] = x[u, k]
                        na += 1
                att_ptr[m + 1] = na
                if terminal:
                    val, dp, ddp = _centred(r, scale)
                    val *= cnt
                    grad[m] = cnt * dp
                    if nh == hi.shape[0]:
                        hi = _grow_f(hi, nh + 1)
                        hj = _grow_f(hj, nh + 1)
                        hv = _grow_f(hv, nh + 1)
                    hi[nh] = m
                    hj[nh] = m
                    hv[nh] = cnt * ddp
                    nh += 1
                    has_val = True
            if not has_val:
                if depth == stk.shape[0]:
                    stk = _grow_2(stk, depth + 1)
                    sS = _grow_f(sS, depth + 1)
                stk[depth, _S_I] = I
                stk[depth, _S_J] = J
                stk[depth, _S_P] = p
                stk[depth, _S_ROW] = m
                stk[depth, _S_H] = nh
                n = 0
                if p >= 0:
                    leaf_a = node_k[I, 0] < 0
                    leaf_b = pair_plane[p] or node_k[J, 0] < 0
                    nx = 1 if leaf_a else 2
                    ny = 1 if leaf_b else 2
                    for xx in range(nx):
                        for yy in range(ny):
                            stk[depth, _S_CH + 3 * n] = I if leaf_a else node_k[I, xx]
                            stk[depth, _S_CH + 3 * n + 1] = J if leaf_b else node_k[J, yy]
                            stk[depth, _S_CH + 3 * n + 2] = p
                            n += 1
                else:
                    la = sc_k[I, 0] < 0
                    lb = sc_k[J, 0] < 0
                    nx = 1 if la else 2
                    ny = 1 if lb else 2
                    for xx in range(nx):
                        for yy in range(ny):
                            ci = I if la else sc_k[I, xx]
                            cj = J if lb else sc_k[J, yy]
                            if I == J and yy < xx:
                                continue              # a self pair: (L, L), (L, R), (R, R)
                            if ci == cj:
                                if sc_k[ci, 0] < 0:
                                    continue
                                if _count(cand_cum, sc_lo[ci], sc_hi[ci], sc_lo[ci],
                                          sc_hi[ci]) == 0:
                                    continue
                                stk[depth, _S_CH + 3 * n] = ci
                                stk[depth, _S_CH + 3 * n + 1] = ci
                                stk[depth, _S_CH + 3 * n + 2] = -1
                                n += 1
                                continue
                            if _count(cand_cum, sc_lo[ci], sc_hi[ci], sc_lo[cj], sc_hi[cj]) == 0:
                                continue
                            if sc_k[ci, 0] < 0 and sc_k[cj, 0] < 0:
                                q = leaf_pair[sc_lo[ci], sc_lo[cj]]
                                stk[depth, _S_CH + 3 * n] = roots[pair_a[q]]
                                stk[depth, _S_CH + 3 * n + 1] = roots[pair_b[q]]
                                stk[depth, _S_CH + 3 * n + 2] = q
                            else:
                                stk[depth, _S_CH + 3 * n] = ci
                                stk[depth, _S_CH + 3 * n + 1] = cj
                                stk[depth, _S_CH + 3 * n + 2] = -1
                            n += 1
                stk[depth, _S_NCH] = n
                stk[depth, _S_NEXT] = 0
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
                if depth == 0:
                    done = True
                    break
                d = depth - 1
                if stk[d, _S_NEXT] < stk[d, _S_NCH]:
                    c = stk[d, _S_NEXT]
                    stk[d, _S_NEXT] += 1
                    pend_I = stk[d, _S_CH + 3 * c]
                    pend_J = stk[d, _S_CH + 3 * c + 1]
                    pend_P = stk[d, _S_CH + 3 * c + 2]
                    break
                # frame d is complete: the children's sum, blended with its centred term
                m = stk[d, _S_ROW]
                S = sS[d]
                depth -= 1
                has_val = True
                val = S
                if m < 0:
                    continue                              # a scene self pair: the plain sum
                p = stk[d, _S_P]
                I = stk[d, _S_I]
                J = stk[d, _S_J]
                r = dist[m]
                cnt = 1.0
                if p >= 0:
                    d1 = node_r[I] if pair_plane[p] else node_r[I] + node_r[J]
                else:
                    if open_all:
                        continue
                    d1 = sc_r[I] + sc_r[J]
                    cnt = float(_count(cand_cum, sc_lo[I], sc_hi[I], sc_lo[J], sc_hi[J]))
                if r <= d1:
                    continue
                w = margin * d1
                f, f1, f2 = _smoothstep((r - d1) / w)
                f1 = f1 / w
                f2 = f2 / (w * w)
                pv, dp, ddp = _centred(r, scale)
                pv *= cnt
                dp *= cnt
                ddp *= cnt
                for k in range(stk[d, _S_H], nh):
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
    return (total, nrows, fixed, ca, cb, e, dist, grad, nh, hi, hj, hv, att_ptr, att_g, att_p,
            att_w)


@njit
def assemble(nrows, fixed, ca, cb, e, dist, grad, nh, hi, hj, hv, att_ptr, att_g, att_p, att_w,
             gjoint, support, sp_ptr, sp_idx, anc_dof, Jw, derivative):
    """The generalized force ``-dP/dq`` (nv,) and, with ``derivative``, its derivative (nv, nv)
    from the rows of ``evaluate``. ``gjoint[g]``: the joint moving geom g;
    ``support[j, k]``: dof k moves joint j (``sp_ptr``/``sp_idx``: the same as CSR rows);
    ``anc_dof[i, k]``: joint(i) is joint(k) or one of its ancestors; ``Jw`` the world joint
    Jacobians (6, nv)."""
    nv = Jw.shape[1]
    nj = support.shape[0]
    tau = np.zeros(nv)
    K = np.zeros((nv, nv)) if derivative else np.zeros((0, 0))
    # per row: the dofs moving any attachment (CSR), dr/dq on them (U) and D = dc_a/dq - dc_b/dq
    stamp = np.full(nv, -1, dtype=np.int64)
    pos = np.zeros(nv, dtype=np.int64)
    off = np.zeros(nrows + 1, dtype=np.int64)
    for m in range(nrows):
        n = 0
        for t in range(att_ptr[m], att_ptr[m + 1]):
            j = gjoint[att_g[t]]
            for s in range(sp_ptr[j], sp_ptr[j + 1]):
                k = sp_idx[s]
                if stamp[k] != m:
                    stamp[k] = m
                    n += 1
        off[m + 1] = off[m] + n
    dofs = np.empty(off[nrows], dtype=np.int64)
    U = np.zeros(off[nrows])
    stamp[:] = -1
    smax = 0
    for m in range(nrows):
        smax = max(smax, off[m + 1] - off[m])
    D = np.zeros((3, smax))
    G = np.zeros((nj, 3))           # per joint: the sum of the world forces g at its points,
    X = np.zeros((nj, 3, 3))        # the sum of [g]x [c]x
    W = np.zeros((nj, 6))           # and the wrench (g, c x g) at the world origin
    for m in range(nrows):
        s0 = off[m]
        s = off[m + 1] - s0
        n = 0
        for t in range(att_ptr[m], att_ptr[m + 1]):
            j = gjoint[att_g[t]]
            for q in range(sp_ptr[j], sp_ptr[j + 1]):
                k = sp_idx[q]
                if stamp[k] != m:
                    stamp[k] = m
                    pos[k] = n
                    dofs[s0 + n] = k
                    for x in range(3):
                        D[x, n] = 0.0
                    n += 1
        for t in range(att_ptr[m], att_ptr[m + 1]):
            j = gjoint[att_g[t]]
            wt = att_w[t]
            c0, c1, c2 = att_p[t, 0], att_p[t, 1], att_p[t, 2]
            for q in range(sp_ptr[j], sp_ptr[j + 1]):
                k = sp_idx[q]
                u = pos[k]
                w0, w1, w2 = Jw[3, k], Jw[4, k], Jw[5, k]
                D[0, u] += wt * (Jw[0, k] - (c1 * w2 - c2 * w1))
                D[1, u] += wt * (Jw[1, k] - (c2 * w0 - c0 * w2))
                D[2, u] += wt * (Jw[2, k] - (c0 * w1 - c1 * w0))
        for u in range(s):
            acc = e[m, 0] * D[0, u] + e[m, 1] * D[1, u] + e[m, 2] * D[2, u]
            U[s0 + u] = acc
            tau[dofs[s0 + u]] -= grad[m] * acc
        if not derivative or grad[m] == 0.0:
            continue
        a = grad[m]
        # (1) the turning of the direction: a / r D^T (I - e e^T) D (a plane's normal is fixed)
        if not fixed[m]:
            wr = a / dist[m]
            for t1 in range(s):
                k1 = dofs[s0 + t1]
                u1 = U[s0 + t1]
                for t2 in range(s):
                    dd = D[0, t1] * D[0, t2] + D[1, t1] * D[1, t2] + D[2, t1] * D[2, t2]
                    K[k1, dofs[s0 + t2]] += wr * (dd - u1 * U[s0 + t2])
        # (3) world forces g = a w e at the attachments, gathered per joint
        for t in range(att_ptr[m], att_ptr[m + 1]):
            j = gjoint[att_g[t]]
            if j == 0:
                continue
            sg = a * att_w[t]
            c0, c1, c2 = att_p[t, 0], att_p[t, 1], att_p[t, 2]
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
    # (2) second derivatives of P in the distances: sum x U_i U_j^T
    for h in range(nh):
        i = hi[h]
        j = hj[h]
        x = hv[h]
        for t1 in range(off[i], off[i + 1]):
            u1 = x * U[t1]
            if u1 == 0.0:
                continue
            k1 = dofs[t1]
            for t2 in range(off[j], off[j + 1]):
                K[k1, dofs[t2]] += u1 * U[t2]
    # (3) per joint: the motion of the points' Jacobians under fixed world forces,
    #     -Jang^T [g]x J_c summed over the joint's points, and the motion of the joint's
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
