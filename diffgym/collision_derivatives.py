"""Closed-form derivatives of contact geometry between polytopes (boxes, convex meshes), a
capsule against a polytope (its axis segment with a radius), and two capsules.

What is differentiated is the collision output as ``collision_driver.detect`` produces it: for
a pair A (geom 1), B (geom 2) one normal ``n`` (from A to B), a signed distance ``d``, and
either a single point, the midpoint of the two witness points of GJK/EPA, or the vertices of a
contact patch (coal's ``ContactPatchSolver``: the support sets of A along ``n`` and of B along
``-n``, taken with the patch tolerance, projected on the plane through the witness midpoint
normal to ``n``, and clipped against each other, Sutherland-Hodgman). For box-box and
box-capsule pairs the driver snaps ``n`` and ``d`` to the separating axis (``snap_pair``) and
gives each patch point its own distance (``patch_distances``); otherwise the patch shares coal's.

Each of these is a smooth function of the two poses determined by a few features, which are
identified at the current pose:

* ``n`` and ``d``: ``d = max_{|m|=1} (min_B y.m - max_A x.m)`` for separated and penetrating
  pairs alike (separating axis), ``n`` its maximizer. By the envelope theorem
  ``dd = n . (dy - dx)`` at the witness points x of A and y of B moving with their bodies. The
  maximizer is the normal of the Minkowski-difference feature closest to the origin: a face of A
  (``dn = w_A x n``), a face of B (``dn = w_B x n``), two edges (``n ~ u_A x u_B``), or, separated
  only, a vertex against an edge or a vertex (``n`` along the witness difference ``z = d n``,
  projected off the edge: ``dn = -u (n . du) + (I - u u^T - n n^T) dz / d``). The features are
  the exact support sets of A along n and of B along -n (vertices within ``SUPPORT_TOL`` times
  the size of the pair), classified by their affine rank; a capsule's vertices are its axis
  ends, and its radius moves the support plane.
* a single point: the witness midpoint, ``v +- (d/2) n`` with v a vertex of A or B, or the
  midpoint of the closest points of two edge lines (implicit differentiation of the two
  orthogonality conditions).
* patch points: the patch plane is at height ``c = (max_A x.n + min_B y.n) / 2`` along n; a
  point is the projection ``X - (X.n - c) n`` of a vertex X of either support set (for a
  capsule, coal's support points: its axis ends moved by ``r (a . n) a``), or of the point of an
  edge of A whose projection crosses the projection of an edge of B (implicit differentiation
  of the crossing: ``T (X_A + s u_A - X_B - t u_B) = 0``, ``T = I - n n^T``). Each point coal
  returned is matched to the nearest candidate. With per-point distances, the offsets sA, sB
  from the patch point along n to each support feature (a face plane, an edge line, a vertex;
  a capsule's axis moved by its radius) follow from ``y = p + s n`` on the feature, the feature
  moving with its body.
* two capsules (``capsule_pair``): the closest points of the axis segments, interior
  parameters by their orthogonality conditions, clamped ones at the body-fixed ends.

Everything is a 3 x nv (or nv) array of derivatives with respect to the tangent of q, chained
with the body Jacobians (``derivatives._Kin``). Where a configuration is degenerate in a way
these features do not cover (parallel edges or axes, a rank the tolerances cannot decide, a
point that matches no candidate) the functions return the rows they could not do and the caller
uses the finite-difference fallback for them, which it counts and reports.
"""
from __future__ import annotations

import coal
import numpy as np

# exact support sets: vertices within this fraction of the pair's size of the support plane
SUPPORT_TOL = 1e-8
# a contact point matches a patch candidate within this fraction of the pair's size
MATCH_TOL = 1e-7
# coal's default contact patch tolerance (ContactPatchRequest), the thickness of a support set
PATCH_TOL = 1e-3

POLYTOPE_KINDS = ("box", "mesh")

_BOX_SIGNS = np.array([[sx, sy, sz] for sx in (-1.0, 1.0) for sy in (-1.0, 1.0) for sz in (-1.0, 1.0)])


def snap_box_box(RA, tA, hA, RB, tB, hB, n, d, tol=1e-7):
    """The exact normal and signed distance of two boxes (rotations R, centres t, half sizes h)
    by the separating-axis test, where it agrees with coal's (n, d): (n, d, c) with c the height
    along n of the plane midway between the support planes, or None (separated boxes whose
    closest features are a vertex against a vertex or an edge, where coal's answer stands).

    Near contact coal's GJK/EPA normal is the direction of a witness difference of length |d|,
    so its error grows like 1e-16 / |d| (1e-4 rad at 1e-12 m, where resting contacts settle);
    the separating axis is a face normal or an edge cross product, exact to rounding."""
    cr = np.cross(RA.T[:, None, :], RB.T[None, :, :]).reshape(9, 3)
    nc = np.sqrt(np.einsum("ij,ij->i", cr, cr))
    keep = nc > 1e-6
    M = np.concatenate([RA.T, RB.T, cr[keep] / nc[keep, None]])
    M = M * np.where(M @ n >= 0.0, 1.0, -1.0)[:, None]        # oriented along coal's normal
    a = M @ RA
    b = M @ RB
    topA = M @ tA + np.abs(a) @ hA
    botB = M @ tB - np.abs(b) @ hB
    f = botB - topA
    i = int(np.argmax(f))
    if abs(f[i] - d) > tol * (1.0 + abs(d)) or float(M[i] @ n) < 1.0 - 1e-6:
        return None
    return M[i], float(f[i]), 0.5 * float(topA[i] + botB[i])


