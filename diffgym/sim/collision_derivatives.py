"""Closed-form derivatives of contact geometry between polytopes (boxes, convex meshes), a
capsule against a polytope (its axis segment with a radius), and two capsules.

What is differentiated is the collision output as ``collision_driver.detect`` produces it: for
a pair A (geom 1), B (geom 2) one normal ``n`` (from A to B), a signed distance ``d``, and
either a single point, the midpoint of the two witness points of GJK/EPA, or the vertices of a
contact patch (coal's ``ContactPatchSolver``: the support sets of A along ``n`` and of B along
``-n``, taken with the patch tolerance, projected on the plane through the witness midpoint
normal to ``n``, and clipped against each other, Sutherland-Hodgman). For box-box and
box-capsule pairs the driver snaps ``n`` and ``d`` to the separating axis (``snap_pair``) and
gives each patch point its own distance (``_k_world_patch_distances``); otherwise the patch shares coal's.

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
  parameters by their orthogonality conditions, clamped ones at the body-fixed ends. Axes lying
  along each other (a line contact) are the driver's 2-point patch (``capsule_line_patch``):
  each point an axis end of one capsule against its closest point on the other's segment
  (``capsule_end_rows``).
* the separating-axis snap of a separated pair whose closest features do not lie across the
  axis (a corner beyond the face it faces, a capsule end beyond a box edge) is the exact
  direction between the closest points of the near-support sets (``_k_snap_pair``): a vertex
  against an edge or a vertex, which the single-point features above describe.

Everything is a 3 x nv (or nv) array of derivatives with respect to the tangent of q, chained
with the body Jacobians (``derivatives._Kin``).

The polytope analysis is compiled (numba, ``jit.njit``; the ``_k_*`` kernels, plain Python with
``DIFFGYM_JIT=0``): ``polytope_pairs`` gathers every polytope pair of a step (local vertices,
placements, coal's normal and distance, the joint Jacobians) into arrays and makes one call of
``polytope_pairs_kernel``, which writes dp, dn, dd of the rows in place and a status per row
(``_REASONS``). The narrow phase's separating-axis snap (``snap_pair``) and per-point patch
distances (``_k_patch_distances``) share its feature solve. Where a configuration is degenerate in a way
these features do not cover (parallel edges or axes, a rank the tolerances cannot decide, a
point that matches no candidate) the functions return the rows they could not do and the caller
uses the finite-difference fallback for them, which it counts and reports.
"""
from __future__ import annotations

import coal
import numpy as np

from .jit import njit

# point ids of the margin rows of a polytope pair (collision_kernels.poly_margin_rows): a
# vertex i of geom 1 over a face of geom 2 is MARGIN_VERTEX_ID + i, the point where its edge to
# vertex o leaves the face MARGIN_VERTEX_ID + 1000 (1 + i) + o; a point of geom 2 over a face of
# geom 1 adds MARGIN_SIDE (stable from step to step: the warm start)
MARGIN_VERTEX_ID = 3_000_000
MARGIN_SIDE = 500_000

# exact support sets: vertices within this fraction of the pair's size of the support plane
SUPPORT_TOL = 1e-8
# a contact point matches a patch candidate within this fraction of the pair's size
MATCH_TOL = 1e-7
# coal's default contact patch tolerance (ContactPatchRequest), the thickness of a support set
PATCH_TOL = 1e-3

POLYTOPE_KINDS = ("box", "mesh")

_BOX_SIGNS = np.array([[sx, sy, sz] for sx in (-1.0, 1.0) for sy in (-1.0, 1.0) for sz in (-1.0, 1.0)])


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
    """A capsule's radius (0 for other shapes), cached on the simulator."""
    cache = sim.__dict__.setdefault("_polytope_radius", {})
    r = cache.get(g)
    if r is None:
        shape = sim.geom_model.geometryObjects[g].geometry
        r = cache[g] = float(shape.radius) if isinstance(shape, coal.Capsule) else 0.0
    return r


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
    ok, m, f, c = _k_snap_pair(np.ascontiguousarray(XA, dtype=float), float(radA),
                               np.ascontiguousarray(FA, dtype=float).reshape(-1, 3),
                               np.ascontiguousarray(EA, dtype=float).reshape(-1, 3),
                               np.ascontiguousarray(XB, dtype=float), float(radB),
                               np.ascontiguousarray(FB, dtype=float).reshape(-1, 3),
                               np.ascontiguousarray(EB, dtype=float).reshape(-1, 3),
                               np.ascontiguousarray(n, dtype=float), float(d), float(tol))
    return (m, f, c) if ok else None


def _patch_tol(sim, pair: int) -> float:
    try:
        return float(sim.geom_data.contactPatchRequests[pair].getPatchTolerance())
    except Exception:       # noqa: BLE001 - an older binding: coal's default
        return PATCH_TOL


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


# -- compiled kernel of polytope_pair ------------------------------------------------------------
# status codes of the rows the kernel could not do (the caller's finite-difference fallback)
_REASONS = {1: "features undecided", 2: "single point: features undecided",
            3: "single point: no match", 4: "parallel segments", 5: "patch point: no match",
            6: "degenerate (singular or not finite)"}


@njit
def _k_cross(a, b):
    out = np.empty(3)
    out[0] = a[1] * b[2] - a[2] * b[1]
    out[1] = a[2] * b[0] - a[0] * b[2]
    out[2] = a[0] * b[1] - a[1] * b[0]
    return out


@njit
def _k_crossD(x, D):
    """x x D column by column (skew(x) @ D) for D (3, nv)."""
    nv = D.shape[1]
    out = np.empty((3, nv))
    for k in range(nv):
        out[0, k] = x[1] * D[2, k] - x[2] * D[1, k]
        out[1, k] = x[2] * D[0, k] - x[0] * D[2, k]
        out[2, k] = x[0] * D[1, k] - x[1] * D[0, k]
    return out


@njit
def _k_vD(v, D):
    """v^T D (nv,) for D (3, nv)."""
    return v[0] * D[0] + v[1] * D[1] + v[2] * D[2]


@njit
def _k_outer(u, r):
    out = np.empty((3, r.shape[0]))
    for i in range(3):
        out[i] = u[i] * r
    return out


@njit
def _k_pj(J, o, p):
    """Jacobian (3, nv) of the world point p fixed on the body of joint Jacobian J (6, nv,
    LOCAL_WORLD_ALIGNED) and origin o: J_lin - (p - o) x J_ang."""
    r = p - o
    return J[:3] - _k_crossD(r, J[3:])


@njit
def _k_turn(J, u):
    """d u (3, nv) of a body-fixed direction u: w x u."""
    return -_k_crossD(u, J[3:])


@njit
def _k_svd3(D):
    """Singular values (descending) and right singular vectors (rows of Vt, in the same order)
    of D (k, 3), as ``np.linalg.svd(D, full_matrices=False)[1:]`` for k >= 3 (for k < 3 the
    trailing values are zeros): one-sided Jacobi (Hestenes) on the three columns, which gives
    the small singular values to full relative accuracy, without LAPACK's call and workspace
    (the singular vectors of equal singular values may be another basis of their space)."""
    k = D.shape[0]
    A = D.copy()
    V = np.eye(3)
    for _sweep in range(60):
        rotated = False
        for p in range(2):
            for q in range(p + 1, 3):
                alpha = beta = gamma = 0.0
                for i in range(k):
                    alpha += A[i, p] * A[i, p]
                    beta += A[i, q] * A[i, q]
                    gamma += A[i, p] * A[i, q]
                if gamma == 0.0 or abs(gamma) <= 1e-16 * np.sqrt(alpha * beta):
                    continue
                rotated = True
                zeta = (beta - alpha) / (2.0 * gamma)
                t = (1.0 if zeta >= 0.0 else -1.0) / (abs(zeta) + np.sqrt(1.0 + zeta * zeta))
                c = 1.0 / np.sqrt(1.0 + t * t)
                s = c * t
                for i in range(k):
                    ap, aq = A[i, p], A[i, q]
                    A[i, p], A[i, q] = c * ap - s * aq, s * ap + c * aq
                for i in range(3):
                    vp, vq = V[i, p], V[i, q]
                    V[i, p], V[i, q] = c * vp - s * vq, s * vp + c * vq
        if not rotated:
            break
    sv = np.empty(3)
    for j in range(3):
        acc = 0.0
        for i in range(k):
            acc += A[i, j] * A[i, j]
        sv[j] = np.sqrt(acc)
    order = np.argsort(-sv)
    s_out = np.empty(3)
    Vt = np.empty((3, 3))
    for r in range(3):
        s_out[r] = sv[order[r]]
        for i in range(3):
            Vt[r, i] = V[i, order[r]]
    return s_out, Vt


