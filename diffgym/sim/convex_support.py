"""Exact single-point contacts between smooth or mixed convex primitives and their closed-form
derivatives, from the optimality conditions of the distance problem written with support
functions (issue 16; the differentiable-collision paper's idea: differentiate the optimality
conditions of the convex problem, not the algorithm that solved it).

For convex A (geom 1) and B (geom 2) with support functions h_A, h_B, the signed distance is
``d = max_{|n| = 1} f(n)``, ``f(n) = -h_A(n) - h_B(-n)`` (separated and penetrating alike;
n from A to B). At the maximizer the witness points are support points, p1 of A along n and p2
of B along -n, and ``p2 - p1 = d n``.

Each side's support near the current normal is described by a *feature*:

* a smooth support point ``f(m)`` (m the side's outward direction) with the Hessian H of its
  support function (``df = H dm``, ``H m = 0``): a sphere (``t + r m``, ``H = r (I - m m^T)``),
  an ellipsoid (``t + E m / sqrt(m^T E m)``, ``H = E / s - E m m^T E / s^3``), a capsule's end
  (the axis end ``+ r m``), a tilted cylinder's rim point (``t +- h a + r e / |e|``,
  ``e = m - (a.m) a``, ``H = r (I - a a^T - u u^T) / |e|``), a polytope vertex (``H = 0``);
* plus free directions U (body-fixed, orthonormal) along which the witness slides where the
  support set is not one point: an edge of a box or mesh, the side line of a capsule or a
  cylinder (one direction), a face of a box or mesh or a cylinder's cap (two). The witness is
  ``f(m) + sum_i s_i u_i``.

With the unknowns x = (dn in a tangent basis E of n, the slides ds of A and dt of B, dd) the
conditions ``z = p2 - p1 = d n`` and ``n . u = 0`` for every free direction differentiate to

    (K + d I) dn + U_A ds - U_B dt + n dd = dz_q          (K = H_A + H_B)
    u . dn = -n . du                                       (each free direction)

where ``dz_q`` is the motion of the witnesses with their bodies at fixed normal
(``J_pt(p) - H (w x m)``, w the body's angular velocity Jacobian) and ``du = w x u``. The same
square system is the Newton step of the conditions themselves: ``refine`` uses it to make the
narrow phase's (coal's GJK/EPA) witness points and normal exact to rounding, so the collision
output is a smooth function of the poses that these derivatives describe exactly.

The support features, the Newton refinement with its verification and the choice among its
starts run on every step for every such pair: they are compiled kernels (``_feature_k``,
``_solve_at_k``, ``_solve_k``; one call per pair; ``DIFFGYM_JIT=0`` runs them as Python), and
``feature``, ``solve_at`` and ``solve`` are thin wrappers over them. The derivatives (the
Jacobian path) use the same features from numpy.

Configurations outside this description return None (the caller keeps coal's output and its
finite-difference fallback): a face against a face or an edge parallel to it (a contact patch),
parallel edges, features that the tolerances cannot decide, a swept-sphere radius.
"""
from __future__ import annotations

import coal
import numpy as np

from .jit import njit

# angular tolerance deciding a cylinder's cap face or side line, a capsule's side, and the
# fraction of a polytope's size within which vertices form its support set (loose: the feature
# the Newton refinement starts from; the converged answer is verified tightly)
FEATURE_TOL = 1e-6
# the tolerances tried in turn: a loose one first (a cap or a face the narrow phase's normal
# misses by its own error, ~1e-5 rad for curved shapes), then a tight one (a rim point or a
# vertex close to a face's normal: the loose face's optimum fails the verification)
TOLERANCES = (1e-4, 1e-10)
# the refined normal agrees with the narrow phase's to this (1 - cos), the point to this
# fraction of the pair's size
# (coal's EPA normal of two penetrating ellipsoids is off by up to ~1e-2 rad, its witness points
# by ~1e-3 of their size: the refinement starts there and must find the optimum nearby)
AGREE_COS = 1e-2
AGREE_POS = 1e-2
NEWTON_ITERS = 40
MAX_TURN = 0.2
# a refined depth beyond this fraction of the smaller shape's size is checked from other starts
DEEP = 0.05          # rad: the largest turn of the normal in one Newton step

SMOOTH_KINDS = ("cylinder", "ellipsoid")


def _skew(x):
    return np.array([[0.0, -x[2], x[1]], [x[2], 0.0, -x[0]], [-x[1], x[0], 0.0]])


class Shape:
    """A convex primitive in its own frame: kind and parameters (from a coal geometry)."""

    def __init__(self, geometry):
        g = geometry
        sw = g.getSweptSphereRadius() if hasattr(g, "getSweptSphereRadius") else 0.0
        self.ok = sw == 0.0
        self.V = None
        if isinstance(g, coal.Sphere):
            self.kind, self.r = "sphere", float(g.radius)
            self.size = 2 * self.r
        elif isinstance(g, coal.Ellipsoid):
            self.kind, self.radii = "ellipsoid", np.asarray(g.radii, float).copy()
            self.size = 2 * float(self.radii.max())
        elif isinstance(g, coal.Capsule):
            self.kind, self.r, self.h = "capsule", float(g.radius), float(g.halfLength)
            self.size = 2 * (self.r + self.h)
        elif isinstance(g, coal.Cylinder):
            self.kind, self.r, self.h = "cylinder", float(g.radius), float(g.halfLength)
            self.size = 2 * max(self.r, self.h)
        elif isinstance(g, coal.Box):
            self.kind = "polytope"
            self.V = np.array([[sx, sy, sz] for sx in (-1.0, 1.0) for sy in (-1.0, 1.0)
                               for sz in (-1.0, 1.0)]) * np.asarray(g.halfSide, float)
        elif isinstance(g, coal.ConvexBase):
            self.kind = "polytope"
            self.V = np.asarray(g.points(), float).reshape(-1, 3).copy()
        else:
            self.kind, self.ok = "other", False
        if self.V is not None:
            self.size = float(np.ptp(self.V, axis=0).max()) if len(self.V) else 0.0
            self.ok = self.ok and len(self.V) > 0
        # the kernels' description: shape code, parameters (sphere r; ellipsoid radii; capsule
        # and cylinder r, h), vertices and hull equations (polytopes; empty otherwise)
        self.code = CODES.get(self.kind, -1)
        self.prm = np.zeros(3)
        if self.kind == "sphere":
            self.prm[0] = self.r
        elif self.kind == "ellipsoid":
            self.prm[:] = self.radii
        elif self.kind in ("capsule", "cylinder"):
            self.prm[:2] = self.r, self.h
        self.size = float(getattr(self, "size", 0.0))
        self.Vk = np.zeros((0, 3))
        self.eqk = np.zeros((0, 4))
        if self.kind == "polytope" and self.ok:
            self.Vk = np.ascontiguousarray(self.V, dtype=float)
            self.eqk = np.ascontiguousarray(face_planes(self)[2], dtype=float)


