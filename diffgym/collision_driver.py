"""Collision detection: broad phase, coal narrow phase and contact patches.

``detect`` returns every contact point whose signed distance is below the pair's margin:

* broad phase: the candidate pairs (already filtered by contype/conaffinity, exclusions and
  the parent-child rule) are tested with bounding spheres (planes with a half-space test, boxes
  with their oriented box) in one vectorized numpy pass, so a table of 16 balls runs the exact
  test on touching pairs only;
* narrow phase: coal's GJK/EPA or analytic tests (``pinocchio.computeCollision``) with a
  security margin, so that contacts about to close within this step are found (speculative
  contacts: a 10 m/s ball cannot tunnel through a 2 cm wall);
* contact patches (``pinocchio.computeContactPatch``): a face or edge contact gives a polygon,
  reduced to at most ``max_points`` (4) points that span it, so a box lies flat without rocking.

The margin of a pair is ``base_margin + dt * (speed bound of geom 1 + speed bound of geom 2)``.
Normals point from geom 1 to geom 2; ``dist`` is the signed distance (negative in penetration).

Cost: the per-step Python work is one loop over the *moving joints* (their placements and
velocities, read from pinocchio's data), a fixed number of numpy calls for the broad phase, and
a loop over the candidate pairs only. The broad phase is conservative (plus a 1 nm slack), so
the exact narrow-phase tests alone decide which points are contacts.
"""
from __future__ import annotations

from dataclasses import dataclass

import coal
import numpy as np
import pinocchio as pin

from .frames import tangent_frames
from .model import SimModel
from .plane_contacts import _BOX_SIGNS, ANALYTIC_KINDS, shape_points

# The broad phase computes geom placements in numpy (round-off differs from pinocchio's); a
# pair is dropped only when its lower bound on the distance exceeds the margin by this much.
_BROAD_SLACK = 1e-9


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


def _norms(x: np.ndarray) -> np.ndarray:
    """Row norms of (k, 3), equal bit for bit to ``np.linalg.norm`` of each row (a BLAS dot)."""
    return np.sqrt(np.matmul(x[:, None, :], x[:, :, None])[:, 0, 0])