@njit
def _k_affine(P, tol):
    """Affine rank (0..3) of the points P (k, 3) and an orthonormal basis (r, 3) of their
    directions (the singular vectors of P[1:] - P[0] above tol)."""
    k = P.shape[0]
    if k < 2:
        return 0, np.zeros((0, 3))
    D = np.ascontiguousarray(P[1:] - P[0])
    s, Vt = _k_svd3(D)
    r = 0
    for i in range(s.shape[0]):
        if s[i] > tol:
            r += 1
    return r, np.ascontiguousarray(Vt[:r])


@njit
def _k_area(P):
    """Product of the two largest singular values of the centred points P (k, 3): ranks two
    faces in contact against each other (proportional to a rectangle's area)."""
    if P.shape[0] < 3:
        return 0.0
    Q = np.ascontiguousarray(P - P.sum(axis=0) / P.shape[0])
    s, _ = _k_svd3(Q)
    return s[0] * s[1]


@njit
def _k_hull2(P2):
    """Indices of the 2-D convex hull of P2 (k, 2), counter-clockwise (monotone chain, points
    sorted by x then y, stable); two indices for collinear points."""
    k = P2.shape[0]
    if k <= 2:
        return np.arange(k)
    order = np.arange(k)
    for i in range(1, k):                          # stable insertion sort by (x, y)
        j = i
        while j > 0:
            a, b = order[j - 1], order[j]
            if P2[a, 0] > P2[b, 0] or (P2[a, 0] == P2[b, 0] and P2[a, 1] > P2[b, 1]):
                order[j - 1], order[j] = b, a
                j -= 1
            else:
                break
    out = np.empty(2 * k + 2, dtype=np.int64)
    m = 0
    for sweep in range(2):
        start = m
        for ii in range(k):
            i = order[ii] if sweep == 0 else order[k - 1 - ii]
            while m - start >= 2:
                o, a = out[m - 2], out[m - 1]
                cr = (P2[a, 0] - P2[o, 0]) * (P2[i, 1] - P2[o, 1]) \
                    - (P2[a, 1] - P2[o, 1]) * (P2[i, 0] - P2[o, 0])
                if cr <= 0.0:
                    m -= 1
                else:
                    break
            out[m] = i
            m += 1
        m -= 1                                     # (the last point starts the other chain)
    if m >= 2:
        return out[:m].copy()
    res = np.empty(2, dtype=np.int64)
    res[0], res[1] = order[0], order[k - 1]
    return res


@njit
def _k_parallel(uA, uB):
    c = _k_cross(uA, uB)
    return np.sqrt(c @ c) <= 1e-6 * np.sqrt(uA @ uA) * np.sqrt(uB @ uB)


@njit
def _k_plane_axes(n):
    h = np.zeros(3)
    if abs(n[0]) < 0.9:
        h[0] = 1.0
    else:
        h[1] = 1.0
    e1 = _k_cross(n, h)
    e1 /= np.sqrt(e1 @ e1)
    return e1, _k_cross(n, e1)


@njit
def _k_side(h, m, i, s):
    """Distance of the plane point s from the line of hull edge i, positive inside."""
    j = (i + 1) % m
    d0, d1 = h[j, 0] - h[i, 0], h[j, 1] - h[i, 1]
    return (d0 * (s[1] - h[i, 1]) - d1 * (s[0] - h[i, 0])) / np.sqrt(d0 * d0 + d1 * d1)


@njit
def _k_edge_across_face(PA, PB, rA, rB, n, L, out):
    """An edge (support set of affine rank 1: a box edge, a capsule's axis) lying on a face
    (rank 2) of the other body: fills out (4, 3) with (point, direction) of a line of A and of
    a line of B and returns True when the separating axis near this pose is the cross product
    of the edge with face edges, else False.

    The separating distance is the largest height of the edge over the face (relative to the
    face plane) over the part of the edge that lies over the face. Where both ends of the edge
    lie over the face, that is an end of the edge and the axis is the face normal (it turns
    with the face). Where the edge runs out over the face's boundary at both ends (a rod
    longer than the box face it is flush against), it is a crossing of the edge with a face
    edge, so the axis is the cross product of the two edge directions (it turns with both
    bodies); when the two crossed face edges are parallel (a rectangular face) this holds for
    every perturbation, otherwise (or with one end over the face) the axis has a kink there and
    the face normal, one of its one-sided values, is kept."""
    if not ((rA == 1 and rB == 2) or (rA == 2 and rB == 1)):
        return False
    E, F = (PA, PB) if rA == 1 else (PB, PA)
    e1, e2 = _k_plane_axes(n)
    P2 = np.empty((F.shape[0], 2))
    for i in range(F.shape[0]):
        P2[i, 0], P2[i, 1] = F[i] @ e1, F[i] @ e2
    hull = _k_hull2(P2)
    m = hull.shape[0]
    if m < 3:
        return False
    h = np.empty((m, 2))
    for i in range(m):
        h[i] = P2[hull[i]]
    # the edge's end points (its extreme points along its direction)
    u = E[E.shape[0] - 1] - E[0]
    i0 = i1 = 0
    t0 = t1 = 0.0
    for i in range(E.shape[0]):
        t = (E[i] - E[0]) @ u
        if i == 0 or t < t0:
            i0, t0 = i, t
        if i == 0 or t > t1:
            i1, t1 = i, t
    a0, a1 = E[i0], E[i1]
    s0 = np.array([a0 @ e1, a0 @ e2])
    s1 = np.array([a1 @ e1, a1 @ e2])
    eps = 1e-7 * L
    min0 = min1 = np.inf
    for i in range(m):
        min0 = min(min0, _k_side(h, m, i, s0))
        min1 = min(min1, _k_side(h, m, i, s1))
    if min0 >= -eps or min1 >= -eps:
        return False                      # an end of the edge over the face: the face normal
    first = -1
    ncross = 0
    dir0 = np.zeros(3)
    for i in range(m):
        o0, o1 = _k_side(h, m, i, s0), _k_side(h, m, i, s1)
        if (o0 < -eps and o1 > eps) or (o0 > eps and o1 < -eps):
            x = s0 + o0 / (o0 - o1) * (s1 - s0)
            j = (i + 1) % m
            d = h[j] - h[i]
            tt = ((x - h[i]) @ d) / (d @ d)
            if -1e-9 <= tt <= 1.0 + 1e-9:
                dv = F[hull[j]] - F[hull[i]]
                if ncross == 0:
                    first = i
                    dir0 = dv
                elif not _k_parallel(dir0, dv):
                    return False
                ncross += 1
    if ncross < 2:
        return False
    ue = (a1 - a0) / np.sqrt((a1 - a0) @ (a1 - a0))
    uf = dir0 / np.sqrt(dir0 @ dir0)
    if _k_parallel(ue, uf):
        return False
    f0 = F[hull[first]]
    if rA == 1:
        out[0], out[1], out[2], out[3] = a0, ue, f0, uf
    else:
        out[0], out[1], out[2], out[3] = f0, uf, a0, ue
    return True


@njit
def _k_line_points(a0, uA, b0, uB):
    """Closest points of the lines a0 + s uA and b0 + t uB (not parallel)."""
    w0 = a0 - b0
    a, b, c = uA @ uA, uA @ uB, uB @ uB
    d, e = uA @ w0, uB @ w0
    den = a * c - b * b
    s = (b * e - c * d) / den
    t = (a * e - b * d) / den
    return a0 + s * uA, b0 + t * uB


@njit
def _k_edges_normal(uA, uB, n, JA, JB):
    """dn (3, nv) of the normal along uA x uB (two edges turning with their bodies)."""
    cr = _k_cross(uA, uB)
    ncr = np.sqrt(cr @ cr)
    s = 1.0 if cr @ n >= 0.0 else -1.0
    dcr = -_k_crossD(uB, _k_turn(JA, uA)) + _k_crossD(uA, _k_turn(JB, uB))
    return s * (dcr - _k_outer(n, _k_vD(n, dcr))) / ncr


@njit
def _k_feature_row(P, n, L):
    """The support feature spanned by the points P (k, 3) (a vertex, an edge line, a face
    plane: origin P[0], orthonormal basis U (r <= 2)) and the last row of the least-squares
    inverse of M = [U^T, -n]: the offset s along n from a patch point p to the feature point
    p + s n is row . (p - origin). ok False where M^T M is singular."""
    r, U = _k_affine(P, 1e-7 * L)
    r = min(r, 2)
    q = r + 1
    M = np.empty((3, q))
    for i in range(r):
        M[:, i] = U[i]
    M[:, r] = -n
    G = M.T @ M
    # last row of inv(G) (G symmetric): solve G z = e_last, Gauss with partial pivoting
    z = np.zeros(q)
    z[q - 1] = 1.0
    ok = True
    for col in range(q):
        piv = col
        for i in range(col + 1, q):
            if abs(G[i, col]) > abs(G[piv, col]):
                piv = i
        if G[piv, col] == 0.0:
            ok = False
            break
        if piv != col:
            for j in range(q):
                G[col, j], G[piv, j] = G[piv, j], G[col, j]
            z[col], z[piv] = z[piv], z[col]
        for i in range(col + 1, q):
            f = G[i, col] / G[col, col]
            for j in range(col, q):
                G[i, j] -= f * G[col, j]
            z[i] -= f * z[col]
    if ok:
        for col in range(q - 1, -1, -1):
            acc = z[col]
            for j in range(col + 1, q):
                acc -= G[col, j] * z[j]
            z[col] = acc / G[col, col]
    return P[0].copy(), M @ z, ok