def patch_feature(P: np.ndarray, L: float):
    """The support feature spanned by the points P (k, 3) of a support set: (origin, basis
    (r, 3)) of a vertex (r = 0), an edge line (r = 1) or a face plane (r = 2)."""
    r, U = _affine(P, 1e-7 * L)
    return P[0], U[:2]


def feature_solver(origin: np.ndarray, U: np.ndarray, n: np.ndarray):
    """For a support feature (origin, basis U): the rows (r + 1, 3) of the least-squares
    inverse of [U^T, -n], whose last row gives the offset s along n from a patch point p to the
    feature point y = p + s n (exact for a face, a crossing edge, or a vertex above p), and
    whose rows solve the same system for derivatives."""
    M = np.column_stack([*U, -n]) if len(U) else -n[:, None]
    return np.linalg.inv(M.T @ M) @ M.T


def patch_distances(XA: np.ndarray, YB: np.ndarray, n: np.ndarray, P: np.ndarray, L: float):
    """Per-point distances and contact points of a patch: for each patch point p (rows of P,
    on the plane midway between the support planes), the offsets sA, sB along n to the
    support features of A (points XA) and B (points YB); the distance is sB - sA and the
    contact point their midpoint p + n (sA + sB) / 2. A face on a face tilted by less than the
    patch tolerance gets the penetration of each corner, not the deepest one for all, so the
    distances of a box lying flat are smooth in its pose."""
    (oa, Ua), (ob, Ub) = patch_feature(XA, L), patch_feature(YB, L)
    sa = (P - oa) @ feature_solver(oa, Ua, n)[-1]
    sb = (P - ob) @ feature_solver(ob, Ub, n)[-1]
    return sb - sa, P + np.outer(0.5 * (sa + sb), n)


def box_corners(R: np.ndarray, t: np.ndarray, h: np.ndarray) -> np.ndarray:
    return (_BOX_SIGNS * h) @ R.T + t


def _cross3(a, b) -> np.ndarray:
    return np.array([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


# rows left to the finite-difference fallback since the process started, by reason
fallback_reasons: dict = {}


def _undone(rows, reason: str) -> list:
    fallback_reasons[reason] = fallback_reasons.get(reason, 0) + len(rows)
    return list(rows)


def _skew(x: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -x[2], x[1]], [x[2], 0.0, -x[0]], [-x[1], x[0], 0.0]])


def local_vertices(sim, g: int) -> np.ndarray | None:
    """Vertices (k, 3) of polytope geom g in its own frame (box corners, the points of a convex
    mesh), cached on the simulator; None where g is not a polytope without a swept radius."""
    cache = sim.__dict__.setdefault("_polytope_vertices", {})
    if g in cache:
        return cache[g]
    shape = sim.geom_model.geometryObjects[g].geometry
    sw = shape.getSweptSphereRadius() if hasattr(shape, "getSweptSphereRadius") else 0.0
    out = None
    if sw == 0.0:
        if isinstance(shape, coal.Box):
            out = _BOX_SIGNS * np.asarray(shape.halfSide, float)
        elif isinstance(shape, coal.Capsule):          # the axis segment (radius: _radius)
            out = np.array([[0.0, 0.0, -shape.halfLength], [0.0, 0.0, shape.halfLength]])
        elif isinstance(shape, coal.ConvexBase):
            out = np.asarray(shape.points(), dtype=float).reshape(-1, 3).copy()
    cache[g] = out
    return out


def _radius(sim, g: int) -> float:
    shape = sim.geom_model.geometryObjects[g].geometry
    return float(shape.radius) if isinstance(shape, coal.Capsule) else 0.0