class CollisionDriver:
    def __init__(self, sm: SimModel, base_margin: float = 1e-3, max_points: int = 4,
                 batch_plane_pairs: bool = True):
        self.sm = sm
        # capsule and box on static plane pairs in one numpy pass (False: pair by pair through
        # the broad phase, the reference the tests compare the batched pass with)
        self.batch_plane_pairs = bool(batch_plane_pairs)
        self.base_margin = float(base_margin)
        self.max_points = int(max_points)
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
        # shape-on-plane pairs with closed-form contact points (see plane_contacts.py)
        kinds = [g.kind for g in sm.geoms]
        self.analytic = np.array([pl >= 0 and kinds[ot] in ANALYTIC_KINDS
                                  for pl, ot in zip(self.pair_plane, self.pair_other)], dtype=bool)
        self.moving_joints = np.unique(self.parent_joint[~self.static])
        self._gdata = None
        self._precompute(gm)

    # -- constant tables for the per-step work -----------------------------------------------
    def _precompute(self, gm: pin.GeometryModel) -> None:
        p = self.pairs
        self._npairs = len(p)
        self._mj = [int(j) for j in self.moving_joints]
        slot = np.full(max(int(self.parent_joint.max(initial=0)) + 1, 1), -1, dtype=np.int64)
        slot[self.moving_joints] = np.arange(len(self._mj))
        # slot of the joint of each geom in the moving-joint arrays (-1: static geom)
        self._gslot = np.where(self.static, -1, slot[self.parent_joint])
        self._moving_geoms = np.flatnonzero(~self.static)
        self._mg_slot = self._gslot[self._moving_geoms]
        # reach of each geom from its joint origin (speed bound = |v_o| + |w| * reach)
        self._reach = np.linalg.norm(self.local_pos, axis=1) + np.where(self.is_plane, 0.0, self.radius)
        self._reach_moving = self._reach[self._moving_geoms]
        # world placements (homogeneous) of the static geoms, which never change, and the local
        # placements of the moving ones: W[moving] = oMi[joint] @ L each step
        self._W0 = np.array([g.placement.homogeneous for g in gm.geometryObjects]).reshape(-1, 4, 4)
        self._L_moving = self._W0[self._moving_geoms].copy()
        # shape-on-static-plane pairs of capsules and boxes: closed-form points for all of them
        # in one numpy pass (no broad phase: the closed form is as cheap as a bound)
        kinds = [g.kind for g in self.sm.geoms]
        batch = np.zeros(len(p), dtype=bool)
        self._batch = {}
        for kind in ("capsule", "box") if self.batch_plane_pairs else ():
            if kind == "capsule" and self.max_points < 2:
                continue                   # (the per-pair path keeps the deepest point)
            ks = [k for k in range(len(p)) if self.analytic[k]
                  and kinds[int(self.pair_other[k])] == kind and self.static[int(self.pair_plane[k])]]
            if not ks:
                continue
            ks = np.array(ks, dtype=np.int64)
            batch[ks] = True
            pl, ot = self.pair_plane[ks], self.pair_other[ks]
            n_plane, offset = [], []
            for g in pl:
                M = gm.geometryObjects[int(g)].placement
                n_plane.append(M.rotation[:, 2].copy())
                offset.append(float(n_plane[-1] @ M.translation))
            n_plane = np.array(n_plane).reshape(-1, 3)
            flip = pl != p[ks, 0]
            size = np.zeros((len(ks), 3))
            for i, g in enumerate(ot):
                sz = np.asarray(self.sm.geoms[int(g)].size, float).reshape(-1)[:3]
                size[i, :len(sz)] = sz
            self._batch[kind] = dict(
                pairs=ks, geom=ot, n=n_plane, offset=np.array(offset),
                N=np.where(flip[:, None], -n_plane, n_plane),       # from geom 1 to geom 2
                frames=tangent_frames(np.where(flip[:, None], -n_plane, n_plane)),
                r=size[:, 0].copy(), h=size[:, 1].copy(),
                corners=_BOX_SIGNS[None, :, :] * size[:, None, :],  # body-fixed box corners
                g1=p[ks, 0], g2=p[ks, 1])
            tab = self._batch[kind]
            tab.update(pairs2=ks[:, None].copy(), geom_list=[int(g) for g in ot],
                       h2=tab["h"][:, None].copy(), rn=tab["r"][:, None] * n_plane,
                       xshape=(len(ks), 2, 3), n3=n_plane[:, :, None].copy(),
                       offset2=tab["offset"][:, None].copy())
        self._batched = batch
        self._rest_analytic = self.analytic & ~batch
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
        nonplane = (self.pair_plane < 0)
        self._np = np.flatnonzero(nonplane)
        self._np_a, self._np_b = p[nonplane, 0], p[nonplane, 1]
        self._rest = np.flatnonzero(~batch)
        self._np_rad = self.radius[self._np_a] + self.radius[self._np_b]
        # oriented-box refinement of pairs (without a plane) that involve a box
        ent_pair, ent_box, ent_other, half = [], [], [], []
        for k in self._np:
            for box, other in ((p[k, 0], p[k, 1]), (p[k, 1], p[k, 0])):
                shape = gm.geometryObjects[int(box)].geometry
                if isinstance(shape, coal.Box):
                    ent_pair.append(k); ent_box.append(box); ent_other.append(other)
                    sw = shape.getSweptSphereRadius() if hasattr(shape, "getSweptSphereRadius") else 0.0
                    half.append(np.asarray(shape.halfSide, float) + sw)
        self._box_pair = np.array(ent_pair, dtype=np.int64)
        self._box_geom = np.array(ent_box, dtype=np.int64)
        self._box_other = np.array(ent_other, dtype=np.int64)
        self._box_half = np.array(half, dtype=float).reshape(-1, 3)
        self._box_orad = self.radius[self._box_other] if len(ent_pair) else np.zeros(0)
        # narrow phase tables
        self._analytic_list = self.analytic.tolist()
        self._pl_list = [int(x) for x in self.pair_plane]
        self._ot_list = [int(x) for x in self.pair_other]
        self._flip = [bool(pl >= 0 and pl != p[k, 0]) for k, pl in enumerate(self._pl_list)]
        self._plane_frame: dict[int, tuple[np.ndarray, float]] = {}
        for k in np.flatnonzero(self.analytic):
            pl = self._pl_list[k]
            if self.static[pl]:
                M = gm.geometryObjects[pl].placement
                n_plane = M.rotation[:, 2].copy()
                self._plane_frame[pl] = (n_plane, float(n_plane @ M.translation))

    # -- per-step kinematics ---------------------------------------------------------------
    def geom_frames(self, gdata: pin.GeometryData) -> tuple[np.ndarray, np.ndarray]:
        """World positions (ngeom, 3) and z axes (ngeom, 3) of every geom."""
        pos = np.empty((self.ngeom, 3))
        zax = np.empty((self.ngeom, 3))
        for i, M in enumerate(gdata.oMg):
            pos[i] = M.translation
            zax[i] = M.rotation[:, 2]
        return pos, zax

    def _joint_state(self, data: pin.Data) -> tuple[np.ndarray, np.ndarray]:
        """Placements (m, 4, 4) and local spatial velocities (m, 6) of the moving joints."""
        oMi, vel = data.oMi, data.v
        H = np.array([oMi[j].homogeneous for j in self._mj])
        V = np.array([vel[j].vector for j in self._mj])
        return H, V

    def _speeds(self, V: np.ndarray) -> np.ndarray:
        speed = np.zeros(self.ngeom)
        lin = _norms(V[:, :3])
        ang = _norms(V[:, 3:])
        s = self._mg_slot
        speed[self._moving_geoms] = lin[s] + ang[s] * self._reach_moving
        return speed

    def speed_bounds(self, data: pin.Data) -> np.ndarray:
        """Upper bound on the speed of any point of each geom (from the joint velocities)."""
        if not len(self._mj):
            return np.zeros(self.ngeom)
        return self._speeds(self._joint_state(data)[1])

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
        if m > self.max_points:
            sel = sel[np.argsort(height[sel], kind="stable")[:self.max_points]]
            m = self.max_points
        N = -n_plane if self._flip[k] else n_plane   # from geom 1 to geom 2
        d = height[sel]
        rows_pair += [k] * m
        rows_pt += ids[sel].tolist()
        # midpoint of the witness point x and its projection on the plane
        rows_pos.extend(x[sel] - (0.5 * d)[:, None] * n_plane)
        rows_n += [N] * m
        rows_d += d.tolist()

    def _narrow_tables(self, gdata: pin.GeometryData):
        """References to gdata's per-pair request/result objects (looked up once per gdata)."""
        if self._gdata is not gdata:
            self._gdata = gdata
            self._reqs = list(gdata.collisionRequests)
            self._cres = list(gdata.collisionResults)
            self._pres = list(gdata.contactPatchResults)
        return self._reqs, self._cres, self._pres

    # -- the detection pass ----------------------------------------------------------------
    def detect(self, data: pin.Data, gdata: pin.GeometryData, dt: float) -> Contacts:
        if not self._npairs:
            return Contacts.empty()
        p = self.pairs
        if self._mj:
            H, V = self._joint_state(data)
            speed = self._speeds(V)
            W = self._W0.copy()
            W[self._moving_geoms] = np.matmul(H[self._mg_slot], self._L_moving)
        else:
            speed = np.zeros(self.ngeom)
            W = self._W0
        margin = self.base_margin + dt * (speed[p[:, 0]] + speed[p[:, 1]])
        blocks = []
        for kind, tab in self._batch.items():
            blk = self._batched_points(kind, tab, W, margin, gdata)
            if blk is not None:
                blocks.append(blk)
        rest = self._rest
        if not len(rest):
            return self._assemble(blocks)
        # broad phase: lower bounds on the distance of each remaining pair
        gap = np.empty(self._npairs)
        if len(self._hp):
            Wp, Wo = W[self._hp_pl], W[self._hp_ot]
            zax = Wp[:, :3, 2]
            if self._hp_use_rot:
                w = np.abs(np.einsum("kji,kj->ki", Wo[:, :3, :3], zax))
                ext = np.einsum("ki,ki->k", w, self._hp_ext_vec) + self._hp_ext_const
            else:
                ext = self._hp_rad
            gap[self._hp] = np.einsum("ij,ij->i", zax, Wo[:, :3, 3] - Wp[:, :3, 3]) - ext
            for k, pl, ot, pts, sw in self._hp_mesh:
                if gap[k] < margin[k] + _BROAD_SLACK:
                    n = W[pl, :3, 2]
                    low = float(np.min(pts @ (W[ot, :3, :3].T @ n)))
                    gap[k] = max(gap[k], float(n @ (W[ot, :3, 3] - W[pl, :3, 3])) + low - sw)
        if len(self._np):
            pos = W[:, :3, 3]
            dpos = pos[self._np_a] - pos[self._np_b]
            gap[self._np] = np.sqrt(np.einsum("ij,ij->i", dpos, dpos)) - self._np_rad
            if len(self._box_pair):
                Wb = W[self._box_geom]
                d = np.einsum("kji,kj->ki", Wb[:, :3, :3], pos[self._box_other] - Wb[:, :3, 3])
                out = np.maximum(np.abs(d) - self._box_half, 0.0)
                lb = np.sqrt(np.einsum("ij,ij->i", out, out)) - self._box_orad
                np.maximum.at(gap, self._box_pair, lb)
        cand = rest[gap[rest] < margin[rest] + _BROAD_SLACK]
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
        reqs, cres, pres_all = self._narrow_tables(gdata)
        for k, mk in zip(cand.tolist(), margin[cand].tolist()):
            if analytic[k]:
                self._plane_pair(k, gdata, mk, rows_pair, rows_pt, rows_pos, rows_n, rows_d)
                continue
            reqs[k].security_margin = mk
            if not pin.computeCollision(gm, gdata, k):
                continue
            pin.computeContactPatch(gm, gdata, k)
            pres = pres_all[k]
            if pres.numContactPatches() == 0:
                c = cres[k].getContact(0)
                p1, p2 = c.getNearestPoint1(), c.getNearestPoint2()
                n = np.asarray(c.normal).copy()
                rows_pair.append(k); rows_pt.append(0)
                rows_pos.append(0.5 * (p1 + p2)); rows_n.append(n); rows_d.append(float(n @ (p2 - p1)))
                continue
            patch = pres.getContactPatch(0)
            n = np.asarray(patch.getNormal()).copy()
            m = patch.size()
            if m == 1:
                p1, p2 = patch.getPointShape1(0), patch.getPointShape2(0)
                rows_pair.append(k); rows_pt.append(0)
                rows_pos.append(0.5 * (p1 + p2)); rows_n.append(n); rows_d.append(float(n @ (p2 - p1)))
                continue
            P1 = np.array([patch.getPointShape1(i) for i in range(m)])
            P2 = np.array([patch.getPointShape2(i) for i in range(m)])
            keep = _reduce_patch(0.5 * (P1 + P2), self.max_points)
            for j, i in enumerate(keep):
                rows_pair.append(k); rows_pt.append(j)
                rows_pos.append(0.5 * (P1[i] + P2[i])); rows_n.append(n)
                rows_d.append(float(n @ (P2[i] - P1[i])))
        if rows_pair:
            pair = np.array(rows_pair, dtype=np.int64)
            blocks.append((pair, np.array(rows_pt, dtype=np.int64), np.array(rows_pos).reshape(-1, 3),
                           np.array(rows_n).reshape(-1, 3), np.array(rows_d, dtype=float), None))
        return self._assemble(blocks)

    @staticmethod
    def _batch_heights(kind: str, tab: dict, Wg: np.ndarray, rows=None):
        """Witness points (P, k, 3) and heights (P, k) of batched pairs from geom placements
        ``Wg`` (P, 4, 4), with the arithmetic of ``plane_contacts.shape_points``."""
        if rows is None:
            h2, rn, n3, off2 = tab["h2"], tab["rn"], tab["n3"], tab["offset2"]
            corners = tab["corners"]
        else:
            h2, rn, n3, off2 = tab["h2"][rows], tab["rn"][rows], tab["n3"][rows], tab["offset2"][rows]
            corners = tab["corners"][rows]
        if kind == "capsule":
            T = Wg[:, :3, 3]
            hA = h2 * Wg[:, :3, 2]
            x = np.empty((len(Wg), 2, 3))
            x0, x1 = x[:, 0], x[:, 1]
            np.subtract(T, hA, out=x0)
            x0 -= rn
            np.add(T, hA, out=x1)
            x1 -= rn
        else:
            x = Wg[:, None, :3, 3] + np.matmul(corners, Wg[:, :3, :3].transpose(0, 2, 1))
        return x, np.matmul(x, n3)[:, :, 0] - off2

    def _batched_points(self, kind: str, tab: dict, W: np.ndarray, margin: np.ndarray, gdata):
        """Closed-form points of all capsule (or box) on static plane pairs, exactly as
        ``plane_contacts.shape_points`` computes them pair by pair from pinocchio's geom
        placements; rows (pair, point, pos, normal, dist, frames) or None."""
        Wg = W[tab["geom"]]
        x, height = self._batch_heights(kind, tab, Wg)
        mk = margin[tab["pairs2"]]
        # candidates from the numpy placements (which may differ from pinocchio's by an ulp):
        # their points again from pinocchio's placements where those differ
        near = np.flatnonzero((height < mk + _BROAD_SLACK).any(axis=1))
        if not len(near):
            return None
        oMg, gl = gdata.oMg, tab["geom_list"]
        rows = near.tolist()
        Wc = np.array([oMg[gl[i]].homogeneous for i in rows])
        if Wc.tobytes() != Wg[near].tobytes():
            x[near], height[near] = self._batch_heights(kind, tab, Wc, near)
        sel = height < mk
        if not sel.any():
            return None
        if kind == "box" and int(sel.sum(axis=1).max()) > self.max_points:
            # the deepest max_points corners of a pair, in order of depth
            ii, jj = [], []
            for i in np.flatnonzero(sel.any(axis=1)).tolist():
                js = np.flatnonzero(sel[i])
                if len(js) > self.max_points:
                    js = js[np.argsort(height[i, js], kind="stable")[:self.max_points]]
                ii += [i] * len(js)
                jj += js.tolist()
            ii = np.array(ii, dtype=np.int64)
            jj = np.array(jj, dtype=np.int64)
        else:
            ii, jj = np.nonzero(sel)
        d = height[ii, jj]
        pos = x[ii, jj] - (0.5 * d)[:, None] * tab["n"][ii]
        return tab["pairs"][ii], jj, pos, tab["N"][ii], d, tab["frames"][ii]

    def _assemble(self, blocks: list) -> Contacts:
        """Contacts from row blocks (pair, point, pos, normal, dist, frames or None), ordered by
        pair."""
        if not blocks:
            return Contacts.empty()
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