@njit
def _k_support_span(XA, XB, axis):
    """(top, bot): the highest of A's vertices ``XA`` and the lowest of B's ``XB`` along
    ``axis``."""
    top = -np.inf
    for a in range(XA.shape[0]):
        top = max(top, axis @ XA[a])
    bot = np.inf
    for b in range(XB.shape[0]):
        bot = min(bot, axis @ XB[b])
    return top, bot


@njit
def _k_rows_of(X, h, top, tol, above):
    """Indices of the rows of X whose height h is within tol of the support plane top (A:
    above=True, the largest h) or bottom (B)."""
    k = 0
    idx = np.empty(X.shape[0], dtype=np.int64)
    for i in range(X.shape[0]):
        if (top - h[i] < tol) if above else (h[i] - top < tol):
            idx[k] = i
            k += 1
    return idx[:k].copy()


@njit(inline="always")
def _k_plane_point(x, w, n, c0, out):
    """``out = P - (P @ n - c0) * n`` with ``P = x + w`` (3-vectors), element by element as
    numpy computes the vector expression (the dot product in ddot's order)."""
    p0 = x[0] + w[0]
    p1 = x[1] + w[1]
    p2 = x[2] + w[2]
    h = (p0 * n[0] + p1 * n[1] + p2 * n[2]) - c0
    out[0] = p0 - h * n[0]
    out[1] = p1 - h * n[1]
    out[2] = p2 - h * n[2]