def snap_pair(XA, radA, FA, EA, XB, radB, FB, EB, n, d, tol=1e-7):
    """The exact normal and signed distance of two polytopes or capsules (vertices X, radius
    rad: a capsule is its axis segment with a radius) by the separating-axis test over their
    face normals F (k, 3) and the cross products of their edge directions E (k, 3), where it
    agrees with coal's (n, d): (n, d, c), c the height along n of the plane midway between the
    support planes; None where it does not (closest features of a separated pair that are a
    vertex against a vertex or an edge, a capsule's rounded end), where coal's answer stands.

    Near contact coal's GJK/EPA normal is the direction of a witness difference of length |d|,
    so its error grows like 1e-16 / |d| (1e-4 rad at 1e-12 m, where resting contacts settle);
    the separating axis is a face normal or an edge cross product, exact to rounding."""
    cr = np.cross(EA[:, None, :], EB[None, :, :]).reshape(-1, 3)
    nc = np.sqrt(np.einsum("ij,ij->i", cr, cr))
    keep = nc > 1e-6
    M = np.concatenate([FA, FB, cr[keep] / nc[keep, None]])
    M = M * np.where(M @ n >= 0.0, 1.0, -1.0)[:, None]        # oriented along coal's normal
    topA = (M @ XA.T).max(axis=1) + radA
    botB = (M @ XB.T).min(axis=1) - radB
    f = botB - topA
    i = int(np.argmax(f))
    # coal's distance can be off by ~1e-6 of the size near contact (its normal by as much):
    # accept the axis where they agree to that
    size = float(max(np.ptp(XA, axis=0).max(), np.ptp(XB, axis=0).max())) + radA + radB
    if abs(f[i] - d) > max(tol * (1.0 + abs(d)), 1e-5 * size) or float(M[i] @ n) < 1.0 - 1e-6:
        return None
    return M[i], float(f[i]), 0.5 * float(topA[i] + botB[i])


def _patch_tol(sim, pair: int) -> float:
    try:
        return float(sim.geom_data.contactPatchRequests[pair].getPatchTolerance())
    except Exception:       # noqa: BLE001 - an older binding: coal's default
        return PATCH_TOL


def _affine(P: np.ndarray, tol: float):
    """Affine rank (0, 1, 2 or 3) of the points P (k, 3) and an orthonormal basis (r, 3) of
    their directions."""
    if len(P) < 2:
        return 0, np.zeros((0, 3))
    D = P[1:] - P[0]
    _, s, Vt = np.linalg.svd(D, full_matrices=False)
    r = int(np.sum(s > tol))
    return r, Vt[:r]


def _hull2(P2: np.ndarray) -> np.ndarray:
    """Indices of the 2-D convex hull of P2 (k, 2), counter-clockwise (monotone chain); two
    indices for collinear points."""
    k = len(P2)
    if k <= 2:
        return np.arange(k)
    order = sorted(range(k), key=lambda i: (P2[i, 0], P2[i, 1]))

    def cross(o, a, b):
        return (P2[a, 0] - P2[o, 0]) * (P2[b, 1] - P2[o, 1]) - (P2[a, 1] - P2[o, 1]) * (P2[b, 0] - P2[o, 0])

    lower: list = []
    for i in order:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], i) <= 0:
            lower.pop()
        lower.append(i)
    upper: list = []
    for i in reversed(order):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], i) <= 0:
            upper.pop()
        upper.append(i)
    hull = lower[:-1] + upper[:-1]
    return np.array(hull if len(hull) >= 2 else [order[0], order[-1]])


def _area(P: np.ndarray, n: np.ndarray) -> float:
    """A measure of the size of the planar support set P (k, 3): the product of the two
    singular values of the centred points (proportional to the area of a rectangle's
    corners), to rank two faces in contact against each other."""
    if len(P) < 3:
        return 0.0
    sv = np.linalg.svd(P - P.mean(axis=0), compute_uv=False)
    return float(sv[0] * sv[1])


def _line_points(a0, uA, b0, uB):
    """Closest points of the lines a0 + s uA and b0 + t uB (not parallel)."""
    w0 = a0 - b0
    a, b, c = uA @ uA, uA @ uB, uB @ uB
    d, e = uA @ w0, uB @ w0
    den = a * c - b * b
    s = (b * e - c * d) / den
    t = (a * e - b * d) / den
    return a0 + s * uA, b0 + t * uB