class Feature:
    """Support feature of a placed shape along the outward direction m: smooth point f, world
    Hessian H, free directions U (k, 3) and an extent test for a witness on it."""

    __slots__ = ("f", "H", "U", "key", "inside")

    def __init__(self, f, H, U, key, inside):
        self.f, self.H, self.U, self.key, self.inside = f, H, U, key, inside


def feature(shape: Shape, R, t, m, tol=FEATURE_TOL):
    """The support feature of ``shape`` placed at (R, t) along the unit direction m, or None
    (the compiled ``_feature_k``)."""
    if shape.code < 0:
        return None
    R, t = np.ascontiguousarray(R, dtype=float), np.ascontiguousarray(t, dtype=float)
    f, H, U = np.zeros(3), np.zeros((3, 3)), np.zeros((2, 3))
    key = np.zeros(2 + len(shape.Vk), np.int64)
    k = _feature_k(shape.code, shape.prm, shape.size, shape.Vk, R, t,
                   np.ascontiguousarray(m, dtype=float), tol, f, H, U, key)
    if k < 0:
        return None
    code = int(key[0])
    if code >= F_VERTEX:
        tag = (_KEY_NAMES[code],) + tuple(int(i) for i in key[2:2 + key[1]])
    else:
        tag = (_KEY_NAMES[code],) + ((float(key[1]),) if code in (F_END, F_CAP, F_RIM) else ())

    def inside(p, key=key, f=f):
        return bool(_inside_k(shape.code, shape.prm, shape.size, shape.eqk, R, t, key, f,
                              np.ascontiguousarray(p, dtype=float)))
    return Feature(f, H, U[:k].copy(), tag, inside)


def _system(FA, FB, n, d):
    """The square matrix M of the conditions' linearization (see the module docstring) and the
    tangent basis E: unknowns (dn in E (2), ds (kA), dt (kB), dd)."""
    kA, kB = len(FA.U), len(FB.U)
    UA, UB = np.zeros((2, 3)), np.zeros((2, 3))
    UA[:kA], UB[:kB] = FA.U, FB.U
    M, E = _system_k(FA.H, UA, kA, FB.H, UB, kB, np.ascontiguousarray(n, dtype=float), float(d))
    return M, E, np.concatenate([FA.U, FB.U])


def surface_normal(shape: Shape, R, t, p):
    """Outward unit normal of a smooth shape's surface at (near) its point p, or None where the
    shape has no unique normal there (polytopes, a cylinder's rim)."""
    ok, m = _surface_normal_k(shape.code, shape.prm, shape.size,
                              np.ascontiguousarray(R, dtype=float),
                              np.ascontiguousarray(t, dtype=float),
                              np.ascontiguousarray(p, dtype=float))
    return m if ok else None


def _args(shape, R, t):
    return (shape.code, shape.prm, shape.size, shape.Vk, shape.eqk,
            np.ascontiguousarray(R, dtype=float), np.ascontiguousarray(t, dtype=float))


def solve(shapeA, RA, tA, shapeB, RB, tB, n, p1, p2, previous=None):
    """The exact optimum of a pair's distance problem near the narrow phase's answer (normal n,
    witness points p1 on A and p2 on B): ``solve_at`` with the feature tolerances of TOLERANCES
    in turn (the first that gives a verified optimum), started from the narrow phase's normal,
    then (where that one is poor: coal's EPA normal of two barely penetrating ellipsoids can be
    off by 0.5 rad while its witness points are right) from the surface normals at its witness
    points. Where the answer is deep, new or missing, the other starts run as well and the
    largest verified value (the signed distance by definition: coal's EPA also stops at another
    local maximum of the separating function now and then) is kept; where the narrow phase
    failed (witness points of 1e307, not finite), the largest verified local maximum from the
    previous normal, the direction between the centres and the axes of both bodies.
    ``previous``: the pair's normal at the previous call. Returns (n, d, p1, p2, tol) or None.
    One compiled call (``_solve_k``)."""
    if not (shapeA.ok and shapeB.ok):
        return None
    has_prev = previous is not None
    prev = np.ascontiguousarray(previous, dtype=float) if has_prev else np.zeros(3)
    ok, n, d, q1, q2, tol = _solve_k(*_args(shapeA, RA, tA), *_args(shapeB, RB, tB),
                                     np.ascontiguousarray(n, dtype=float),
                                     np.ascontiguousarray(p1, dtype=float),
                                     np.ascontiguousarray(p2, dtype=float), prev, has_prev,
                                     np.asarray(TOLERANCES, dtype=float))
    return (n, float(d), q1, q2, float(tol)) if ok else None


def solve_at(shapeA, RA, tA, shapeB, RB, tB, n, p1, p2, tol, check_normal=True, agree=True):
    """Refine the witness points p1 (on A), p2 (on B) and the normal n (A to B) of a single
    point contact to the exact optimum; returns (n, d, p1, p2, FA, FB) or None where the
    configuration is not one this module describes or the refinement does not agree with the
    starting point (the compiled ``_solve_at_k``)."""
    if not (shapeA.ok and shapeB.ok):
        return None
    ok, n, d, q1, q2 = _solve_at_k(*_args(shapeA, RA, tA), *_args(shapeB, RB, tB),
                                   np.ascontiguousarray(n, dtype=float),
                                   np.ascontiguousarray(p1, dtype=float),
                                   np.ascontiguousarray(p2, dtype=float), float(tol),
                                   bool(check_normal), bool(agree))
    if not ok:
        return None
    return n, float(d), q1, q2, feature(shapeA, RA, tA, n, tol), feature(shapeB, RB, tB, -n, tol)


