"""Compiled per-step collision work (see ``collision_driver.py`` for the algorithm).

The kernels, called once per step with the driver's constant tables:

* ``joint_speeds``: the speed of each moving joint's origin and its angular speed, from
  pinocchio's world-frame joint Jacobians ``data.J`` and ``v`` (no per-joint Python reads);
* ``placements_and_bounds``: every geom's world placement and speed bound, and the broad
  phase: the pairs of a shape and a plane one by one, every other pair through
  ``sweep_and_prune`` over the geoms' bounding spheres inflated by their share of the margin
  ``base_margin + dt (speed bound 1 + speed bound 2)`` (near linear in the geoms, no loop over
  the N^2 / 2 registered pairs); then, for the pairs it finds, the lower bounds on their
  distance (the candidates of the narrow phase are returned) or, for sphere-sphere and
  sphere-box pairs, the closed forms below;
* ``plane_points``: the closed-form contacts of every sphere, capsule and box resting on a
  static plane (``plane_contacts.py`` describes the points), with their normals and frames;
* ``sphere_pairs``: the closed-form contacts of sphere-sphere pairs (exact: the broad-phase
  distance of two spheres is their distance);
* ``sphere_box_pairs``: the closed-form contacts of sphere-box pairs (the box point closest to
  the sphere centre, or the face of least penetration with the centre inside);
* the polytope route of the narrow phase (box-box, box-capsule, convex meshes), around coal's
  collision and patch: ``poly_separated`` (the candidates the separating-axis test proves out
  of reach), ``poly_snaps`` (every patch's normal and distance snapped to the exact separating
  axis, or the crossing-segments test), ``poly_patches`` (every snapped patch projected on its
  mid plane, per-point distances, reduced to ``max_points``, as rows); ``narrow_rows`` gives
  the narrow phase's rows their frames, geoms and friction.

They are plain loops over floats, compiled with numba (``jit.py``).
"""
from __future__ import annotations

import numpy as np

from .collision_derivatives import (MARGIN_SIDE, MARGIN_VERTEX_ID, _k_common_plane, _k_cross,
                                    _k_rows_of, _k_snap_pair,
                                    _k_world_patch_distances)
from .jit import njit

SPHERE, CAPSULE, BOX = 0, 1, 2
KIND_CODES = {"sphere": SPHERE, "capsule": CAPSULE, "box": BOX}

# The broad phase is conservative by this much (its bounds use their own round-off).
BROAD_SLACK = 1e-9


@njit
def joint_speeds(Jw, v, support, origins):
    """Linear speed of each joint origin and angular speed (m,) of the joints whose support
    masks (m, nv) are given; ``Jw`` is pinocchio's data.J (6, nv, world frame: the linear rows
    are the velocity of the point at the world origin), ``origins`` (m, 3)."""
    m = support.shape[0]
    nv = v.shape[0]
    lin = np.empty(m)
    ang = np.empty(m)
    for s in range(m):
        v0 = v1 = v2 = w0 = w1 = w2 = 0.0
        for d in range(nv):
            if support[s, d]:
                x = v[d]
                v0 += Jw[0, d] * x
                v1 += Jw[1, d] * x
                v2 += Jw[2, d] * x
                w0 += Jw[3, d] * x
                w1 += Jw[4, d] * x
                w2 += Jw[5, d] * x
        o0, o1, o2 = origins[s, 0], origins[s, 1], origins[s, 2]
        # velocity of the origin: v_O + w x o
        a0 = v0 + w1 * o2 - w2 * o1
        a1 = v1 + w2 * o0 - w0 * o2
        a2 = v2 + w0 * o1 - w1 * o0
        lin[s] = np.sqrt(a0 * a0 + a1 * a1 + a2 * a2)
        ang[s] = np.sqrt(w0 * w0 + w1 * w1 + w2 * w2)
    return lin, ang


@njit
def placements(oM, mj, lin, ang, gslot, W0, reach):
    """World placements W (ngeom, 4, 4) and speed bounds (ngeom,) of every geom. ``oM``
    (njoints, 12): joint placements (rotation column-major, then translation; ``pinviews``),
    ``mj``: the moving joints; ``gslot``: each geom's index in mj (-1: static, W0 is then its
    world placement, else its placement in the joint frame)."""
    ng = gslot.shape[0]
    W = np.empty((ng, 4, 4))
    speed = np.zeros(ng)
    for gi in range(ng):
        s = gslot[gi]
        if s < 0:
            W[gi] = W0[gi]
            continue
        j = mj[s]
        for r in range(3):
            for c in range(4):
                W[gi, r, c] = (oM[j, r] * W0[gi, 0, c] + oM[j, 3 + r] * W0[gi, 1, c]
                               + oM[j, 6 + r] * W0[gi, 2, c] + oM[j, 9 + r] * W0[gi, 3, c])
        for c in range(4):
            W[gi, 3, c] = W0[gi, 3, c]
        speed[gi] = lin[s] + ang[s] * reach[gi]
    return W, speed


@njit
def pair_margin(speed, pairs, base_margin, dt, k):
    """The margin of pair k: ``base_margin + dt (speed bound 1 + speed bound 2)``."""
    return base_margin + dt * (speed[pairs[k, 0]] + speed[pairs[k, 1]])


@njit
def plane_bounds(W, speed, pairs, base_margin, dt, hp_k, hp_pl, hp_ot, ext_vec, ext_const,
                 use_rot, mesh_i, mesh_pl, mesh_ot, mesh_sw, hull_off, hull_pts):
    """Margins (m,) and distance lower bounds (m,) of the pairs of a shape and a plane that are
    not closed form (``hp_k``): the height of the shape's centre minus its support along the
    normal; for a mesh (``mesh_i``: its entry in hp_k) the lowest vertex of its convex hull."""
    m = hp_k.shape[0]
    margin = np.empty(m)
    gap = np.empty(m)
    for i in range(m):
        margin[i] = pair_margin(speed, pairs, base_margin, dt, hp_k[i])
        pl, ot = hp_pl[i], hp_ot[i]
        z0, z1, z2 = W[pl, 0, 2], W[pl, 1, 2], W[pl, 2, 2]
        if use_rot:
            ext = ext_const[i]
            for a in range(3):
                ext += abs(W[ot, 0, a] * z0 + W[ot, 1, a] * z1 + W[ot, 2, a] * z2) * ext_vec[i, a]
        else:
            ext = ext_const[i]
        gap[i] = (z0 * (W[ot, 0, 3] - W[pl, 0, 3]) + z1 * (W[ot, 1, 3] - W[pl, 1, 3])
                  + z2 * (W[ot, 2, 3] - W[pl, 2, 3])) - ext
    # a mesh against a plane, where the bound above does not clear it: the lowest vertex of the
    # mesh's convex hull (hull_pts[hull_off[t]:hull_off[t + 1]], in the geom frame) gives the
    # exact height of the mesh above the plane
    for t in range(mesh_i.shape[0]):
        i = mesh_i[t]
        if not gap[i] < margin[i] + BROAD_SLACK:
            continue
        pl, ot = mesh_pl[t], mesh_ot[t]
        z0, z1, z2 = W[pl, 0, 2], W[pl, 1, 2], W[pl, 2, 2]
        # the plane normal in the mesh frame
        m0 = W[ot, 0, 0] * z0 + W[ot, 1, 0] * z1 + W[ot, 2, 0] * z2
        m1 = W[ot, 0, 1] * z0 + W[ot, 1, 1] * z1 + W[ot, 2, 1] * z2
        m2 = W[ot, 0, 2] * z0 + W[ot, 1, 2] * z1 + W[ot, 2, 2] * z2
        low = np.inf
        for u in range(hull_off[t], hull_off[t + 1]):
            h = hull_pts[u, 0] * m0 + hull_pts[u, 1] * m1 + hull_pts[u, 2] * m2
            if h < low:
                low = h
        exact = (z0 * (W[ot, 0, 3] - W[pl, 0, 3]) + z1 * (W[ot, 1, 3] - W[pl, 1, 3])
                 + z2 * (W[ot, 2, 3] - W[pl, 2, 3])) + low - mesh_sw[t]
        if exact > gap[i]:
            gap[i] = exact
    return margin, gap