def _edge_across_face(PA: np.ndarray, PB: np.ndarray, rA: int, rB: int, n: np.ndarray, L: float):
    """An edge (support set of affine rank 1: a box edge, a capsule's axis) lying on a face
    (rank 2) of the other body: (point, direction) of a line of A and of a line of B when the
    separating axis near this pose is the cross product of the edge with face edges, else None.

    The separating distance is the largest height of the edge over the face (relative to the
    face plane) over the part of the edge that lies over the face. Where both ends of the edge
    lie over the face, that is an end of the edge and the axis is the face normal (it turns
    with the face). Where the edge runs out over the face's boundary at both ends (a rod
    longer than the box face it is flush against), it is a crossing of the edge with a face
    edge, so the axis is the cross product of the two edge directions (it turns with both
    bodies); when the two crossed face edges are parallel (a rectangular face) this holds for
    every perturbation, otherwise (or with one end over the face) the axis has a kink there and
    the face normal, one of its one-sided values, is kept."""
    if {rA, rB} != {1, 2}:
        return None
    E, F = (PA, PB) if rA == 1 else (PB, PA)
    e1 = _cross3(n, (1.0, 0.0, 0.0) if abs(n[0]) < 0.9 else (0.0, 1.0, 0.0))
    e1 /= np.linalg.norm(e1)
    e2 = _cross3(n, e1)
    P2 = np.stack([F @ e1, F @ e2], axis=1)
    hull = _hull2(P2)
    if len(hull) < 3:
        return None
    h = P2[hull]
    # the edge's end points (its extreme points along its direction)
    u = E[-1] - E[0]
    t = (E - E[0]) @ u
    a0, a1 = E[int(np.argmin(t))], E[int(np.argmax(t))]
    s0, s1 = np.array([a0 @ e1, a0 @ e2]), np.array([a1 @ e1, a1 @ e2])
    eps = 1e-7 * L

    def side(i, s):
        """Distance of s from the line of face edge i, positive inside (the hull runs
        counter-clockwise)."""
        p, d = h[i], h[(i + 1) % len(h)] - h[i]
        return float(d[0] * (s - p)[1] - d[1] * (s - p)[0]) / float(np.hypot(*d))

    k = range(len(h))
    if min(side(i, s0) for i in k) >= -eps or min(side(i, s1) for i in k) >= -eps:
        return None                       # an end of the edge over the face: the face normal
    crossed = []
    for i in k:
        o0, o1 = side(i, s0), side(i, s1)
        if (o0 < -eps and o1 > eps) or (o0 > eps and o1 < -eps):
            x = s0 + o0 / (o0 - o1) * (s1 - s0)
            p, d = h[i], h[(i + 1) % len(h)] - h[i]
            tt = float((x - p) @ d) / float(d @ d)
            if -1e-9 <= tt <= 1.0 + 1e-9:
                crossed.append((i, o0, o1))
    if len(crossed) < 2:
        return None
    idx = [hull[i] for i, _, _ in crossed]
    jdx = [hull[(i + 1) % len(hull)] for i, _, _ in crossed]
    dirs = [F[j] - F[i] for i, j in zip(idx, jdx)]
    for dv in dirs[1:]:
        if not segments_parallel(dirs[0], dv):
            return None
    ue, uf = (a1 - a0) / np.linalg.norm(a1 - a0), dirs[0] / np.linalg.norm(dirs[0])
    if segments_parallel(ue, uf):
        return None
    f0 = F[idx[0]]
    return (a0, ue, f0, uf) if rA == 1 else (f0, uf, a0, ue)


class _Body:
    """A geom's body: rigid point Jacobians and the angular Jacobian (3, nv), zero for the
    world."""

    def __init__(self, kin, j: int):
        self.kin, self.j = kin, int(j)
        self.Jw = kin.J[self.j][3:] if self.j else np.zeros((3, kin.nv))

    def point(self, p: np.ndarray) -> np.ndarray:
        return self.kin.point_jacobian(self.j, p)

    def turn(self, u: np.ndarray) -> np.ndarray:
        """d u of a body-fixed direction: w x u."""
        return -_skew(u) @ self.Jw