def derivatives(FA, FB, n, d, p1, p2, JA, oA, JB, oB):
    """(dp (3, nv), dn (3, nv), dd (nv,)) of the contact point (the witness midpoint), the
    normal and the signed distance, from the features at the optimum and the joint Jacobians
    J (6, nv, LOCAL_WORLD_ALIGNED, zeros for the world) and origins o of the two bodies."""
    WA, WB = JA[3:], JB[3:]
    dP1 = JA[:3] - _skew(p1 - oA) @ WA + FA.H @ _skew(n) @ WA      # J_pt - H (w x n)
    dP2 = JB[:3] - _skew(p2 - oB) @ WB - FB.H @ _skew(n) @ WB      # m_B = -n
    M, E, U = _system(FA, FB, n, d)
    kA, kB = len(FA.U), len(FB.U)
    nv = JA.shape[1]
    rhs = np.zeros((M.shape[0], nv))
    rhs[:3] = dP2 - dP1
    for i in range(kA):
        rhs[3 + i] = -n @ (-_skew(FA.U[i]) @ WA)
    for j in range(kB):
        rhs[3 + kA + j] = -n @ (-_skew(FB.U[j]) @ WB)
    x = np.linalg.solve(M, rhs)
    Dn = E @ x[:2]
    Dd = x[-1]
    dp1 = dP1 + FA.H @ Dn + (FA.U.T @ x[2:2 + kA] if kA else 0.0)
    dp2 = dP2 - FB.H @ Dn + (FB.U.T @ x[2 + kA:2 + kA + kB] if kB else 0.0)
    return 0.5 * (dp1 + dp2), Dn, Dd


def shape_of(owner, g: int) -> Shape:
    """The Shape of geom g of ``owner`` (a Simulator or SimModel: its geom_model), cached on it."""
    cache = owner.__dict__.setdefault("_convex_shapes", {})
    s = cache.get(g)
    if s is None:
        s = cache[g] = Shape(owner.geom_model.geometryObjects[g].geometry)
    return s


# -- a shape lying on a face: a cylinder's cap or a convex mesh's face ---------------------------
# ids of the points of a face contact: the candidate's own id (a polytope vertex, a capsule end
# 0/1, plane_contacts.cylinder_points' ids) plus FACE_ID_BASE times (1 + the face's index)
FACE_ID_BASE = 1_000_000


def face_planes(shape: Shape):
    """Candidate faces of a shape in its own frame: (normals (f, 3), offsets (f,), hull
    equations or None) — a cylinder's two caps, a polytope's hull facets (merged by normal);
    None for other shapes."""
    if shape.kind == "cylinder":
        N = np.array([[0.0, 0.0, -1.0], [0.0, 0.0, 1.0]])
        return N, np.array([shape.h, shape.h]), None
    if shape.kind == "polytope":
        cache = getattr(shape, "_faces", None)
        if cache is None:
            from scipy.spatial import ConvexHull
            eq = ConvexHull(shape.V).equations
            keep = []
            for e in eq:
                if not any(float(e[:3] @ k[:3]) > 1.0 - 1e-9 for k in keep):
                    keep.append(e)
            keep = np.array(keep)
            cache = shape._faces = (keep[:, :3].copy(), -keep[:, 3].copy(), keep)
        return cache
    return None


def shape_candidates(shape: Shape, R, t, n):
    """Points of a shape (world, (k, 3)) that can touch a plane with normal n (out of the plane,
    towards the shape) and their ids and kinds (0: body-fixed, 1: a capsule end moved by -r n,
    2: a tilted cylinder's lowest rim point): polytope vertices, capsule ends, cylinder rim
    points (plane_contacts.cylinder_points); None for smooth shapes (one point: the single-point
    route)."""
    if shape.kind == "polytope":
        X = shape.V @ R.T + t
        return X, np.arange(len(X)), np.zeros(len(X), dtype=np.int64)
    if shape.kind == "capsule":
        a = R[:, 2]
        X = np.stack([t - shape.h * a, t + shape.h * a]) - shape.r * n
        return X, np.arange(2), np.ones(2, dtype=np.int64)
    if shape.kind == "cylinder":
        from .plane_contacts import CYLINDER_LOWEST_ID, cylinder_points
        X, ids = cylinder_points(shape.r, shape.h, R, t, n)
        return X, ids, np.where(ids >= CYLINDER_LOWEST_ID, 2, 0).astype(np.int64)
    return None


def face_contact(shapeF, RF, tF, shapeO, RO, tO, margin, max_points):
    """Shape O lying on a face of shape F (a cylinder's cap, a convex mesh's facet), in closed
    form where that face is the contact feature: the face whose plane O is highest above
    (separating axis among F's faces), with every candidate point of O within ``margin`` of
    the plane projecting inside the face (the cap's disc, the facet's polygon): (n (out of F),
    face index, points x on O (k, 3), heights (k,), ids, kinds, separation) with at most max_points points
    (the lowest), or None where it is not (the narrow phase decides)."""
    planes = face_planes(shapeF)
    if planes is None or not (shapeF.ok and shapeO.ok):
        return None
    N, off, eq = planes
    best, bi, bx = -np.inf, -1, None
    for i in range(len(N)):
        n = RF @ N[i]
        cand = shape_candidates(shapeO, RO, tO, n)
        if cand is None:
            return None
        x = cand[0]
        height = float((x @ n).min()) - (float(n @ tF) + off[i])
        if height > best:
            best, bi, bx = height, i, cand
    n = RF @ N[bi]
    offset = float(n @ tF) + off[bi]
    x, ids, kinds = bx
    if best < -0.25 * shapeF.size:
        return None
    if shapeF.kind == "cylinder" and shapeO.kind == "capsule":
        # a capsule on a cap: its lowered axis segment clipped by the cap's disc (an end inside
        # the disc, or the crossing of the segment's projection with the rim circle: kind 3)
        c = tF + off[bi] * n
        A, u = x[0], x[1] - x[0]
        T = np.eye(3) - np.outer(n, n)
        y0, tu = T @ (A - c), T @ u
        qa, qb, qc = tu @ tu, 2.0 * (y0 @ tu), y0 @ y0 - shapeF.r ** 2
        disc = qb * qb - 4.0 * qa * qc
        if qa <= 1e-24 * shapeF.size ** 2 or disc <= 0.0:
            return None
        sq = np.sqrt(disc)
        s_lo, s_hi = (-qb - sq) / (2.0 * qa), (-qb + sq) / (2.0 * qa)
        pts, pid, pk = [], [], []
        for sv, end in ((s_lo, 0), (s_hi, 1)):
            if 0.0 <= sv <= 1.0:
                pts.append(A + sv * u); pid.append(2 + end); pk.append(3)
            elif (sv < 0.0) == (end == 0):
                pts.append(x[end]); pid.append(end); pk.append(1)
        if len(pts) != 2 or s_lo > 1.0 or s_hi < 0.0:
            return None
        x, ids, kinds = np.array(pts), np.array(pid), np.array(pk, dtype=np.int64)
        height = x @ n - offset
        sel = np.flatnonzero(height < margin)
        return n, bi, x[sel], height[sel], ids[sel], kinds[sel], best
    height = x @ n - offset
    sel = np.flatnonzero(height < margin)
    if len(sel) > max_points:
        sel = sel[np.argsort(height[sel], kind="stable")[:max_points]]
    # every point over the face
    loc = (x[sel] - height[sel, None] * n - tF) @ RF              # projections, F's frame
    tol = 1e-9 * shapeF.size
    if shapeF.kind == "cylinder":
        if np.any(np.hypot(loc[:, 0], loc[:, 1]) > shapeF.r - tol):
            # a polytope's edge or face crossing the rim: the patch clipped by the cap's disc
            clip = _clip_disc(shapeO, RO, tO, x[sel], height[sel], ids[sel], n,
                              tF + off[bi] * n, shapeF.r, tol, max_points)
            if clip is None:
                return None
            return (n, bi) + clip + (best,)
    else:
        others = np.flatnonzero(np.abs(eq[:, :3] @ N[bi] - 1.0) > 1e-9)
        if np.any(loc @ eq[others, :3].T + eq[others, 3] > -tol):
            return None
    return n, bi, x[sel], height[sel], ids[sel], kinds[sel], best