@njit
def _grow(buf, n):
    """buf with room for at least n + 1 entries (doubled when full)."""
    if n < buf.shape[0]:
        return buf
    out = np.empty(2 * buf.shape[0] + 16, dtype=buf.dtype)
    out[:n] = buf[:n]
    return out


@njit
def _lower(pairs, perm, a, b):
    """First position of the pair key (a, b), a < b, in the sorted pair keys: ``pairs`` itself
    when ``perm`` is empty (its rows are (i, k), i < k, strictly increasing), else the rows
    ``pairs[perm]`` ordered by (min, max)."""
    lo, hi = 0, (pairs.shape[0] if perm.shape[0] == 0 else perm.shape[0])
    while lo < hi:
        mid = (lo + hi) >> 1
        k = mid if perm.shape[0] == 0 else perm[mid]
        x, y = pairs[k, 0], pairs[k, 1]
        if x > y:
            x, y = y, x
        if x < a or (x == a and y < b):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit
def sweep_and_prune(W, speed, rad, sap_g, pairs, perm, base_margin, dt):
    """The registered pairs (indices into ``pairs``) of geoms ``sap_g`` whose bounding spheres
    (``rad``: radius about the geom origin), inflated by their share of the pair margin
    (``dt`` speed + half the base margin, plus a slack far above round-off), overlap: sort
    the spheres' intervals on the axis along which the centres spread most and sweep, then the
    sphere test, then the pair's index by binary search in the sorted pair keys (``_lower``).
    A superset of the pairs whose bounding-sphere gap is below their margin (every broad-phase
    bound and closed-form distance of a pair is at least that gap), in increasing order; near
    linear in the number of geoms for scenes whose geoms are not all near one another."""
    n = sap_g.shape[0]
    out = np.empty(4 * n + 16, dtype=np.int64)
    if n < 2:
        return out[:0]
    c = np.empty((n, 3))
    r = np.empty(n)
    mean = np.zeros(3)
    for i in range(n):
        g = sap_g[i]
        for a in range(3):
            c[i, a] = W[g, a, 3]
            mean[a] += c[i, a]
        big = max(abs(c[i, 0]), abs(c[i, 1]), abs(c[i, 2]), rad[g])
        r[i] = rad[g] + dt * speed[g] + 0.5 * base_margin + BROAD_SLACK + 1e-12 * big
    for a in range(3):
        mean[a] /= n
    var = np.zeros(3)
    for i in range(n):
        for a in range(3):
            var[a] += (c[i, a] - mean[a]) ** 2
    ax = 0
    if var[1] > var[ax]:
        ax = 1
    if var[2] > var[ax]:
        ax = 2
    lo = np.empty(n)
    for i in range(n):
        lo[i] = c[i, ax] - r[i]
    order = np.argsort(lo)
    cnt = 0
    for ii in range(n):
        i = order[ii]
        hi_i = c[i, ax] + r[i]
        for jj in range(ii + 1, n):
            j = order[jj]
            if lo[j] > hi_i:
                break
            d0 = c[i, 0] - c[j, 0]
            d1 = c[i, 1] - c[j, 1]
            d2 = c[i, 2] - c[j, 2]
            s = r[i] + r[j]
            if d0 * d0 + d1 * d1 + d2 * d2 > s * s:
                continue
            a, b = sap_g[i], sap_g[j]
            if a > b:
                a, b = b, a
            p = _lower(pairs, perm, a, b)
            npk = pairs.shape[0] if perm.shape[0] == 0 else perm.shape[0]
            while p < npk:
                k = p if perm.shape[0] == 0 else perm[p]
                x, y = pairs[k, 0], pairs[k, 1]
                if x > y:
                    x, y = y, x
                if x != a or y != b:
                    break
                out = _grow(out, cnt)
                out[cnt] = k
                cnt += 1
                p += 1
    return np.sort(out[:cnt])


@njit
def placements_and_bounds(oM, mj, lin, ang, gslot, W0, reach, pairs, perm, pcat, rad, sap_g,
                          base_margin, dt, hp_k, hp_pl, hp_ot, ext_vec, ext_const, use_rot,
                          mesh_i, mesh_pl, mesh_ot, mesh_sw, hull_off, hull_pts, g_boxhalf,
                          g_isbox):
    """World placements W, speed bounds, and the broad phase: the candidate pairs without a
    closed form whose distance lower bound is below their margin (+ BROAD_SLACK), with their
    margins, and the sphere-sphere (``pcat`` 2) and sphere-box (3: geom 1 is the box, 4:
    geom 2) pairs near enough for their closed forms to be tried, with theirs. Pairs of a shape
    and a plane (``hp_*``) are bounded one by one; every other pair (``pcat`` 1: a bounding-
    sphere gap, raised by a box's oriented bounds against the other's sphere) is found by
    ``sweep_and_prune`` over the geoms ``sap_g``. Returns (W, speed, cand, cand_margin, ss,
    ss_margin, sb, sb_margin), each list of pairs in increasing order."""
    W, speed = placements(oM, mj, lin, ang, gslot, W0, reach)
    hp_m, hp_gap = plane_bounds(W, speed, pairs, base_margin, dt, hp_k, hp_pl, hp_ot, ext_vec,
                                ext_const, use_rot, mesh_i, mesh_pl, mesh_ot, mesh_sw, hull_off,
                                hull_pts)
    near = sweep_and_prune(W, speed, rad, sap_g, pairs, perm, base_margin, dt)
    nn = near.shape[0]
    nh = hp_k.shape[0]
    cand = np.empty(nh + nn, dtype=np.int64)
    cm = np.empty(nh + nn)
    ss = np.empty(nn, dtype=np.int64)
    ssm = np.empty(nn)
    sb = np.empty(nn, dtype=np.int64)
    sbm = np.empty(nn)
    nc = nss = nsb = 0
    for i in range(nh):
        if hp_gap[i] < hp_m[i] + BROAD_SLACK:
            cand[nc] = hp_k[i]
            cm[nc] = hp_m[i]
            nc += 1
    nplane = nc
    for t in range(nn):
        k = near[t]
        cat = pcat[k]
        mk = pair_margin(speed, pairs, base_margin, dt, k)
        if cat == 2:
            ss[nss] = k
            ssm[nss] = mk
            nss += 1
            continue
        if cat == 3 or cat == 4:
            sb[nsb] = k
            sbm[nsb] = mk
            nsb += 1
            continue
        if cat != 1:
            continue
        a, b = pairs[k, 0], pairs[k, 1]
        # two shapes: their bounding spheres
        d0 = W[a, 0, 3] - W[b, 0, 3]
        d1 = W[a, 1, 3] - W[b, 1, 3]
        d2 = W[a, 2, 3] - W[b, 2, 3]
        gap = np.sqrt(d0 * d0 + d1 * d1 + d2 * d2) - (rad[a] + rad[b])
        # a box and a shape: the box's oriented bounds against the shape's bounding sphere
        for side in range(2):
            bx, ot = (a, b) if side == 0 else (b, a)
            if not g_isbox[bx]:
                continue
            o2 = 0.0
            for x in range(3):
                loc = (W[bx, 0, x] * (W[ot, 0, 3] - W[bx, 0, 3])
                       + W[bx, 1, x] * (W[ot, 1, 3] - W[bx, 1, 3])
                       + W[bx, 2, x] * (W[ot, 2, 3] - W[bx, 2, 3]))
                out = abs(loc) - g_boxhalf[bx, x]
                if out > 0.0:
                    o2 += out * out
            lb = np.sqrt(o2) - rad[ot]
            if lb > gap:
                gap = lb
        if gap < mk + BROAD_SLACK:
            cand[nc] = k
            cm[nc] = mk
            nc += 1
    cand, cm = cand[:nc], cm[:nc]
    if nplane and nc > nplane:
        o = np.argsort(cand)
        cand, cm = cand[o], cm[o]
    return W, speed, cand, cm, ss[:nss], ssm[:nss], sb[:nsb], sbm[:nsb]


