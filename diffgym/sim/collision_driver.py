"""Collision detection: broad phase, coal narrow phase and contact patches.

``detect`` returns every contact point whose signed distance is below the pair's margin:

* broad phase: the candidate pairs (already filtered by contype/conaffinity, exclusions and
  the parent-child rule) are tested with bounding spheres (planes with a half-space test, boxes
  with their oriented box) in one compiled pass, so a table of 16 balls runs the exact test on
  touching pairs only. Pairs without a plane are not visited one by one: a sweep and prune
  over the geoms' bounding spheres, inflated by their share of the margin, finds those near
  enough (``collision_kernels.sweep_and_prune``; near linear in the geoms), and only those
  are bounded and tested;
* narrow phase: coal's GJK/EPA or analytic tests (``pinocchio.computeCollision``) with a
  security margin, so that contacts about to close within this step are found (speculative
  contacts: a 10 m/s ball cannot tunnel through a 2 cm wall);
* contact patches (``pinocchio.computeContactPatch``): a face or edge contact gives a polygon,
  reduced to at most ``max_points`` (4) points that span it, so a box lies flat without rocking;
* margin rows of box-box and box-capsule pairs (``collision_kernels.poly_margin_rows``): the
  patch holds the support sets along the contact normal only, so a box on an edge or a corner
  over another box's face, or a tilted capsule, has one or two points and turns about them
  into the face within the step; where the contact has one or two points, the box corners or
  capsule ends within the pair's margin over a box face (and the points where an edge from
  one leaves the face) that the pair's relative motion can bring to it within the step get
  rows, the nearest first, up to three points with the contact's: the contact's normal, the
  point projected on its mid plane, the distance along the normal to the face's plane (so
  that the pair's drift correction stays realizable, as a patch's);
* closed form, without coal (``collision_kernels``): spheres, capsules and boxes on a static
  plane, sphere-sphere and sphere-box pairs (a ball against a cushion); (``plane_contacts``)
  cylinders and ellipsoids on a plane, and a cylinder on the face of a box
  (``cylinder_box_face``: 4 rim points of a cap lying flat, the two ends of a side-lying
  cylinder's line contact, a tilted cap's lowest rim point; coal where the cylinder is over an
  edge or a corner of the box); (``convex_support.face_contact``) a box, mesh, capsule or
  cylinder lying on a cylinder's cap and a cylinder on a mesh facet;
* single points of pairs with a cylinder or an ellipsoid, and of a sphere with a mesh: coal's
  witness points and normal refined to the exact optimum of the distance problem
  (``convex_support.solve``; coal's EPA normal of penetrating ellipsoids is off by up to 0.5
  rad), kept only where verified.

The margin of a pair is ``base_margin + dt^2 |gravity| + dt * (speed bound of geom 1 + speed
bound of geom 2)``.
Normals point from geom 1 to geom 2; ``dist`` is the signed distance (negative in penetration).

Cost: the per-step Python work is one loop over the *moving joints* (their placements and
velocities, read from pinocchio's data), one compiled call for the broad phase and the closed
forms, and a loop over the candidate pairs only (``last_candidates``: their number). The broad
phase is conservative (plus a 1 nm slack), so the exact narrow-phase tests alone decide which
points are contacts.

Polytope pairs (box-box, box-capsule, convex meshes, no swept radius, on no other route) take a
compiled route with three calls per pass in all (``collision_kernels``): ``poly_separated``
drops the candidates the separating-axis test proves farther apart than their margin (coal
would say no: the separation along an axis is a lower bound on the distance); coal is asked
about the rest (collision, then the contact patch), ``poly_snaps`` snaps every patch's normal
and distance to the exact separating axis, coal recomputes each patch about its axis, and
``poly_patches`` projects the points on the mid plane, gives each its own distance and reduces
the patch to ``max_points``. The geoms' placements are read through a view of gdata.oMg, their
vertices, face normals and edge directions from tables made at load. The rows of every route
get their frames and are merged with the closed-form rows in compiled code too
(``narrow_rows``, ``merge_rows``).
"""
from __future__ import annotations

from dataclasses import dataclass

import coal
import numpy as np
import pinocchio as pin

from .collision_derivatives import (_k_common_plane, _k_world_patch_distances, box_corners,
                                    capsule_axis, capsule_line_patch, segments_parallel,
                                    snap_pair)
from .frames import tangent_frames
from .pinviews import gather_placements, placement_view
from .model import SimModel
from .convex_support import FACE_ID_BASE, SMOOTH_KINDS, face_contact, shape_of, solve
from .pair_tables import NarrowPhase
from .collision_kernels import (BROAD_SLACK as _BROAD_SLACK, KIND_CODES, MARGIN_POINTS as
                                _MARGIN_POINTS, MARGIN_REACH, detect_closed_form,
                                merge_rows, narrow_rows, poly_margin_rows, poly_patches,
                                poly_separated,
                                poly_snaps)
from .trees import _oMg_view
from .plane_contacts import (ANALYTIC_KINDS, CYLINDER_POINTS, ELLIPSOID_POINTS, cylinder_box_face,
                             cylinder_lowest,
                             shape_points)



def _unpack_detect(F, I, nc, n):
    """Views of ``detect_closed_form``'s packed arrays: (cand, cand_margin, rows), rows =
    (pair, geom1, geom2, point, pos, normal, dist, mu, frames) of the n closed-form points."""
    return I[:nc], F[:nc], _unpack_rows(F, I, nc, n)


def _unpack_rows(F, I, nc, n):
    """``_unpack_detect``'s rows alone (a step without narrow-phase candidates)."""
    o = nc + 2 * n
    return (I[nc:nc + n], I[nc + n:nc + 2 * n], I[nc + 2 * n:nc + 3 * n],
            I[nc + 3 * n:], F[o:o + 3 * n].reshape(n, 3),
            F[o + 3 * n:o + 6 * n].reshape(n, 3), F[nc:nc + n],
            F[nc + n:o], F[o + 6 * n:].reshape(n, 3, 3))


@dataclass
class Contacts:
    """Contact points found by one detection pass (all arrays have one row per point)."""

    pair: np.ndarray      # (k,) index into SimModel.pairs
    geom1: np.ndarray     # (k,)
    geom2: np.ndarray     # (k,)
    point: np.ndarray     # (k,) index of the point within its pair's patch
    pos: np.ndarray       # (k, 3) world position (midpoint of the two witness points)
    normal: np.ndarray    # (k, 3) unit normal, from geom1 to geom2
    dist: np.ndarray      # (k,) signed distance along the normal
    mu: np.ndarray        # (k,) friction coefficient
    frames: np.ndarray | None = None   # (k, 3, 3) contact frames when known in advance, or None

    def __len__(self) -> int:
        return int(self.pair.shape[0])

    @staticmethod
    def empty() -> "Contacts":
        z = np.zeros(0, dtype=np.int64)
        return Contacts(z, z, z, z, np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), np.zeros(0))