# ids of the points where a polytope's edge (vertices i < j) crosses the rim of a cap:
# CROSSING_ID + 2 (i NV + j) + (0: the crossing nearer i, 1: the other), NV = CROSSING_NV
CROSSING_ID, CROSSING_NV = 1000, 256


def crossing_edge(pid: int):
    """(i, j) of the polytope edge of a rim-crossing point's id (FACE_ID_BASE part removed)."""
    e = (int(pid) - CROSSING_ID) // 2
    return e // CROSSING_NV, e % CROSSING_NV


def _clip_disc(shapeO, RO, tO, X, height, ids, n, c, radius, tol, max_points):
    """A polytope O on a cylinder's cap (centre c, normal n, ``radius``) whose support
    vertices X (on one edge or one face of O) do not all project inside the cap's disc: the
    patch clipped by the disc, its vertices inside the disc (kind 0) and the points where its
    edges cross the rim circle (kind 4, on O's edge: ``x = X_i + s (X_j - X_i)`` with
    ``|T (x - c)| = radius``, T = I - n n^T); (x, heights, ids, kinds) or None where the
    vertices are not one edge or one face of O (or O is not a polytope, or the disc misses
    the patch: then the rim does not touch the patch's interior and the narrow phase decides).
    The arc of the rim inside the patch is not sampled (its crossing points and the inside
    vertices span the patch but for the arc's circular segments)."""
    if shapeO.kind != "polytope" or len(X) < 2 or np.any(ids >= len(shapeO.Vk)):
        return None
    T = np.eye(3) - np.outer(n, n)
    if len(X) == 2:
        order = [0, 1]
        edges = [(0, 1)]
    else:
        # one face of O: all the vertices on one of its hull planes (O's frame)
        loc = (X - tO) @ RO
        on = np.abs(loc @ shapeO.eqk[:, :3].T + shapeO.eqk[:, 3]) <= 1e-9 * max(shapeO.size, 1e-300)
        if not np.any(np.all(on, axis=0)):
            return None
        y = (X - X.mean(axis=0)) @ T
        e1 = y[np.argmax(np.einsum("ij,ij->i", y, y))]
        e1 = e1 / np.linalg.norm(e1)
        e2 = np.cross(n, e1)
        order = list(np.argsort(np.arctan2(y @ e2, y @ e1), kind="stable"))
        edges = [(order[k], order[(k + 1) % len(order)]) for k in range(len(order))]
    rad = np.sqrt(np.einsum("ij,ij->i", (X - c) @ T, (X - c) @ T))
    inside = rad < radius - tol
    keep_x, keep_id, keep_k = [X[i] for i in np.flatnonzero(inside)], \
        [int(ids[i]) for i in np.flatnonzero(inside)], [0] * int(inside.sum())
    for a, b in edges:
        i, j = (a, b) if ids[a] < ids[b] else (b, a)
        A, u = X[i], X[j] - X[i]
        y0, tu = T @ (A - c), T @ u
        qa, qb, qc = tu @ tu, 2.0 * (y0 @ tu), y0 @ y0 - radius ** 2
        disc = qb * qb - 4.0 * qa * qc
        if qa <= 1e-24 * max(radius, 1e-300) ** 2 or disc <= 0.0:
            continue
        sq = np.sqrt(disc)
        for w, sv in enumerate(((-qb - sq) / (2.0 * qa), (-qb + sq) / (2.0 * qa))):
            if 1e-9 < sv < 1.0 - 1e-9:
                keep_x.append(A + sv * u)
                keep_id.append(CROSSING_ID + 2 * (int(ids[i]) * CROSSING_NV + int(ids[j])) + w)
                keep_k.append(4)
    if not keep_x or len(shapeO.Vk) > CROSSING_NV or not np.any(~inside) or \
            sum(k == 4 for k in keep_k) == 0:
        return None
    x = np.array(keep_x)
    h = x @ n - (float(n @ c))
    sel = np.argsort(h, kind="stable")[:max_points]
    return x[sel], h[sel], np.array(keep_id)[sel], np.array(keep_k, dtype=np.int64)[sel]


def _rim_crossing(A, u, xl, n, Dn, centre, JF, oF, JO, oO):
    """d(A + s u) of the point ``xl`` where a line of O (through A along u, both moving with O)
    crosses the rim circle of F's cap (``centre``; |T (A + s u - centre)| = radius, T = I - n n^T,
    n the face normal: Dn its derivative), s by implicit differentiation: for
    ``face_derivatives``' kinds 3 (a capsule's lowered axis) and 4 (a polytope's edge)."""
    WF, WO = JF[3:], JO[3:]
    sv = float(u @ (xl - A)) / float(u @ u)
    y = A + sv * u - centre
    w = y - (n @ y) * n
    dA = JO[:3] - _skew(A - oO) @ WO
    du = -_skew(u) @ WO
    dc = JF[:3] - _skew(centre - oF) @ WF
    ds = ((w @ Dn) * (n @ y) - w @ (dA + sv * du - dc)) / float(w @ u)
    return dA + sv * du + np.outer(u, ds)