def polytope_pair(sim, kin, c, rows: list, j1: int, j2: int, dp, dn, dd) -> list:
    """Closed-form dp, dn, dd for the contact rows (all of one pair of polytope geoms, in
    ``c = cons.contacts``); returns the rows it could not do (for the fallback)."""
    k0 = rows[0]
    g1, g2 = int(c.geom1[k0]), int(c.geom2[k0])
    VA, VB = local_vertices(sim, g1), local_vertices(sim, g2)
    if VA is None or VB is None:
        return _undone(rows, 'not polytopes')
    MA, MB = sim.geom_data.oMg[g1], sim.geom_data.oMg[g2]
    X = VA @ MA.rotation.T + MA.translation
    Y = VB @ MB.rotation.T + MB.translation
    n = np.asarray(c.normal[k0], float)
    d = float(c.dist[k0])
    radA, radB = _radius(sim, g1), _radius(sim, g2)
    A, B = _Body(kin, j1), _Body(kin, j2)
    L = max(float(np.ptp(X, axis=0).max()), float(np.ptp(Y, axis=0).max()), 1e-9)
    hA, hB = X @ n, Y @ n
    hAmax, hBmin = float(hA.max()), float(hB.min())
    HA, HB = hAmax + radA, hBmin - radB                       # the support planes
    # a patch whose rows carry per-point distances (collision_driver): the pair's separating
    # distance is the separating-axis value along n
    per_point = len(rows) > 1 and int(c.pair[k0]) in getattr(sim.collision, "per_point_pairs", ())
    if per_point:
        d = HB - HA
    dc = d + radA + radB                                      # between the cores (axes)
    tol = SUPPORT_TOL * L
    SA, SB = np.flatnonzero(hAmax - hA < tol), np.flatnonzero(hB - hBmin < tol)
    rA, UA = _affine(X[SA], 1e-7 * L)
    rB, UB = _affine(Y[SB], 1e-7 * L)
    xs, ys = X[SA[0]], Y[SB[0]]
    dxs, dys = A.point(xs), B.point(ys)
    nn = np.outer(n, n)
    # an edge (or a capsule's axis) across a face, out over the face's boundary at both ends:
    # the separating axis is the cross product of the edge with the face edges it crosses
    across = _edge_across_face(X[SA], Y[SB], rA, rB, n, L)
    # -- the normal ---------------------------------------------------------------------------
    # witness points xw on A, yw on B (yw - xw = d n), for dd = n . (dyw - dxw)
    if across is not None:
        x0, uA, y0, uB = across                                 # a line of A, a line of B
        xw, yw = _line_points(x0, uA, y0, uB)
        cr = _cross3(uA, uB)
        ncr = np.linalg.norm(cr)
        s = 1.0 if cr @ n >= 0.0 else -1.0
        dcr = -_skew(uB) @ A.turn(uA) + _skew(uA) @ B.turn(uB)
        Dn = s * (np.eye(3) - nn) @ dcr / ncr
    elif rA == 2 and (rB < 2 or _area(X[SA], n) >= _area(Y[SB], n)):
        Dn = A.turn(n)                                          # a face of A
        yw = Y[SB].mean(axis=0)
        xw = yw - dc * n
    elif rB == 2:
        Dn = B.turn(n)                                          # a face of B
        xw = X[SA].mean(axis=0)
        yw = xw + dc * n
    elif rA == 1 and rB == 1 and np.linalg.norm(_cross3(UA[0], UB[0])) > 1e-6:
        uA, uB = UA[0], UB[0]                                   # two edges
        xw, yw = _line_points(xs, uA, ys, uB)
        cr = _cross3(uA, uB)
        ncr = np.linalg.norm(cr)
        s = 1.0 if cr @ n >= 0.0 else -1.0
        dcr = -_skew(uB) @ A.turn(uA) + _skew(uA) @ B.turn(uB)
        Dn = s * (np.eye(3) - nn) @ dcr / ncr
    elif dc > tol and rA + rB <= 1:                              # separated: vertex-edge/vertex
        if rA == 0:
            xw = xs
            if rB == 1:
                u = UB[0]
                yw = ys + u * float(u @ (xw - ys))              # foot of the vertex on the edge
                du = B.turn(u)
            else:
                yw = ys
        else:
            yw = ys
            u = UA[0]
            xw = xs + u * float(u @ (yw - xs))
            du = A.turn(u)
        dz = B.point(yw) - A.point(xw)
        if rA + rB == 0:
            Dn = (np.eye(3) - nn) @ dz / dc
        else:
            Dn = -np.outer(u, n @ du) + (np.eye(3) - np.outer(u, u) - nn) @ dz / dc
    else:
        return _undone(rows, 'features undecided')
    dxw, dyw = A.point(xw), B.point(yw)
    Dd = n @ (dyw - dxw)
    # -- the points ---------------------------------------------------------------------------
    if len(rows) == 1:                                          # the witness midpoint
        k = rows[0]
        # core witness points (on the axes of capsules) and their derivatives
        if rA == 0:
            xc, dxc = xs, dxs
            yc, dyc = xs + dc * n, dxs + np.outer(n, Dd) + dc * Dn
        elif rB == 0:
            yc, dyc = ys, dys
            xc, dxc = ys - dc * n, dys - np.outer(n, Dd) - dc * Dn
        elif rA == 1 and rB == 1 and np.linalg.norm(_cross3(UA[0], UB[0])) > 1e-6:
            uA, uB = UA[0], UB[0]
            a, b, cc = uA @ uA, uA @ uB, uB @ uB
            dxr, dyr = A.point(xw), B.point(yw)
            r = yw - xw
            duA, duB = A.turn(uA), B.turn(uB)
            M = np.array([[-a, b], [-b, cc]])
            rhs = -np.vstack([uA @ (dyr - dxr) + r @ duA, uB @ (dyr - dxr) + r @ duB])
            st = np.linalg.solve(M, rhs)
            xc, dxc = xw, dxr + np.outer(uA, st[0])
            yc, dyc = yw, dyr + np.outer(uB, st[1])
        else:
            return _undone(rows, 'single point: features undecided')
        m = 0.5 * (xc + yc) + 0.5 * (radA - radB) * n
        Dm = 0.5 * (dxc + dyc) + 0.5 * (radA - radB) * Dn
        if np.linalg.norm(m - c.pos[k]) > 100.0 * MATCH_TOL * L:      # (GJK's witness on curved shapes)
            return _undone(rows, 'single point: no match')
        dp[k], dn[k], dd[k] = Dm, Dn, Dd
        return []
    # a patch: candidates from the support sets taken with coal's patch tolerance
    ptol = _patch_tol(sim, int(c.pair[k0]))
    PA, PB = np.flatnonzero(hAmax - hA < ptol), np.flatnonzero(hB - hBmin < ptol)
    c0 = 0.5 * (HA + HB)
    Dc = 0.5 * (n @ (dxw + dyw) + (xw + yw) @ Dn)
    T = np.eye(3) - nn
    e1 = _cross3(n, (1.0, 0.0, 0.0) if abs(n[0]) < 0.9 else (0.0, 1.0, 0.0))
    e1 /= np.linalg.norm(e1)
    e2 = _cross3(n, e1)
    XA, YB = X[PA], Y[PB]
    A2 = np.stack([XA @ e1, XA @ e2], axis=1)
    B2 = np.stack([YB @ e1, YB @ e2], axis=1)
    hullA, hullB = PA[_hull2(A2)], PB[_hull2(B2)]
    if len(hullA) == 2 and len(hullB) == 2:
        return _undone(rows, 'parallel segments')  # segment against segment (coal's parallel-edge case)

    def proj(P):
        return P - np.outer(P @ n - c0, n) if P.ndim == 2 else P - (P @ n - c0) * n

    # a capsule's support points (coal): its axis ends moved by rad (a . n) a along the axis
    # (the rest of coal's offset, rad (dir - (a . dir) a), is along n: the projection drops it)
    shift = []
    for V, rad, sgn, body in ((X, radA, -1.0, A), (Y, radB, 1.0, B)):
        if rad:
            a = (V[1] - V[0]) / np.linalg.norm(V[1] - V[0])
            an, da = float(a @ n), body.turn(a)
            shift.append((sgn * rad * an * a,
                          sgn * rad * (np.outer(a, n @ da + a @ Dn) + an * da)))
        else:
            shift.append((np.zeros(3), 0.0))
    (wA, dwA), (wB, dwB) = shift
    cands = [proj(X[i] + wA) for i in hullA] + [proj(Y[i] + wB) for i in hullB]
    kinds = [("A", int(i)) for i in hullA] + [("B", int(i)) for i in hullB]
    eA = [(hullA[i], hullA[(i + 1) % len(hullA)]) for i in range(len(hullA) if len(hullA) > 2 else 1)]
    eB = [(hullB[i], hullB[(i + 1) % len(hullB)]) for i in range(len(hullB) if len(hullB) > 2 else 1)]
    # every edge of A's hull against every edge of B's, projected (vectorized)
    ia, ja = np.array([e[0] for e in eA]), np.array([e[1] for e in eA])
    ib, jb = np.array([e[0] for e in eB]), np.array([e[1] for e in eB])
    E = np.stack([e1, e2], axis=1)                       # (3, 2) plane coordinates
    a0, uA = X[ia], X[ja] - X[ia]
    b0, uB = Y[ib], Y[jb] - Y[ib]
    a2, ua2, b2, ub2 = a0 @ E, uA @ E, b0 @ E, uB @ E
    den = ua2[:, None, 0] * -ub2[None, :, 1] + ua2[:, None, 1] * ub2[None, :, 0]
    rhs = b2[None, :, :] - a2[:, None, :]
    ok = np.abs(den) >= 1e-12 * L * L
    with np.errstate(divide="ignore", invalid="ignore"):
        sp = (rhs[..., 0] * -ub2[None, :, 1] + rhs[..., 1] * ub2[None, :, 0]) / den
        tp = (ua2[:, None, 0] * rhs[..., 1] - ua2[:, None, 1] * rhs[..., 0]) / den
    ok &= (sp >= -1e-9) & (sp <= 1.0 + 1e-9) & (tp >= -1e-9) & (tp <= 1.0 + 1e-9)
    for i, j in zip(*np.nonzero(ok)):
        xa = a0[i] + sp[i, j] * uA[i]
        cands.append(proj(xa))
        kinds.append(("AB", (xa, uA[i], b0[j] + tp[i, j] * uB[j], uB[j])))
    cands = np.array(cands)
    # per-point distances (collision_driver: patch_distances): a capsule's feature is its axis
    # moved by its radius along n, which turns with n
    if per_point:
        fa, fb = patch_feature(XA + radA * n, L), patch_feature(YB - radB * n, L)
        feats = [(fa[0], feature_solver(*fa, n), A, radA), (fb[0], feature_solver(*fb, n), B, -radB)]
    undone = []
    for k in rows:
        dist = np.linalg.norm((cands - c.pos[k]) @ T, axis=1)      # (tangential: see below)
        best = float(dist.min())
        if best > MATCH_TOL * L:
            undone += _undone([k], 'patch point: no match')
            continue
        i = int(np.flatnonzero(dist <= best + SUPPORT_TOL * L)[0])    # ties: A, then B, then crossings
        kind, data = kinds[i]
        if kind == "A":
            Xp = X[data] + wA
            DX = A.point(X[data]) + dwA
        elif kind == "B":
            Xp = Y[data] + wB
            DX = B.point(Y[data]) + dwB
        else:
            Xa, uA, Xb, uB = data
            DXa, DXb = A.point(Xa), B.point(Xb)
            kk = float(n @ (Xa - Xb))
            Mst = np.stack([T @ uA, -(T @ uB)], axis=1)
            st = np.linalg.pinv(Mst) @ -(T @ (DXa - DXb) - kk * Dn)
            Xp = Xa
            DX = DXa + np.outer(uA, st[0])
        Dp = DX - np.outer(n, n @ DX + Xp @ Dn - Dc) - (Xp @ n - c0) * Dn
        dn[k] = Dn
        if not per_point:
            dp[k], dd[k] = Dp, Dd
            continue
        # offsets to the support features: y = p + s n on each, y = origin + U a moving with
        # its body, so  d(y) + U da = dp + ds n + s dn
        p = cands[i]
        ds = []
        for origin, Mp, body, off in feats:
            sv = float(Mp[-1] @ (p - origin))
            y = p + sv * n                   # on the feature; off n back to the body's core
            ds.append((sv, Mp[-1] @ (Dp + sv * Dn - (body.point(y - off * n) + off * Dn))))
        (sa, dsa), (sb, dsb) = ds
        dd[k] = dsb - dsa
        dp[k] = Dp + 0.5 * (np.outer(n, dsa + dsb) + (sa + sb) * Dn)
    return undone


