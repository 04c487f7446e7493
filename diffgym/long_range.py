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
- The total ``P(q)`` is the sum over the candidate pairs (static-static pairs excluded). Its
  generalized force ``-dP/dq`` and the exact derivative of that force with respect to q (in
  pinocchio's tangent space) are returned; the simulator adds the force to the applied ones
  before ABA, so it enters the step and its derivative follows the ABA derivative chain like a
  joint spring's.
"""
from __future__ import annotations

import math

import numpy as np
import pinocchio as pin

from .gradient_modes import LongRange

_MAX_PER_AXIS = 16


def _cross_rows(c: np.ndarray, A: np.ndarray) -> np.ndarray:
    """``c_m x A_m[:, n]`` for every m and column n: c (M, 3), A (M, 3, nv) -> (M, 3, nv)."""
    c0, c1, c2 = c[:, 0, None], c[:, 1, None], c[:, 2, None]
    a0, a1, a2 = A[:, 0], A[:, 1], A[:, 2]
    return np.stack([c1 * a2 - c2 * a1, c2 * a0 - c0 * a2, c0 * a1 - c1 * a0], axis=1)


def _phi(s: float):
    """The quintic smoothstep and its first two derivatives at s (clamped to [0, 1])."""
    if s <= 0.0:
        return 0.0, 0.0, 0.0
    if s >= 1.0:
        return 1.0, 0.0, 0.0
    s2 = s * s
    return (s2 * s * (10.0 - 15.0 * s + 6.0 * s2), 30.0 * s2 * (1.0 - s) ** 2,
            60.0 * s * (1.0 - s) * (1.0 - 2.0 * s))


def centred(r, scale: float):
    """``Pc(r) = scale (1 + r^-1/2)^2`` and its first two derivatives (r > 0, array or float)."""
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
    the simulator's current kinematics; ``force_derivative`` the derivative of that force."""

    def __init__(self, sim, mode: LongRange, leaves=None):
        """``leaves``: optional ``{geom index: (centres, radii)}`` replacing the default leaf
        spheres of those geoms (finer resolutions, for benchmarks)."""
        self.scale = float(mode.scale)
        self.margin = float(mode.margin)
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

    # -- evaluation ------------------------------------------------------------------------
    def _pair(self, ta: Tree, Ma, I, tb: Tree | None, Mb, J, plane, rows, out):
        """Potential of node I of ``ta`` against node J of ``tb`` (or the plane (n, offset)):
        appends its distances to ``rows`` and returns (value, {row: dP/dr}, {(row, row): d2P})."""
        ca = Ma[0] @ ta.centres[I] + Ma[1]
        if tb is None:
            n, off = plane
            r = float(n @ ca) - off
            cb = None
            d1 = ta.radii[I]
            kids_b = None
        else:
            cb = Mb[0] @ tb.centres[J] + Mb[1]
            r = float(np.linalg.norm(ca - cb))
            d1 = ta.radii[I] + tb.radii[J]
            kids_b = tb.kids[J]
        if r <= 0.0:
            raise FloatingPointError(f"long_range potential: two bounding-sphere centres coincide "
                                     f"(distance {r:.3g} m): the shapes interpenetrate")
        m = len(rows)
        rows.append((ca, cb, r))
        leaf_a = ta.kids[I][0] < 0
        leaf_b = tb is None or kids_b[0] < 0
        p, dp, ddp = centred(r, self.scale)
        d2 = (1.0 + self.margin) * d1
        if (leaf_a and leaf_b) or r >= d2:
            return p, {m: dp}, {(m, m): ddp}
        ch_a = [I] if leaf_a else list(ta.kids[I])
        ch_b = [J] if leaf_b else list(kids_b)
        S, gS, hS = 0.0, {}, {}
        for Ic in ch_a:
            for Jc in ch_b:
                v, g, h = self._pair(ta, Ma, Ic, tb, Mb, Jc, plane, rows, out)
                S += v
                for k, x in g.items():
                    gS[k] = gS.get(k, 0.0) + x
                for k, x in h.items():
                    hS[k] = hS.get(k, 0.0) + x
        if r <= d1:
            # this node pair's distance still reported (gradient 0) for a uniform bookkeeping
            return S, gS, hS
        w = d2 - d1
        f, f1, f2 = _phi((r - d1) / w)
        f1, f2 = f1 / w, f2 / (w * w)
        val = (1.0 - f) * S + f * p
        g = {k: (1.0 - f) * x for k, x in gS.items()}
        g[m] = f1 * (p - S) + f * dp
        h = {k: (1.0 - f) * x for k, x in hS.items()}
        h[(m, m)] = f2 * (p - S) + 2.0 * f1 * dp + f * ddp
        for k, x in gS.items():
            h[(m, k)] = h.get((m, k), 0.0) - f1 * x
            h[(k, m)] = h.get((k, m), 0.0) - f1 * x
        return val, g, h

    def evaluate(self, data, geom_data, Jw: np.ndarray):
        """P and the generalized force ``-dP/dq`` (nv,) at the kinematics in ``data``/
        ``geom_data`` (forward kinematics and geometry placements updated) with ``Jw`` the
        world-frame joint Jacobians (6, nv) of ``computeJointJacobians``."""
        place = {}

        def pose(g):
            M = place.get(g)
            if M is None:
                o = geom_data.oMg[g]
                M = place[g] = (np.array(o.rotation), np.array(o.translation))
            return M

        rows: list = []
        owners: list = []
        P = 0.0
        grad: dict = {}
        hess: dict = {}
        for a, b in self.pairs:
            ta = self.trees[a]
            start = len(rows)
            if self.kinds[b] == "plane":
                Mb = pose(b)
                n = Mb[0][:, 2].copy()
                v, g, h = self._pair(ta, pose(a), ta.root, None, None, -1,
                                     (n, float(n @ Mb[1])), rows, None)
            else:
                tb = self.trees[b]
                v, g, h = self._pair(ta, pose(a), ta.root, tb, pose(b), tb.root, None, rows, None)
            owners.extend([(a, b)] * (len(rows) - start))
            P += v
            grad.update(g)
            hess.update(h)
        nv = Jw.shape[1]
        M = len(rows)
        tau = np.zeros(nv)
        if M == 0:
            self.last = None
            return P, tau
        ja = np.array([self.gjoint[a] for a, _ in owners], dtype=np.int64)
        jb = np.array([self.gjoint[b] if self.kinds[b] != "plane" else 0 for _, b in owners],
                      dtype=np.int64)
        ca = np.array([r[0] for r in rows])
        cb = np.array([r[1] if r[1] is not None else np.zeros(3) for r in rows])
        plane = np.array([r[1] is None for r in rows])
        dist = np.array([r[2] for r in rows])
        E = np.zeros((M, 3))
        for m, (a, b) in enumerate(owners):
            if plane[m]:
                E[m] = geom_data.oMg[b].rotation[:, 2]
            else:
                E[m] = (ca[m] - cb[m]) / dist[m]
        a_m = np.zeros(M)
        for k, x in grad.items():
            a_m[k] = x
        # point Jacobians of the centres (world frame): J_c = Jlin_j - [c]x Jang_j on j's support
        Jl, Ja = Jw[:3], Jw[3:]

        def point_jac(js, cs):
            S = self.support[js][:, None, :]                        # (M, 1, nv)
            L = np.where(S, Jl[None], 0.0)
            A = np.where(S, Ja[None], 0.0)
            return L - _cross_rows(cs, A), A

        JA, AA = point_jac(ja, ca)
        JB, AB = point_jac(jb, cb)
        D = JA - np.where(plane[:, None, None], 0.0, JB)            # (M, 3, nv)
        U = np.einsum("mk,mkn->mn", E, D)                            # dr_m/dq
        tau = -(a_m @ U)
        self.last = dict(rows=M, a=a_m, hess=hess, E=E, dist=dist, plane=plane, D=D, U=U,
                         ja=ja, jb=jb, ca=ca, cb=cb, AA=AA, AB=AB, Jw=Jw.copy())
        return P, tau

    def force_derivative(self) -> np.ndarray:
        """d(-dP/dq)/dq (nv, nv, tangent space) at the last ``evaluate``."""
        L = self.last
        nv = self.model.nv
        if L is None:
            return np.zeros((nv, nv))
        a, E, dist, plane, D, U = L["a"], L["E"], L["dist"], L["plane"], L["D"], L["U"]
        M = len(a)
        # (1) the turning of the direction: a_m D^T (I - e e^T) D / r (zero for a plane height)
        w = np.where(plane, 0.0, a / dist)
        Pm = np.eye(3)[None] - E[:, :, None] * E[:, None, :]
        Df = D.reshape(3 * M, nv)
        H = Df.T @ np.matmul(w[:, None, None] * Pm, D).reshape(3 * M, nv)
        # (2) second derivatives of P in the distances
        hs = L["hess"]
        bi = np.fromiter((k[0] for k in hs), dtype=np.int64, count=len(hs))
        bj = np.fromiter((k[1] for k in hs), dtype=np.int64, count=len(hs))
        bx = np.fromiter(hs.values(), dtype=float, count=len(hs))
        H += (U[bi] * bx[:, None]).T @ U[bj]              # U^T B U, B sparse
        # (3) the motion of the Jacobians under fixed world forces g at the centres:
        #     d(J_c^T g)/dq = Jang^T (-[g]x) J_c + (dJ_joint^T/dq) W,  W = (g, c x g)
        Jw = L["Jw"]
        W = np.zeros((self.model.njoints, 6))
        for side, js, cs, A, sgn in (("a", L["ja"], L["ca"], L["AA"], 1.0),
                                     ("b", L["jb"], L["cb"], L["AB"], -1.0)):
            g = sgn * a[:, None] * E
            if side == "b":
                g = np.where(plane[:, None], 0.0, g)
            # J_c of this side
            S = self.support[js][:, None, :]
            Jc = np.where(S, Jw[None, :3], 0.0) - _cross_rows(cs, A)
            gx = _cross_rows(g, Jc)                                   # [g]x J_c
            H -= A.reshape(3 * M, nv).T @ gx.reshape(3 * M, nv)
            np.add.at(W, js, np.concatenate([g, np.cross(cs, g)], axis=1))
        Vl, Va = Jw[:3], Jw[3:]                                       # columns S_k = (v_k, w_k)
        for j in np.nonzero(np.abs(W).sum(axis=1))[0].tolist():
            if j == 0:
                continue
            cols = np.nonzero(self.support[j])[0]
            if not len(cols):
                continue
            v, wv = Vl[:, cols], Va[:, cols]
            fl, fa = W[j, :3], W[j, 3:]
            # K[k, i] = fl . (w_i x v_k + v_i x w_k) + fa . (w_i x w_k), for i turning k
            # fl . (w_i x v_k) = v_k . (fl x w_i)
            K = (np.cross(fl, wv, axisa=0, axisb=0) @ v                 # [i, k]: (fl x w_i).v_k
                 + np.cross(fl, v, axisa=0, axisb=0) @ wv              # (fl x v_i).w_k
                 + np.cross(fa, wv, axisa=0, axisb=0) @ wv)            # (fa x w_i).w_k
            K = np.where(self.anc_dof[np.ix_(cols, cols)], K, 0.0)     # [i, k]
            H[np.ix_(cols, cols)] += K.T                                # H[k, i]
        return -H


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
