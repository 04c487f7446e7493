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

Configurations outside this description return None (the caller keeps coal's output and its
finite-difference fallback): a face against a face or an edge parallel to it (a contact patch),
parallel edges, features that the tolerances cannot decide, a swept-sphere radius.
"""
from __future__ import annotations

import coal
import numpy as np

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


def _cross(a, b):
    return np.array([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


def _tangent(n):
    """(3, 2) orthonormal basis of the plane normal to the unit vector n."""
    e1 = np.array([0.0, -n[2], n[1]]) if abs(n[0]) < 0.9 else np.array([n[2], 0.0, -n[0]])
    e1 /= np.sqrt(e1 @ e1)
    E = np.empty((3, 2))
    E[:, 0] = e1
    E[:, 1] = _cross(n, e1)
    return E


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


class Feature:
    """Support feature of a placed shape along the outward direction m: smooth point f, world
    Hessian H, free directions U (k, 3) and an extent test for a witness on it."""

    __slots__ = ("f", "H", "U", "key", "inside")

    def __init__(self, f, H, U, key, inside):
        self.f, self.H, self.U, self.key, self.inside = f, H, U, key, inside


def feature(shape: Shape, R, t, m, tol=FEATURE_TOL):
    """The support feature of ``shape`` placed at (R, t) along the unit direction m, or None."""
    k = shape.kind
    Z = np.zeros((0, 3))
    if not np.all(np.isfinite(m)):
        return None
    if k == "sphere":
        return Feature(t + shape.r * m, shape.r * (np.eye(3) - np.outer(m, m)), Z, ("p",),
                       lambda p: True)
    if k == "ellipsoid":
        E = (R * shape.radii ** 2) @ R.T
        y = E @ m
        s = float(np.sqrt(m @ y))
        return Feature(t + y / s, E / s - np.outer(y, y) / s ** 3, Z, ("p",), lambda p: True)
    if k in ("capsule", "cylinder"):
        a = R[:, 2]
        am = float(a @ m)
        e = m - am * a
        ne = float(np.linalg.norm(e))
        r, h = shape.r, shape.h
        if k == "capsule":
            H = r * (np.eye(3) - np.outer(m, m))
            if abs(am) * h > tol * shape.size:
                return Feature(t + np.sign(am) * h * a + r * m, H, Z, ("end", np.sign(am)),
                               lambda p: True)
            return Feature(t + r * m, H, a[None], ("side",),
                           lambda p: abs(a @ (p - t)) <= h * (1 + 1e-9))
        if ne < tol:                                   # a cap face
            c = t + np.sign(am) * h * a
            return Feature(c, np.zeros((3, 3)), np.stack([R[:, 0], R[:, 1]]), ("cap", np.sign(am)),
                           lambda p: np.linalg.norm(p - c - a * (a @ (p - c))) <= r * (1 + 1e-9))
        u = e / ne
        H = r * (np.eye(3) - np.outer(a, a) - np.outer(u, u)) / ne
        if abs(am) < tol:                              # the side line
            return Feature(t + r * u, H, a[None], ("side",),
                           lambda p: abs(a @ (p - t)) <= h * (1 + 1e-9))
        return Feature(t + np.sign(am) * h * a + r * u, H, Z, ("rim", np.sign(am)), lambda p: True)
    if k == "polytope":
        X = shape.V @ R.T + t
        hx = X @ m
        S = np.flatnonzero(hx.max() - hx <= tol * max(shape.size, 1e-300))
        P = X[S]
        if len(S) == 1:
            return Feature(P[0], np.zeros((3, 3)), Z, ("v", int(S[0])), lambda p: True)
        D = P[1:] - P[0]
        _, sv, Vt = np.linalg.svd(D, full_matrices=False)
        rank = int(np.sum(sv > 1e-9 * max(shape.size, 1e-300)))
        _, _, eq = face_planes(shape)
        tol_in = 1e-9 * max(shape.size, 1e-300)

        def inside(p, R=R, t=t, eq=eq):
            # on the support plane, a point of the polytope is a point of its support feature
            x = R.T @ (p - t)
            return bool(np.all(eq[:, :3] @ x + eq[:, 3] <= tol_in))
        if rank == 1:
            return Feature(P[0], np.zeros((3, 3)), Vt[0][None], ("e",) + tuple(S.tolist()), inside)
        if rank == 2:
            return Feature(P[0], np.zeros((3, 3)), Vt[:2], ("f",) + tuple(S.tolist()), inside)
        return None
    return None


def _system(FA, FB, n, d):
    """The square matrix M of the conditions' linearization (see the module docstring) and the
    tangent basis E: unknowns (dn in E (2), ds (kA), dt (kB), dd)."""
    E = _tangent(n)
    kA, kB = len(FA.U), len(FB.U)
    m = 3 + kA + kB
    M = np.zeros((m, m))
    K = FA.H + FB.H + d * np.eye(3)
    M[:3, :2] = K @ E
    if kA:
        M[:3, 2:2 + kA] = FA.U.T
    if kB:
        M[:3, 2 + kA:2 + kA + kB] = -FB.U.T
    M[:3, -1] = n
    U = np.concatenate([FA.U, FB.U])
    M[3:, :2] = U @ E
    return M, E, U


class _Side:
    def __init__(self, shape, R, t):
        self.shape, self.R, self.t = shape, R, t


def _witnesses(FA, FB, sA, sB):
    p1 = FA.f + (sA @ FA.U if len(FA.U) else 0.0)
    p2 = FB.f + (sB @ FB.U if len(FB.U) else 0.0)
    return p1, p2


def surface_normal(shape: Shape, R, t, p):
    """Outward unit normal of a smooth shape's surface at (near) its point p, or None where the
    shape has no unique normal there (polytopes, a cylinder's rim)."""
    x = R.T @ (p - t)
    if shape.kind == "sphere":
        g = x
    elif shape.kind == "ellipsoid":
        g = x / shape.radii ** 2
    elif shape.kind == "capsule":
        g = x - np.array([0.0, 0.0, min(max(x[2], -shape.h), shape.h)])
    elif shape.kind == "cylinder":
        rho = float(np.hypot(x[0], x[1]))
        side, cap = abs(rho - shape.r), abs(abs(x[2]) - shape.h)
        if min(side, cap) > 1e-3 * shape.size or abs(side - cap) < 1e-3 * shape.size:
            return None
        g = np.array([x[0], x[1], 0.0]) if side < cap else np.array([0.0, 0.0, np.sign(x[2])])
    else:
        return None
    ng = float(np.linalg.norm(g))
    return R @ (g / ng) if ng > 0.0 else None


def solve(shapeA, RA, tA, shapeB, RB, tB, n, p1, p2, previous=None):
    """``solve_at`` with the feature tolerances of TOLERANCES in turn (the first that gives a
    verified optimum), started from the narrow phase's normal, then (where that one is poor:
    coal's EPA normal of two barely penetrating ellipsoids can be off by 0.5 rad while its
    witness points are right) from the surface normals at its witness points: (n, d, p1, p2,
    tol) or None. ``previous``: the pair's normal at the previous call (a start where the
    narrow phase failed)."""
    p1, p2 = np.asarray(p1, float), np.asarray(p2, float)
    starts = [(np.asarray(n, float), True)]
    mA, mB = surface_normal(shapeA, RA, tA, p1), surface_normal(shapeB, RB, tB, p2)
    if mA is not None:
        starts.append((mA, False))
    if mB is not None:
        starts.append((-mB, False))
    reach = 10.0 * (shapeA.size + shapeB.size)
    if not (np.all(np.isfinite(np.concatenate([n, p1, p2, p2 - p1])))
            and np.linalg.norm(p1 - tA) < reach and np.linalg.norm(p2 - tB) < reach):
        # the narrow phase failed (coal's EPA returns witness points of 1e307 now and then):
        # nothing to agree with; the signed distance is the largest value of the separating
        # function, so the largest verified local maximum from several starts (the previous
        # normal, the direction between the centres, the axes of both bodies) is the answer
        c = tB - tA
        starts = [c / np.linalg.norm(c)] + [sg * R[:, i] for R in (RA, RB) for i in range(3)
                                            for sg in (1.0, -1.0)]
        if previous is not None:
            starts.insert(0, previous)
        nan = np.full(3, np.nan)
        best = None
        for tol in TOLERANCES:
            for m in starts:
                out = solve_at(shapeA, RA, tA, shapeB, RB, tB, m, nan, nan, tol, False)
                if out is not None and (best is None or out[1] > best[1] + 1e-12):
                    best = out[:4] + (tol,)
            if best is not None:
                return best
        return None
    best = None
    for tol in TOLERANCES:
        out = solve_at(shapeA, RA, tA, shapeB, RB, tB, starts[0][0], p1, p2, tol, True)
        if out is not None:
            best = out[:4] + (tol,)
            break
    # coal's EPA also stops at another local maximum of the separating function now and then
    # (an ellipsoid resting on a flat ellipsoid got the normal through the far side, a depth of
    # 0.25 m, and was pushed through): where the answer is deep, new, or missing, the other
    # starts (the previous normal, the surface normals at coal's witnesses) run as well and the
    # largest verified value, the signed distance by definition, is kept
    if best is not None and best[1] > -DEEP * min(shapeA.size, shapeB.size) and (
            previous is None or float(best[0] @ previous) > np.cos(0.05)):
        return best
    others = [m for m, _ in starts[1:]] + ([previous] if previous is not None else [])
    for tol in TOLERANCES:
        for m in others:
            out = solve_at(shapeA, RA, tA, shapeB, RB, tB, m, p1, p2, tol, False, False)
            if out is not None and (best is None or out[1] > best[1] + 1e-12):
                best = out[:4] + (tol,)
    return best


def solve_at(shapeA, RA, tA, shapeB, RB, tB, n, p1, p2, tol, check_normal=True, agree=True):
    """Refine the witness points p1 (on A), p2 (on B) and the normal n (A to B) of a single
    point contact to the exact optimum; returns (n, d, p1, p2, FA, FB) or None where the
    configuration is not one this module describes or the refinement does not agree with the
    starting point."""
    if not (shapeA.ok and shapeB.ok):
        return None
    n = np.asarray(n, float) / np.linalg.norm(n)
    n0, mid0 = n.copy(), 0.5 * (p1 + p2)
    size = max(shapeA.size, shapeB.size)
    FA, FB = feature(shapeA, RA, tA, n, tol), feature(shapeB, RB, tB, -n, tol)
    if FA is None or FB is None or len(FA.U) + len(FB.U) > 2:
        return None
    keys = (FA.key, FB.key)
    start_ok = bool(np.all(np.isfinite(p1)) and np.all(np.isfinite(p2)))
    if start_ok:
        sA = FA.U @ (p1 - FA.f) if len(FA.U) else np.zeros(0)
        sB = FB.U @ (p2 - FB.f) if len(FB.U) else np.zeros(0)
        d = float(n @ (p2 - p1))
    else:
        sA, sB = np.zeros(len(FA.U)), np.zeros(len(FB.U))
        d = float(n @ (FB.f - FA.f))
    stable = 0
    for it in range(NEWTON_ITERS):
        q1, q2 = _witnesses(FA, FB, sA, sB)
        U = np.concatenate([FA.U, FB.U])
        res = np.concatenate([q2 - q1 - d * n, -(U @ n)])     # (M x = -r in M's signs)
        M, E, _ = _system(FA, FB, n, d)
        try:
            dx = np.linalg.solve(M, res)
        except np.linalg.LinAlgError:
            return None
        kA = len(FA.U)
        if not np.all(np.isfinite(dx)):
            return None
        turn = float(np.linalg.norm(dx[:2]))
        if turn > MAX_TURN:                     # (far from the optimum: a damped step)
            dx = dx * (MAX_TURN / turn)
            stable = -1
        n = n + E @ dx[:2]
        n /= np.linalg.norm(n)
        sA = sA + dx[2:2 + kA]
        sB = sB + dx[2 + kA:-1]
        d = d + dx[-1]
        q1, q2 = _witnesses(FA, FB, sA, sB)
        FA, FB = feature(shapeA, RA, tA, n, tol), feature(shapeB, RB, tB, -n, tol)
        if FA is None or FB is None or len(FA.U) + len(FB.U) > 2:
            return None
        if (FA.key, FB.key) != keys:
            # another feature pair: continue from the current witnesses on the new features
            keys, stable = (FA.key, FB.key), 0
            sA = FA.U @ (q1 - FA.f) if len(FA.U) else np.zeros(0)
            sB = FB.U @ (q2 - FB.f) if len(FB.U) else np.zeros(0)
            continue
        stable += 1
        if np.abs(dx).max() <= 1e-15 * max(size, 1.0) and stable > 1:
            break
    q1, q2 = _witnesses(FA, FB, sA, sB)
    res = np.concatenate([q2 - q1 - d * n, np.concatenate([FA.U, FB.U]) @ n])
    if not np.all(np.isfinite(res)) or np.abs(res).max() > 1e-12 * max(size, 1.0):
        return None
    # the answer is the optimum of this feature pair: the witnesses on the features, agreeing
    # with the narrow phase's
    if not (FA.inside(q1) and FB.inside(q2)):
        return None
    # a local maximum of f over the normals the features allow (penetrating pairs: not a
    # saddle of the separating function): (K + d I) positive on the tangents that keep n . u = 0
    M, E, U = _system(FA, FB, n, d)
    T = E
    if len(U):
        _, sv, Vt = np.linalg.svd(U @ E)
        T = E @ Vt[int(np.sum(sv > 1e-12)):].T
    if T.shape[1]:
        w = np.linalg.eigvalsh(T.T @ (FA.H + FB.H + d * np.eye(3)) @ T)
        if w.min() <= 0.0:
            return None
    if start_ok and agree and ((check_normal and 1.0 - float(n @ n0) > AGREE_COS)
                     or np.linalg.norm(0.5 * (q1 + q2) - mid0) > AGREE_POS * size
                     or abs(d - float(n0 @ (p2 - p1))) > AGREE_POS * size):
        return None
    return n, float(d), q1, q2, FA, FB


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
FACE_ID_BASE = 1000


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
            return None
    else:
        others = np.flatnonzero(np.abs(eq[:, :3] @ N[bi] - 1.0) > 1e-9)
        if np.any(loc @ eq[others, :3].T + eq[others, 3] > -tol):
            return None
    return n, bi, x[sel], height[sel], ids[sel], kinds[sel], best


def face_derivatives(shapeO, RO, tO, n, kind, x, d, JF, oF, JO, oO, centre=None, radius=0.0):
    """(dp, dn, dd) of one point of a face contact: x the witness on O (its kind: 0 body-fixed,
    1 a capsule end, 2 a tilted cylinder's lowest rim point, 3 a capsule's axis crossing the rim
    circle of the cap (``centre``, ``radius``)), d its height above F's face plane,
    n the face normal (out of F; turns with F: dn = w_F x n); p = x - d n on the face moves with
    F: dd = n . (dx - dX_F(p)), dp = dx - n dd - d dn. J, o: joint Jacobians (6, nv, zeros for
    the world) and origins of F's and O's bodies."""
    WF, WO = JF[3:], JO[3:]
    Dn = -_skew(n) @ WF
    if kind == 3:
        # a capsule's lowered axis crossing the rim circle of a cap (centre, radius): x = A +
        # s u - r n with |T (A + s u - c)| = radius, T = I - n n^T; s by implicit differentiation
        a = RO[:, 2]
        u = 2.0 * shapeO.h * a
        A = tO - shapeO.h * a
        sv = float(u @ (x + shapeO.r * n - A)) / float(u @ u)
        y = A + sv * u - centre
        w = y - (n @ y) * n
        dA = JO[:3] - _skew(A - oO) @ WO
        du = -_skew(u) @ WO
        dc = JF[:3] - _skew(centre - oF) @ WF
        ds = ((w @ Dn) * (n @ y) - w @ (dA + sv * du - dc)) / float(w @ u)
        dx = dA + sv * du + np.outer(u, ds) - shapeO.r * Dn
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
