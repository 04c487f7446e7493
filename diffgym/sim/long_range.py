"""The long-range barrier potential of the ``long_range`` gradient mode.

After the long-range-gradients contact model (``shared/papers/contact-model-long-range-
gradients.txt``, sections 4-5), on our rigid bodies and primitive shapes:

- Every geom of a candidate collision pair (``SimModel.pairs``: contype/conaffinity, exclusions
  and parent-child filtering already applied) is covered by *leaf spheres* whose centres lie
  inside the shape (one for a sphere; a row along the axis of a capsule or cylinder; a grid of
  cells of a box), bound into a layered bounding-sphere hierarchy (a binary tree; each node's
  sphere is the smallest enclosing its two children's, as the paper requires for blending).
- Between two nodes I, J at centre distance r the *centred potential* is the paper's
  eq. (7) with strength ``scale`` (J)::

      Pc(r) = scale * (1 + r**-1/2)**2

  smooth, positive and decreasing for r > 0: repulsive with global support (its force decays
  as r**-3/2). Leaf centres lie inside their shapes, so r stays positive for any two shapes
  that do not overlap and Pc is finite at contact (the exact NCP handles contact itself; this
  potential only has to be smooth and repulsive there, and negligible).
- The potential of a node pair is the paper's hierarchical blend (eqs. 4, 8): with
  ``d1 = R_I + R_J`` and ``d2 = (1 + margin) d1``, below d1 the sum over the children's pairs
  (``C(I) x C(J)``, a leaf its own child), above d2 the single centred term, in between the
  quintic blend ``(1 - phi) sum + phi Pc`` with ``phi = Phi((r - d1) / (d2 - d1))``,
  ``Phi(s) = 6 s^5 - 15 s^4 + 10 s^3`` (C2). Well-separated geoms cost one term, so the cost of a
  pair grows with the part of the two shapes that is close, not with their resolution.
  Because a child centre lies inside its parent's sphere, a child pair's distance is at most
  ``r + R_I + R_J <= 2 r`` in the blend zone, and ``2 Pc(2 r) >= Pc(r)``: the sum is never
  below the centred term, so every blend is decreasing in r too (the paper's Lemma 5.1).
- A static plane (a half-space) against a node uses the height ``h`` of the node's centre
  above the plane in place of r, with ``d1 = R_I``.
- The total ``P(q)`` is the sum over the candidate pairs (static-static pairs excluded),
  evaluated through a scene-level tree over the pairs' geoms (``LongRangePotential``): two far
  clusters of geoms are one centred term at their mean centres, weighted by the number of
  candidate pairs between them, blended in the same way, so the terms grow far slower than
  the N^2/2 pairs (billiards racks of 16 -> 256 balls: 433 -> 14,491 terms, about N^1.26) (``scene_tree=False``: every pair, the exact pair sum). Its
  generalized force ``-dP/dq`` and the exact derivative of that force with respect to q (in
  pinocchio's tangent space) are returned; the simulator adds the force to the applied ones
  before ABA, so it enters the step and its derivative follows the ABA derivative chain like a
  joint spring's.
- Evaluation and derivative run in ``diffgym.sim.long_range_kernels`` (numba; ``DIFFGYM_JIT=0``
  runs the same loops as Python): the trees are flattened into one node table at
  construction; per step, the geoms' placements are read from pinocchio, the kernels walk the
  pairs and assemble the force and its derivative on each row's own dofs.
"""
from __future__ import annotations

import math

import numpy as np
import pinocchio as pin

from . import long_range_kernels as K
from .gradient_modes import LongRange

_MAX_PER_AXIS = 16


def centred(r, scale: float):
    """``Pc(r) = scale (1 + r^-1/2)^2`` and its first two derivatives (r > 0, array or float;
    the kernels' ``_centred`` spells the same formulas for one float)."""
    r = np.asarray(r, dtype=float) if not isinstance(r, float) else r
    s = r ** -0.5
    p = scale * (1.0 + s) ** 2
    dp = -scale * (1.0 + s) * s ** 3                  # d/dr: 2 (1 + s) * (-1/2) r^-3/2
    ddp = scale * (0.5 * s ** 6 + 1.5 * (1.0 + s) * s ** 5)
    return p, dp, ddp