def face_derivatives(shapeO, RO, tO, n, kind, x, d, JF, oF, JO, oO, centre=None, radius=0.0,
                     edge=None):
    """(dp, dn, dd) of one point of a face contact: x the witness on O (its kind: 0 body-fixed,
    1 a capsule end, 2 a tilted cylinder's lowest rim point, 3 a capsule's axis crossing the rim
    circle of the cap (``centre``, ``radius``), 4 a polytope's edge (its two vertices ``edge``,
    world) crossing that rim circle), d its height above F's face plane,
    n the face normal (out of F; turns with F: dn = w_F x n); p = x - d n on the face moves with
    F: dd = n . (dx - dX_F(p)), dp = dx - n dd - d dn. J, o: joint Jacobians (6, nv, zeros for
    the world) and origins of F's and O's bodies."""
    WF, WO = JF[3:], JO[3:]
    Dn = -_skew(n) @ WF
    if kind == 4:
        # a polytope's edge (body-fixed vertices ``edge`` = (X_i, X_j)) crossing the rim circle
        # of a cap (centre, radius): x = A + s u, |T (x - c)| = radius; s implicitly
        dx = _rim_crossing(edge[0], edge[1] - edge[0], x, n, Dn, centre, JF, oF, JO, oO)
    elif kind == 3:
        # a capsule's lowered axis crossing the rim circle of a cap (centre, radius): x = A +
        # s u - r n with |T (A + s u - c)| = radius, T = I - n n^T; s by implicit differentiation
        a = RO[:, 2]
        dx = (_rim_crossing(tO - shapeO.h * a, 2.0 * shapeO.h * a, x + shapeO.r * n, n, Dn,
                            centre, JF, oF, JO, oO) - shapeO.r * Dn)
    elif kind == 1:                                   # capsule end: the end point - r n
        end = x + shapeO.r * n
        dx = JO[:3] - _skew(end - oO) @ WO - shapeO.r * Dn
    elif kind == 2:                                 # the lowest rim point c - r u of a cap
        a = RO[:, 2]
        na = float(n @ a)
        e = n - na * a
        ne = float(np.linalg.norm(e))
        u = e / ne
        c = x + shapeO.r * u
        da = -_skew(a) @ WO
        de = Dn - np.outer(a, a @ Dn + n @ da) - na * da
        du = (de - np.outer(u, u @ de)) / ne
        dx = JO[:3] - _skew(c - oO) @ WO - shapeO.r * du
    else:
        dx = JO[:3] - _skew(x - oO) @ WO
    p = x - d * n
    dXf = JF[:3] - _skew(p - oF) @ WF
    dd = n @ (dx - dXf)
    return dx - np.outer(n, dd) - d * Dn, Dn, dd


# -- compiled refinement (the forward step's hot path) --------------------------------------------
# shape codes of the kernels (Shape.code) and feature codes (the first entry of a feature's key)
CODES = {"sphere": 0, "ellipsoid": 1, "capsule": 2, "cylinder": 3, "polytope": 4}
F_POINT, F_END, F_SIDE, F_CAP, F_RIM, F_VERTEX, F_EDGE, F_FACE = range(8)
_KEY_NAMES = ("p", "end", "side", "cap", "rim", "v", "e", "f")


@njit
def _feature_k(code, prm, size, V, R, t, m, tol, f, H, U, key):
    """The support feature of a placed shape along the unit direction m (see ``feature``),
    written into f (3,), H (3, 3), U (2, 3) and key (int64, 2 + len(V): code, a sign or the
    number of vertices, the vertices); returns the number of free directions, -1 where there is
    no feature this module describes."""
    for i in range(3):
        if not np.isfinite(m[i]):
            return -1
    for i in range(3):
        f[i] = 0.0
        for j in range(3):
            H[i, j] = 0.0
    for i in range(key.shape[0]):
        key[i] = -1
    if code == 0:                                     # sphere
        r = prm[0]
        for i in range(3):
            f[i] = t[i] + r * m[i]
            for j in range(3):
                H[i, j] = r * ((1.0 if i == j else 0.0) - m[i] * m[j])
        key[0] = F_POINT
        key[1] = 0
        return 0
    if code == 1:                                     # ellipsoid
        E = np.empty((3, 3))
        for i in range(3):
            for j in range(3):
                s = 0.0
                for l in range(3):
                    s += R[i, l] * prm[l] ** 2 * R[j, l]
                E[i, j] = s
        y = np.empty(3)
        for i in range(3):
            y[i] = E[i, 0] * m[0] + E[i, 1] * m[1] + E[i, 2] * m[2]
        s = np.sqrt(m[0] * y[0] + m[1] * y[1] + m[2] * y[2])
        for i in range(3):
            f[i] = t[i] + y[i] / s
            for j in range(3):
                H[i, j] = E[i, j] / s - y[i] * y[j] / s ** 3
        key[0] = F_POINT
        key[1] = 0
        return 0
    if code == 2 or code == 3:                        # capsule, cylinder
        a = R[:, 2]
        am = a[0] * m[0] + a[1] * m[1] + a[2] * m[2]
        e = m - am * a
        ne = np.sqrt(e[0] * e[0] + e[1] * e[1] + e[2] * e[2])
        r, h = prm[0], prm[1]
        sg = np.sign(am)
        if code == 2:
            for i in range(3):
                for j in range(3):
                    H[i, j] = r * ((1.0 if i == j else 0.0) - m[i] * m[j])
            if abs(am) * h > tol * size:
                for i in range(3):
                    f[i] = t[i] + sg * h * a[i] + r * m[i]
                key[0] = F_END
                key[1] = int(sg)
                return 0
            for i in range(3):
                f[i] = t[i] + r * m[i]
                U[0, i] = a[i]
            key[0] = F_SIDE
            key[1] = 0
            return 1
        if ne < tol:                                  # a cap face
            for i in range(3):
                f[i] = t[i] + sg * h * a[i]
                U[0, i] = R[i, 0]
                U[1, i] = R[i, 1]
            key[0] = F_CAP
            key[1] = int(sg)
            return 2
        u = e / ne
        for i in range(3):
            for j in range(3):
                H[i, j] = r * ((1.0 if i == j else 0.0) - a[i] * a[j] - u[i] * u[j]) / ne
        if abs(am) < tol:                             # the side line
            for i in range(3):
                f[i] = t[i] + r * u[i]
                U[0, i] = a[i]
            key[0] = F_SIDE
            key[1] = 0
            return 1
        for i in range(3):
            f[i] = t[i] + sg * h * a[i] + r * u[i]
        key[0] = F_RIM
        key[1] = int(sg)
        return 0
    if code == 4:                                     # polytope
        nV = V.shape[0]
        X = np.empty((nV, 3))
        hx = np.empty(nV)
        hmax = -np.inf
        for v in range(nV):
            for i in range(3):
                X[v, i] = V[v, 0] * R[i, 0] + V[v, 1] * R[i, 1] + V[v, 2] * R[i, 2] + t[i]
            hx[v] = X[v, 0] * m[0] + X[v, 1] * m[1] + X[v, 2] * m[2]
            if hx[v] > hmax:
                hmax = hx[v]
        lim = tol * max(size, 1e-300)
        nS = 0
        for v in range(nV):
            if hmax - hx[v] <= lim:
                key[2 + nS] = v
                nS += 1
        key[1] = nS
        s0 = key[2]
        for i in range(3):
            f[i] = X[s0, i]
        if nS == 1:
            key[0] = F_VERTEX
            return 0
        D = np.empty((nS - 1, 3))
        for k in range(1, nS):
            for i in range(3):
                D[k - 1, i] = X[key[2 + k], i] - X[s0, i]
        _, sv, Vt = np.linalg.svd(D, full_matrices=False)
        rank = 0
        for k in range(sv.shape[0]):
            if sv[k] > 1e-9 * max(size, 1e-300):
                rank += 1
        if rank == 1 or rank == 2:
            for k in range(rank):
                for i in range(3):
                    U[k, i] = Vt[k, i]
            key[0] = F_EDGE if rank == 1 else F_FACE
            return rank
        return -1
    return -1