@njit
def _k_polytope_pair(X, Y, n, d, radA, radB, per_point, ptol, JA, oA, JB, oB, rows, pos,
                     dp, dn, dd, status):
    """polytope_pair for one pair: world vertices X (kA, 3) of A and Y (kB, 3) of B (a
    capsule: its axis ends, with its radius), coal's normal n and distance d, the joint
    Jacobians J (6, nv) and origins o of the two bodies; writes dp, dn, dd of the contact rows
    and status[i] = 0 for rows[i] done, else the code of the reason (``_REASONS``)."""
    nv = JA.shape[1]
    nr = rows.shape[0]
    L = 1e-9
    for V in (X, Y):
        for ax in range(3):
            L = max(L, V[:, ax].max() - V[:, ax].min())
    hA, hB = X @ n, Y @ n
    hAmax, hBmin = hA.max(), hB.min()
    HA, HB = hAmax + radA, hBmin - radB                 # the support planes
    if per_point:                 # the pair's separating distance: the separating-axis value
        d = HB - HA
    dc = d + radA + radB                                # between the cores (axes)
    tol = SUPPORT_TOL * L
    SA, SB = _k_rows_of(X, hA, hAmax, tol, True), _k_rows_of(Y, hB, hBmin, tol, False)
    XS, YS = X[SA], Y[SB]
    rA, UA = _k_affine(XS, 1e-7 * L)
    rB, UB = _k_affine(YS, 1e-7 * L)
    xs, ys = XS[0].copy(), YS[0].copy()
    two_edges = rA == 1 and rB == 1
    if two_edges:
        cu = _k_cross(UA[0], UB[0])
        two_edges = np.sqrt(cu @ cu) > 1e-6
    lines = np.empty((4, 3))
    across = _k_edge_across_face(XS, YS, rA, rB, n, L, lines)
    # -- the normal -------------------------------------------------------------------------
    # witness points xw on A, yw on B (yw - xw = d n), for dd = n . (dyw - dxw)
    if across:
        xw, yw = _k_line_points(lines[0], lines[1], lines[2], lines[3])
        Dn = _k_edges_normal(lines[1], lines[3], n, JA, JB)
    elif rA == 2 and (rB < 2 or _k_area(XS) >= _k_area(YS)):
        Dn = _k_turn(JA, n)                                 # a face of A
        yw = YS.sum(axis=0) / YS.shape[0]
        xw = yw - dc * n
    elif rB == 2:
        Dn = _k_turn(JB, n)                                 # a face of B
        xw = XS.sum(axis=0) / XS.shape[0]
        yw = xw + dc * n
    elif two_edges:
        xw, yw = _k_line_points(xs, UA[0], ys, UB[0])
        Dn = _k_edges_normal(UA[0], UB[0], n, JA, JB)
    elif dc > tol and rA + rB <= 1:                         # separated: vertex-edge/vertex
        u = np.zeros(3)
        du = np.zeros((3, nv))
        if rA == 0:
            xw = xs
            if rB == 1:
                u = UB[0].copy()
                yw = ys + u * (u @ (xw - ys))               # foot of the vertex on the edge
                du = _k_turn(JB, u)
            else:
                yw = ys
        else:
            yw = ys
            u = UA[0].copy()
            xw = xs + u * (u @ (yw - xs))
            du = _k_turn(JA, u)
        dz = _k_pj(JB, oB, yw) - _k_pj(JA, oA, xw)
        Dn = (dz - _k_outer(n, _k_vD(n, dz))) / dc
        if rA + rB == 1:
            Dn += -_k_outer(u, _k_vD(n, du)) - _k_outer(u, _k_vD(u, dz)) / dc
    else:
        status[:] = 1
        return
    dxw, dyw = _k_pj(JA, oA, xw), _k_pj(JB, oB, yw)
    Dd = _k_vD(n, dyw - dxw)
    # -- the points -------------------------------------------------------------------------
    if nr == 1:                                             # the witness midpoint
        k = rows[0]
        # core witness points (on the axes of capsules) and their derivatives
        if rA == 0:
            xc, dxc = xs, _k_pj(JA, oA, xs)
            yc, dyc = xs + dc * n, dxc + _k_outer(n, Dd) + dc * Dn
        elif rB == 0:
            yc, dyc = ys, _k_pj(JB, oB, ys)
            xc, dxc = ys - dc * n, dyc - _k_outer(n, Dd) - dc * Dn
        elif two_edges:
            uA, uB = UA[0], UB[0]
            aa, bb, cc = uA @ uA, uA @ uB, uB @ uB
            r = yw - xw
            duA, duB = _k_turn(JA, uA), _k_turn(JB, uB)
            # [[-a, b], [-b, cc]] [ds, dt] = -[uA . (dyw - dxw) + r . duA, uB . (...) + r . duB]
            r1 = -(_k_vD(uA, dyw - dxw) + _k_vD(r, duA))
            r2 = -(_k_vD(uB, dyw - dxw) + _k_vD(r, duB))
            det = -aa * cc + bb * bb
            if det == 0.0:
                status[:] = 6
                return
            ds = (cc * r1 - bb * r2) / det
            dt = (-aa * r2 + bb * r1) / det
            xc, dxc = xw, dxw + _k_outer(uA, ds)
            yc, dyc = yw, dyw + _k_outer(uB, dt)
        else:
            status[:] = 2
            return
        mpt = 0.5 * (xc + yc) + 0.5 * (radA - radB) * n
        off = mpt - pos[k]
        if np.sqrt(off @ off) > 100.0 * MATCH_TOL * L:      # (GJK's witness on curved shapes)
            status[:] = 3
            return
        dp[k] = 0.5 * (dxc + dyc) + 0.5 * (radA - radB) * Dn
        dn[k] = Dn
        dd[k] = Dd
        status[0] = 0
        return
    # a patch: candidates from the support sets taken with coal's patch tolerance
    PA, PB = _k_rows_of(X, hA, hAmax, ptol, True), _k_rows_of(Y, hB, hBmin, ptol, False)
    c0 = 0.5 * (HA + HB)
    Dc = 0.5 * (_k_vD(n, dxw + dyw) + _k_vD(xw + yw, Dn))
    e1, e2 = _k_plane_axes(n)
    A2 = np.empty((PA.shape[0], 2))
    for i in range(PA.shape[0]):
        A2[i, 0], A2[i, 1] = _dot3(X[PA[i]], e1), _dot3(X[PA[i]], e2)
    B2 = np.empty((PB.shape[0], 2))
    for i in range(PB.shape[0]):
        B2[i, 0], B2[i, 1] = _dot3(Y[PB[i]], e1), _dot3(Y[PB[i]], e2)
    hullA, hullB = PA[_k_hull2(A2)], PB[_k_hull2(B2)]
    mA, mB = hullA.shape[0], hullB.shape[0]
    if mA == 2 and mB == 2:
        status[:] = 4                 # segment against segment (coal's parallel-edge case)
        return
    # a capsule's support points (coal): its axis ends moved by rad (a . n) a along the axis
    # (the rest of coal's offset, rad (dir - (a . dir) a), is along n: the projection drops it)
    wA, wB = np.zeros(3), np.zeros(3)
    dwA, dwB = np.zeros((3, nv)), np.zeros((3, nv))
    if radA != 0.0:
        ea = (X[1] - X[0]) / np.sqrt((X[1] - X[0]) @ (X[1] - X[0]))
        an, da = ea @ n, _k_turn(JA, ea)
        wA = -radA * an * ea
        dwA = -radA * (_k_outer(ea, _k_vD(n, da) + _k_vD(ea, Dn)) + an * da)
    if radB != 0.0:
        ea = (Y[1] - Y[0]) / np.sqrt((Y[1] - Y[0]) @ (Y[1] - Y[0]))
        an, da = ea @ n, _k_turn(JB, ea)
        wB = radB * an * ea
        dwB = radB * (_k_outer(ea, _k_vD(n, da) + _k_vD(ea, Dn)) + an * da)
    nA = mA if mA > 2 else 1                               # hull edges
    nB = mB if mB > 2 else 1
    ncap = mA + mB + nA * nB
    cands = np.empty((ncap, 3))
    kind = np.empty(ncap, dtype=np.int64)                  # 0: vertex of A, 1: of B, 2: crossing
    ref = np.empty(ncap, dtype=np.int64)
    cross = np.empty((ncap, 4, 3))
    nc_ = 0
    # (written out over the components, as the vector expressions they stand for compute
    # them element by element: P = X + w, cands = P - (P . n - c0) n; no temporaries)
    for i in range(mA):
        _k_plane_point(X[hullA[i]], wA, n, c0, cands[nc_])
        kind[nc_], ref[nc_] = 0, hullA[i]
        nc_ += 1
    for i in range(mB):
        _k_plane_point(Y[hullB[i]], wB, n, c0, cands[nc_])
        kind[nc_], ref[nc_] = 1, hullB[i]
        nc_ += 1
    # every edge of A's hull against every edge of B's, projected
    for i in range(nA):
        a0, uA = X[hullA[i]], X[hullA[(i + 1) % mA]] - X[hullA[i]]
        a20, a21, ua20, ua21 = _dot3(a0, e1), _dot3(a0, e2), _dot3(uA, e1), _dot3(uA, e2)
        for j in range(nB):
            b0, uB = Y[hullB[j]], Y[hullB[(j + 1) % mB]] - Y[hullB[j]]
            b20, b21, ub20, ub21 = _dot3(b0, e1), _dot3(b0, e2), _dot3(uB, e1), _dot3(uB, e2)
            den = ua20 * -ub21 + ua21 * ub20
            if not abs(den) >= 1e-12 * L * L:
                continue
            rh0, rh1 = b20 - a20, b21 - a21
            sp = (rh0 * -ub21 + rh1 * ub20) / den
            tp = (ua20 * rh1 - ua21 * rh0) / den
            if sp >= -1e-9 and sp <= 1.0 + 1e-9 and tp >= -1e-9 and tp <= 1.0 + 1e-9:
                xa = a0 + sp * uA
                cands[nc_] = xa - (_dot3(xa, n) - c0) * n
                kind[nc_], ref[nc_] = 2, nc_
                cross[nc_, 0], cross[nc_, 1] = xa, uA
                cross[nc_, 2], cross[nc_, 3] = b0 + tp * uB, uB
                nc_ += 1
    # per-point distances (_k_patch_distances): a capsule's feature is its axis
    # moved by its radius along n, which turns with n
    if per_point:
        XA, YB = X[PA] + radA * n, Y[PB] - radB * n
        oa, mra, oka = _k_feature_row(XA, n, L)
        ob, mrb, okb = _k_feature_row(YB, n, L)
        if not (oka and okb):
            status[:] = 6
            return
    dist = np.empty(nc_)
    mids = np.zeros((nr, 3))
    for ir in range(nr):
        k = rows[ir]
        best = np.inf
        for i in range(nc_):
            # w = cands[i] - pos[k], its tangential part w - (w . n) n, |w| (written out)
            w0 = cands[i, 0] - pos[k, 0]
            w1 = cands[i, 1] - pos[k, 1]
            w2 = cands[i, 2] - pos[k, 2]
            t = w0 * n[0] + w1 * n[1] + w2 * n[2]
            w0 = w0 - t * n[0]
            w1 = w1 - t * n[1]
            w2 = w2 - t * n[2]
            dist[i] = np.sqrt(w0 * w0 + w1 * w1 + w2 * w2)
            best = min(best, dist[i])
        if not best <= MATCH_TOL * L:
            status[ir] = 5
            continue
        i = 0
        while dist[i] > best + SUPPORT_TOL * L:             # ties: A, then B, then crossings
            i += 1
        if kind[i] == 0:
            Xp = X[ref[i]] + wA
            DX = _k_pj(JA, oA, X[ref[i]]) + dwA
        elif kind[i] == 1:
            Xp = Y[ref[i]] + wB
            DX = _k_pj(JB, oB, Y[ref[i]]) + dwB
        else:
            Xa, uA, Xb, uB = cross[i, 0], cross[i, 1], cross[i, 2], cross[i, 3]
            DXa, DXb = _k_pj(JA, oA, Xa), _k_pj(JB, oB, Xb)
            kk = n @ (Xa - Xb)
            # T (X_a + s uA - X_b - t uB) = 0 differentiated: [T uA, -T uB] [ds, dt] = rhs
            ta, tb = uA - (uA @ n) * n, -(uB - (uB @ n) * n)
            D = DXa - DXb
            rhs = -(D - _k_outer(n, _k_vD(n, D)) - kk * Dn)
            g11, g12, g22 = ta @ ta, ta @ tb, tb @ tb
            det = g11 * g22 - g12 * g12
            if det == 0.0:
                status[ir] = 6
                continue
            ra, rb = _k_vD(ta, rhs), _k_vD(tb, rhs)
            s_ = (g22 * ra - g12 * rb) / det
            Xp = Xa.copy()
            DX = DXa + _k_outer(uA, s_)
        Dp = DX - _k_outer(n, _k_vD(n, DX) + _k_vD(Xp, Dn) - Dc) - (_dot3(Xp, n) - c0) * Dn
        dn[k] = Dn
        if not per_point:
            dp[k] = Dp
            dd[k] = Dd
            status[ir] = 0
            continue
        # offsets to the support features: y = p + s n on each, y = origin + U a moving with
        # its body, so  d(y) + U da = dp + ds n + s dn
        p = cands[i]
        sa = _dot3(mra, p - oa)
        ya = p + sa * n - radA * n                       # on A's core
        dsa = _k_vD(mra, Dp + sa * Dn - (_k_pj(JA, oA, ya) + radA * Dn))
        sb = _dot3(mrb, p - ob)
        yb = p + sb * n + radB * n
        dsb = _k_vD(mrb, Dp + sb * Dn - (_k_pj(JB, oB, yb) - radB * Dn))
        dd[k] = dsb - dsa
        dp[k] = Dp + 0.5 * (_k_outer(n, dsa + dsb) + (sa + sb) * Dn)   # its own midpoint
        mids[ir] = p + 0.5 * (sa + sb) * n
        status[ir] = 0
    if not per_point:
        return
    # the rows onto their common mid plane at the mean height hb of their midpoints m
    # (_k_common_plane): p = m - (m . n - hb) n
    for ir in range(nr):
        if status[ir] != 0:
            status[:] = status[ir]
            return
    hb = 0.0
    dhb = np.zeros(nv)
    for ir in range(nr):
        hb += _dot3(mids[ir], n)
        dhb += _k_vD(n, dp[rows[ir]]) + _k_vD(mids[ir], Dn)
    hb /= nr
    dhb /= nr
    for ir in range(nr):
        k = rows[ir]
        Dm = dp[k].copy()
        dp[k] = Dm - _k_outer(n, _k_vD(n, Dm) + _k_vD(mids[ir], Dn) - dhb) \
            - (mids[ir] @ n - hb) * Dn