def _leaves(kind: str, size: np.ndarray, mesh_points=None, max_per_axis: int = _MAX_PER_AXIS):
    """Leaf spheres (centres (n, 3) in the geom frame, radii (n,)) covering a shape, at most
    ``max_per_axis`` along an axis (a box's cells are near-cubes of its smallest half size)."""
    if kind == "sphere":
        return np.zeros((1, 3)), np.array([float(size[0])])
    if kind in ("capsule", "cylinder"):
        r, h = float(size[0]), float(size[1])
        n = int(min(max(1, math.ceil(h / max(r, 1e-9))), max_per_axis))
        z = -h + (2.0 * np.arange(n) + 1.0) * h / n
        c = np.zeros((n, 3))
        c[:, 2] = z
        rad = np.hypot(r, h / n) if kind == "cylinder" else r + h / n
        return c, np.full(n, rad)
    if kind == "box":
        a = np.asarray(size[:3], dtype=float)
        n = np.minimum(np.maximum(1, np.ceil(a / max(a.min(), 1e-9)).astype(int)), max_per_axis)
        cell = a / n                                  # half sizes of a cell
        axes = [-a[k] + (2.0 * np.arange(n[k]) + 1.0) * cell[k] for k in range(3)]
        c = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
        return c, np.full(len(c), float(np.linalg.norm(cell)))
    if kind == "ellipsoid":
        return np.zeros((1, 3)), np.array([float(np.max(size[:3]))])
    if kind == "mesh" and mesh_points is not None and len(mesh_points):
        p = np.asarray(mesh_points, dtype=float)
        c = p.mean(axis=0)
        return c[None], np.array([float(np.linalg.norm(p - c, axis=1).max())])
    raise ValueError(f"long_range potential: no bounding spheres for a geom of kind {kind!r}")


def _enclose(c1, r1, c2, r2):
    d = float(np.linalg.norm(c2 - c1))
    if d + r2 <= r1:
        return c1.copy(), r1
    if d + r1 <= r2:
        return c2.copy(), r2
    R = 0.5 * (d + r1 + r2)
    return c1 + (R - r1) / d * (c2 - c1), R


class Tree:
    """A layered bounding-sphere hierarchy over a geom's leaf spheres (geom frame)."""

    def __init__(self, centres: np.ndarray, radii: np.ndarray):
        C, R, kids = [], [], []

        def build(idx):
            if len(idx) == 1:
                C.append(centres[idx[0]])
                R.append(float(radii[idx[0]]))
                kids.append((-1, -1))
                return len(C) - 1
            pts = centres[idx]
            ax = int(np.argmax(pts.max(0) - pts.min(0)))
            order = idx[np.argsort(pts[:, ax], kind="stable")]
            h = len(order) // 2
            a, b = build(order[:h]), build(order[h:])
            c, r = _enclose(C[a], R[a], C[b], R[b])
            C.append(c)
            R.append(r)
            kids.append((a, b))
            return len(C) - 1

        self.root = build(np.arange(len(radii)))
        self.centres = np.array(C)
        self.radii = np.array(R)
        self.kids = np.array(kids, dtype=np.int64)
        self.nleaves = len(radii)