# -- capsule against capsule --------------------------------------------------------------------
def capsule_axis(sim, g: int):
    """World end points (a0, a1) of the axis segment of capsule geom g and its radius."""
    M = sim.geom_data.oMg[g]
    shape = sim.geom_model.geometryObjects[g].geometry
    h = float(shape.halfLength)
    u = M.rotation[:, 2]
    return M.translation - h * u, M.translation + h * u, float(shape.radius)


def segments_parallel(uA: np.ndarray, uB: np.ndarray, tol: float = 1e-6) -> bool:
    return float(np.linalg.norm(_cross3(uA, uB))) <= tol * float(np.linalg.norm(uA) * np.linalg.norm(uB))


def capsule_pair(sim, kin, c, rows: list, j1: int, j2: int, dp, dn, dd) -> list:
    """Closed form for a capsule-capsule contact (one point: their axes not parallel).

    With c1 = a0 + s uA and c2 = b0 + t uB the closest points of the two axis segments (each
    parameter interior, or clamped at an end), n = (c2 - c1) / L, L = |c2 - c1|, the distance
    is L - rA - rB and the point the midpoint of c1 + rA n and c2 - rB n. An interior parameter
    follows from its orthogonality condition ((c2 - c1) . u = 0, differentiated implicitly), a
    clamped one stays at its body-fixed end; then dn = (I - n n^T)(dc2 - dc1) / L and
    dd = n . (dc2 - dc1). Parallel axes (a line contact, coal returns two points) are left to
    the fallback."""
    if len(rows) != 1:
        return _undone(rows, 'capsules: several points')
    k = rows[0]
    g1, g2 = int(c.geom1[k]), int(c.geom2[k])
    a0, a1, rA = capsule_axis(sim, g1)
    b0, b1, rB = capsule_axis(sim, g2)
    uA, uB = a1 - a0, b1 - b0
    if segments_parallel(uA, uB):
        return _undone(rows, 'capsules: parallel axes')
    # closest points of the segments (clamped, as coal's capsule-capsule distance)
    w0 = a0 - b0
    a, b, cc = uA @ uA, uA @ uB, uB @ uB
    d_, e = uA @ w0, uB @ w0
    den = a * cc - b * b
    s = min(max((b * e - cc * d_) / den, 0.0), 1.0)
    t = (b * s + e) / cc
    if t < 0.0 or t > 1.0:
        t = min(max(t, 0.0), 1.0)
        s = min(max((b * t - d_) / a, 0.0), 1.0)
    p1, p2 = a0 + s * uA, b0 + t * uB
    r = p2 - p1
    L = float(np.linalg.norm(r))
    if L < 1e-12:
        return _undone(rows, 'capsules: coincident axes')
    n = r / L
    if n @ c.normal[k] < 0.99:
        return _undone(rows, 'capsules: normal mismatch')
    A, B = _Body(kin, j1), _Body(kin, j2)
    dP1, dP2 = A.point(p1), B.point(p2)
    duA, duB = A.turn(uA), B.turn(uB)
    eps = 1e-12
    free_s, free_t = eps < s < 1.0 - eps, eps < t < 1.0 - eps
    # orthogonality conditions of the free parameters: (r + dt uB - ds uA + ...) . u = 0
    rows_M, rhs = [], []
    if free_s:
        rows_M.append([-(uA @ uA), uB @ uA]); rhs.append(-(uA @ (dP2 - dP1) + r @ duA))
    if free_t:
        rows_M.append([-(uA @ uB), uB @ uB]); rhs.append(-(uB @ (dP2 - dP1) + r @ duB))
    ds = dt = np.zeros(kin.nv)
    if free_s and free_t:
        sol = np.linalg.solve(np.array(rows_M), np.vstack(rhs))
        ds, dt = sol[0], sol[1]
    elif free_s:
        ds = rhs[0] / rows_M[0][0]
    elif free_t:
        dt = rhs[0] / rows_M[0][1]
    dc1 = dP1 + np.outer(uA, ds)
    dc2 = dP2 + np.outer(uB, dt)
    dr = dc2 - dc1
    Dn = (np.eye(3) - np.outer(n, n)) @ dr / L
    pos = 0.5 * (p1 + p2) + 0.5 * (rA - rB) * n
    if np.linalg.norm(pos - c.pos[k]) > MATCH_TOL * max(L, 1.0):
        return _undone(rows, 'capsules: no match')
    dn[k] = Dn
    dd[k] = n @ dr
    dp[k] = 0.5 * (dc1 + dc2) + 0.5 * (rA - rB) * Dn
    return []