@njit
def polytope_pairs_kernel(verts, vrange, place, normal, scal, joints, Jall, oall, rows,
                          row_start, pos, dp, dn, dd, status):
    """Every polytope pair of a step in one call. Pair i: the local vertices of A are
    verts[vrange[i, 0]:vrange[i, 1]], of B verts[vrange[i, 2]:vrange[i, 3]], placed by
    place[i, 0 or 1] (rotation row-major 9, translation 3); coal's normal normal[i]; scal[i] =
    (d, radA, radB, per-point flag, patch tolerance); joints[i] = (jA, jB) into Jall (nj, 6,
    nv) and oall (nj, 3) (joint 0: the world, zeros); its contact rows
    rows[row_start[i]:row_start[i + 1]]. status (per row): 0 done, else a ``_REASONS`` code.
    Rows of a pair with a non-finite result are all marked 6.

    Each pair is worked out on the columns its two joints' Jacobians move (a free box: 6 of
    nv; every other column of its rows' derivatives is zero, and the arithmetic is column by
    column), then scattered into dp, dn, dd: the same numbers, in O(pair's dofs) instead of
    O(nv) per vector operation."""
    nv = Jall.shape[2]
    cols = np.empty(nv, dtype=np.int64)
    for i in range(vrange.shape[0]):
        r0, r1 = row_start[i], row_start[i + 1]
        jA, jB = joints[i, 0], joints[i, 1]
        ncol = 0
        for c in range(nv):
            for a in range(6):
                if Jall[jA, a, c] != 0.0 or Jall[jB, a, c] != 0.0:
                    cols[ncol] = c
                    ncol += 1
                    break
        JA = np.empty((6, ncol))
        JB = np.empty((6, ncol))
        for a in range(6):
            for c in range(ncol):
                JA[a, c] = Jall[jA, a, cols[c]]
                JB[a, c] = Jall[jB, a, cols[c]]
        nr = r1 - r0
        lrows = np.arange(nr)
        lpos = np.empty((nr, 3))
        for a in range(nr):
            lpos[a] = pos[rows[r0 + a]]
        ldp = np.zeros((nr, 3, ncol))
        ldn = np.zeros((nr, 3, ncol))
        ldd = np.zeros((nr, ncol))
        XY = []
        for s in range(2):
            V = verts[vrange[i, 2 * s]:vrange[i, 2 * s + 1]]
            W = np.empty((V.shape[0], 3))
            for a in range(V.shape[0]):
                for b in range(3):
                    W[a, b] = place[i, s, 9 + b] + place[i, s, 3 * b] * V[a, 0] \
                        + place[i, s, 3 * b + 1] * V[a, 1] + place[i, s, 3 * b + 2] * V[a, 2]
            XY.append(W)
        st = status[r0:r1]
        _k_polytope_pair(XY[0], XY[1], normal[i], scal[i, 0], scal[i, 1], scal[i, 2],
                         scal[i, 3] != 0.0, scal[i, 4], JA, oall[jA], JB, oall[jB],
                         lrows, lpos, ldp, ldn, ldd, st)
        for a in range(nr):
            k = rows[r0 + a]
            for c in range(ncol):
                cc = cols[c]
                for b in range(3):
                    dp[k, b, cc] = ldp[a, b, c]
                    dn[k, b, cc] = ldn[a, b, c]
                dd[k, cc] = ldd[a, c]
        finite = True
        for q in range(r0, r1):
            if status[q] == 0:
                k = rows[q]
                if not (np.isfinite(dp[k]).all() and np.isfinite(dn[k]).all()
                        and np.isfinite(dd[k]).all()):
                    finite = False
        if not finite:
            status[r0:r1] = 6


@njit
def _k_patch_distances(XA, YB, n, P, L):
    """Per-point distances and contact points of a patch: for each patch point p (rows of P,
    on the plane midway between the support planes), the offsets sA, sB along n to the
    support features of A (points XA) and B (points YB): a vertex, an edge line or a face
    plane, spanned by the points; y = p + s n on the feature, s by least squares. The distance
    is sB - sA and the point's own midpoint p + n (sA + sB) / 2; the caller moves the points
    it keeps onto their common mid plane (``_k_common_plane``). A face on a face tilted by
    less than the patch tolerance gets the penetration of each corner, not the deepest one
    for all, so the distances of a box lying flat are smooth in its pose.

    (Left at their own midpoints, the points of a tilted patch sit at different heights along
    n, 4e-4 m apart at a 6.6 mm penetration: the rotation that removes the tilt then moves
    them tangentially by different amounts, so no motion realized both the drift correction
    of the normal rows and sticking tangent rows (9.7e-6 m/s unrealizable). On one plane
    normal to n the depths are affine in the in-plane position and a rigid motion realizes
    them with every point sticking.)
    Returns (ok, distances (m,), points (m, 3)); ok False where a support feature's
    least-squares system is singular."""
    oa, ra, oka = _k_feature_row(XA, n, L)
    ob, rb, okb = _k_feature_row(YB, n, L)
    m = P.shape[0]
    dist = np.empty(m)
    pts = np.empty((m, 3))
    for i in range(m):
        sa = ra @ (P[i] - oa)
        sb = rb @ (P[i] - ob)
        dist[i] = sb - sa
        pts[i] = P[i] + 0.5 * (sa + sb) * n
    return oka and okb, dist, pts


@njit
def _k_common_plane(pts, n, keep):
    """The kept points ``pts[keep]`` of a per-point patch (each at its own midpoint,
    ``_k_patch_distances``) moved along n onto their common mid plane: normal n, at the mean
    height of their midpoints. (The mean, not the support planes' midway height, which takes
    the lowest corner and so has a kink where a patch lies flat.) Returns (len(keep), 3)."""
    k = keep.shape[0]
    h = 0.0
    for j in range(k):
        h += pts[keep[j]] @ n
    h /= k
    out = np.empty((k, 3))
    for j in range(k):
        p = pts[keep[j]]
        out[j] = p - (p @ n - h) * n
    return out


@njit
def _k_segments_closest(a0, a1, b0, b1):
    """Closest points of the segments a0-a1 and b0-b1 (either may be a point), parameters
    clamped to the segments."""
    uA, uB, w0 = a1 - a0, b1 - b0, a0 - b0
    a, b, c = uA @ uA, uA @ uB, uB @ uB
    d, e = uA @ w0, uB @ w0
    if a == 0.0 and c == 0.0:
        return a0.copy(), b0.copy()
    if a == 0.0:
        return a0.copy(), b0 + min(max(e / c, 0.0), 1.0) * uB
    if c == 0.0:
        return a0 + min(max(-d / a, 0.0), 1.0) * uA, b0.copy()
    den = a * c - b * b
    s = min(max((b * e - c * d) / den, 0.0), 1.0) if den > 1e-14 * a * c else 0.0
    t = (b * s + e) / c
    if t < 0.0 or t > 1.0:
        t = min(max(t, 0.0), 1.0)
        s = min(max((b * t - d) / a, 0.0), 1.0)
    return a0 + s * uA, b0 + t * uB


@njit
def _k_world_patch_distances(X, radA, Y, radB, n, P, ptol):
    """``_k_patch_distances`` of a pair from its world vertices X, Y (a capsule: its axis ends, with
    its radius): the support sets along n taken with the patch tolerance ptol, the size L the
    larger extent of the two vertex sets along a world axis (collision_driver)."""
    hx, hy = X @ n, Y @ n
    L = 0.0
    for V in (X, Y):
        for ax in range(3):
            L = max(L, V[:, ax].max() - V[:, ax].min())
    ia = _k_rows_of(X, hx, hx.max(), ptol, True)
    ib = _k_rows_of(Y, hy, hy.min(), ptol, False)
    XA = np.empty((ia.shape[0], 3))
    for i in range(ia.shape[0]):
        XA[i] = X[ia[i]] + radA * n
    YB = np.empty((ib.shape[0], 3))
    for i in range(ib.shape[0]):
        YB[i] = Y[ib[i]] - radB * n
    return _k_patch_distances(XA, YB, n, P, L)


@njit(inline="always")
def _dot3(a, b):
    """``a @ b`` of two 3-vectors written out: the same sum in the same order as the BLAS
    ddot numba calls for ``@`` (((a0 b0 + a1 b1) + a2 b2), checked equal bit for bit), without
    the call (the snap's axis loop makes ~300 of them a box pair)."""
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


@njit
def _k_across(XA, XB, axis, top, bot, tol):
    """Whether the exact support sets of A (vertices XA within tol of its support plane
    ``top`` along ``axis``) and of B (within tol of ``bot``) lie across each other: their
    projections on the plane normal to the axis overlap (to within tol), so that a point of
    each is separated by the axis distance ``bot - top`` alone (a vertex over a face, crossing
    edges). 2-D separating-axis test of the two projected convex hulls over the directions of,
    and normal to, every segment between two of their points (the hulls' edges among them)."""
    ia = _k_rows_of(XA, XA @ axis, top, tol, True)
    ib = _k_rows_of(XB, XB @ axis, bot, tol, False)
    na, nb = ia.shape[0], ib.shape[0]
    e1, e2 = _k_plane_axes(axis)
    P = np.empty((na + nb, 2))
    for i in range(na):
        P[i, 0], P[i, 1] = XA[ia[i]] @ e1, XA[ia[i]] @ e2
    for j in range(nb):
        P[na + j, 0], P[na + j, 1] = XB[ib[j]] @ e1, XB[ib[j]] @ e2
    m = na + nb
    for u in range(m):
        for w in range(u + 1, m):
            dx, dy = P[w, 0] - P[u, 0], P[w, 1] - P[u, 1]
            L = np.sqrt(dx * dx + dy * dy)
            if not L > tol:
                continue
            for s in range(2):
                if s == 0:
                    mx, my = dx / L, dy / L
                else:
                    mx, my = -dy / L, dx / L
                amin, amax, bmin, bmax = np.inf, -np.inf, np.inf, -np.inf
                for i in range(m):
                    h = mx * P[i, 0] + my * P[i, 1]
                    if i < na:
                        amin, amax = min(amin, h), max(amax, h)
                    else:
                        bmin, bmax = min(bmin, h), max(bmax, h)
                if bmin - amax > tol or amin - bmax > tol:
                    return False
    return True