@njit
def _inside_k(code, prm, size, eq, R, t, key, f, p):
    """Whether the witness p lies on the support feature (key, its smooth point f) of a placed
    shape: within a capsule's or a cylinder's side line, a cap's disc, a polytope's face."""
    c = key[0]
    if c == F_SIDE:
        h = prm[1]
        a = R[:, 2]
        return abs(a[0] * (p[0] - t[0]) + a[1] * (p[1] - t[1]) + a[2] * (p[2] - t[2])) <= h * (1 + 1e-9)
    if c == F_CAP:
        a = R[:, 2]
        w = p - f
        aw = a[0] * w[0] + a[1] * w[1] + a[2] * w[2]
        w = w - a * aw
        return np.sqrt(w[0] * w[0] + w[1] * w[1] + w[2] * w[2]) <= prm[0] * (1 + 1e-9)
    if c == F_EDGE or c == F_FACE:
        tol_in = 1e-9 * max(size, 1e-300)
        x = np.empty(3)
        for i in range(3):
            x[i] = R[0, i] * (p[0] - t[0]) + R[1, i] * (p[1] - t[1]) + R[2, i] * (p[2] - t[2])
        for k in range(eq.shape[0]):
            if eq[k, 0] * x[0] + eq[k, 1] * x[1] + eq[k, 2] * x[2] + eq[k, 3] > tol_in:
                return False
        return True
    return True


@njit
def _tangent_k(n):
    e1 = np.empty(3)
    if abs(n[0]) < 0.9:
        e1[0], e1[1], e1[2] = 0.0, -n[2], n[1]
    else:
        e1[0], e1[1], e1[2] = n[2], 0.0, -n[0]
    e1 /= np.sqrt(e1[0] * e1[0] + e1[1] * e1[1] + e1[2] * e1[2])
    E = np.empty((3, 2))
    E[:, 0] = e1
    E[0, 1] = n[1] * e1[2] - n[2] * e1[1]
    E[1, 1] = n[2] * e1[0] - n[0] * e1[2]
    E[2, 1] = n[0] * e1[1] - n[1] * e1[0]
    return E


@njit
def _system_k(HA, UA, kA, HB, UB, kB, n, d):
    """The square matrix of the conditions' linearization (``_system``) and the tangent basis."""
    E = _tangent_k(n)
    sz = 3 + kA + kB
    M = np.zeros((sz, sz))
    for i in range(3):
        for c in range(2):
            s = 0.0
            for j in range(3):
                s += (HA[i, j] + HB[i, j] + (d if i == j else 0.0)) * E[j, c]
            M[i, c] = s
        for k in range(kA):
            M[i, 2 + k] = UA[k, i]
        for k in range(kB):
            M[i, 2 + kA + k] = -UB[k, i]
        M[i, sz - 1] = n[i]
    for k in range(kA + kB):
        for c in range(2):
            s = 0.0
            for j in range(3):
                s += (UA[k, j] if k < kA else UB[k - kA, j]) * E[j, c]
            M[3 + k, c] = s
    return M, E


@njit
def _lu_solve_k(A, b):
    """Solve A x = b by LU with partial pivoting (LAPACK's gesv); ok False where a pivot is
    exactly zero (numpy's LinAlgError)."""
    n = A.shape[0]
    M = A.copy()
    x = b.copy()
    for k in range(n):
        p = k
        amax = abs(M[k, k])
        for i in range(k + 1, n):
            if abs(M[i, k]) > amax:
                p = i
                amax = abs(M[i, k])
        if M[p, k] == 0.0:
            return False, x
        if p != k:
            for j in range(n):
                tmp = M[k, j]
                M[k, j] = M[p, j]
                M[p, j] = tmp
            tmp = x[k]
            x[k] = x[p]
            x[p] = tmp
        for i in range(k + 1, n):
            l = M[i, k] / M[k, k]
            M[i, k] = l
            for j in range(k + 1, n):
                M[i, j] -= l * M[k, j]
            x[i] -= l * x[k]
    for k in range(n - 1, -1, -1):
        s = x[k]
        for j in range(k + 1, n):
            s -= M[k, j] * x[j]
        x[k] = s / M[k, k]
    return True, x


@njit
def _witness_k(f, U, k, s):
    q = f.copy()
    for i in range(k):
        for j in range(3):
            q[j] += s[i] * U[i, j]
    return q