# -- a cylinder on a face of a box (or on a plane) --------------------------------------------------
def cylinder_face(x, d, n, lowest, a, rad, dX, dC, Wc, dn_face, dXf):
    """Closed-form (dp (3, nv), dn (3, nv), dd (nv,)) of one contact row of a cylinder on a face
    plane (``plane_contacts.cylinder_points``): x the witness point on the cylinder, d its
    height above the plane, n the plane's unit normal (out of the plane, towards the cylinder),
    ``lowest`` whether x is the lowest point of a tilted cap's rim (else a body-fixed rim
    point of a flat cap), a the cylinder's axis, rad its radius; dX, dC the Jacobians of the
    cylinder's body points at x and at the centre ``x + rad u`` of x's cap; Wc the cylinder's
    angular Jacobian; dn_face the Jacobian of n (``w_box x n`` for a box face, 0 for a static
    plane); dXf the Jacobian of the face's body point at the contact point p = x - d n.

    A rim vertex moves with the cylinder (dx = dX); the lowest rim point is ``c - rad u`` with
    u the unit projection of n on the cap plane, u = e / |e|, e = n - (n.a) a, so
    ``de = dn - a (dn.a + n.da) - (n.a) da``, da = w_c x a, du = (I - u u^T) de / |e| and
    dx = dC - rad du. The height d = n.(x - y) over the face's point y (at p, moving with the
    face) has dd = dn.(x - y) + n.(dx - dy) = n.(dx - dXf) (x - y = d n is normal to dn), and
    p = x - d n has dp = dx - n dd - d dn."""
    if lowest:
        na = float(n @ a)
        e = n - na * a
        ne = float(np.sqrt(e @ e))
        u = e / ne
        da = -_skew(a) @ Wc
        de = dn_face - np.outer(a, a @ dn_face + n @ da) - na * da
        du = (de - np.outer(u, u @ de)) / ne
        dx = dC - rad * du
    else:
        dx = dX
    ddist = n @ (dx - dXf)
    return dx - np.outer(n, ddist) - d * dn_face, dn_face, ddist