@njit
def _new_rows(n):
    """Empty contact rows (pair, geom1, geom2, point, pos, normal, dist, mu, frames) for n
    points; point indices zero."""
    return (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64),
            np.zeros(n, dtype=np.int64), np.empty((n, 3)), np.empty((n, 3)), np.empty(n),
            np.empty(n), np.empty((n, 3, 3)))


@njit
def _set_frame(frames, r, n0, n1, n2):
    """frames[r] = frames.tangent_frames of the unit normal n: t1 = helper x n / |.| (helper e_x
    where |n_x| < 0.9, else e_y), t2 = n x t1, columns (t1, t2, n)."""
    if abs(n0) < 0.9:
        t0, t1, t2 = 0.0, -n2, n1
    else:
        t0, t1, t2 = n2, 0.0, -n0
    tn = np.sqrt(t0 * t0 + t1 * t1 + t2 * t2)
    t0, t1, t2 = t0 / tn, t1 / tn, t2 / tn
    frames[r, 0, 0], frames[r, 1, 0], frames[r, 2, 0] = t0, t1, t2
    frames[r, 0, 1] = n1 * t2 - n2 * t1
    frames[r, 1, 1] = n2 * t0 - n0 * t2
    frames[r, 2, 1] = n0 * t1 - n1 * t0
    frames[r, 0, 2], frames[r, 1, 2], frames[r, 2, 2] = n0, n1, n2