@njit
def _slides_k(U, k, p, f):
    s = np.zeros(k)
    for i in range(k):
        s[i] = U[i, 0] * (p[0] - f[0]) + U[i, 1] * (p[1] - f[1]) + U[i, 2] * (p[2] - f[2])
    return s


@njit
def _same_key(a, b):
    for i in range(a.shape[0]):
        if a[i] != b[i]:
            return False
    return True


@njit
def _solve_at_k(cA, prA, szA, VA, eqA, RA, tA, cB, prB, szB, VB, eqB, RB, tB, n_in, p1, p2, tol,
                check_normal, agree):
    """``solve_at``'s kernel: (ok, n, d, q1, q2)."""
    nn = np.sqrt(n_in[0] ** 2 + n_in[1] ** 2 + n_in[2] ** 2)
    n = n_in / nn
    n0 = n.copy()
    mid0 = 0.5 * (p1 + p2)
    size = max(szA, szB)
    fA, HA, UA, keyA = np.zeros(3), np.zeros((3, 3)), np.zeros((2, 3)), np.zeros(2 + VA.shape[0], np.int64)
    fB, HB, UB, keyB = np.zeros(3), np.zeros((3, 3)), np.zeros((2, 3)), np.zeros(2 + VB.shape[0], np.int64)
    z3 = np.zeros(3)
    kA = _feature_k(cA, prA, szA, VA, RA, tA, n, tol, fA, HA, UA, keyA)
    kB = _feature_k(cB, prB, szB, VB, RB, tB, -n, tol, fB, HB, UB, keyB)
    if kA < 0 or kB < 0 or kA + kB > 2:
        return False, n, 0.0, z3, z3
    kA0, kB0 = keyA.copy(), keyB.copy()
    start_ok = True
    for i in range(3):
        if not (np.isfinite(p1[i]) and np.isfinite(p2[i])):
            start_ok = False
    if start_ok:
        sA = _slides_k(UA, kA, p1, fA)
        sB = _slides_k(UB, kB, p2, fB)
        d = n[0] * (p2[0] - p1[0]) + n[1] * (p2[1] - p1[1]) + n[2] * (p2[2] - p1[2])
    else:
        sA, sB = np.zeros(kA), np.zeros(kB)
        d = n[0] * (fB[0] - fA[0]) + n[1] * (fB[1] - fA[1]) + n[2] * (fB[2] - fA[2])
    stable = 0
    for it in range(NEWTON_ITERS):
        q1 = _witness_k(fA, UA, kA, sA)
        q2 = _witness_k(fB, UB, kB, sB)
        sz = 3 + kA + kB
        res = np.empty(sz)
        for i in range(3):
            res[i] = q2[i] - q1[i] - d * n[i]
        for k in range(kA):
            res[3 + k] = -(UA[k, 0] * n[0] + UA[k, 1] * n[1] + UA[k, 2] * n[2])
        for k in range(kB):
            res[3 + kA + k] = -(UB[k, 0] * n[0] + UB[k, 1] * n[1] + UB[k, 2] * n[2])
        M, E = _system_k(HA, UA, kA, HB, UB, kB, n, d)
        ok, dx = _lu_solve_k(M, res)
        if not ok:
            return False, n, 0.0, z3, z3
        for i in range(sz):
            if not np.isfinite(dx[i]):
                return False, n, 0.0, z3, z3
        turn = np.sqrt(dx[0] * dx[0] + dx[1] * dx[1])
        if turn > MAX_TURN:
            dx = dx * (MAX_TURN / turn)
            stable = -1
        for i in range(3):
            n[i] = n[i] + E[i, 0] * dx[0] + E[i, 1] * dx[1]
        n = n / np.sqrt(n[0] * n[0] + n[1] * n[1] + n[2] * n[2])
        for k in range(kA):
            sA[k] += dx[2 + k]
        for k in range(kB):
            sB[k] += dx[2 + kA + k]
        d = d + dx[sz - 1]
        q1 = _witness_k(fA, UA, kA, sA)
        q2 = _witness_k(fB, UB, kB, sB)
        kA = _feature_k(cA, prA, szA, VA, RA, tA, n, tol, fA, HA, UA, keyA)
        kB = _feature_k(cB, prB, szB, VB, RB, tB, -n, tol, fB, HB, UB, keyB)
        if kA < 0 or kB < 0 or kA + kB > 2:
            return False, n, 0.0, z3, z3
        if not (_same_key(keyA, kA0) and _same_key(keyB, kB0)):
            kA0, kB0 = keyA.copy(), keyB.copy()
            stable = 0
            sA = _slides_k(UA, kA, q1, fA)
            sB = _slides_k(UB, kB, q2, fB)
            continue
        stable += 1
        big = 0.0
        for i in range(sz):
            big = max(big, abs(dx[i]))
        if big <= 1e-15 * max(size, 1.0) and stable > 1:
            break
    q1 = _witness_k(fA, UA, kA, sA)
    q2 = _witness_k(fB, UB, kB, sB)
    big = 0.0
    for i in range(3):
        big = max(big, abs(q2[i] - q1[i] - d * n[i]))
    for k in range(kA + kB):
        u = UA[k] if k < kA else UB[k - kA]
        big = max(big, abs(u[0] * n[0] + u[1] * n[1] + u[2] * n[2]))
    if not np.isfinite(big) or big > 1e-12 * max(size, 1.0):
        return False, n, 0.0, z3, z3
    if not (_inside_k(cA, prA, szA, eqA, RA, tA, keyA, fA, q1)
            and _inside_k(cB, prB, szB, eqB, RB, tB, keyB, fB, q2)):
        return False, n, 0.0, z3, z3
    # a local maximum over the normals the features allow: (K + d I) positive on the tangents T
    # of n that keep n . u = 0
    M, E = _system_k(HA, UA, kA, HB, UB, kB, n, d)
    T = E
    if kA + kB:
        UE = M[3:, :2].copy()
        _, sv, Vt = np.linalg.svd(UE)
        rank = 0
        for k in range(sv.shape[0]):
            if sv[k] > 1e-12:
                rank += 1
        T = np.zeros((3, 2 - rank))
        for c in range(2 - rank):
            for i in range(3):
                T[i, c] = E[i, 0] * Vt[rank + c, 0] + E[i, 1] * Vt[rank + c, 1]
    nc = T.shape[1]
    if nc:
        K = HA + HB
        for i in range(3):
            K[i, i] += d
        S = np.zeros((nc, nc))
        for a in range(nc):
            for b in range(nc):
                s = 0.0
                for i in range(3):
                    for j in range(3):
                        s += T[i, a] * K[i, j] * T[j, b]
                S[a, b] = s
        if nc == 1:
            wmin = S[0, 0]
        else:
            hm = 0.5 * (S[0, 0] - S[1, 1])
            wmin = 0.5 * (S[0, 0] + S[1, 1]) - np.sqrt(hm * hm + 0.25 * (S[0, 1] + S[1, 0]) ** 2)
        if wmin <= 0.0:
            return False, n, 0.0, z3, z3
    if start_ok and agree:
        dn = 1.0 - (n[0] * n0[0] + n[1] * n0[1] + n[2] * n0[2])
        dm = 0.5 * (q1 + q2) - mid0
        d0 = n0[0] * (p2[0] - p1[0]) + n0[1] * (p2[1] - p1[1]) + n0[2] * (p2[2] - p1[2])
        if ((check_normal and dn > AGREE_COS)
                or np.sqrt(dm[0] ** 2 + dm[1] ** 2 + dm[2] ** 2) > AGREE_POS * size
                or abs(d - d0) > AGREE_POS * size):
            return False, n, 0.0, z3, z3
    return True, n, d, q1, q2