@njit
def _k_snap_pair(XA, radA, FA, EA, XB, radB, FB, EB, n, d, tol):
    """snap_pair: (ok, axis, distance, mid-plane height)."""
    na, nb = FA.shape[0], FB.shape[0]
    M = np.empty((na + nb + EA.shape[0] * EB.shape[0], 3))
    m = 0
    for i in range(na):
        M[m] = FA[i]
        m += 1
    for i in range(nb):
        M[m] = FB[i]
        m += 1
    for i in range(EA.shape[0]):
        for j in range(EB.shape[0]):
            cr = _k_cross(EA[i], EB[j])
            nc = np.sqrt(_dot3(cr, cr))
            if nc > 1e-6:
                M[m] = cr / nc
                m += 1
    best, fbest, cbest = -1, -np.inf, 0.0
    for i in range(m):
        Mi = M[i]
        if _dot3(Mi, n) < 0.0:                       # oriented along coal's normal
            M[i] = -Mi
        top = -np.inf
        for a in range(XA.shape[0]):
            top = max(top, _dot3(Mi, XA[a]))
        bot = np.inf
        for b in range(XB.shape[0]):
            bot = min(bot, _dot3(Mi, XB[b]))
        top += radA
        bot -= radB
        if best < 0 or bot - top > fbest:
            best, fbest, cbest = i, bot - top, 0.5 * (top + bot)
    # coal's distance can be off by ~1e-6 of the size near contact (its normal by as much):
    # accept the axis where they agree to that
    size = 0.0
    for V in (XA, XB):
        for ax in range(3):
            size = max(size, V[:, ax].max() - V[:, ax].min())
    size += radA + radB
    axis = M[max(best, 0)].copy()
    if best >= 0 and fbest > 0.0:
        # separated: the axis is the distance only where the closest features lie across it
        # from each other (a vertex over a face, crossing edges). Otherwise (a box corner
        # beyond the edge of the face it faces, a capsule's end beyond the box edge it faces)
        # the closest points are a vertex against an edge or a vertex, farther apart than the
        # axis says, along a direction that is no face normal or edge cross product; within
        # coal's tolerance of it (DiffPush-v0's rod end 15 cm from a box edge: 1e-3 rad), and
        # the witness point then matched no feature of the derivatives. The exact closest
        # points of the near-support sets (vertices within 2e-3 of the size of the support
        # planes along the axis), over every pair of segments (or points) they span: the
        # boundary edges of the faces are among them. Only where the exact support sets do
        # not lie across each other (_k_across): segments miss a vertex over the inside of a
        # face (two faces a few 1e-6 rad from parallel, apart within the margin: the common
        # normal of an edge and a face diagonal is ~1e-9 of the size longer than the axis and
        # was taken instead, and the derivatives took it for a vertex pair)
        top, bot = _k_support_span(XA, XB, axis)
        stol = 2e-3 * size
        ia = _k_rows_of(XA, XA @ axis, top, stol, True)
        ib = _k_rows_of(XB, XB @ axis, bot, stol, False)
        if ia.shape[0] <= 8 and ib.shape[0] <= 8 and not _k_across(XA, XB, axis, top, bot,
                                                                   SUPPORT_TOL * size):
            Lmin, rmin = np.inf, np.zeros(3)
            for i0 in range(ia.shape[0]):
                for i1 in range(i0, ia.shape[0]):
                    for j0 in range(ib.shape[0]):
                        for j1 in range(j0, ib.shape[0]):
                            x, y = _k_segments_closest(XA[ia[i0]], XA[ia[i1]], XB[ib[j0]],
                                                       XB[ib[j1]])
                            r = y - x
                            L = np.sqrt(r @ r)
                            if L < Lmin:
                                Lmin, rmin = L, r
            if Lmin > 0.0 and Lmin - radA - radB > fbest + 1e-9 * size:
                axis = rmin / Lmin
                top, bot = _k_support_span(XA, XB, axis)
                top += radA
                bot -= radB
                fbest, cbest = bot - top, 0.5 * (top + bot)
    ok = best >= 0 and not (abs(fbest - d) > max(tol * (1.0 + abs(d)), 1e-5 * size)
                            or axis @ n < 1.0 - 1e-6)
    return ok, axis, fbest, cbest


def polytope_pairs(sim, kin, c, groups, dp, dn, dd, deferred=None) -> list:
    """Closed-form dp, dn, dd for the contact rows of polytope pairs (boxes, convex meshes, a
    capsule with a polytope): groups is a list of (j1, j2, rows), the rows of one pair of geoms
    each, in ``c = cons.contacts``. One compiled call does them all; returns the rows it could
    not do (for the fallback). (The kernel's constant inputs per set of geom pairs, vertices and
    radii, are kept on the simulator: a step's Python work is a few gathers.) The margin rows
    of a pair (``margin_vertex_rows``) follow its contact row; where that row is left to the
    fallback they are appended to ``deferred`` as ``margin_vertex_rows``' arguments after
    (sim, kin, c), for the caller to do once the fallback has done the contact row (without
    ``deferred``: returned with the rows not done)."""
    undone: list = []
    todo = []
    margin = []
    geom1, geom2 = c.geom1, c.geom2
    point = c.point
    for j1, j2, rows in groups:
        k0 = rows[0]
        g1, g2 = int(geom1[k0]), int(geom2[k0])
        VA, VB = local_vertices(sim, g1), local_vertices(sim, g2)
        if VA is None or VB is None:
            undone += _undone(rows, 'not polytopes')
            continue
        spec = [k for k in rows if int(point[k]) >= MARGIN_VERTEX_ID]
        if spec:
            # the margin rows (collision_kernels.poly_margin_rows: a vertex over a face), done
            # after the pair's contact row, whose normal and point they share
            rows = [k for k in rows if int(point[k]) < MARGIN_VERTEX_ID]
            if not rows:
                undone += _undone(spec, "margin row without a contact row")
            else:
                margin.append((spec, rows[0], j1, j2, g1, g2, VA, VB))
            if not rows:
                continue
        todo.append((j1, j2, rows, g1, g2, VA, VB))
    if not todo:
        return undone
    P = len(todo)
    nv = kin.nv
    gidx = np.array([(t[3], t[4]) for t in todo], dtype=np.int64)
    # per set of geom pairs: the concatenated local vertices, their ranges and the radii
    cache = sim.__dict__.setdefault("_polytope_sets", {})
    key = gidx.tobytes()
    const = cache.get(key)
    if const is None:
        vrange = np.empty((P, 4), dtype=np.int64)
        verts, nvert = [], 0
        for i, (_, _, _, g1, g2, VA, VB) in enumerate(todo):
            for s_, V in enumerate((VA, VB)):
                verts.append(V)
                vrange[i, 2 * s_], vrange[i, 2 * s_ + 1] = nvert, nvert + len(V)
                nvert += len(V)
        radii = np.array([(_radius(sim, t[3]), _radius(sim, t[4])) for t in todo], dtype=float)
        if len(cache) > 256:
            cache.clear()
        const = cache[key] = (np.ascontiguousarray(np.concatenate(verts), dtype=float), vrange,
                              radii)
    verts, vrange, radii = const
    first = [t[2][0] for t in todo]
    normal = np.ascontiguousarray(c.normal[first], dtype=float)
    # the geoms' placements (rotation row-major, translation), read through the driver's view
    # of gdata.oMg (rotation column-major) where there is one
    view = sim.collision._oMg(sim.geom_data) if hasattr(sim.collision, "_oMg") else None
    if view is not None:
        place = view[gidx][:, :, _ROW_MAJOR]
    else:
        place = np.empty((P, 2, 12))
        oMg = sim.geom_data.oMg
        for i in range(P):
            for s_ in range(2):
                M = oMg[int(gidx[i, s_])]
                place[i, s_, :9] = M.rotation.reshape(9)
                place[i, s_, 9:] = M.translation
    per_point_pairs = getattr(sim.collision, "per_point_pairs", ())
    scal = np.empty((P, 5))
    scal[:, 0] = c.dist[first]
    scal[:, 1:3] = radii
    joints = np.empty((P, 2), dtype=np.int64)
    row_start = np.zeros(P + 1, dtype=np.int64)
    all_rows: list = []
    pairs = c.pair
    for i, (j1, j2, rows, _, _, _, _) in enumerate(todo):
        pair = int(pairs[rows[0]])
        many = len(rows) > 1
        scal[i, 3] = float(many and pair in per_point_pairs)
        scal[i, 4] = _patch_tol(sim, pair) if many else PATCH_TOL
        joints[i, 0], joints[i, 1] = j1, j2
        all_rows += rows
        row_start[i + 1] = len(all_rows)
    used = sorted({int(j) for j in joints.ravel()} - {0})
    nj = max(used, default=0) + 1
    Jall = np.zeros((nj, 6, nv))
    oall = np.zeros((nj, 3))
    for j in used:
        Jall[j] = kin.J[j]
        oall[j] = kin.o[j]
    status = np.zeros(len(all_rows), dtype=np.int64)
    polytope_pairs_kernel(verts, vrange, place, normal, scal, joints, Jall, oall,
                          np.asarray(all_rows, dtype=np.int64), row_start,
                          np.ascontiguousarray(c.pos, dtype=float), dp, dn, dd, status)
    if status.any():
        for code in np.unique(status[status != 0]):
            undone += _undone([all_rows[q] for q in np.flatnonzero(status == code)],
                              _REASONS[int(code)])
    if margin:
        failed = {k for k, _ in undone}
        for spec, k0, j1, j2, g1, g2, VA, VB in margin:
            if k0 in failed:
                if deferred is None:
                    undone += _undone(spec, "margin row: its contact row was not done")
                else:
                    deferred.append((spec, k0, j1, j2, g1, g2, VA, VB))
            else:
                undone += margin_vertex_rows(sim, kin, c, spec, k0, j1, j2, g1, g2, VA, VB,
                                             dp, dn, dd)
    return undone