@njit
def _witness(kind, size, W, gi, n, j, x):
    """Witness point j of shape ``gi`` (placement W[gi]) against a plane of normal n into x."""
    if kind == SPHERE:
        for a in range(3):
            x[a] = W[gi, a, 3] - size[0] * n[a]
    elif kind == CAPSULE:
        sgn = -1.0 if j == 0 else 1.0
        for a in range(3):
            x[a] = (W[gi, a, 3] + sgn * size[1] * W[gi, a, 2]) - size[0] * n[a]
    else:
        sx = -1.0 if j < 4 else 1.0
        sy = -1.0 if (j // 2) % 2 == 0 else 1.0
        sz = -1.0 if j % 2 == 0 else 1.0
        for a in range(3):
            x[a] = W[gi, a, 3] + (W[gi, a, 0] * (sx * size[0]) + W[gi, a, 1] * (sy * size[1])
                                  + W[gi, a, 2] * (sz * size[2]))


@njit
def plane_points(W, margin, pairs, friction, max_points, bp_pair, bp_kind, bp_geom, bp_n,
                 bp_off, bp_N, bp_frames, bp_size, reach):
    """Closed-form contacts of the shape-on-static-plane pairs ``bp_*`` (in pair order;
    ``margin``: theirs, one per entry; ``reach``: the part of it that the pair's motion can
    cover within the step, ``dt`` times the speed bounds).

    Points of a pair whose height above the plane is below the pair's margin; when more than
    ``max_points`` are, the deepest (ties: the lower index) in order of depth, and beyond those
    every further point lower than ``reach``, else in index order. (A box tumbling onto the
    floor at 10 Hz turns by a radian or more within a step: the corners that swing down are not
    the deepest now. Cut to the 4 deepest, bench_drops #240, a long box at 10 Hz, went 22 cm
    into the floor, its centre below it. ``reach`` and not the margin, so that a large base
    margin, DiffPush-v0's, keeps a resting box at its 4 points.) Returns (pair, geom1, geom2,
    point, pos, normal, dist, mu, frames) arrays."""
    nb = bp_pair.shape[0]
    npt = np.empty(nb, dtype=np.int64)
    ids = np.empty((nb, 8), dtype=np.int64)
    hts = np.empty((nb, 8))
    xs = np.empty((nb, 8, 3))
    x = np.empty(3)
    total = 0
    for i in range(nb):
        kind = bp_kind[i]
        cnt = 1 if kind == SPHERE else (2 if kind == CAPSULE else 8)
        mk = margin[i]
        n = bp_n[i]
        sel = 0
        for j in range(cnt):
            _witness(kind, bp_size[i], W, bp_geom[i], n, j, x)
            h = (x[0] * n[0] + x[1] * n[1] + x[2] * n[2]) - bp_off[i]
            if h < mk:
                ids[i, sel] = j
                hts[i, sel] = h
                xs[i, sel, 0] = x[0]
                xs[i, sel, 1] = x[1]
                xs[i, sel, 2] = x[2]
                sel += 1
        if sel > max_points:
            # stable insertion sort by height, then keep the deepest max_points
            for a in range(1, sel):
                hj, ij = hts[i, a], ids[i, a]
                x0, x1, x2 = xs[i, a, 0], xs[i, a, 1], xs[i, a, 2]
                b = a - 1
                while b >= 0 and hts[i, b] > hj:
                    hts[i, b + 1] = hts[i, b]
                    ids[i, b + 1] = ids[i, b]
                    xs[i, b + 1, 0] = xs[i, b, 0]
                    xs[i, b + 1, 1] = xs[i, b, 1]
                    xs[i, b + 1, 2] = xs[i, b, 2]
                    b -= 1
                hts[i, b + 1] = hj
                ids[i, b + 1] = ij
                xs[i, b + 1, 0] = x0
                xs[i, b + 1, 1] = x1
                xs[i, b + 1, 2] = x2
            keep = max_points
            while keep < sel and hts[i, keep] < reach[i]:
                keep += 1
            sel = keep
        npt[i] = sel
        total += sel
    pair, g1, g2, point, pos, normal, dist, mu, frames = _new_rows(total)
    r = 0
    for i in range(nb):
        k = bp_pair[i]
        n = bp_n[i]
        for s in range(npt[i]):
            d = hts[i, s]
            pair[r] = k
            g1[r] = pairs[k, 0]
            g2[r] = pairs[k, 1]
            point[r] = ids[i, s]
            for a in range(3):
                # the witness point's projection on the plane (points of one face on a plane
                # are then coplanar: the sticking equations of a resting face are consistent)
                pos[r, a] = xs[i, s, a] - d * n[a]
                normal[r, a] = bp_N[i, a]
            dist[r] = d
            mu[r] = friction[k]
            frames[r] = bp_frames[i]
            r += 1
    return pair, g1, g2, point, pos, normal, dist, mu, frames


@njit
def sphere_pairs(W, margin, pairs, friction, ss_k, g_r):
    """Closed-form contacts of sphere-sphere pairs ``ss_k`` (in increasing order; ``margin``:
    theirs, ``g_r``: the radius of each sphere geom) closer than their margins: normal along the centres (from geom 1 to geom 2), the
    midpoint of the two surface points, frames as ``frames.tangent_frames``. Rows as
    ``plane_points``."""
    n_ss = ss_k.shape[0]
    hit = np.zeros(n_ss, dtype=np.bool_)
    total = 0
    for i in range(n_ss):
        k = ss_k[i]
        a, b = pairs[k, 0], pairs[k, 1]
        d0 = W[b, 0, 3] - W[a, 0, 3]
        d1 = W[b, 1, 3] - W[a, 1, 3]
        d2 = W[b, 2, 3] - W[a, 2, 3]
        if np.sqrt(d0 * d0 + d1 * d1 + d2 * d2) - g_r[a] - g_r[b] < margin[i]:
            hit[i] = True
            total += 1
    pair, g1, g2, point, pos, normal, dist, mu, frames = _new_rows(total)
    r = 0
    for i in range(n_ss):
        if not hit[i]:
            continue
        k = ss_k[i]
        a, b = pairs[k, 0], pairs[k, 1]
        d0 = W[b, 0, 3] - W[a, 0, 3]
        d1 = W[b, 1, 3] - W[a, 1, 3]
        d2 = W[b, 2, 3] - W[a, 2, 3]
        L = np.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
        if L > 0.0:
            n0, n1, n2 = d0 / L, d1 / L, d2 / L
        else:                               # coincident centres: any direction is a normal
            n0, n1, n2 = 0.0, 0.0, 1.0
        pair[r], g1[r], g2[r] = k, a, b
        r1, r2 = g_r[a], g_r[b]
        dist[r] = L - r1 - r2
        mu[r] = friction[k]
        nn = (n0, n1, n2)
        for c in range(3):
            # surface points c_a + r1 n and c_b - r2 n; their midpoint
            pos[r, c] = 0.5 * ((W[a, c, 3] + r1 * nn[c]) + (W[b, c, 3] - r2 * nn[c]))
            normal[r, c] = nn[c]
        _set_frame(frames, r, n0, n1, n2)
        r += 1
    return pair, g1, g2, point, pos, normal, dist, mu, frames


@njit
def merge_rows(A, B):
    """Rows of A and B (tuples as plane_points returns, each ordered by pair) merged by pair
    (A's rows first on equal pairs)."""
    na, nb = A[0].shape[0], B[0].shape[0]
    if nb == 0:
        return A
    if na == 0:
        return B
    n = na + nb
    pair, g1, g2, point, pos, normal, dist, mu, frames = _new_rows(n)
    i = j = 0
    for r in range(n):
        take_a = j >= nb or (i < na and A[0][i] <= B[0][j])
        S, t = (A, i) if take_a else (B, j)
        pair[r], g1[r], g2[r], point[r] = S[0][t], S[1][t], S[2][t], S[3][t]
        pos[r] = S[4][t]
        normal[r] = S[5][t]
        dist[r], mu[r] = S[6][t], S[7][t]
        frames[r] = S[8][t]
        if take_a:
            i += 1
        else:
            j += 1
    return pair, g1, g2, point, pos, normal, dist, mu, frames


@njit
def detect_closed_form(oM, mj, Jw, v, support, lin, ang, from_jacobian, gslot, W0, reach, pairs,
                       perm, pcat, rad, sap_g, base_margin, dt, hp_k, hp_pl, hp_ot, ext_vec,
                       ext_const, use_rot, mesh_i, mesh_pl, mesh_ot, mesh_sw, hull_off,
                       hull_pts, g_boxhalf, g_isbox, friction, max_points, bp_pair, bp_kind,
                       bp_geom, bp_n, bp_off, bp_N, bp_frames, bp_size, g_ssr, g_sbhalf, g_sbr):
    """The kernels above in one call (one dispatch from Python): speeds (from ``Jw`` and
    ``v`` when ``from_jacobian``, else the given ``lin``, ``ang``), placements, the broad phase,
    then the closed-form points: (nc, n, F, I), the candidate pairs of the narrow phase (nc)
    and the n closed-form contact rows packed in one float64 and one int64 array (each array
    numba returns costs a boxing and an unpickling call; Python's slices of two cost less):
    I = cand (nc), pair, geom1, geom2, point (n each); F = cand_margin (nc), dist, mu (n each),
    pos, normal (3 n each, row-major (n, 3)), frames (9 n, row-major (n, 3, 3)).
    ``collision_driver._unpack_detect`` gives the views (cand, cand_margin, rows)."""
    if from_jacobian:
        origins = np.empty((mj.shape[0], 3))
        for s in range(mj.shape[0]):
            for a in range(3):
                origins[s, a] = oM[mj[s], 9 + a]
        lin, ang = joint_speeds(Jw, v, support, origins)
    W, speed, cand, cm, ss, ssm, sb, sbm = placements_and_bounds(
        oM, mj, lin, ang, gslot, W0, reach, pairs, perm, pcat, rad, sap_g, base_margin, dt,
        hp_k, hp_pl, hp_ot, ext_vec, ext_const, use_rot, mesh_i, mesh_pl, mesh_ot, mesh_sw,
        hull_off, hull_pts, g_boxhalf, g_isbox)
    bpm = np.empty(bp_pair.shape[0])
    bpr = np.empty(bp_pair.shape[0])
    for i in range(bp_pair.shape[0]):
        bpm[i] = pair_margin(speed, pairs, base_margin, dt, bp_pair[i])
        bpr[i] = pair_margin(speed, pairs, 0.0, dt, bp_pair[i])
    rows = plane_points(W, bpm, pairs, friction, max_points, bp_pair, bp_kind, bp_geom, bp_n,
                        bp_off, bp_N, bp_frames, bp_size, bpr)
    if ss.shape[0]:
        rows = merge_rows(rows, sphere_pairs(W, ssm, pairs, friction, ss, g_ssr))
    if sb.shape[0]:
        rows = merge_rows(rows, sphere_box_pairs(W, sbm, pairs, friction, sb, pcat, g_sbhalf,
                                                 g_sbr))
    pair, g1, g2, point, pos, normal, dist, mu, frames = rows
    nc, n = cand.shape[0], pair.shape[0]
    I = np.empty(nc + 4 * n, dtype=np.int64)
    F = np.empty(nc + 17 * n)
    for i in range(nc):
        I[i] = cand[i]
        F[i] = cm[i]
    o = nc + 2 * n
    for r in range(n):
        I[nc + r] = pair[r]
        I[nc + n + r] = g1[r]
        I[nc + 2 * n + r] = g2[r]
        I[nc + 3 * n + r] = point[r]
        F[nc + r] = dist[r]
        F[nc + n + r] = mu[r]
        for c in range(3):
            F[o + 3 * r + c] = pos[r, c]
            F[o + 3 * n + 3 * r + c] = normal[r, c]
            for e in range(3):
                F[o + 6 * n + 9 * r + 3 * c + e] = frames[r, c, e]
    return nc, n, F, I


@njit
def sphere_box_pairs(W, margin, pairs, friction, sb_k, pcat, g_half, g_r):
    """Closed-form contacts of sphere-box pairs ``sb_k`` (in increasing order; ``margin``:
    theirs; the box is geom 1 where ``pcat[k]`` is 3, else geom 2, with half sizes ``g_half``;
    the sphere's radius ``g_r``) closer than their margins. In the box frame the
    closest box point to the sphere centre c is c clamped to the half sizes; with c outside the
    box the normal points from that point to c and dist = |c - p| - r; with c inside, the face
    of least penetration gives the normal (its outward normal) and dist = -penetration - r.
    Normals from geom 1 to geom 2, the point is the midpoint of the box and sphere surface
    points (point index 0), frames as ``frames.tangent_frames``. Rows as ``plane_points``."""
    n_sb = sb_k.shape[0]
    hit = np.zeros(n_sb, dtype=np.bool_)
    tpos = np.empty((n_sb, 3))
    tnrm = np.empty((n_sb, 3))
    tdist = np.empty(n_sb)
    x = np.empty(3)
    p = np.empty(3)
    m = np.empty(3)
    total = 0
    for i in range(n_sb):
        k = sb_k[i]
        if pcat[k] == 3:
            b, s = pairs[k, 0], pairs[k, 1]
        else:
            b, s = pairs[k, 1], pairs[k, 0]
        r = g_r[s]
        d0 = W[s, 0, 3] - W[b, 0, 3]
        d1 = W[s, 1, 3] - W[b, 1, 3]
        d2 = W[s, 2, 3] - W[b, 2, 3]
        outside = False
        for a in range(3):
            x[a] = W[b, 0, a] * d0 + W[b, 1, a] * d1 + W[b, 2, a] * d2
            h = g_half[b, a]
            if x[a] > h:
                p[a] = h
                outside = True
            elif x[a] < -h:
                p[a] = -h
                outside = True
            else:
                p[a] = x[a]
        if outside:
            e0, e1, e2 = x[0] - p[0], x[1] - p[1], x[2] - p[2]
            L = np.sqrt(e0 * e0 + e1 * e1 + e2 * e2)
            m[0], m[1], m[2] = e0 / L, e1 / L, e2 / L
            dist = L - r
        else:                               # centre inside: the face of least penetration
            ax = 0
            best = np.inf
            for a in range(3):
                pen = g_half[b, a] - abs(x[a])
                if pen < best:
                    best = pen
                    ax = a
            m[0] = m[1] = m[2] = 0.0
            sg = 1.0 if x[ax] >= 0.0 else -1.0
            m[ax] = sg
            p[ax] = sg * g_half[b, ax]
            dist = -best - r
        if not dist < margin[i]:
            continue
        hit[i] = True
        total += 1
        sgn = 1.0 if b == pairs[k, 0] else -1.0     # the normal from geom 1 to geom 2
        for c in range(3):
            nw = W[b, c, 0] * m[0] + W[b, c, 1] * m[1] + W[b, c, 2] * m[2]
            pb = W[b, c, 3] + W[b, c, 0] * p[0] + W[b, c, 1] * p[1] + W[b, c, 2] * p[2]
            # box surface point and sphere surface point c - r n (n out of the box)
            tpos[i, c] = 0.5 * (pb + (W[s, c, 3] - r * nw))
            tnrm[i, c] = sgn * nw
        tdist[i] = dist
    pair, g1, g2, point, pos, normal, dist_o, mu, frames = _new_rows(total)
    # rows ordered by pair (sb_k is sorted)
    r = 0
    for i in range(n_sb):
        if not hit[i]:
            continue
        k = sb_k[i]
        pair[r], g1[r], g2[r] = k, pairs[k, 0], pairs[k, 1]
        dist_o[r] = tdist[i]
        mu[r] = friction[k]
        n0, n1, n2 = tnrm[i, 0], tnrm[i, 1], tnrm[i, 2]
        for c in range(3):
            pos[r, c] = tpos[i, c]
            normal[r, c] = tnrm[i, c]
        _set_frame(frames, r, n0, n1, n2)
        r += 1
    return pair, g1, g2, point, pos, normal, dist_o, mu, frames


# -- polytope pairs of the narrow phase (box-box, box-capsule, convex meshes) ------------------
# coal decides whether a pair touches and gives its contact patch; what the driver does with
# them (the world vertices and axes of both shapes, the segment-crossing test, the snap to the
# exact separating axis, the projection of the patch on the mid plane, the per-point distances
# and the reduction to max_points) is one compiled call per pair, reading the geoms' world
# placements from a view of gdata.oMg and their local cores from tables made at load.
@njit
def _core_dirs(view, g, A):
    """Directions A (k, 3) of geom g turned to the world (``A @ R.T``)."""
    W = np.empty((A.shape[0], 3))
    _world_rows(view, g, A, 0, A.shape[0], W, False)
    return W


@njit
def _core_world(view, g, c_v, c_voff, c_f, c_foff, c_e, c_eoff):
    """World vertices, face normals and edge directions of geom g's core (``V @ R.T + t``,
    ``F @ R.T``, ``E @ R.T``; view[g] = rotation column-major, then translation)."""
    return (_core_vertices(view, g, c_v, c_voff), _core_dirs(view, g, c_f[c_foff[g]:c_foff[g + 1]]),
            _core_dirs(view, g, c_e[c_eoff[g]:c_eoff[g + 1]]))


@njit
def _crossing_support(X, Y, n, ptol):
    """Whether the support sets of X along n and of Y along -n (within ptol) are two segments
    that cross (not parallel, as ``collision_derivatives.segments_parallel``)."""
    hx, hy = X @ n, Y @ n
    ia = _k_rows_of(X, hx, hx.max(), ptol, True)
    ib = _k_rows_of(Y, hy, hy.min(), ptol, False)
    if ia.shape[0] != 2 or ib.shape[0] != 2:
        return False
    uA, uB = X[ia[1]] - X[ia[0]], Y[ib[1]] - Y[ib[0]]
    cr = _k_cross(uA, uB)
    return not (np.sqrt(cr @ cr) <= 1e-6 * (np.sqrt(uA @ uA) * np.sqrt(uB @ uB)))


@njit
def poly_pair_snap(view, ga, gb, c_v, c_voff, c_f, c_foff, c_e, c_eoff, c_rad, n, d, tol, ptol,
                   want_cross):
    """The driver's first look at polytope pair (ga, gb) after coal's test: (crossing, ok,
    axis, distance, mid-plane height). With ``want_cross`` (coal's patch has two points) the
    crossing-segments test first (crossing: the rest is not computed); then
    ``collision_derivatives.snap_pair`` of coal's normal n and distance d (ok False: coal's
    answer stands)."""
    X, FA, EA = _core_world(view, ga, c_v, c_voff, c_f, c_foff, c_e, c_eoff)
    Y, FB, EB = _core_world(view, gb, c_v, c_voff, c_f, c_foff, c_e, c_eoff)
    if want_cross and _crossing_support(X, Y, n, ptol):
        return True, False, n.copy(), 0.0, 0.0
    ok, axis, f, c = _k_snap_pair(X, c_rad[ga], FA, EA, Y, c_rad[gb], FB, EB, n, d, tol)
    return False, ok, axis, f, c


@njit
def _sum3(a0, a1, a2):
    """a0 + a1 + a2 summed as numpy's add.reduce of three ((a0 + a1) + a2)."""
    return (a0 + a1) + a2


@njit
def reduce_patch(points, max_points):
    """Indices (sorted) of at most max_points points spanning a planar polygon: the point
    farthest from the centroid, the point farthest from it, then the points farthest from
    their line on either side (``collision_driver._reduce_patch``)."""
    m = points.shape[0]
    if m <= max_points:
        return np.arange(m)
    c = np.zeros(3)
    for i in range(m):
        c += points[i]
    c /= m
    i0, best = 0, -1.0
    for i in range(m):
        e = points[i] - c
        s = _sum3(e[0] * e[0], e[1] * e[1], e[2] * e[2])
        if s > best:
            i0, best = i, s
    i1, best = 0, -1.0
    for i in range(m):
        e = points[i] - points[i0]
        s = _sum3(e[0] * e[0], e[1] * e[1], e[2] * e[2])
        if s > best:
            i1, best = i, s
    chosen = np.full(4, -1, dtype=np.int64)
    chosen[0], chosen[1] = i0, i1
    if max_points > 2:
        dv = points[i1] - points[i0]
        dv /= max(np.sqrt(dv @ dv), 1e-300)
        perp = np.empty((m, 3))
        for i in range(m):
            r = points[i] - points[i0]
            perp[i] = r - (r @ dv) * dv
        ip, best = 0, -1.0
        for i in range(m):
            s = _sum3(perp[i, 0] * perp[i, 0], perp[i, 1] * perp[i, 1], perp[i, 2] * perp[i, 2])
            if s > best:
                ip, best = i, s
        if max_points == 3:
            chosen[2] = ip
        else:
            ref = perp[ip].copy()
            hi, lo = 0, 0
            shi, slo = perp[0] @ ref, perp[0] @ ref
            for i in range(1, m):
                s = perp[i] @ ref
                if s > shi:
                    hi, shi = i, s
                if s < slo:
                    lo, slo = i, s
            chosen[2], chosen[3] = hi, lo
    k = min(max_points, 4)
    return np.unique(chosen[:k][chosen[:k] >= 0])


@njit
def poly_pair_patch(view, ga, gb, c_v, c_voff, c_rad, n, c, mid, ptol, max_points):
    """The snapped patch of polytope pair (ga, gb): its points ``mid`` (coal's patch about the
    axis n) projected on the mid plane at height c along n, each point's own distance and
    contact point (``collision_derivatives._k_world_patch_distances``) and the indices of the
    points kept (``reduce_patch``), the kept points moved onto their common mid plane
    (``_k_common_plane``). Returns (ok, dist, points, keep); ok False where a support
    feature's least-squares system is singular."""
    X = _core_vertices(view, ga, c_v, c_voff)
    Y = _core_vertices(view, gb, c_v, c_voff)
    P = np.empty((mid.shape[0], 3))
    for i in range(mid.shape[0]):
        h = mid[i] @ n - c
        for a in range(3):
            P[i, a] = mid[i, a] - h * n[a]
    ok, dist, pts = _k_world_patch_distances(X, c_rad[ga], Y, c_rad[gb], n, P, ptol)
    keep = reduce_patch(pts, max_points)
    if ok:
        lev = _k_common_plane(pts, n, keep)
        for j in range(keep.shape[0]):
            pts[keep[j]] = lev[j]
    return ok, dist, pts, keep


@njit
def _core_vertices(view, g, c_v, c_voff):
    """World vertices of geom g's core (``V @ R.T + t``)."""
    A = c_v[c_voff[g]:c_voff[g + 1]]
    W = np.empty((A.shape[0], 3))
    _world_rows(view, g, A, 0, A.shape[0], W, True)
    return W


@njit
def narrow_rows(pair, point, pos, normal, dist, pairs, friction, by_pair):
    """Contact rows (as ``plane_points`` returns) of the narrow phase's points: geoms and
    friction of their pairs, frames as ``frames.tangent_frames`` (of the normalized normal),
    ordered by pair (stable) when ``by_pair``, else in the order given."""
    order = np.argsort(pair, kind="mergesort") if by_pair else np.arange(pair.shape[0])
    m = pair.shape[0]
    P, g1, g2, pt, X, N, D, mu, frames = _new_rows(m)
    for r in range(m):
        s = order[r]
        k = pair[s]
        P[r], g1[r], g2[r], pt[r] = k, pairs[k, 0], pairs[k, 1], point[s]
        X[r] = pos[s]
        N[r] = normal[s]
        D[r], mu[r] = dist[s], friction[k]
        n0, n1, n2 = normal[s, 0], normal[s, 1], normal[s, 2]
        L = np.sqrt(_sum3(n0 * n0, n1 * n1, n2 * n2))
        _set_frame(frames, r, n0 / L, n1 / L, n2 / L)
    return P, g1, g2, pt, X, N, D, mu, frames


@njit
def _world_rows(view, g, A, lo, hi, W, translate):
    """Rows ``lo:hi`` of a core table ``A`` (geom g's) turned to the world into the same rows of
    ``W`` (``A @ R.T``, plus t where ``translate``; view[g] = rotation column-major, then
    translation)."""
    for a in range(lo, hi):
        for i in range(3):
            x = A[a, 0] * view[g, i] + A[a, 1] * view[g, 3 + i] + A[a, 2] * view[g, 6 + i]
            W[a, i] = x + view[g, 9 + i] if translate else x


@njit(inline="always")
def _extent(W, lo, hi, m0, m1, m2):
    """(min, max) of ``W[a] . m`` over rows ``lo:hi`` (at least one)."""
    h = W[lo, 0] * m0 + W[lo, 1] * m1 + W[lo, 2] * m2
    hmin = h
    hmax = h
    for a in range(lo + 1, hi):
        h = W[a, 0] * m0 + W[a, 1] * m1 + W[a, 2] * m2
        hmin = min(hmin, h)
        hmax = max(hmax, h)
    return hmin, hmax


@njit
def poly_separated(view, cand, margin, fast, pairs, c_v, c_voff, c_f, c_foff, c_e, c_eoff, c_rad):
    """For each candidate pair ``cand[i]`` of the compiled polytope route (``fast``): whether
    the separating-axis test over its face normals and edge cross products proves it farther
    apart than its margin (by more than a 1e-9 slack of its size), so that coal's test, which
    asks whether the distance is below the margin, would say no. The separation along an axis
    is a lower bound on the distance, so this never drops a pair coal would keep.
    (Each geom's core is turned to the world once per call, into tables laid out as the cores';
    the projections are written out over the three components: a rack of 64 boxes has ~300
    candidates a step, and per-pair arrays and 3-vector dot products were most of its cost.)"""
    out = np.zeros(cand.shape[0], dtype=np.bool_)
    ng = c_voff.shape[0] - 1
    done = np.zeros(ng, dtype=np.bool_)
    Wv = np.empty(c_v.shape)
    Wf = np.empty(c_f.shape)
    We = np.empty(c_e.shape)
    for i in range(cand.shape[0]):
        k = cand[i]
        if not fast[k]:
            continue
        ga, gb = pairs[k, 0], pairs[k, 1]
        for g in (ga, gb):
            if not done[g]:
                done[g] = True
                _world_rows(view, g, c_v, c_voff[g], c_voff[g + 1], Wv, True)
                _world_rows(view, g, c_f, c_foff[g], c_foff[g + 1], Wf, False)
                _world_rows(view, g, c_e, c_eoff[g], c_eoff[g + 1], We, False)
        xa, xb = c_voff[ga], c_voff[ga + 1]
        ya, yb = c_voff[gb], c_voff[gb + 1]
        size = 0.0
        for lo, hi in ((xa, xb), (ya, yb)):
            for ax in range(3):
                vmin = Wv[lo, ax]
                vmax = Wv[lo, ax]
                for a in range(lo + 1, hi):
                    vmin = min(vmin, Wv[a, ax])
                    vmax = max(vmax, Wv[a, ax])
                size = max(size, vmax - vmin)
        thr = margin[i] + c_rad[ga] + c_rad[gb] + 1e-9 * max(size, 1.0)
        sep = -np.inf
        fa0, na = c_foff[ga], c_foff[ga + 1] - c_foff[ga]
        fb0, nb = c_foff[gb], c_foff[gb + 1] - c_foff[gb]
        ea0, nea = c_eoff[ga], c_eoff[ga + 1] - c_eoff[ga]
        eb0, neb = c_eoff[gb], c_eoff[gb + 1] - c_eoff[gb]
        for j in range(na + nb + nea * neb):
            if j < na:
                m0, m1, m2 = Wf[fa0 + j, 0], Wf[fa0 + j, 1], Wf[fa0 + j, 2]
            elif j < na + nb:
                m0, m1, m2 = Wf[fb0 + j - na, 0], Wf[fb0 + j - na, 1], Wf[fb0 + j - na, 2]
            else:
                e = j - na - nb
                ia = ea0 + e // neb
                ib = eb0 + e % neb
                m0 = We[ia, 1] * We[ib, 2] - We[ia, 2] * We[ib, 1]
                m1 = We[ia, 2] * We[ib, 0] - We[ia, 0] * We[ib, 2]
                m2 = We[ia, 0] * We[ib, 1] - We[ia, 1] * We[ib, 0]
                L = np.sqrt(m0 * m0 + m1 * m1 + m2 * m2)
                if not L > 1e-6:
                    continue
                m0 /= L
                m1 /= L
                m2 /= L
            amin, amax = _extent(Wv, xa, xb, m0, m1, m2)
            bmin, bmax = _extent(Wv, ya, yb, m0, m1, m2)
            sep = max(sep, bmin - amax, amin - bmax)
            if sep > thr:
                out[i] = True
                break
    return out


@njit
def poly_snaps(view, pairs, ks, normals, d0, want_cross, tol, ptol, c_v, c_voff, c_f, c_foff, c_e,
               c_eoff, c_rad):
    """``poly_pair_snap`` of the polytope pairs ``ks`` of a step (coal's normals and distances
    ``normals[i]``, ``d0[i]``; ``want_cross[i]``: coal's patch has two points) in one call:
    (crossing, ok, axes, distances, mid-plane heights), one entry per pair."""
    n = ks.shape[0]
    cross = np.zeros(n, dtype=np.bool_)
    ok = np.zeros(n, dtype=np.bool_)
    axes = np.empty((n, 3))
    dist = np.zeros(n)
    mid = np.zeros(n)
    for i in range(n):
        k = ks[i]
        cr, o, ax, d, c = poly_pair_snap(view, pairs[k, 0], pairs[k, 1], c_v, c_voff, c_f, c_foff,
                                         c_e, c_eoff, c_rad, normals[i], d0[i], tol, ptol,
                                         want_cross[i])
        cross[i], ok[i], dist[i], mid[i] = cr, o, d, c
        axes[i] = ax
    return cross, ok, axes, dist, mid


@njit
def poly_patches(view, pairs, ks, axes, heights, mids, off, c_v, c_voff, c_rad, ptol, max_points):
    """``poly_pair_patch`` of the snapped polytope pairs ``ks`` of a step (axes, mid-plane
    heights, coal's patch points about each axis ``mids[off[i]:off[i + 1]]``) in one call, as
    contact rows: (ok, pair, point, pos, normal, dist), the kept points of each pair in order
    (point indices 0, 1, ...), the normal its axis; ok False (and no rows) where a support
    feature's least-squares system is singular."""
    n = ks.shape[0]
    cap = 0
    for i in range(n):
        cap += min(off[i + 1] - off[i], max(max_points, 1))
    pair = np.empty(cap, dtype=np.int64)
    point = np.empty(cap, dtype=np.int64)
    pos = np.empty((cap, 3))
    nrm = np.empty((cap, 3))
    dist = np.empty(cap)
    r = 0
    for i in range(n):
        k = ks[i]
        ok, d, pts, keep = poly_pair_patch(view, pairs[k, 0], pairs[k, 1], c_v, c_voff, c_rad,
                                           axes[i], heights[i], mids[off[i]:off[i + 1]], ptol,
                                           max_points)
        if not ok:
            return False, pair[:0], point[:0], pos[:0], nrm[:0], dist[:0]
        for j in range(keep.shape[0]):
            pair[r], point[r], dist[r] = k, j, d[keep[j]]
            pos[r] = pts[keep[j]]
            nrm[r] = axes[i]
            r += 1
    return True, pair[:r], point[:r], pos[:r], nrm[:r], dist[:r]


# (point ids of the margin-vertex rows of a polytope pair, ``poly_margin_rows``: a vertex i of
# geom 1 over a face of geom 2 is MARGIN_VERTEX_ID + i, a vertex of geom 2 over a face of geom 1
# MARGIN_VERTEX_ID + MARGIN_SIDE + i, stable from step to step for the warm start; defined in
# collision_derivatives)


@njit
def _near_rows(x, n, at, r0, r1, tol):
    """Whether the point x is within tol, across the normal n, of one of the points at[r0:r1]."""
    for r in range(r0, r1):
        w = x - at[r]
        w = w - (w @ n) * n
        if w @ w <= tol * tol:
            return True
    return False


# a margin row needs the reference face within this angle of the contact normal (cos): its
# distance is taken along the normal, (gap + r) / cos - r
MARGIN_COS = 0.7
# points of a pair with its margin rows at most (its one or two contact points and one or two
# margin rows: any depths on three points are realizable by a rigid motion with every point
# sticking)
MARGIN_POINTS = 3
# a margin row's point must be within this many times (its approach speed plus the contact's
# closing speed) dt of the face (poly_margin_rows)
MARGIN_REACH = 2.0


@njit(inline="always")
def _relative_speed(tw, x):
    """Speed of the point x of one geom of a pair relative to the other's point there,
    ``|v_1(x) - v_2(x)|`` with ``v(x) = v_O + w x x`` (tw (2, 6): the two geoms' world
    twists)."""
    a = np.zeros(3)
    for g in range(2):
        sg = 1.0 if g == 0 else -1.0
        w0, w1, w2 = tw[g, 3], tw[g, 4], tw[g, 5]
        a[0] += sg * (tw[g, 0] + w1 * x[2] - w2 * x[1])
        a[1] += sg * (tw[g, 1] + w2 * x[0] - w0 * x[2])
        a[2] += sg * (tw[g, 2] + w0 * x[1] - w1 * x[0])
    return np.sqrt(a[0] * a[0] + a[1] * a[1] + a[2] * a[2])


@njit
def poly_margin_rows(view, pairs, ks, normals, margins, deepest, off, at, ptol, isbox, half,
                     c_v, c_voff, c_rad, twists, dt, m0, reach):
    """Speculative rows of the polytope pairs ``ks`` that touch at one or two points (a corner,
    an edge: ``at[off[i]:off[i + 1]]``, their contact normal ``normals[i]``, from geom 1 to geom
    2, and margin ``margins[i]``) at
    the points of one geom over a face of the other where that one is a box (the reference):
    a vertex of the other's core (a box corner, a capsule's axis end with its radius) that lies
    over a face of the box (its box coordinates within the half sizes on the face's two axes,
    and outside it, or least deep, on the third), or the point where an edge from such a
    vertex (a box edge, a capsule's axis) leaves the face over its boundary.

    Each row is a row of the pair's contact as a patch point is: the contact's normal n, its
    point the vertex's projection on the plane through the (first) contact point normal to n
    (the pair's common mid plane), its distance the distance along n from the incident surface to
    the face's plane, ``(gap + r) / cos - r`` (gap along the face normal, r the incident core's
    radius, cos between the face normal and n, at least ``MARGIN_COS``). All of a pair's rows
    then share one normal and one plane, and with at most ``MARGIN_POINTS`` (three) points
    with the contact's any depths are realizable by a rigid motion with every point sticking
    (constraint.realizable_bias). Rows within the margin only, the nearest first; none for a
    point at the contact (within ``ptol`` across n), nor deeper than the contact's row
    (``deepest``) by more than ``ptol`` (it went into the box through another face), nor for
    a point the pair's motion does not bring to the face within the step: its distance must
    be below ``m0`` (the margin's part that is not the bodies' motion) plus ``reach`` dt
    times the speed at which the point approaches the face plus the speed at which the
    contact point closes (``twists[i, s]``: each geom's world twist, the velocity of the point
    at the world origin and the angular velocity; the impulse that stops the contact point
    turns the body about it, and drives a far end down by up to half its closing speed for a
    rod struck at one end). A box sliding flat past an edge, a rod held still against a face
    get none.

    Coal's patch holds the support sets along the contact normal only. A box standing on an
    edge or a corner over another box's face, two boxes touching edge on edge, a capsule tilted
    over a box face: the contact is one point, and within the step the body turns about it and
    a far corner or end, which no row holds, goes into the face (bench_drops #119, 100 Hz: two
    boxes edge on edge 0.9 mm apart, then a corner 10 mm deep in one step)."""
    nk = ks.shape[0]
    cap = nk * (MARGIN_POINTS - 1)
    pair = np.empty(cap, dtype=np.int64)
    point = np.empty(cap, dtype=np.int64)
    pos = np.empty((cap, 3))
    nrm = np.empty((cap, 3))
    dist = np.empty(cap)
    m = 0
    R = np.empty((3, 3))
    for i in range(nk):
        k = ks[i]
        n = normals[i]
        p0 = at[off[i]]
        c0 = p0 @ n
        tw = twists[i]
        close = 0.0
        for r in range(off[i], off[i + 1]):
            close = max(close, _relative_speed(tw, at[r]))
        # candidates of both sides: distance along n, id, point
        cg = np.empty(64)
        cid = np.empty(64, dtype=np.int64)
        cx = np.empty((64, 3))
        ncand = 0
        for side in range(2):
            # side 0: vertices of geom 1 over a face of geom 2; side 1: of geom 2 over geom 1's
            gR = pairs[k, 1] if side == 0 else pairs[k, 0]
            gI = pairs[k, 0] if side == 0 else pairs[k, 1]
            if not isbox[gR]:
                continue
            s = 1.0 if side == 0 else -1.0
            Iv = _core_vertices(view, gI, c_v, c_voff)
            r_inc = c_rad[gI]
            for r in range(3):
                for c in range(3):
                    R[r, c] = view[gR, 3 * c + r]
            t = view[gR, 9:12]
            h = half[gR]
            nI = Iv.shape[0]
            # each incident vertex in the box frame: the face it lies over (-1: beyond an edge
            # of every face, or a face turned from the normal) and its side, its distance
            # along n to that face's plane, whether it is the contact point
            Lc = np.empty((nI, 3))
            face = np.full(nI, -1, dtype=np.int64)
            sgn = np.empty(nI)
            cosf = np.empty(nI)
            gapv = np.empty(nI)
            atpt = np.zeros(nI, dtype=np.bool_)
            for j in range(nI):
                w = Iv[j] - t
                for a in range(3):
                    Lc[j, a] = R[0, a] * w[0] + R[1, a] * w[1] + R[2, a] * w[2]
                c = 0
                for a in range(1, 3):
                    if abs(Lc[j, a]) - h[a] > abs(Lc[j, c]) - h[c]:
                        c = a
                over = True
                for a in range(3):
                    if a != c and abs(Lc[j, a]) > h[a]:
                        over = False
                if not over:
                    continue
                sc = 1.0 if Lc[j, c] >= 0.0 else -1.0
                # the face's outward normal sc R[:, c] faces the incident geom: along -s n
                cs = -s * sc * (R[0, c] * n[0] + R[1, c] * n[1] + R[2, c] * n[2])
                if cs < MARGIN_COS:
                    continue
                face[j], sgn[j], cosf[j] = c, sc, cs
                gapv[j] = (abs(Lc[j, c]) - h[c]) / cs - r_inc
                atpt[j] = _near_rows(Iv[j], n, at, off[i], off[i + 1], ptol)
            isbox_inc = nI == 8 and isbox[gI]
            for j in range(nI):
                c = face[j]
                if c < 0:
                    continue
                if gapv[j] < margins[i] and gapv[j] > deepest[i] - ptol and not atpt[j] \
                        and ncand < 64 and gapv[j] < m0 + reach * dt * (
                            _relative_speed(tw, Iv[j]) + close):
                    cg[ncand], cid[ncand] = gapv[j], side * MARGIN_SIDE + j
                    cx[ncand] = Iv[j]
                    ncand += 1
                for o in range(nI):
                    if o == j:
                        continue
                    if isbox_inc:
                        x = j ^ o
                        if x != 1 and x != 2 and x != 4:
                            continue
                    elif nI != 2:
                        continue
                    if face[o] == c and sgn[o] == sgn[j]:
                        continue                        # (the whole edge over the face)
                    tt = 2.0
                    for a in range(3):
                        if a == c:
                            continue
                        if abs(Lc[o, a]) > h[a]:
                            lim = h[a] if Lc[o, a] > 0.0 else -h[a]
                            ta = (lim - Lc[j, a]) / (Lc[o, a] - Lc[j, a])
                            tt = min(tt, ta)
                    if not (tt > 0.0 and tt < 1.0):
                        continue
                    lcx = Lc[j, c] + tt * (Lc[o, c] - Lc[j, c])
                    g_ = (sgn[j] * lcx - h[c]) / cosf[j] - r_inc
                    if not (g_ < margins[i] and g_ > deepest[i] - ptol):
                        continue
                    xc = Iv[j] + tt * (Iv[o] - Iv[j])
                    if not g_ < m0 + reach * dt * (_relative_speed(tw, xc) + close):
                        continue
                    if _near_rows(xc, n, at, off[i], off[i + 1], ptol) or ncand == 64:
                        continue                        # (the contact point itself)
                    cg[ncand], cid[ncand] = g_, side * MARGIN_SIDE + 1000 * (1 + j) + o
                    cx[ncand] = xc
                    ncand += 1
        # an edge crossing seen from both sides is one point: geom 1's row stands (whichever
        # distance is smaller by rounding: the row must not switch sides under a perturbation)
        for q in range(ncand):
            if cid[q] >= MARGIN_SIDE + 1000:
                for q2 in range(ncand):
                    if cid[q2] < MARGIN_SIDE and cid[q2] >= 1000:
                        w = cx[q] - cx[q2]
                        w = w - (w @ n) * n
                        if w @ w <= ptol * ptol:
                            cg[q] = np.inf
        order = np.argsort(cg[:ncand], kind="mergesort")
        mstart = m
        for q in range(ncand):
            if m - mstart + off[i + 1] - off[i] >= MARGIN_POINTS:
                break
            j = order[q]
            if cg[j] == np.inf:
                break
            pair[m] = k
            point[m] = MARGIN_VERTEX_ID + cid[j]
            hx = cx[j] @ n - c0
            for b in range(3):
                pos[m, b] = cx[j, b] - hx * n[b]
                nrm[m, b] = n[b]
            dist[m] = cg[j]
            m += 1
    return pair[:m].copy(), point[:m].copy(), pos[:m].copy(), nrm[:m].copy(), dist[:m].copy()