@njit
def _surface_normal_k(code, prm, size, R, t, p):
    """``surface_normal``'s kernel: (ok, m)."""
    x = np.empty(3)
    for i in range(3):
        x[i] = R[0, i] * (p[0] - t[0]) + R[1, i] * (p[1] - t[1]) + R[2, i] * (p[2] - t[2])
    g = np.zeros(3)
    if code == 0:
        g[:] = x
    elif code == 1:
        for i in range(3):
            g[i] = x[i] / prm[i] ** 2
    elif code == 2:
        g[:] = x
        g[2] = x[2] - min(max(x[2], -prm[1]), prm[1])
    elif code == 3:
        rho = np.hypot(x[0], x[1])
        side, cap = abs(rho - prm[0]), abs(abs(x[2]) - prm[1])
        if min(side, cap) > 1e-3 * size or abs(side - cap) < 1e-3 * size:
            return False, g
        if side < cap:
            g[0], g[1] = x[0], x[1]
        else:
            g[2] = np.sign(x[2])
    else:
        return False, g
    ng = np.sqrt(g[0] * g[0] + g[1] * g[1] + g[2] * g[2])
    if not ng > 0.0:
        return False, g
    g = g / ng
    out = np.empty(3)
    for i in range(3):
        out[i] = R[i, 0] * g[0] + R[i, 1] * g[1] + R[i, 2] * g[2]
    return True, out


@njit
def _solve_k(cA, prA, szA, VA, eqA, RA, tA, cB, prB, szB, VB, eqB, RB, tB, n, p1, p2, prev,
             has_prev, tols):
    """``solve``'s kernel: (ok, n, d, p1, p2, tol)."""
    z3 = np.zeros(3)
    starts = np.empty((14, 3))
    ns = 1
    starts[0] = n
    okA, mA = _surface_normal_k(cA, prA, szA, RA, tA, p1)
    if okA:
        starts[ns] = mA
        ns += 1
    okB, mB = _surface_normal_k(cB, prB, szB, RB, tB, p2)
    if okB:
        starts[ns] = -mB
        ns += 1
    reach = 10.0 * (szA + szB)
    fin = True
    for i in range(3):
        if not (np.isfinite(n[i]) and np.isfinite(p1[i]) and np.isfinite(p2[i])
                and np.isfinite(p2[i] - p1[i])):
            fin = False
    best_ok, best_n, best_d, best_1, best_2, best_tol = False, z3, 0.0, z3, z3, 0.0
    if not (fin and np.sqrt(np.sum((p1 - tA) ** 2)) < reach and np.sqrt(np.sum((p2 - tB) ** 2)) < reach):
        # the narrow phase failed: the largest verified local maximum of the separating
        # function from several starts (see ``solve``)
        ns = 0
        if has_prev:
            starts[0] = prev
            ns = 1
        c = tB - tA
        starts[ns] = c / np.sqrt(c[0] * c[0] + c[1] * c[1] + c[2] * c[2])
        ns += 1
        for R in (RA, RB):
            for i in range(3):
                for sg in (1.0, -1.0):
                    starts[ns] = sg * R[:, i]
                    ns += 1
        nan = np.full(3, np.nan)
        for tol in tols:
            for s in range(ns):
                ok, nn, d, q1, q2 = _solve_at_k(cA, prA, szA, VA, eqA, RA, tA, cB, prB, szB, VB,
                                                eqB, RB, tB, starts[s].copy(), nan, nan, tol,
                                                False, True)
                if ok and (not best_ok or d > best_d + 1e-12):
                    best_ok, best_n, best_d, best_1, best_2, best_tol = True, nn, d, q1, q2, tol
            if best_ok:
                break
        return best_ok, best_n, best_d, best_1, best_2, best_tol
    for tol in tols:
        ok, nn, d, q1, q2 = _solve_at_k(cA, prA, szA, VA, eqA, RA, tA, cB, prB, szB, VB, eqB, RB,
                                        tB, starts[0].copy(), p1, p2, tol, True, True)
        if ok:
            best_ok, best_n, best_d, best_1, best_2, best_tol = True, nn, d, q1, q2, tol
            break
    if best_ok and best_d > -DEEP * min(szA, szB) and (
            not has_prev or best_n[0] * prev[0] + best_n[1] * prev[1] + best_n[2] * prev[2] > np.cos(0.05)):
        return best_ok, best_n, best_d, best_1, best_2, best_tol
    if has_prev:
        starts[ns] = prev
        ns += 1
    for tol in tols:
        for s in range(1, ns):
            ok, nn, d, q1, q2 = _solve_at_k(cA, prA, szA, VA, eqA, RA, tA, cB, prB, szB, VB, eqB,
                                            RB, tB, starts[s].copy(), p1, p2, tol, False, False)
            if ok and (not best_ok or d > best_d + 1e-12):
                best_ok, best_n, best_d, best_1, best_2, best_tol = True, nn, d, q1, q2, tol
    return best_ok, best_n, best_d, best_1, best_2, best_tol