class LongRangePotential:
    """The potential of a simulator's scene: ``evaluate`` gives P and the generalized force at
    the simulator's current kinematics; ``force_derivative`` the derivative of that force.

    Scene level: the non-plane geoms of the candidate pairs (*units*) are bound into a binary
    scene tree (median splits along the longest axis of their root spheres' centres), so that
    two far clusters of units cost one term (their centres' distance, times the number of
    candidate pairs between them) instead of one per pair (billiards racks, 16 -> 256 balls:
    433 -> 14,491 terms against 200 -> 33,920 pairs). A scene node's centre is the mean of its units' centres; its radius is
    fixed when the tree is built (the bound at that configuration times ``SLACK``), so within
    a tree the potential is a smooth function of q and its derivative is exact. The tree is
    rebuilt only when a unit has left a node's sphere (checked at every evaluation, before
    the potential is evaluated, so never inside one step or its derivative). Rebuilding at
    every reset instead would make the radii, and so the potential, depend on the rollout's
    initial state in a way the step Jacobians do not see; rebuilding only on exit keeps the
    function the same for neighbouring rollouts. ``scene_tree=False`` walks every candidate
    pair (the per-pair sum; for comparisons)."""

    SLACK = 1.2

    def __init__(self, sim, mode: LongRange, leaves=None, scene_tree: bool = True):
        """``leaves``: optional ``{geom index: (centres, radii)}`` replacing the default leaf
        spheres of those geoms (finer resolutions, for benchmarks)."""
        self.scale = float(mode.scale)
        self.margin = float(mode.margin)
        self.scene_tree = bool(scene_tree)
        sm = sim.sm
        model = sim.model
        gm = sim.geom_model
        self.model = model
        nv, nj = model.nv, model.njoints
        self.gjoint = np.asarray(sim.constraints.geom_joint, dtype=np.int64)
        self.kinds = [g.kind for g in sm.geoms]
        self.trees: dict[int, Tree] = {}
        pairs = []
        for a, b in np.asarray(sm.pairs, dtype=np.int64).reshape(-1, 2).tolist():
            if self.gjoint[a] == 0 and self.gjoint[b] == 0:
                continue
            for g in (a, b):
                if self.kinds[g] == "plane":
                    if self.gjoint[g] != 0:
                        raise ValueError(f"long_range potential: plane geom {sm.geoms[g].name!r} "
                                         "is attached to a moving body; only static planes "
                                         "(half-spaces of the world) are supported")
                    continue
                if g not in self.trees and leaves is not None and g in leaves:
                    self.trees[g] = Tree(*leaves[g])
                if g not in self.trees:
                    pts = None
                    if self.kinds[g] == "mesh":
                        from .collision_driver import _mesh_points
                        pts = _mesh_points(gm.geometryObjects[g].geometry)
                    self.trees[g] = Tree(*_leaves(self.kinds[g], np.asarray(sm.geoms[g].size),
                                                  pts))
            if self.kinds[a] == "plane":
                a, b = b, a                       # plane second
            pairs.append((a, b))
        self.pairs = pairs
        # dof -> joint, ancestor-or-same relation between dofs, support of each joint
        dof_joint = np.zeros(nv, dtype=np.int64)
        for j in range(1, nj):
            jm = model.joints[j]
            dof_joint[jm.idx_v:jm.idx_v + jm.nv] = j
        parents = [int(p) for p in model.parents]
        anc_j = np.zeros((nj, nj), dtype=bool)      # anc_j[a, j]: a is j or one of its ancestors
        for j in range(nj):
            a = j
            while True:
                anc_j[a, j] = True
                if a == 0:
                    break
                a = parents[a]
        self.support = anc_j[dof_joint, :].T.copy()        # (nj, nv): dof k moves joint j
        self.support[0] = False
        # dK[k, i] = ad(S_i) S_k: q_i turns column k when joint(i) is joint(k) or an ancestor
        self.anc_dof = anc_j[dof_joint][:, dof_joint]       # [i, k]
        self.last = None
        self.rebuilds = 0

        self._flatten(nv, nj)

    def _flatten(self, nv: int, nj: int) -> None:
        """The kernels' arrays: every tree's nodes in one table, the pairs, the units of the
        scene tree and their candidate matrix."""
        base = {}
        cs, rs, ks = [], [], []
        n = 0
        for g, t in self.trees.items():
            base[g] = n
            cs.append(t.centres)
            rs.append(t.radii)
            ks.append(np.where(t.kids >= 0, t.kids + n, -1))
            n += len(t.radii)
        G = len(self.kinds)
        self.node_c = np.ascontiguousarray(np.concatenate(cs) if cs else np.zeros((0, 3)))
        self.node_r = np.ascontiguousarray(np.concatenate(rs) if rs else np.zeros(0))
        self.node_k = np.ascontiguousarray(np.concatenate(ks) if ks else np.zeros((0, 2), np.int64),
                                           dtype=np.int64)
        self.roots = np.full(G, -1, dtype=np.int64)
        for g, t in self.trees.items():
            self.roots[g] = base[g] + t.root
        P = len(self.pairs)
        self.pair_a = np.array([a for a, _ in self.pairs], dtype=np.int64).reshape(P)
        self.pair_b = np.array([b for _, b in self.pairs], dtype=np.int64).reshape(P)
        self.pair_plane = np.array([self.kinds[b] == "plane" for _, b in self.pairs],
                                   dtype=np.bool_).reshape(P)
        self.plane_pairs = np.nonzero(self.pair_plane)[0].astype(np.int64)
        self.sp_ptr = np.zeros(nj + 1, dtype=np.int64)
        self.sp_ptr[1:] = np.cumsum(self.support.sum(axis=1))
        self.sp_idx = np.ascontiguousarray(np.nonzero(self.support)[1], dtype=np.int64)
        self._topology = (self.gjoint, self.support, self.sp_ptr, self.sp_idx, self.anc_dof)
        self.geoms = np.array(sorted(set(self.pair_a.tolist()) | set(self.pair_b.tolist())),
                              dtype=np.int64)
        self.geom_R = np.zeros((G, 3, 3))
        self.geom_t = np.zeros((G, 3))
        # scene units: the non-plane geoms of the non-plane pairs; their candidate pairs
        inner = np.nonzero(~self.pair_plane)[0]
        self.units = np.array(sorted(set(self.pair_a[inner].tolist())
                                     | set(self.pair_b[inner].tolist())), dtype=np.int64)
        U = len(self.units)
        uidx = np.full(G, -1, dtype=np.int64)
        uidx[self.units] = np.arange(U)
        self.unit_pair = np.full((U, U), -1, dtype=np.int64)
        for p in inner.tolist():
            u, v = uidx[self.pair_a[p]], uidx[self.pair_b[p]]
            self.unit_pair[u, v] = self.unit_pair[v, u] = p
        self.unit_r = self.node_r[self.roots[self.units]] if U else np.zeros(0)
        self.sc = None

    # -- the scene tree ----------------------------------------------------------------------
    def reset_tree(self) -> None:
        """Build the scene tree afresh at the next evaluation (from that configuration)."""
        self.sc = None

    def _build_scene(self, xu: np.ndarray) -> None:
        """The scene tree over the units at world centres ``xu`` (U, 3, unit order)."""
        U = len(self.units)
        kids, lo, hi, rad, order = [], [], [], [], []

        def build(idx):
            node = len(kids)
            kids.append((-1, -1))
            lo.append(len(order))
            hi.append(0)
            rad.append(0.0)
            if len(idx) == 1:
                order.append(int(idx[0]))
                rad[node] = float(self.unit_r[idx[0]])
            else:
                pts = xu[idx]
                ax = int(np.argmax(pts.max(0) - pts.min(0)))
                srt = idx[np.argsort(pts[:, ax], kind="stable")]
                h = len(srt) // 2
                a = build(srt[:h])
                b = build(srt[h:])
                kids[node] = (a, b)
                c = pts.mean(axis=0)
                rad[node] = self.SLACK * float(np.max(np.linalg.norm(pts - c, axis=1)
                                                      + self.unit_r[idx]))
            hi[node] = len(order)
            return node

        build(np.arange(U))
        order = np.array(order, dtype=np.int64)
        cand = (self.unit_pair[np.ix_(order, order)] >= 0).astype(np.int64)
        cum = np.zeros((U + 1, U + 1), dtype=np.int64)
        cum[1:, 1:] = cand.cumsum(0).cumsum(1)
        self.sc = dict(k=np.array(kids, dtype=np.int64).reshape(-1, 2),
                       lo=np.array(lo, dtype=np.int64), hi=np.array(hi, dtype=np.int64),
                       r=np.array(rad), order=order, leaf_geom=self.units[order],
                       leaf_r=self.unit_r[order], cum=cum,
                       leaf_pair=np.ascontiguousarray(self.unit_pair[np.ix_(order, order)]))
        self.rebuilds += 1

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(self, data, geom_data, Jw: np.ndarray):
        """P and the generalized force ``-dP/dq`` (nv,) at the kinematics in ``data``/
        ``geom_data`` (forward kinematics and geometry placements updated) with ``Jw`` the
        world-frame joint Jacobians (6, nv) of ``computeJointJacobians``. The rows are kept for
        ``force_derivative``."""
        R, t = self.geom_R, self.geom_t
        oMg = geom_data.oMg
        for g in self.geoms.tolist():
            o = oMg[g]
            R[g] = o.rotation
            t[g] = o.translation
        nv = Jw.shape[1]
        if not len(self.pairs):
            self.last = None
            return 0.0, np.zeros(nv)
        U = len(self.units)
        if U >= 2:
            xu = K.unit_centres(self.node_c, self.roots, self.units, R, t)
            sc = self.sc
            if sc is None or not K.scene_bounds_hold(xu[sc["order"]], sc["leaf_r"], sc["lo"],
                                                     sc["hi"], sc["r"]):
                self._build_scene(xu)
                sc = self.sc
            x = np.ascontiguousarray(xu[sc["order"]])
            args = (sc["k"], sc["lo"], sc["hi"], sc["r"], 0, sc["leaf_geom"], x, sc["cum"],
                    sc["leaf_pair"])
        else:
            e2 = np.zeros((0, 2), dtype=np.int64)
            e1 = np.zeros(0, dtype=np.int64)
            args = (e2, e1, e1, np.zeros(0), -1, e1, np.zeros((0, 3)),
                    np.zeros((1, 1), dtype=np.int64), np.zeros((0, 0), dtype=np.int64))
        out = K.evaluate(self.node_c, self.node_r, self.node_k, self.roots, self.pair_a,
                         self.pair_b, self.pair_plane, R, t, self.scale, self.margin,
                         self.plane_pairs, *args, not self.scene_tree)
        Jw = np.ascontiguousarray(Jw, dtype=float)
        tau, _ = K.assemble(*out[1:], *self._topology, Jw, False)
        self.last = (out, Jw)
        return float(out[0]), tau

    @property
    def rows(self) -> int:
        """Node pairs visited at the last evaluation (terms of the hierarchical sum)."""
        return 0 if self.last is None else int(self.last[0][1])

    def hessian_entries(self):
        """The nonzero second derivatives of P in the rows' distances at the last evaluation:
        (i, j, value) arrays (repeated entries add)."""
        out, _ = self.last
        nh, hi, hj, hv = out[8:12]
        return hi[:nh].copy(), hj[:nh].copy(), hv[:nh].copy()

    def force_derivative(self) -> np.ndarray:
        """d(-dP/dq)/dq (nv, nv, tangent space) at the last ``evaluate``."""
        if self.last is None:
            return np.zeros((self.model.nv, self.model.nv))
        out, Jw = self.last
        _, H = K.assemble(*out[1:], *self._topology, Jw, True)
        return H


def potential(sim, q, derivative: bool = False):
    """The long-range potential of ``sim``'s scene at configuration ``q``: ``(P, force)`` or,
    with ``derivative``, ``(P, force, dforce_dq)`` (force = ``-dP/dq``, (nv,); its derivative
    (nv, nv) in pinocchio's tangent space). Uses ``sim.gradient``'s parameters when it is a
    LongRange mode, the defaults otherwise; does not disturb the simulator's step state."""
    mode = sim.gradient if isinstance(sim.gradient, LongRange) else LongRange()
    lr = sim.__dict__.get("_lr_probe")
    if lr is None or lr.model is not sim.model or (lr.scale, lr.margin) != (mode.scale, mode.margin):
        lr = sim._lr_probe = LongRangePotential(sim, mode)
    model = sim.model
    data = model.createData()
    gdata = pin.GeometryData(sim.geom_model)
    q = np.asarray(q, dtype=float)
    pin.forwardKinematics(model, data, q)
    pin.updateGeometryPlacements(model, data, sim.geom_model, gdata)
    pin.computeJointJacobians(model, data, q)
    P, f = lr.evaluate(data, gdata, np.array(data.J).reshape(6, model.nv))
    if derivative:
        return P, f, lr.force_derivative()
    return P, f