def cylinder_box_pair(sim, kin, c, rows: list, j1: int, j2: int, dp, dn, dd) -> list:
    """Closed-form dp, dn, dd for the rows of a cylinder-box pair that the driver found on a
    box face (``plane_contacts.cylinder_box_face``; the pair is in the collision driver's
    ``cylinder_face_pairs``): per row ``cylinder_face`` with the face normal turning with the
    box. Returns the rows it could not do (for the fallback)."""
    from .plane_contacts import CYLINDER_LOWEST_ID
    k0 = rows[0]
    if int(c.pair[k0]) not in getattr(sim.collision, "cylinder_face_pairs", ()):
        return _undone(rows, 'cylinder-box: not on a face')
    g1, g2 = int(c.geom1[k0]), int(c.geom2[k0])
    box_first = sim.sm.geoms[g1].kind == "box"
    gb, gc = (g1, g2) if box_first else (g2, g1)
    B, C = (_Body(kin, j1), _Body(kin, j2)) if box_first else (_Body(kin, j2), _Body(kin, j1))
    sgn = 1.0 if box_first else -1.0
    Mc, Mb = sim.geom_data.oMg[gc], sim.geom_data.oMg[gb]
    a = Mc.rotation[:, 2]
    rad = float(sim.geom_model.geometryObjects[gc].geometry.radius)
    undone = []
    for k in rows:
        n = sgn * np.asarray(c.normal[k], float)
        if float(np.max(np.abs(Mb.rotation.T @ n))) < 1.0 - 1e-12:
            undone += _undone([k], 'cylinder-box: normal off the face')
            continue
        d = float(c.dist[k])
        p = np.asarray(c.pos[k], float)
        x = p + d * n
        lowest = int(c.point[k]) >= CYLINDER_LOWEST_ID
        if lowest:
            e = n - float(n @ a) * a
            centre = x + rad * e / np.linalg.norm(e)
            dC = C.point(centre)
        else:
            dC = None
        Dp, Dn, Dd = cylinder_face(x, d, n, lowest, a, rad, C.point(x), dC, C.Jw, B.turn(n),
                                   B.point(p))
        dp[k], dn[k], dd[k] = Dp, sgn * Dn, Dd
    return undone