def margin_vertex_rows(sim, kin, c, rows, k0, j1, j2, g1, g2, VA, VB, dp, dn, dd) -> list:
    """Closed-form dp, dn, dd of the margin rows of one polytope pair (geoms g1, g2 on joints
    j1, j2, local core vertices VA, VB; collision_kernels.poly_margin_rows), from those of the
    pair's contact row k0 (done before: its point p0, normal n and their derivatives). A point
    X of the incident geom's core (radius r_I) lies over a face of the reference box, whose
    outward normal is u (u . n < 0 for a point of geom 1, > 0 for one of geom 2). X is a vertex
    (body-fixed), or the point where the edge from vertex P to vertex Q crosses the plane of
    the face's side e . x = const (e the box axis of that side): ``X = P + t (Q - P)`` with
    ``e . (dX_I - dX_R) + e . (Q - P) dt = 0`` (dX_I, dX_R the Jacobians of the point moving
    with the incident body and with the box; the side plane moves with the box), so ``dX =
    dX_I + (Q - P) dt``. With Y any vertex of the face (body-fixed, on its plane) the distance
    along n from the incident surface to the face's plane is ``d = u . (Y - X) / (u . n) -
    r_I`` for a point of geom 1 (of geom 2: ``u . (X - Y) / (u . n) - r_I``, its sign turned): ``dd = (du . (Y - X) + u . (dY - dX)) / (u . n) - u . (Y - X) (du . n + u . dn) /
    (u . n)^2`` with ``du = w_R x u`` (the face turns with the box). The row's normal is n
    (``dn`` the contact row's), its point X projected on the plane through p0 normal to n:
    ``p = X - (X . n - p0 . n) n``. Returns the rows it could not do (a crossing the pose no
    longer has)."""
    oMg = sim.geom_data.oMg
    nv = kin.nv
    zJ = np.zeros((6, nv))
    zo = np.zeros(3)
    left = []
    n = np.asarray(c.normal[k0], float)
    p0 = np.asarray(c.pos[k0], float)
    Dn, Dp0 = dn[k0], dp[k0]
    c0 = float(p0 @ n)
    Dc0 = _k_vD(n, Dp0) + _k_vD(p0, Dn)
    for k in rows:
        pid = int(c.point[k]) - MARGIN_VERTEX_ID
        side = 1 if pid >= MARGIN_SIDE else 0
        code = pid - side * MARGIN_SIDE
        gI, gR, jI, jR, VI, VR = (g1, g2, j1, j2, VA, VB) if side == 0 else (g2, g1, j2, j1, VB, VA)
        MI, MR = oMg[gI], oMg[gR]
        RR, tR = MR.rotation, MR.translation
        JI, oI = (kin.J[jI], kin.o[jI]) if jI else (zJ, zo)
        JR, oR = (kin.J[jR], kin.o[jR]) if jR else (zJ, zo)
        half = np.abs(VR).max(axis=0)
        if code < 1000:                                  # a vertex
            X = MI.rotation @ VI[code] + MI.translation
            dX = _k_pj(JI, oI, X)
            lX = RR.T @ (X - tR)
            cax = int(np.argmax(np.abs(lX) - half))      # the face it lies over
            sx = lX[cax]
        else:                                            # an edge leaving the face
            P = MI.rotation @ VI[code // 1000 - 1] + MI.translation
            Q = MI.rotation @ VI[code % 1000] + MI.translation
            lP, lQ = RR.T @ (P - tR), RR.T @ (Q - tR)
            cax = int(np.argmax(np.abs(lP) - half))
            best, ax = 2.0, -1
            for a in range(3):
                if a != cax and abs(lQ[a]) > half[a]:
                    ta = (np.copysign(half[a], lQ[a]) - lP[a]) / (lQ[a] - lP[a])
                    if ta < best:
                        best, ax = ta, a
            if ax < 0 or not 0.0 < best < 1.0:
                left.append(k)
                continue
            X = P + best * (Q - P)
            e = RR[:, ax]
            dXI = _k_pj(JI, oI, X)
            dt = -_k_vD(e, dXI - _k_pj(JR, oR, X)) / float(e @ (Q - P))
            dX = dXI + _k_outer(Q - P, dt)
            sx = lP[cax]
        # the face's outward normal u and a point Y of its plane (body-fixed)
        u = RR[:, cax] * (1.0 if sx >= 0.0 else -1.0)
        Y = tR + u * half[cax]
        du = _k_turn(JR, u)
        dY = _k_pj(JR, oR, Y)
        un = float(u @ n)
        N = float(u @ (Y - X))
        DN = _k_vD(Y - X, du) + _k_vD(u, dY - dX)
        DD = _k_vD(n, du) + _k_vD(u, Dn)
        sd = 1.0 if side == 0 else -1.0                  # (geom 2's point: d = u . (X - Y) / (u . n))
        dd[k] = sd * (DN / un - N * DD / (un * un))
        dn[k] = Dn
        h = float(X @ n) - c0
        dp[k] = dX - _k_outer(n, _k_vD(n, dX) + _k_vD(X, Dn) - Dc0) - h * Dn
    return _undone(left, "margin row: no crossing") if left else []


# the (ngeom, 12) placement rows' rotation from column-major to row-major order
_ROW_MAJOR = np.array([0, 3, 6, 1, 4, 7, 2, 5, 8, 9, 10, 11])


def polytope_pair(sim, kin, c, rows: list, j1: int, j2: int, dp, dn, dd) -> list:
    """Closed-form dp, dn, dd for the contact rows (all of one pair of polytope geoms, in
    ``c = cons.contacts``); returns the rows it could not do (for the fallback). (One pair of
    ``polytope_pairs``.)"""
    return polytope_pairs(sim, kin, c, [(j1, j2, list(rows))], dp, dn, dd)


# -- capsule against capsule --------------------------------------------------------------------
def capsule_axis(sim, g: int, gdata=None):
    """World end points (a0, a1) of the axis segment of capsule geom g and its radius (at the
    placements of ``gdata``, default the simulator's)."""
    M = (sim.geom_data if gdata is None else gdata).oMg[g]
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
    dd = n . (dc2 - dc1). Axes lying along each other are a line contact: the driver's 2-point
    patch (``capsule_line_patch``, rows ``capsule_end_rows``); a single point of parallel
    axes the patch did not cover is left to the fallback."""
    if int(c.point[rows[0]]) >= CAPSULE_END_ID:       # a line patch (capsule_line_patch)
        return capsule_end_rows(sim, kin, c, rows, j1, j2, dp, dn, dd)
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


# -- two capsules lying along each other: a line contact as a 2-point patch ------------------------
# point ids of the rows of a capsule line patch: CAPSULE_END_ID + 2 * side + end, the end (0, 1)
# of capsule ``side`` (0: geom 1, 1: geom 2) against the other capsule's axis segment
CAPSULE_END_ID = 16


def capsule_line_patch(A0, A1, rA, B0, B1, rB, tol):
    """The contact patch of two capsules whose axes (segments A0-A1, B0-B1) lie along each
    other: the two ends of the overlap of the segments, each an axis end of one capsule
    against the closest point of the other's axis segment (interior there). A list of
    (point id, core point on A, core point on B) of the ends kept, or None where the axes are
    not near-parallel over the overlap or fewer than two ends project inside the other
    segment (coal's single closest point then stands).

    Like coal's contact patch of two faces (support sets taken with the patch tolerance
    ``tol``): an end is kept when its axis-to-axis distance is within ``tol`` of the smallest
    one, and the axes are taken as parallel when they turn by less than ``tol`` across the
    overlap (sin(angle) times its length). With one end left (an overlap shorter than tol) the
    patch is that end alone. MuJoCo's capsule-capsule collision likewise gives two contacts at
    the ends of the overlap for near-parallel axes; a single closest point leaves a capsule
    lying on another free to rock about it."""
    uA, uB = A1 - A0, B1 - B0
    lA, lB = float(np.sqrt(uA @ uA)), float(np.sqrt(uB @ uB))
    if lA == 0.0 or lB == 0.0:
        return None
    sin = float(np.linalg.norm(_cross3(uA, uB))) / (lA * lB)
    if sin * min(lA, lB) > tol:
        return None
    eps = 1e-9
    cands = []
    for side, (E0, E1, Y0, uY, lY) in enumerate(((A0, A1, B0, uB, lB), (B0, B1, A0, uA, lA))):
        for end, E in enumerate((E0, E1)):
            t = float((E - Y0) @ uY) / (lY * lY)
            if eps < t < 1.0 - eps:
                C = Y0 + t * uY
                pA, pB = (E, C) if side == 0 else (C, E)
                cands.append((CAPSULE_END_ID + 2 * side + end, pA, pB,
                              float(np.linalg.norm(pB - pA)), float((pA - A0) @ uA) / lA))
    if len(cands) < 2:
        return None
    Lmin = min(c[3] for c in cands)
    keep = [c for c in cands if c[3] - Lmin < tol]
    if len(keep) < 2:
        return None
    keep.sort(key=lambda c: c[4])
    lo, hi = keep[0], keep[-1]
    spread = hi[4] - lo[4]
    if sin * spread > tol:
        return None
    if spread < tol:
        keep = [min(keep, key=lambda c: c[3])]
    else:
        keep = [lo, hi]
    return [(c[0], c[1], c[2]) for c in keep]


def capsule_end_rows(sim, kin, c, rows: list, j1: int, j2: int, dp, dn, dd) -> list:
    """Closed-form dp, dn, dd for the rows of a capsule line patch (``capsule_line_patch``):
    per row an axis end E of one capsule, body-fixed, against the closest point C = Y0 + t uY
    of the other's axis segment, t interior. The orthogonality condition (E - C) . uY = 0
    differentiated gives dt = ((dE - dC_fixed) . uY + (E - C) . duY) / |uY|^2, dC_fixed the
    Jacobian of C moving with its body; then with r = pB - pA, L = |r|, n = r / L:
    dn = (I - n n^T) dr / L, dd = n . dr, and the point (the midpoint of the two surface
    points) dp = (dpA + dpB) / 2 + (rA - rB) / 2 dn. Returns the rows it could not do."""
    k0 = rows[0]
    g1, g2 = int(c.geom1[k0]), int(c.geom2[k0])
    axes = (capsule_axis(sim, g1), capsule_axis(sim, g2))
    rA, rB = axes[0][2], axes[1][2]
    bodies = (_Body(kin, j1), _Body(kin, j2))
    undone = []
    for k in rows:
        code = int(c.point[k]) - CAPSULE_END_ID
        if not 0 <= code < 4:
            undone += _undone([k], "capsules: unknown point")
            continue
        side, end = divmod(code, 2)
        X, Y = axes[side], axes[1 - side]
        BX, BY = bodies[side], bodies[1 - side]
        E = X[end]
        Y0, uY = Y[0], Y[1] - Y[0]
        uu = float(uY @ uY)
        t = float((E - Y0) @ uY) / uu
        C = Y0 + t * uY
        dE = BX.point(E)
        dCf = BY.point(C)
        dt = (uY @ (dE - dCf) + (E - C) @ BY.turn(uY)) / uu
        dC = dCf + np.outer(uY, dt)
        pA, pB, dpA, dpB = (E, C, dE, dC) if side == 0 else (C, E, dC, dE)
        r = pB - pA
        L = float(np.sqrt(r @ r))
        n = r / L
        pos = 0.5 * (pA + pB) + 0.5 * (rA - rB) * n
        if np.linalg.norm(pos - c.pos[k]) > MATCH_TOL * max(L, 1.0) or n @ c.normal[k] < 0.99:
            undone += _undone([k], "capsules: no match")
            continue
        dr = dpB - dpA
        Dn = (dr - np.outer(n, n @ dr)) / L
        dn[k] = Dn
        dd[k] = n @ dr
        dp[k] = 0.5 * (dpA + dpB) + 0.5 * (rA - rB) * Dn
    return undone


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


# -- smooth and mixed convex primitives (cylinder, ellipsoid, sphere-mesh): convex_support -------
def convex_pair(sim, kin, c, rows: list, j1: int, j2: int, dp, dn, dd) -> list:
    """Closed-form dp, dn, dd for the single contact row of a pair whose point the driver
    refined to the exact optimum of the distance problem (``collision_driver``'s
    ``convex_pairs``; ``convex_support``): implicit differentiation of the optimality
    conditions at the features of the two supports. Returns the rows it could not do."""
    from .convex_support import derivatives as _convex_derivatives, feature, shape_of
    if len(rows) != 1:
        return _undone(rows, "convex: several points")
    k = rows[0]
    g1, g2 = int(c.geom1[k]), int(c.geom2[k])
    sa, sb = shape_of(sim, g1), shape_of(sim, g2)
    Ma, Mb = sim.geom_data.oMg[g1], sim.geom_data.oMg[g2]
    n = np.asarray(c.normal[k], float)
    d = float(c.dist[k])
    tol = c.convex_pairs[int(c.pair[k])]        # (the detect pass's feature tolerance)
    FA = feature(sa, Ma.rotation, Ma.translation, n, tol)
    FB = feature(sb, Mb.rotation, Mb.translation, -n, tol)
    if FA is None or FB is None or len(FA.U) + len(FB.U) > 2:
        return _undone(rows, "convex: features undecided")
    p1 = c.pos[k] - 0.5 * d * n
    p2 = c.pos[k] + 0.5 * d * n
    nv = kin.nv
    JA, oA = (kin.J[j1], kin.o[j1]) if j1 else (np.zeros((6, nv)), np.zeros(3))
    JB, oB = (kin.J[j2], kin.o[j2]) if j2 else (np.zeros((6, nv)), np.zeros(3))
    dp[k], dn[k], dd[k] = _convex_derivatives(FA, FB, n, d, p1, p2, JA, oA, JB, oB)
    return []


def face_pair(sim, kin, c, rows: list, j1: int, j2: int, dp, dn, dd) -> list:
    """Closed-form dp, dn, dd for the rows of a pair whose points the driver found lying on a
    cylinder's cap or a mesh facet (``collision_driver``'s ``face_pairs``;
    ``convex_support.face_derivatives``). Returns the rows it could not do."""
    from .convex_support import FACE_ID_BASE, crossing_edge, face_derivatives, shape_of
    pair = int(c.pair[rows[0]])
    gf, go, kinds = c.face_pairs[pair]
    first = int(c.geom1[rows[0]]) == gf
    jf, jo = (j1, j2) if first else (j2, j1)
    nv = kin.nv
    JF, oF = (kin.J[jf], kin.o[jf]) if jf else (np.zeros((6, nv)), np.zeros(3))
    JO, oO = (kin.J[jo], kin.o[jo]) if jo else (np.zeros((6, nv)), np.zeros(3))
    so, sf = shape_of(sim, go), shape_of(sim, gf)
    Mo, Mf = sim.geom_data.oMg[go], sim.geom_data.oMg[gf]
    sgn = 1.0 if first else -1.0
    undone = []
    for k in rows:
        kind = kinds.get(int(c.point[k]))
        if kind is None:
            undone += _undone([k], "face: unknown point")
            continue
        n = sgn * np.asarray(c.normal[k], float)
        d = float(c.dist[k])
        x = np.asarray(c.pos[k], float) + d * n
        centre = edge = None
        if kind in (3, 4):             # (the centre of the cap under the crossing point)
            a = Mf.rotation[:, 2]
            centre = Mf.translation + np.sign(float(n @ a)) * sf.h * a
        if kind == 4:                  # (the polytope edge crossing the rim: its vertices)
            i, j = crossing_edge(int(c.point[k]) % FACE_ID_BASE)
            edge = so.Vk[[i, j]] @ Mo.rotation.T + Mo.translation
        Dp, Dn, Dd = face_derivatives(so, Mo.rotation, Mo.translation, n, kind, x, d, JF, oF, JO,
                                      oO, centre, getattr(sf, "r", 0.0), edge)
        dp[k], dn[k], dd[k] = Dp, sgn * Dn, Dd
    return undone