def _reduce_patch(points: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of at most max_points points spanning a planar polygon (largest spread)."""
    n = len(points)
    if n <= max_points:
        return np.arange(n)
    c = points.mean(axis=0)
    i0 = int(np.argmax(np.sum((points - c) ** 2, axis=1)))
    i1 = int(np.argmax(np.sum((points - points[i0]) ** 2, axis=1)))
    chosen = [i0, i1]
    if max_points > 2:
        d = points[i1] - points[i0]
        d /= max(np.linalg.norm(d), 1e-300)
        rel = points - points[i0]
        perp = rel - np.outer(rel @ d, d)
        if max_points == 3:
            chosen.append(int(np.argmax(np.sum(perp ** 2, axis=1))))
        else:
            ref = perp[int(np.argmax(np.sum(perp ** 2, axis=1)))]
            side = perp @ ref
            chosen += [int(np.argmax(side)), int(np.argmin(side))]
    return np.unique(np.array(chosen[:max_points]))


def _mesh_points(shape) -> np.ndarray | None:
    """Vertices (k, 3) of a coal mesh (its convex hull's, when qhull can build it) in the geom
    frame, or None for other shapes."""
    if isinstance(shape, coal.BVHModelBase):
        pts = np.asarray(shape.vertices(), dtype=float).reshape(-1, 3)
    elif isinstance(shape, coal.ConvexBase):
        pts = np.asarray(shape.points(), dtype=float).reshape(-1, 3)
    else:
        return None
    if not len(pts):
        return None
    try:
        from scipy.spatial import ConvexHull
        pts = pts[ConvexHull(pts).vertices]
    except Exception:      # noqa: BLE001 - flat or degenerate meshes: keep every vertex
        pass
    return np.ascontiguousarray(pts)


def _mesh_axes(pts: np.ndarray, max_axes: int = 64):
    """("mesh", vertices, 0, unique face normals, unique edge directions) of a convex mesh from
    its hull (qhull), for the separating-axis snap; None for a flat or large hull. (Diagonals of
    coplanar triangles add axes that are not edges: harmless, an extra axis never beats the
    true one, whose separation is the largest.)"""
    try:
        from scipy.spatial import ConvexHull
        hull = ConvexHull(pts)
    except Exception:      # noqa: BLE001 - flat or degenerate
        return None

    def unique(D):
        D = D / np.linalg.norm(D, axis=1, keepdims=True)
        D = D * np.where((D[:, np.argmax(np.abs(D), axis=1)].diagonal() if len(D) else D[:, 0]) < 0, -1.0, 1.0)[:, None]
        keep = []
        for d in D:
            if not any(abs(abs(d @ e) - 1.0) < 1e-9 for e in keep):
                keep.append(d)
        return np.array(keep).reshape(-1, 3)

    F = unique(hull.equations[:, :3])
    tri = hull.simplices
    E = unique(np.concatenate([pts[tri[:, 1]] - pts[tri[:, 0]], pts[tri[:, 2]] - pts[tri[:, 1]],
                               pts[tri[:, 0]] - pts[tri[:, 2]]]))
    if len(F) > max_axes or len(E) > max_axes:
        return None
    return ("mesh", np.ascontiguousarray(pts), 0.0, F, E)


def _norms(x: np.ndarray) -> np.ndarray:
    """Row norms of (k, 3), equal bit for bit to ``np.linalg.norm`` of each row (a BLAS dot)."""
    return np.sqrt(np.matmul(x[:, None, :], x[:, :, None])[:, 0, 0])


# GJK's stopping tolerance for the narrow phase. coal's default (1e-6) leaves the distance of
# separated convex pairs wrong by up to ~1e-6 m and the normal tilted by up to ~5e-3 rad, and
# which of the near-optimal answers GJK stops at flips under perturbations of 1e-14: the
# collision output, hence the step, is then discontinuous at every state (DiffPush-v0's capsule
# rod 5 mm from the box: the normal jumps between (0.9918, -0.1274, 0) and
# (0.9925, -0.1220, -0.0055) and d v1 by ~1e-3 m/s between q and q + 1e-14).
# It also reports every gap below it as a distance of exactly 0, so resting contacts settled
# inside that flat band, where the distance stops following the poses.
GJK_TOLERANCE = 1e-10


def tighten_requests(requests) -> None:
    """Set the GJK and EPA tolerances of coal collision requests (a GeometryData's
    collisionRequests) to GJK_TOLERANCE."""
    for r in requests:
        r.gjk_tolerance = GJK_TOLERANCE
        r.epa_tolerance = GJK_TOLERANCE


class _SnapPairs:
    """The snappable pairs (box-box, box-capsule, polytopes; not capsule-capsule; no swept
    radius) as a read-only mapping pair index -> ((geom 1, kind, vertices, radius, face normals,
    edge directions), (geom 2, ...)) built on lookup from the per-geom cores: a mask over the
    candidate pairs instead of a dict of N^2 / 2 entries."""

    def __init__(self, pairs: np.ndarray, cores: list):
        self.pairs, self.cores = pairs, cores
        ok = np.array([c is not None for c in cores], dtype=bool)
        cap = np.array([c is not None and c[0] == "capsule" for c in cores], dtype=bool)
        a, b = pairs[:, 0], pairs[:, 1]
        self.mask = (ok[a] & ok[b] & ~(cap[a] & cap[b])) if len(pairs) else np.zeros(0, bool)

    def __contains__(self, k) -> bool:
        return bool(self.mask[k])

    def __getitem__(self, k):
        if not self.mask[k]:
            raise KeyError(k)
        a, b = int(self.pairs[k, 0]), int(self.pairs[k, 1])
        return (a,) + self.cores[a], (b,) + self.cores[b]

    def __len__(self) -> int:
        return int(np.count_nonzero(self.mask))


class CollisionDriver:
    def __init__(self, sm: SimModel, base_margin: float = 1e-3, max_points: int = 4,
                 batch_plane_pairs: bool = True):
        self.sm = sm
        # capsule and box on static plane pairs in one numpy pass (False: pair by pair through
        # the broad phase, the reference the tests compare the batched pass with)
        self.batch_plane_pairs = bool(batch_plane_pairs)
        self.base_margin = float(base_margin)
        # in one step a body falls by dt (v + g dt), not dt v: the margins add dt^2 |gravity|
        # (a ball at 10 Hz entered the floor by up to 6 cm before its contact was seen)
        self._gravity = float(np.linalg.norm(sm.model.gravity.linear))
        self.max_points = int(max_points)
        # margin rows (poly_margin_rows): within this many step lengths of the point's and the
        # contact's closing speeds of the face
        self.margin_reach = MARGIN_REACH
        gm = sm.geom_model
        self.pairs = sm.pairs
        self.ngeom = len(gm.geometryObjects)
        self.parent_joint = np.array([g.parentJoint for g in gm.geometryObjects], dtype=np.int64)
        self.local_pos = np.array([g.placement.translation for g in gm.geometryObjects]).reshape(-1, 3)
        self.radius = np.array([g.bound_radius for g in sm.geoms], dtype=float)
        self.is_plane = np.isinf(self.radius)
        self.static = self.parent_joint == 0
        # which pairs involve a plane: store plane index first for the half-space test
        p = self.pairs
        self.pair_plane = np.where(self.is_plane[p[:, 0]], p[:, 0], np.where(self.is_plane[p[:, 1]], p[:, 1], -1)) \
            if len(p) else np.zeros(0, dtype=np.int64)
        self.pair_other = np.where(self.pair_plane == p[:, 0], p[:, 1], p[:, 0]) if len(p) else self.pair_plane
        self.patch_request = coal.ContactPatchRequest()
        self.per_point_pairs: set = set()
        self._world_cache: dict = {}     # pair -> (gdata, world vertices ...) of this pass
        self._patch_tol = self.patch_request.getPatchTolerance()
        # shape-on-plane pairs with closed-form contact points (see plane_contacts.py)
        kinds = [g.kind for g in sm.geoms]
        self._geom_tables(gm, kinds)
        self.analytic = (self.pair_plane >= 0) & self._g_analytic[self.pair_other] \
            if len(p) else np.zeros(0, dtype=bool)
        self.moving_joints = np.unique(self.parent_joint[~self.static])
        self._gdata = None
        self._precompute(gm)

    def _geom_tables(self, gm: pin.GeometryModel, kinds: list) -> None:
        """Per-geom attributes the per-pair tables are read from (one pass over the geoms; the
        pair tables are then numpy masks over the candidate pairs, not Python loops over them)."""
        shapes = [g.geometry for g in gm.geometryObjects]
        self._g_kind = np.array(kinds, dtype=str)
        self._g_analytic = np.array([k in ANALYTIC_KINDS for k in kinds], dtype=bool)
        self._g_code = np.array([k in KIND_CODES for k in kinds], dtype=bool)
        self._g_swept = np.array([float(sh.getSweptSphereRadius())
                                  if hasattr(sh, "getSweptSphereRadius") else 0.0 for sh in shapes])
        self._g_coal_box = np.array([isinstance(sh, coal.Box) for sh in shapes], dtype=bool)
        self._g_coal_sphere = np.array([isinstance(sh, coal.Sphere) for sh in shapes], dtype=bool)
        self._g_coal_capsule = np.array([isinstance(sh, coal.Capsule) for sh in shapes], dtype=bool)
        self._g_coal_cylinder = np.array([isinstance(sh, coal.Cylinder) for sh in shapes], dtype=bool)
        self._g_half = np.array([np.asarray(sh.halfSide, float) if isinstance(sh, coal.Box)
                                 else np.zeros(3) for sh in shapes], dtype=float).reshape(-1, 3)
        self._g_sphere_r = np.array([float(sh.radius) if isinstance(sh, coal.Sphere) else 0.0
                                     for sh in shapes])

    @property
    def _ss(self) -> tuple:
        """(the sphere-sphere pairs with closed-form contacts,)"""
        return (np.flatnonzero(self._pcat == 2),)

    @property
    def _sb(self) -> tuple:
        """(the sphere-box pairs with closed-form contacts,)"""
        return (np.flatnonzero((self._pcat == 3) | (self._pcat == 4)),)

    # -- constant tables for the per-step work -----------------------------------------------
    def _precompute(self, gm: pin.GeometryModel) -> None:
        p = self.pairs
        self._npairs = len(p)
        self._mj = [int(j) for j in self.moving_joints]
        slot = np.full(max(int(self.parent_joint.max(initial=0)) + 1, 1), -1, dtype=np.int64)
        slot[self.moving_joints] = np.arange(len(self._mj))
        # slot of the joint of each geom in the moving-joint arrays (-1: static geom)
        self._gslot = np.where(self.static, -1, slot[self.parent_joint])
        # reach of each geom from its joint origin (speed bound = |v_o| + |w| * reach)
        self._reach = np.linalg.norm(self.local_pos, axis=1) + np.where(self.is_plane, 0.0, self.radius)
        # world placements (homogeneous) of the static geoms, which never change, and the local
        # placements of the moving ones: W[moving] = oMi[joint] @ W0 each step
        self._W0 = np.array([g.placement.homogeneous for g in gm.geometryObjects]).reshape(-1, 4, 4)
        # shape-on-static-plane pairs of spheres, capsules and boxes: closed-form points for all
        # of them in one compiled pass (no broad phase: the closed form is as cheap as a bound)
        kinds = [g.kind for g in self.sm.geoms]
        batch = np.zeros(len(p), dtype=bool)
        if self.batch_plane_pairs and len(p):
            batch = self.analytic & self._g_code[self.pair_other] & self.static[self.pair_plane]
        ks = np.flatnonzero(batch)
        pl, ot = self.pair_plane[ks], self.pair_other[ks]
        n_plane, offset = np.zeros((len(ks), 3)), np.zeros(len(ks))
        size = np.zeros((len(ks), 3))
        for i, (g_pl, g_ot) in enumerate(zip(pl.tolist(), ot.tolist())):
            M = gm.geometryObjects[g_pl].placement
            n_plane[i] = M.rotation[:, 2]
            offset[i] = float(n_plane[i] @ M.translation)
            sz = np.asarray(self.sm.geoms[g_ot].size, float).reshape(-1)[:3]
            size[i, :len(sz)] = sz
        N = np.where((pl != p[ks, 0])[:, None], -n_plane, n_plane)      # from geom 1 to geom 2
        self._bp = (ks.astype(np.int64), np.array([KIND_CODES[kinds[g]] for g in ot.tolist()], dtype=np.int64),
                    ot.astype(np.int64), n_plane, offset, N, tangent_frames(N), size)
        self._friction = np.ascontiguousarray(self.sm.pair_friction, dtype=float) if len(p) else np.zeros(0)
        # per moving joint: which velocity components move it (the support of its Jacobian)
        model = self.sm.model
        self._support = np.zeros((len(self._mj), model.nv), dtype=np.bool_)
        for s, j in enumerate(self._mj):
            jj = j
            while jj > 0:
                jm = model.joints[jj]
                self._support[s, jm.idx_v:jm.idx_v + jm.nv] = True
                jj = model.parents[jj]
        self._mj_arr = np.array(self._mj, dtype=np.int64)
        self._views: tuple | None = None           # (data, placement view or None, buffer)
        self._no_speed = np.zeros(0)
        self._empty = Contacts.empty()     # (returned when nothing touches; never written to)
        self._no_J = np.zeros((6, 0), order="F")      # (the layout of pinocchio's data.J)
        # broad phase (pairs not batched above), plane pairs and sphere pairs
        hp = (self.pair_plane >= 0) & ~batch
        self._hp = np.flatnonzero(hp)
        self._hp_pl = self.pair_plane[hp]
        self._hp_ot = self.pair_other[hp]
        self._hp_rad = self.radius[self._hp_ot]
        # support of the shape along the plane normal n: |R^T n| . ext_vec + ext_const (exact
        # for boxes and capsules, an upper bound for cylinders; the bounding radius otherwise)
        ext_vec = np.zeros((len(self._hp), 3))
        ext_const = self._hp_rad.copy()
        for i, ot in enumerate(self._hp_ot):
            g = self.sm.geoms[int(ot)]
            shape = gm.geometryObjects[int(ot)].geometry
            sw = shape.getSweptSphereRadius() if hasattr(shape, "getSweptSphereRadius") else 0.0
            if g.kind == "box":
                ext_vec[i], ext_const[i] = np.asarray(g.size[:3], float), sw
            elif g.kind in ("capsule", "cylinder"):
                ext_vec[i, 2], ext_const[i] = float(g.size[1]), float(g.size[0]) + sw
        self._hp_ext_vec, self._hp_ext_const = ext_vec, ext_const
        self._hp = self._hp.astype(np.int64)
        self._hp_pl, self._hp_ot = self._hp_pl.astype(np.int64), self._hp_ot.astype(np.int64)
        self._hp_use_rot = bool(np.any(ext_vec))
        # meshes against a plane: the bounding sphere is a loose bound (an arm link resting just
        # above the ground would run coal's mesh test every step); the lowest vertex of the
        # mesh's convex hull gives the exact signed height of the mesh above the plane
        self._hp_mesh = []
        for i, ot in enumerate(self._hp_ot):
            shape = gm.geometryObjects[int(ot)].geometry
            pts = _mesh_points(shape)
            if pts is not None:
                sw = shape.getSweptSphereRadius() if hasattr(shape, "getSweptSphereRadius") else 0.0
                self._hp_mesh.append((int(self._hp[i]), int(self._hp_pl[i]), int(ot), pts, float(sw)))
        # sphere-sphere pairs: closed form in the compiled pass
        sph = self._g_kind == "sphere"
        ss = (sph[p[:, 0]] & sph[p[:, 1]]) if self.batch_plane_pairs \
            else np.zeros(len(p), dtype=bool)
        self._g_ssr = np.array([float(g.size[0]) if g.kind == "sphere" else 0.0
                                for g in self.sm.geoms], dtype=float).reshape(-1)
        # sphere-box pairs (a box without a swept-sphere radius): closed form in the compiled
        # pass too (collision_kernels.sphere_box_pairs)
        sb = side1 = np.zeros(len(p), dtype=bool)
        if self.batch_plane_pairs and len(p):
            # the first side (box, sphere) in order (geom 1, geom 2) whose box geom is a coal
            # Box decides; the pair is batched when neither shape has a swept-sphere radius and
            # the sphere is a coal Sphere
            a, b = p[:, 0], p[:, 1]
            kb, ks = self._g_kind == "box", self._g_kind == "sphere"
            side1 = kb[a] & ks[b] & self._g_coal_box[a]
            side2 = ~side1 & kb[b] & ks[a] & self._g_coal_box[b]
            box = np.where(side1, a, b)
            sphg = np.where(side1, b, a)
            sb = (side1 | side2) & (self._g_swept[box] == 0.0) & (self._g_swept[sphg] == 0.0) \
                & self._g_coal_sphere[sphg]
        nonplane = (self.pair_plane < 0) & ~ss & ~sb
        # the category of each pair in the swept broad phase (collision_kernels): 0 not swept
        # (a plane pair), 1 the distance bounds, 2 sphere-sphere, 3 sphere-box with the box
        # first, 4 with the box second
        pcat = np.zeros(len(p), dtype=np.int8)
        pcat[nonplane] = 1
        pcat[ss] = 2
        pcat[sb & side1] = 3
        pcat[sb & ~side1] = 4
        self._pcat = pcat
        # the geoms the sweep sorts: those of some swept pair
        used = np.zeros(self.ngeom, dtype=bool)
        if len(p):
            used[p[pcat > 0, 0]] = True
            used[p[pcat > 0, 1]] = True
        self._sap_g = np.flatnonzero(used).astype(np.int64)
        self._rad = np.ascontiguousarray(self.radius, dtype=float)
        # pair lookup by (min geom, max geom): the pairs themselves when their rows are (i, k),
        # i < k, strictly increasing (MJCF's candidate_pairs), else a sorting permutation
        self._perm = np.zeros(0, dtype=np.int64)
        if len(p):
            lo, hi = np.minimum(p[:, 0], p[:, 1]), np.maximum(p[:, 0], p[:, 1])
            key = lo * self.ngeom + hi
            if not (np.all(p[:, 0] < p[:, 1]) and np.all(np.diff(key) > 0)):
                self._perm = np.argsort(key, kind="stable").astype(np.int64)
        # oriented-box refinement of the swept pairs that involve a box (a coal Box; half sizes
        # plus its swept-sphere radius)
        self._g_isbox = self._g_coal_box.copy()
        self._g_boxhalf = np.ascontiguousarray(
            (self._g_half + self._g_swept[:, None]).reshape(-1, 3), dtype=float)
        # meshes against a plane, flat for the kernel (their entry in the plane pairs _hp)
        hm = self._hp_mesh
        pos = {int(k): i for i, k in enumerate(self._hp.tolist())}
        self._mesh = (np.array([pos[e[0]] for e in hm], dtype=np.int64),
                      np.array([e[1] for e in hm], dtype=np.int64),
                      np.array([e[2] for e in hm], dtype=np.int64),
                      np.array([e[4] for e in hm], dtype=float),
                      np.cumsum([0] + [len(e[3]) for e in hm]).astype(np.int64),
                      np.concatenate([e[3] for e in hm]).reshape(-1, 3) if hm else np.zeros((0, 3)))
        self.last_candidates = 0        # narrow-phase candidates of the last detect pass
        # narrow phase tables
        self._analytic_list = self.analytic.tolist()
        self._pl_list = self.pair_plane.astype(np.int64).tolist()
        self._ot_list = self.pair_other.astype(np.int64).tolist()
        self._flip = ((self.pair_plane >= 0) & (self.pair_plane != p[:, 0])).tolist() \
            if len(p) else []
        self._plane_frame: dict[int, tuple[np.ndarray, float]] = {}
        for k in np.flatnonzero(self.analytic):
            pl = self._pl_list[k]
            if self.static[pl]:
                M = gm.geometryObjects[pl].placement
                n_plane = M.rotation[:, 2].copy()
                self._plane_frame[pl] = (n_plane, float(n_plane @ M.translation))

        cc = np.flatnonzero(self._g_coal_capsule[p[:, 0]] & self._g_coal_capsule[p[:, 1]]) \
            if len(p) else []
        self._caps_caps = {int(k): (int(p[k, 0]), int(p[k, 1])) for k in cc}
        # box-box and box-capsule pairs (no swept radius): normal and distance snapped to the
        # separating axis, per-point patch distances (collision_derivatives)
        self._box_box = {}

        def core(g):
            """(kind, vertices, radius, face normals, edge directions) in the geom frame."""
            sh = gm.geometryObjects[g].geometry
            if hasattr(sh, "getSweptSphereRadius") and sh.getSweptSphereRadius():
                return None
            eye = np.eye(3)
            if isinstance(sh, coal.Box):
                return ("box", box_corners(eye, np.zeros(3), np.asarray(sh.halfSide, float)), 0.0, eye, eye)
            if isinstance(sh, coal.Capsule):
                return ("capsule", np.array([[0.0, 0.0, -sh.halfLength], [0.0, 0.0, sh.halfLength]]),
                        float(sh.radius), np.zeros((0, 3)), eye[2:])
            if isinstance(sh, coal.ConvexBase):
                return _mesh_axes(np.asarray(sh.points(), dtype=float).reshape(-1, 3))
            return None

        # cylinder-box pairs (no swept radius): closed-form points on a box face
        # (plane_contacts.cylinder_box_face), coal elsewhere
        self._cyl_box = {}
        cyl, cbox, nosw = self._g_coal_cylinder, self._g_coal_box, self._g_swept == 0.0
        cand = np.flatnonzero(nosw[p[:, 0]] & nosw[p[:, 1]]
                              & ((cyl[p[:, 0]] & cbox[p[:, 1]]) | (cbox[p[:, 0]] & cyl[p[:, 1]]))) \
            if len(p) else []
        for k in cand.tolist() if len(cand) else []:
            sh = [gm.geometryObjects[int(g)].geometry for g in p[k]]
            if any(hasattr(x, "getSweptSphereRadius") and x.getSweptSphereRadius() for x in sh):
                continue
            for ic, ib in ((0, 1), (1, 0)):
                if isinstance(sh[ic], coal.Cylinder) and isinstance(sh[ib], coal.Box):
                    self._cyl_box[k] = (int(p[k, ic]), int(p[k, ib]), float(sh[ic].radius),
                                        float(sh[ic].halfLength),
                                        np.asarray(sh[ib].halfSide, float).copy(), ib == 0)
        self.cylinder_face_pairs: set = set()
        # pairs with a cylinder or an ellipsoid, or a sphere with a mesh (no plane): coal's
        # single contact point refined to the exact optimum of the distance problem
        # (convex_support), whose derivatives are closed form
        self._convex = {}
        gk = self._g_kind
        smooth = np.isin(gk, SMOOTH_KINDS)
        cand = np.flatnonzero((gk[p[:, 0]] != "plane") & (gk[p[:, 1]] != "plane") & (
            smooth[p[:, 0]] | smooth[p[:, 1]] | ((gk[p[:, 0]] == "sphere") & (gk[p[:, 1]] == "mesh"))
            | ((gk[p[:, 0]] == "mesh") & (gk[p[:, 1]] == "sphere")))) if len(p) else []
        for k in cand.tolist() if len(cand) else []:
            ka, kb = kinds[int(p[k, 0])], kinds[int(p[k, 1])]
            if "plane" in (ka, kb):
                continue
            if {ka, kb} & set(SMOOTH_KINDS) or {ka, kb} == {"sphere", "mesh"}:
                sa, sb = shape_of(self.sm, int(p[k, 0])), shape_of(self.sm, int(p[k, 1]))
                if sa.ok and sb.ok:
                    self._convex[k] = (int(p[k, 0]), int(p[k, 1]), sa, sb)
        self.convex_pairs: dict = {}
        # pairs of a cylinder with a box, a mesh, a capsule or a cylinder: a shape lying on a
        # cylinder's cap or a cylinder on a mesh facet, in closed form (convex_support.face_contact)
        self._face = {}
        fk = np.isin(gk, ("cylinder", "box", "mesh", "capsule"))
        cand = np.flatnonzero(((gk[p[:, 0]] == "cylinder") | (gk[p[:, 1]] == "cylinder"))
                              & fk[p[:, 0]] & fk[p[:, 1]]) if len(p) else []
        for k in cand.tolist() if len(cand) else []:
            ga, gb = int(p[k, 0]), int(p[k, 1])
            ka, kb = kinds[ga], kinds[gb]
            if "cylinder" not in (ka, kb) or not {ka, kb} <= {"cylinder", "box", "mesh", "capsule"}:
                continue
            sa, sb = shape_of(self.sm, ga), shape_of(self.sm, gb)
            if not (sa.ok and sb.ok):
                continue
            tries = [(f, o) for f, o in ((ga, gb), (gb, ga))
                     if kinds[f] == "cylinder" or (kinds[f] == "mesh" and kinds[o] == "cylinder")]
            self._face[k] = [(f, o, shape_of(self.sm, f), shape_of(self.sm, o), f == ga) for f, o in tries]
        self.face_pairs: dict = {}
        self._convex_n: dict = {}          # pair -> its last refined normal

        cores = [core(g) for g in range(len(gm.geometryObjects))]  # (one per geom, shared)
        self._box_box = _SnapPairs(p, cores)
        # the same cores as flat tables for the compiled polytope route (collision_kernels
        # poly_separated, poly_snaps, poly_patches): vertices, face normals, edge directions (rows
        # off[g]:off[g + 1] of geom g) and radius
        tabs = []
        for i in (1, 3, 4):
            parts = [np.asarray(c[i], float).reshape(-1, 3) if c is not None else np.zeros((0, 3))
                     for c in cores]
            off = np.cumsum([0] + [len(x) for x in parts]).astype(np.int64)
            tabs += [np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros((0, 3))), off]
        self._cores = tuple(tabs) + (np.array([c[2] if c is not None else 0.0 for c in cores],
                                               dtype=float),)
        # pairs of the compiled polytope route: snappable, on no closed-form or refined route
        other = set(self._cyl_box) | set(self._face) | set(self._caps_caps) | set(self._convex)
        fast = self._box_box.mask & ~self.analytic & (self.pair_plane < 0) if len(p) \
            else np.zeros(0, dtype=bool)
        for k in other:
            fast[k] = False
        self._poly_fast = fast
        self._any_fast = bool(fast.any())
        self._any_snap = bool(self._box_box.mask.any()) if len(p) else False
        self._gviews: tuple | None = None       # (gdata, view of its oMg or None)

    def _world(self, k, gdata):
        """Per side of snappable pair k: world vertices, radius, face normals, edge directions
        (kept for the rest of the detection pass: the snap, the patch distances and the
        crossing test of one pair each ask for them)."""
        cache = self._world_cache
        hit = cache.get(k)
        if hit is not None and hit[0] is gdata:
            return hit[1]
        out = []
        for g, kind, V, rad, F, E in self._box_box[k]:
            M = gdata.oMg[g]
            R = M.rotation
            out.append((V @ R.T + M.translation, rad, F @ R.T, E @ R.T))
        cache[k] = (gdata, out)
        return out

    def _patch_distances(self, k, gdata, n, mid):
        """Per-point distances and points of a box-box or box-capsule patch."""
        (X, ra, _, _), (Y, rb, _, _) = self._world(k, gdata)
        ok, dist, pts = _k_world_patch_distances(X, float(ra), Y, float(rb), n,
                                                 np.ascontiguousarray(mid, dtype=float).reshape(-1, 3),
                                                 float(self._patch_tol))
        if not ok:
            raise np.linalg.LinAlgError("patch_distances: singular support feature")
        return dist, pts

    def _crossing_segments(self, k, gdata, n) -> bool:
        """Whether both support sets of pair k along n are segments that cross (not parallel):
        two capsules, two box edges, a box edge and a capsule."""
        if k in self._caps_caps:
            ga, gb = self._caps_caps[k]
            ua, ub = gdata.oMg[ga].rotation[:, 2], gdata.oMg[gb].rotation[:, 2]
            return not segments_parallel(ua, ub)
        if k in self._box_box:
            (X, _, _, _), (Y, _, _, _) = self._world(k, gdata)
            hx, hy = X @ n, Y @ n
            SA = X[hx.max() - hx < self._patch_tol]
            SB = Y[hy - hy.min() < self._patch_tol]
            return len(SA) == 2 and len(SB) == 2 and not segments_parallel(SA[1] - SA[0], SB[1] - SB[0])
        return False

    def _snap(self, k, gdata, n, d):
        (X, ra, FA, EA), (Y, rb, FB, EB) = self._world(k, gdata)
        return snap_pair(X, ra, FA, EA, Y, rb, FB, EB, n, d)

    # -- per-step kinematics ---------------------------------------------------------------
    def _placements(self, data: pin.Data) -> np.ndarray:
        """Joint placements (njoints, 12) of data: a view of its memory (pinviews), made once
        per Data, or a copy where no view can be made."""
        oM = getattr(data, "oM", None)
        if oM is not None:              # diffgym.sim.trees.TreeData: gathered tree by tree
            return oM
        v = self._views
        if v is None or v[0] is not data:
            view = placement_view(self.sm.model, data) if self._mj else None
            v = self._views = (data, view, np.zeros((self.sm.model.njoints, 12)))
        if v[1] is not None:
            return v[1]
        return gather_placements(data, v[2])

    def _joint_speeds(self, data: pin.Data) -> tuple[np.ndarray, np.ndarray]:
        """Speed of each moving joint's origin and its angular speed, from data.v."""
        vel = data.v
        V = np.array([vel[j].vector for j in self._mj]).reshape(-1, 6)
        return _norms(V[:, :3]), _norms(V[:, 3:])

    def speed_bounds(self, data: pin.Data) -> np.ndarray:
        """Upper bound on the speed of any point of each geom (from the joint velocities):
        ``|v_o| + |w| * reach``, as the margins use it."""
        speed = np.zeros(self.ngeom)
        if self._mj:
            lin, ang = self._joint_speeds(data)
            s = self._gslot[~self.static]
            speed[~self.static] = lin[s] + ang[s] * self._reach[~self.static]
        return speed

    # -- narrow phase, closed form ---------------------------------------------------------
    def _plane_pair(self, k, gdata, margin, rows_pair, rows_pt, rows_pos, rows_n, rows_d) -> None:
        """Shape-on-plane points of pair k (appended to the row lists)."""
        pl, ot = self._pl_list[k], self._ot_list[k]
        fr = self._plane_frame.get(pl)
        if fr is None:
            Mp = gdata.oMg[pl]
            n_plane = Mp.rotation[:, 2]
            fr = (n_plane, float(n_plane @ Mp.translation))
        n_plane, offset = fr
        Ms = gdata.oMg[ot]
        g = self.sm.geoms[ot]
        x, height, ids = shape_points(g.kind, g.size, Ms.rotation, Ms.translation, n_plane, offset)
        sel = np.flatnonzero(height < margin)
        m = len(sel)
        if not m:
            return
        if g.kind == "cylinder":
            # a cylinder touching the plane keeps both caps' lowest rim points: a landing on
            # one cap's rim can spin it up within the step (the margin bounds the pre-step
            # speed) and swing the other cap down (bench_drops #197, 30 Hz: 4.7 -> 16 rad/s
            # on a single rim row, 16 mm into the floor)
            low = np.flatnonzero(cylinder_lowest(ids))
            sel = np.union1d(sel, low)
            m = len(sel)
        # (an ellipsoid or a cylinder keeps all its candidates: plane_contacts.ELLIPSOID_POINTS,
        # CYLINDER_POINTS)
        cap = (ELLIPSOID_POINTS if g.kind == "ellipsoid" else
               max(CYLINDER_POINTS, self.max_points) if g.kind == "cylinder" else self.max_points)
        if m > cap:
            order = np.argsort(height[sel], kind="stable")
            keep = cap
            if g.kind not in ("ellipsoid", "cylinder"):
                # beyond the deepest cap, every point lower than the distance the bodies' motion
                # covers within the step (collision_kernels.plane_points' ``reach``)
                reach = margin - self._margin0
                hs = height[sel][order]
                while keep < m and hs[keep] < reach:
                    keep += 1
            sel = sel[order[:keep]]
            m = keep
        N = -n_plane if self._flip[k] else n_plane   # from geom 1 to geom 2
        d = height[sel]
        rows_pair += [k] * m
        rows_pt += ids[sel].tolist()
        # the projection of the witness point x on the plane (see collision_kernels)
        rows_pos.extend(x[sel] - d[:, None] * n_plane)
        rows_n += [N] * m
        rows_d += d.tolist()

    def _single_point(self, k, gdata, side, p1, p2, n, rows_pair, rows_pt, rows_pos, rows_n,
                      rows_d) -> None:
        """One contact row of pair k from its witness points p1, p2 and normal n: for box-box
        pairs the normal snapped to the exact separating axis (about the same witness midpoint);
        the point is the witness on the plane for a shape on a plane (``side`` 1 or 2), else the
        midpoint."""
        cv = self._convex.get(k)
        if cv is not None and not side:
            ga, gb, sa, sb = cv
            Ma, Mb = gdata.oMg[ga], gdata.oMg[gb]
            try:
                out = solve(sa, Ma.rotation, Ma.translation, sb, Mb.rotation, Mb.translation, n,
                            np.asarray(p1, float), np.asarray(p2, float), self._convex_n.get(k))
            except (np.linalg.LinAlgError, FloatingPointError, ValueError, ZeroDivisionError):
                out = None                   # (coal's point stands; its derivative: the fallback)
            if out is not None:
                n, _, p1, p2, tol = out
                self.convex_pairs[k] = tol
                self._convex_n[k] = n
        if k in self._box_box:
            snap = self._snap(k, gdata, n, float(n @ (p2 - p1)))
            if snap is not None:
                mid = 0.5 * (p1 + p2)
                n, d = snap[0], snap[1]
                p1, p2 = mid - 0.5 * d * n, mid + 0.5 * d * n
        rows_pair.append(k)
        rows_pt.append(0)
        rows_pos.append(0.5 * (p1 + p2) if not side else (p1 if side == 1 else p2))
        rows_n.append(n)
        rows_d.append(float(n @ (p2 - p1)))

    def _oMg(self, gdata) -> np.ndarray:
        """The geoms' world placements (ngeom, 12: rotation column-major, translation): a view
        of gdata.oMg made once per GeometryData, or a copy where no view can be made."""
        gv = self._gviews
        if gv is None or gv[0] is not gdata:
            gv = self._gviews = (gdata, _oMg_view(gdata))
        if gv[1] is not None:
            return gv[1]
        out = np.empty((self.ngeom, 12))
        for g, M in enumerate(gdata.oMg):
            out[g, :9] = M.rotation.ravel(order="F")
            out[g, 9:] = M.translation
        return out

    def _poly_first(self, k, gdata, pres, cres, poly, rows_pair, rows_pt, rows_pos, rows_n,
                    rows_d) -> None:
        """Snappable polytope pair k (box-box, box-capsule, convex meshes; no plane) after
        coal's collision and patch: a single point as ``_single_point``; a patch is queued in
        ``poly`` as (k, coal's normal, its distance, its points) for ``_poly_batch``."""
        if pres.numContactPatches() == 0:
            c = cres.getContact(0)
            self._single_point(k, gdata, 0, c.getNearestPoint1(), c.getNearestPoint2(),
                               np.asarray(c.normal).copy(), rows_pair, rows_pt, rows_pos,
                               rows_n, rows_d)
            return
        patch = pres.getContactPatch(0)
        n = np.asarray(patch.getNormal()).copy()
        m = patch.size()
        if m == 1:
            self._single_point(k, gdata, 0, patch.getPointShape1(0), patch.getPointShape2(0),
                               n, rows_pair, rows_pt, rows_pos, rows_n, rows_d)
            return
        p1, p2 = patch.getPointShape1(0), patch.getPointShape2(0)
        poly.append((k, n, float(n @ (p2 - p1)), [patch.getPoint(i) for i in range(m)]))

    def _poly_batch(self, poly, gdata, rows_pair, rows_pt, rows_pos, rows_n, rows_d):
        """Rows of the queued polytope pairs (``_poly_first``): every snap in one compiled call
        (collision_kernels.poly_snaps), then coal's patch about each exact axis, then every
        patch projected on its mid plane with per-point distances and reduced in one call
        (poly_patches); returned as (pair, point, pos, normal, dist) arrays, or None. Pairs of
        crossing segments (one witness point, as in detect) and pairs whose snap coal's answer
        contradicts (coal's patch and distances stand) go to the row lists."""
        view = self._oMg(gdata)
        ks = np.array([e[0] for e in poly], dtype=np.int64)
        N = np.array([e[1] for e in poly], dtype=float).reshape(-1, 3)
        cross, ok, axes, _, heights = poly_snaps(
            view, self.pairs, ks, N, np.array([e[2] for e in poly], dtype=float),
            np.array([len(e[3]) == 2 for e in poly], dtype=np.bool_), 1e-7,
            float(self._patch_tol), *self._cores)
        take, mids, sizes = [], [], []
        pres_all, cres = self._narrow.patch_results, self._narrow.results
        for i, (k, n, _, first) in enumerate(poly):
            if cross[i]:
                # coal's segment-segment patch of crossing segments is wrong: the contact is
                # the one witness point
                ct = cres[k].getContact(0)
                mid, pd = np.asarray(ct.pos).copy(), float(ct.penetration_depth)
                self._single_point(k, gdata, 0, mid - 0.5 * pd * n, mid + 0.5 * pd * n, n,
                                   rows_pair, rows_pt, rows_pos, rows_n, rows_d)
            elif not ok[i]:                # coal's patch and distances stand
                patch = pres_all[k].getContactPatch(0)
                m = patch.size()
                P1 = np.array([patch.getPointShape1(j) for j in range(m)])
                P2 = np.array([patch.getPointShape2(j) for j in range(m)])
                mid = 0.5 * (P1 + P2)
                dist = n @ (P2 - P1).T
                keep = _reduce_patch(mid, self.max_points)
                for j, t in enumerate(keep):
                    rows_pair.append(k); rows_pt.append(j)
                    rows_pos.append(mid[t])
                    rows_n.append(n)
                    rows_d.append(float(dist[t]))
            else:
                # the patch about the axis itself (see detect; coal's, when it has fewer than
                # two points about the axis)
                self._narrow.patch_along(k, gdata, axes[i])
                pres = pres_all[k]
                if pres.numContactPatches() and pres.getContactPatch(0).size() >= 2:
                    patch = pres.getContactPatch(0)
                    first = [patch.getPoint(j) for j in range(patch.size())]
                take.append(i)
                sizes.append(len(first))
                mids += first
        if not take:
            return None
        take = np.array(take, dtype=np.int64)
        off = np.zeros(len(take) + 1, dtype=np.int64)
        np.cumsum(np.array(sizes, dtype=np.int64), out=off[1:])
        good, *rows = poly_patches(view, self.pairs, ks[take], np.ascontiguousarray(axes[take]),
                                   heights[take], np.array(mids, dtype=float).reshape(-1, 3),
                                   off, self._cores[0], self._cores[1], self._cores[6],
                                   float(self._patch_tol), self.max_points)
        if not good:
            raise np.linalg.LinAlgError("patch_distances: singular support feature")
        self.per_point_pairs.update(ks[take].tolist())
        return tuple(rows)

    def _twists(self, geoms, data, Jw, v) -> np.ndarray:
        """World twists (len(geoms), 6) of the given geoms' bodies: the velocity of the point
        at the world origin and the angular velocity (zeros for a static geom), from the joint
        Jacobians ``Jw`` and ``v`` where the step gives them, else from ``data.v``."""
        out = np.zeros((len(geoms), 6))
        for i, g in enumerate(geoms):
            s = int(self._gslot[g])
            if s < 0:
                continue
            if Jw is not None:
                mask = self._support[s]
                out[i] = Jw[:, mask] @ v[mask]
            else:
                j = self._mj[s]
                M, V = data.oMi[j], data.v[j]
                w = M.rotation @ V.angular
                out[i, 3:] = w
                out[i, :3] = M.rotation @ V.linear - np.cross(w, M.translation)
        return out

    def _margin_rows(self, gdata, cand, cand_margin, cols, data, dt, Jw, v):
        """``cols`` (pair, point, pos, normal, dist of the narrow phase's rows) with the
        margin rows of its snappable polytope pairs (box-box, box-capsule) that touch at one
        or two points appended (collision_kernels.poly_margin_rows: the vertices within the
        pair's margin over a face of a box of the pair, beyond the contact, that the pair's
        motion can bring to the face within the step)."""
        P = cols[0]
        sel = np.flatnonzero(self._box_box.mask[P])
        if not len(sel):
            return cols
        # pairs touching at one or two points only (a face patch holds its corners)
        ks, cnt = np.unique(P[sel], return_counts=True)
        few = cnt < _MARGIN_POINTS
        if not few.any():
            return cols
        sel = sel[np.isin(P[sel], ks[few])]
        ks, first, inv = np.unique(P[sel], return_index=True, return_inverse=True)
        normals = np.ascontiguousarray(cols[3][sel[first]])
        margins = np.ascontiguousarray(cand_margin[np.searchsorted(cand, ks)])
        deepest = np.full(len(ks), np.inf)
        np.minimum.at(deepest, inv, cols[4][sel])
        count = np.bincount(inv, minlength=len(ks))
        at = np.ascontiguousarray(cols[2][sel[np.argsort(inv, kind="stable")]])
        off = np.zeros(len(ks) + 1, dtype=np.int64)
        np.cumsum(count, out=off[1:])
        tw = self._twists(self.pairs[ks].ravel(), data, Jw, v).reshape(len(ks), 2, 6)
        c_v, c_voff = self._cores[0], self._cores[1]
        extra = poly_margin_rows(self._oMg(gdata), self.pairs, ks, normals, margins, deepest,
                                 off, at, float(self._patch_tol), self._g_coal_box,
                                 self._g_half, c_v, c_voff, self._cores[6], tw, float(dt),
                                 float(self._margin0), float(self.margin_reach))
        if not len(extra[0]):
            return cols
        return tuple(np.concatenate((a, b)) for a, b in zip(cols, extra))

    def _cylinder_box(self, k, gdata, margin, rows_pair, rows_pt, rows_pos, rows_n, rows_d) -> bool:
        """Closed-form points of cylinder-box pair k where a box face is the contact feature
        (plane_contacts.cylinder_box_face: a cap flat on the face gives 4 rim points, a
        cylinder on its side the two ends of its line contact; the points on the face plane);
        False where it is not (coal decides)."""
        gc, gb, r, h, hb, box_first = self._cyl_box[k]
        Mc, Mb = gdata.oMg[gc], gdata.oMg[gb]
        out = cylinder_box_face(r, h, Mc.rotation, Mc.translation, Mb.rotation, Mb.translation,
                                hb, margin)
        if out is None:
            return False
        n, _, _, x, height, ids = out
        self.cylinder_face_pairs.add(k)
        m = len(ids)
        if not m:
            return True
        if m > self.max_points:
            sel = np.argsort(height, kind="stable")[:self.max_points]
            x, height, ids, m = x[sel], height[sel], ids[sel], self.max_points
        N = n if box_first else -n                   # from geom 1 to geom 2
        rows_pair += [k] * m
        rows_pt += ids.tolist()
        rows_pos.extend(x - height[:, None] * n)
        rows_n += [N] * m
        rows_d += height.tolist()
        return True

    def _capsule_line(self, k, gdata, margin, rows_pair, rows_pt, rows_pos, rows_n, rows_d) -> bool:
        """Closed-form points of capsule-capsule pair k whose axes lie along each other: the
        ends of their overlap (collision_derivatives.capsule_line_patch), each with its own
        normal and distance; False where the axes are not near-parallel (coal decides)."""
        ga, gb = self._caps_caps[k]
        a0, a1, ra = capsule_axis(self.sm, ga, gdata)
        b0, b1, rb = capsule_axis(self.sm, gb, gdata)
        out = capsule_line_patch(a0, a1, ra, b0, b1, rb, float(self._patch_tol))
        if out is None:
            return False
        L = [float(np.linalg.norm(pb - pa)) for _, pa, pb in out]
        if not min(L) > 0.0:
            return False
        if min(L) - ra - rb >= margin:
            return True                        # (no contact)
        for pid, pa, pb in out:
            r = pb - pa
            L = float(np.sqrt(r @ r))
            n = r / L
            rows_pair.append(k)
            rows_pt.append(pid)
            rows_pos.append(0.5 * (pa + pb) + 0.5 * (ra - rb) * n)
            rows_n.append(n)
            rows_d.append(L - ra - rb)
        return True

    def _face_contact(self, k, gdata, margin, rows_pair, rows_pt, rows_pos, rows_n, rows_d) -> bool:
        """Closed-form points of pair k where a shape lies on a cylinder's cap or a cylinder on
        a mesh facet (convex_support.face_contact; of the faces tried, the one with the larger
        separation); False where neither is the contact feature (coal decides)."""
        best = None
        for gf, go, sf, so, first in self._face[k]:
            Mf, Mo = gdata.oMg[gf], gdata.oMg[go]
            try:
                out = face_contact(sf, Mf.rotation, Mf.translation, so, Mo.rotation, Mo.translation,
                                   margin, self.max_points)
            except (np.linalg.LinAlgError, FloatingPointError, ValueError):
                out = None
            if out is not None and (best is None or out[-1] > best[0][-1]):
                best = (out, gf, go, first)
        if best is None:
            return False
        (n, fi, x, height, ids, kinds, _), gf, go, first = best
        pid = (FACE_ID_BASE * (1 + fi) + ids).tolist()
        self.face_pairs[k] = (gf, go, dict(zip(pid, kinds.tolist())))
        m = len(pid)
        if not m:
            return True
        rows_pair += [k] * m
        rows_pt += pid
        rows_pos.extend(x - height[:, None] * n)
        rows_n += [n if first else -n] * m
        rows_d += height.tolist()
        return True

    def _narrow_tables(self, gdata: pin.GeometryData):
        """The per-pair request/result objects of the narrow phase: coal's, made on a pair's
        first test (diffgym.sim.pair_tables; a GeometryData holds them for every pair, quadratic in
        the number of bodies)."""
        nph = self.__dict__.get("_narrow")
        if nph is None:
            nph = self._narrow = NarrowPhase(self.sm.geom_model, self.pairs, GJK_TOLERANCE)
        nph.new_placements()                         # (once per detection pass)
        return nph.requests, nph.results, nph.patch_results

    @property
    def max_points(self) -> int:
        """Most points kept of a contact patch."""
        return self.__dict__["_max_points"]

    @max_points.setter
    def max_points(self, value: int) -> None:
        self.__dict__["_max_points"] = int(value)
        self.__dict__.pop("_fixed_args", None)

    # -- the detection pass ----------------------------------------------------------------
    def _detect_fixed_args(self) -> tuple:
        """``detect_closed_form``'s arguments that the model fixes at load, in the kernel's
        order around the per-step ones (built once: ~30 attribute reads fewer per step):
        (mj, support, the broad phase's, those after ``dt``). Setting ``max_points`` drops
        them (they hold its value)."""
        return (self._mj_arr, self._support,
                (self._gslot, self._W0, self._reach, self.pairs, self._perm, self._pcat,
                 self._rad, self._sap_g),
                (self._hp, self._hp_pl, self._hp_ot, self._hp_ext_vec, self._hp_ext_const,
                 self._hp_use_rot, *self._mesh, self._g_boxhalf, self._g_isbox, self._friction,
                 self.max_points, *self._bp, self._g_ssr, self._g_half, self._g_sphere_r))

    def detect(self, data: pin.Data, gdata: pin.GeometryData, dt: float,
               v: np.ndarray | None = None, Jw: np.ndarray | None = None) -> Contacts:
        """Contacts at the placements of ``data`` (forwardKinematics) and ``gdata``
        (updateGeometryPlacements). With ``v``, the speed bounds come from ``data.J``, which
        must hold the joint Jacobians at those placements (computeJointJacobians), read as
        ``Jw`` when the caller has it already (``data.J.reshape(6, nv)``: the step's, one
        conversion of data.J a step); without ``v``, from the joint velocities in ``data.v``."""
        if not self._npairs:
            return self._empty
        from_jacobian = v is not None
        oM = self._placements(data)
        if self._mj:
            if from_jacobian:
                lin = ang = self._no_speed
                if Jw is None:
                    Jw = data.J.reshape(6, -1)
            else:
                lin, ang = self._joint_speeds(data)
                Jw, v = self._no_J, self._no_speed
        else:
            lin, ang, Jw, v, from_jacobian = (self._no_speed, self._no_speed, self._no_J,
                                              self._no_speed, False)
        # (the margins' part that is not the bodies' motion within the step: _plane_pair)
        self._margin0 = m0 = self.base_margin + dt * dt * self._gravity
        fixed = self.__dict__.get("_fixed_args")
        if fixed is None:
            fixed = self._fixed_args = self._detect_fixed_args()
        mj, support, broad, rest = fixed
        nc, n, F, I = detect_closed_form(oM, mj, Jw, v, support, lin, ang, from_jacobian, *broad,
                                         m0, dt, *rest)
        self.last_candidates = nc
        if not nc:
            return Contacts(*_unpack_rows(F, I, nc, n)) if n else self._empty
        cand, cand_margin, rows = _unpack_detect(F, I, nc, n)
        blocks = [(rows[0], rows[3], rows[4], rows[5], rows[6], rows[8])] if len(rows[0]) else []
        if not len(cand):
            return self._assemble(blocks)
        # narrow phase
        gm = self.sm.geom_model
        rows_pair: list = []
        rows_pt: list = []
        rows_pos: list = []
        rows_n: list = []
        rows_d: list = []
        analytic = self._analytic_list
        poly_fast = self._poly_fast
        poly: list = []                 # polytope pairs with a patch, for _poly_batch
        reqs, cres, pres_all = self._narrow_tables(gdata)
        # box-box pairs whose patch points carry their own distances (derivatives read it)
        per_point = self.per_point_pairs = set()
        self._world_cache = {}
        self.cylinder_face_pairs = set()
        self.convex_pairs = {}          # pair -> feature tolerance of its refined point
        self.face_pairs = {}            # pair -> (face geom, other geom, {point id: kind})
        # polytope pairs the separating-axis test proves out of reach: coal is not asked
        if self._any_fast:
            apart = poly_separated(self._oMg(gdata), cand, cand_margin, poly_fast, self.pairs,
                                   *self._cores).tolist()
        else:
            apart = [False] * len(cand)
        for k, mk, out_of_reach in zip(cand.tolist(), cand_margin.tolist(), apart):
            if out_of_reach:
                continue
            if analytic[k]:
                self._plane_pair(k, gdata, mk, rows_pair, rows_pt, rows_pos, rows_n, rows_d)
                continue
            if k in self._cyl_box and self._cylinder_box(k, gdata, mk, rows_pair, rows_pt,
                                                         rows_pos, rows_n, rows_d):
                continue
            if k in self._face and self._face_contact(k, gdata, mk, rows_pair, rows_pt, rows_pos,
                                                      rows_n, rows_d):
                continue
            if k in self._caps_caps and self._capsule_line(k, gdata, mk, rows_pair, rows_pt,
                                                           rows_pos, rows_n, rows_d):
                continue
            req = reqs[k]
            req.security_margin = mk
            if not self._narrow.collide(k, gdata):        # (pinocchio.computeCollision)
                continue
            if poly_fast[k]:
                self._narrow.patch(k, gdata)
                self._poly_first(k, gdata, pres_all[k], cres[k], poly, rows_pair, rows_pt,
                                 rows_pos, rows_n, rows_d)
                continue
            self._narrow.patch(k, gdata)                  # (pinocchio.computeContactPatch)
            pres = pres_all[k]
            # a shape on a plane: the contact point is the witness on the plane (as the closed
            # forms: the points of a face on a plane are coplanar); otherwise the midpoint
            on_plane = self._pl_list[k]
            side = 1 if on_plane == int(self.pairs[k, 0]) else (2 if on_plane >= 0 else 0)
            if pres.numContactPatches() == 0:
                c = cres[k].getContact(0)
                p1, p2 = c.getNearestPoint1(), c.getNearestPoint2()
                n = np.asarray(c.normal).copy()
                self._single_point(k, gdata, side, p1, p2, n, rows_pair, rows_pt, rows_pos,
                                   rows_n, rows_d)
                continue
            patch = pres.getContactPatch(0)
            n = np.asarray(patch.getNormal()).copy()
            m = patch.size()
            crossing = m == 2 and self._crossing_segments(k, gdata, n)
            if m == 1 or crossing:
                if crossing:
                    # coal 3.0's segment-segment patch (two capsule axes, two box edges) returns
                    # two points far from the contact for some crossing segments (its
                    # determinant test is a comparison): the contact is the one witness point
                    ct = cres[k].getContact(0)
                    mid, pd = np.asarray(ct.pos).copy(), float(ct.penetration_depth)
                    p1, p2 = mid - 0.5 * pd * n, mid + 0.5 * pd * n
                else:
                    p1, p2 = patch.getPointShape1(0), patch.getPointShape2(0)
                self._single_point(k, gdata, side, p1, p2, n, rows_pair, rows_pt, rows_pos,
                                   rows_n, rows_d)
                continue
            P1 = np.array([patch.getPointShape1(i) for i in range(m)])
            P2 = np.array([patch.getPointShape2(i) for i in range(m)])
            mid = 0.5 * (P1 + P2)
            dist = n @ (P2 - P1).T
            if k in self._box_box:
                snap = self._snap(k, gdata, n, float(dist[0]))
                if snap is not None:      # the exact separating axis: points onto its plane
                    n, d, c = snap
                    # coal's patch projects the support sets along its own normal, off the
                    # axis by up to 1e-3 rad near contact: a corner at height h above the plane
                    # lands h * angle away from its projection along the axis, a point that
                    # then follows coal's normal (the derivatives' candidates do not match it;
                    # their finite-difference fallback differentiates coal's noisy normal).
                    # The patch about the axis itself is the one they describe.
                    self._narrow.patch_along(k, gdata, n)
                    if pres.numContactPatches() and pres.getContactPatch(0).size() >= 2:
                        patch = pres.getContactPatch(0)
                        m = patch.size()
                        P1 = np.array([patch.getPointShape1(i) for i in range(m)])
                        P2 = np.array([patch.getPointShape2(i) for i in range(m)])
                        mid = 0.5 * (P1 + P2)
                    mid = mid - np.outer(mid @ n - c, n)
                    dist, mid = self._patch_distances(k, gdata, n, mid)
                    per_point.add(k)
            keep = _reduce_patch(mid, self.max_points)
            if k in per_point:            # the kept points onto their common mid plane
                mid = mid.copy()
                mid[keep] = _k_common_plane(mid, n, np.asarray(keep, dtype=np.int64))
            for j, i in enumerate(keep):
                rows_pair.append(k); rows_pt.append(j)
                rows_pos.append(mid[i] if not side else (P1[i] if side == 1 else P2[i]))
                rows_n.append(n)
                rows_d.append(float(dist[i]))
        poly_rows = self._poly_batch(poly, gdata, rows_pair, rows_pt, rows_pos, rows_n,
                                     rows_d) if poly else None
        if rows_pair or poly_rows is not None:
            # the narrow phase's rows (frames, geoms, friction) in one compiled call, ordered by
            # pair (the order they were found in: the candidates are sorted, and the polytope
            # rows of one pair come in one block), merged by pair with the closed-form rows
            # (theirs first on equal pairs)
            cols = (np.array(rows_pair, dtype=np.int64), np.array(rows_pt, dtype=np.int64),
                    np.array(rows_pos, dtype=float).reshape(-1, 3),
                    np.array(rows_n, dtype=float).reshape(-1, 3), np.array(rows_d, dtype=float))
            if poly_rows is not None:
                cols = tuple(np.concatenate((a, b)) for a, b in zip(cols, poly_rows)) \
                    if rows_pair else poly_rows
            if self._any_snap:
                cols = self._margin_rows(gdata, cand, cand_margin, cols, data, dt,
                                         Jw if from_jacobian else None, v)
            narrow = narrow_rows(*cols, self.pairs, self._friction, True)
            out = Contacts(*(merge_rows(rows, narrow) if blocks else narrow))
        else:
            out = self._assemble(blocks)
        if out is not self._empty:
            # the routes of this pass's rows, carried by the contacts themselves (a later
            # detect pass, at another pose, must not change how these rows are differentiated)
            out.convex_pairs, out.face_pairs = self.convex_pairs, self.face_pairs
        return out

    def _assemble(self, blocks: list) -> Contacts:
        """Contacts from row blocks (pair, point, pos, normal, dist, frames or None), ordered by
        pair."""
        if not blocks:
            return self._empty
        if len(blocks) == 1:
            pair, pt, pos, nrm, dist, frames = blocks[0]
        else:
            blocks = [b if b[5] is not None else b[:5] + (tangent_frames(b[3]),) for b in blocks]
            pair, pt, pos, nrm, dist, frames = (np.concatenate(x) for x in zip(*blocks))
            order = np.argsort(pair, kind="stable")
            pair, pt, pos, nrm, dist, frames = (pair[order], pt[order], pos[order], nrm[order],
                                                dist[order], frames[order])
        p = self.pairs
        return Contacts(pair, p[pair, 0], p[pair, 1], pt.astype(np.int64, copy=False), pos, nrm,
                        dist, self.sm.pair_friction[pair], frames)
