"""Constraint assembly: contact and joint-limit rows of the velocity-level problem.

For contact k (frame ``R_k = [t1 t2 n]``, n from geom 1 to geom 2) the three rows map the
generalized velocity to the velocity of geom 2 relative to geom 1 at the contact point, in the
contact frame: ``sigma_k = R_k^T (J_p2 - J_p1) v_next + b_k``. For a joint limit
``sign * (q - bound) >= 0`` the row is ``sign * v_next[idx_v] + b``.

Baumgarte / speculative offset (documented gains): with signed distance ``d`` and a contact
skin ``s`` (default 1 mm),

    b = erp * d / dt                      if d <= s  (Baumgarte: a penetration is removed
                                                      geometrically, a fraction ``erp`` per step)
    b = (d - s) / dt + erp * s / dt       if d > s   (speculative: a gap closes exactly within
                                                      the step, so nothing tunnels)

so the position-level gain is ``Kp = erp / dt`` (default ``erp = 0.2``) and there is no
velocity-level damping term (``Kd = 0``): the velocity rows are exact. ``b`` is continuous and
smooth around ``d = 0``, where resting contacts settle, so step derivatives there are those of
one smooth piece; its only kink is at ``d = s``, away from resting states.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .collision_driver import Contacts
from .jit import njit
from .model import SimModel


@dataclass
class Constraints:
    J: np.ndarray          # (m, nv) rows: 3 per contact [t1, t2, n], then 1 per active limit
    b: np.ndarray          # (m,) offsets: sigma = J v_next + b
    nc: int                # number of contact points
    mu: np.ndarray         # (nc,)
    frames: np.ndarray     # (nc, 3, 3) columns t1, t2, n
    contacts: Contacts
    limits: np.ndarray     # (nl,) indices into SimModel.limits of the active limit rows
    limit_dist: np.ndarray  # (nl,) signed distance to the limit
    dist: np.ndarray       # (nc,) contact signed distances

    @property
    def m(self) -> int:
        return int(self.J.shape[0])


from .frames import tangent_frames  # noqa: E402


@njit
def _active_limits(q, v, lim_q, lim_v, lim_bound, lim_sign, limit_margin, dt):
    """Indices and signed distances of the limits within reach this step (as active_limits)."""
    n = 0
    L = lim_q.shape[0]
    dist = np.empty(L)
    for i in range(L):
        dist[i] = lim_sign[i] * (q[lim_q[i]] - lim_bound[i])
        if dist[i] < limit_margin + dt * abs(v[lim_v[i]]):
            n += 1
    idx = np.empty(n, dtype=np.int64)
    dd = np.empty(n)
    n = 0
    for i in range(L):
        if dist[i] < limit_margin + dt * abs(v[lim_v[i]]):
            idx[n] = i
            dd[n] = dist[i]
            n += 1
    return idx, dd


@njit
def _offset(d, dt, erp, skin):
    """The Baumgarte / speculative offset b of a signed distance d (module docstring)."""
    return (d - skin) / dt + erp * skin / dt if d > skin else erp * d / dt


@njit
def assemble_problem(pos, frames, j1, j2, dist, Jw, support, tree_lo, tree_hi, lim_idx, lim_dist,
                     lim_v, lim_sign, dt, erp, skin, Minv, v_free):
    """The rows J (m, nv) and offsets b of the contacts (3 each) and active limits, and the
    velocity-level problem ``G = J M^-1 J^T``, ``g = J v_free + b`` with ``M^-1 J^T`` and the
    symmetric ``M^-1``.

    A contact point p on the bodies of joints j1 and j2 moves with ``sum_d (Jlin_d - p x
    Jang_d) v_d`` over the columns d of pinocchio's world-frame joint Jacobian ``Jw`` that
    support each joint (``support``, (njoints, nv); a column supporting both cancels).
    ``Minv``: pinocchio's computeMinverse (its upper triangle is filled)."""
    nc = pos.shape[0]
    nl = lim_idx.shape[0]
    nv = Jw.shape[1]
    m = 3 * nc + nl
    J = np.zeros((m, nv))
    b = np.zeros(m)
    nz = np.zeros((m, nv), dtype=np.int64)      # the nonzero columns of each row
    nnz = np.zeros(m, dtype=np.int64)
    for k in range(nc):
        p0, p1, p2 = pos[k, 0], pos[k, 1], pos[k, 2]
        for d in range(nv):
            s2 = support[j2[k], d]
            if s2 == support[j1[k], d]:
                continue
            sg = 1.0 if s2 else -1.0
            wx, wy, wz = Jw[3, d], Jw[4, d], Jw[5, d]
            r0 = sg * (Jw[0, d] - (p1 * wz - p2 * wy))
            r1 = sg * (Jw[1, d] - (p2 * wx - p0 * wz))
            r2 = sg * (Jw[2, d] - (p0 * wy - p1 * wx))
            for a in range(3):
                row = 3 * k + a
                J[row, d] = frames[k, 0, a] * r0 + frames[k, 1, a] * r1 + frames[k, 2, a] * r2
                nz[row, nnz[row]] = d
                nnz[row] += 1
        b[3 * k + 2] = _offset(dist[k], dt, erp, skin)
    for i in range(nl):
        row = 3 * nc + i
        d = lim_v[lim_idx[i]]
        J[row, d] = lim_sign[lim_idx[i]]
        nz[row, 0] = d
        nnz[row] = 1
        b[row] = _offset(lim_dist[i], dt, erp, skin)
    Ms = np.empty((nv, nv))                     # M^-1, both triangles
    for i in range(nv):
        for d in range(i, nv):
            Ms[i, d] = Ms[d, i] = Minv[i, d]
    # M^-1 is block diagonal over the kinematic trees hanging from the world (dof d's tree is
    # the contiguous range tree_lo[d]:tree_hi[d]): a row couples only with rows on its trees
    rt = np.full((m, 2), -1, dtype=np.int64)
    for r in range(m):
        for t in range(nnz[r]):
            lo = tree_lo[nz[r, t]]
            if rt[r, 0] < 0 or rt[r, 0] == lo:
                rt[r, 0] = lo
            else:
                rt[r, 1] = lo
    MJt = np.zeros((nv, m))
    for r in range(m):
        for t in range(nnz[r]):
            d = nz[r, t]
            x = J[r, d]
            for i in range(tree_lo[d], tree_hi[d]):
                MJt[i, r] += Ms[i, d] * x
    G = np.zeros((m, m))
    g = b.copy()
    for r in range(m):
        a0, a1 = rt[r, 0], rt[r, 1]
        for t in range(nnz[r]):
            d = nz[r, t]
            g[r] += J[r, d] * v_free[d]
        for c in range(r, m):
            c0, c1 = rt[c, 0], rt[c, 1]
            if c0 < 0 or not (c0 == a0 or c0 == a1 or (c1 >= 0 and (c1 == a0 or c1 == a1))):
                continue
            acc = 0.0
            for t in range(nnz[r]):
                d = nz[r, t]
                acc += J[r, d] * MJt[d, c]
            G[r, c] = acc
            G[c, r] = acc
    return J, b, G, g, MJt, Ms


def baumgarte_gain(dist: np.ndarray, dt: float, erp: float, skin: float) -> np.ndarray:
    """d b / d dist."""
    return np.where(dist > skin, 1.0 / dt, erp / dt)


class ConstraintBuilder:
    def __init__(self, sm: SimModel, erp: float = 0.2, limit_margin: float = 1e-3,
                 skin: float = 1e-3):
        self.sm = sm
        self.erp = float(erp)
        self.skin = float(skin)
        self.limit_margin = float(limit_margin)
        self.nv = sm.model.nv
        self.geom_joint = np.array([g.parentJoint for g in sm.geom_model.geometryObjects], dtype=np.int64)
        L = sm.limits
        self.lim_q = np.array([l.idx_q for l in L], dtype=np.int64)
        self.lim_v = np.array([l.idx_v for l in L], dtype=np.int64)
        self.lim_bound = np.array([l.bound for l in L], dtype=float)
        self.lim_sign = np.array([l.sign for l in L], dtype=float)
        # per joint: the velocity components that move it (row 0, the world: none)
        model = sm.model
        self.support = np.zeros((model.njoints, self.nv), dtype=np.bool_)
        for j in range(1, model.njoints):
            jm = model.joints[j]
            self.support[j] = self.support[model.parents[j]]
            self.support[j, jm.idx_v:jm.idx_v + jm.nv] = True
        self._no_limits = (np.zeros(0, dtype=np.int64), np.zeros(0))
        self.has_limits = bool(len(self.lim_q))
        # each dof's kinematic tree (the subtree of a child of the world), as the range of its
        # dofs, where M^-1 is block diagonal; one dense block if a tree's dofs are not contiguous
        self.tree_lo = np.zeros(self.nv, dtype=np.int64)
        self.tree_hi = np.full(self.nv, self.nv, dtype=np.int64)
        roots: dict[int, list[int]] = {}
        for j in range(1, model.njoints):
            r = j
            while model.parents[r] != 0:
                r = model.parents[r]
            jm = model.joints[j]
            roots.setdefault(r, []).extend(range(jm.idx_v, jm.idx_v + jm.nv))
        if all(max(d) + 1 - min(d) == len(d) for d in roots.values() if d):
            for dofs in roots.values():
                if dofs:
                    self.tree_lo[dofs] = min(dofs)
                    self.tree_hi[dofs] = max(dofs) + 1

    def active_limits(self, q: np.ndarray, v: np.ndarray, dt: float):
        """Indices (into SimModel.limits) and signed distances of the limits within reach of
        this step: ``sign (q - bound) < limit_margin + dt |v|``."""
        if not len(self.lim_q):
            return self._no_limits
        return _active_limits(q, v, self.lim_q, self.lim_v, self.lim_bound, self.lim_sign,
                              self.limit_margin, dt)

    def assemble(self, Jw: np.ndarray, contacts: Contacts, limits, dt: float, Minv: np.ndarray,
                 v_free: np.ndarray):
        """Constraints and the problem (G, g, M^-1 J^T) from the world-frame joint Jacobians
        ``Jw`` (pinocchio's data.J after computeJointJacobians) in one compiled pass."""
        lim_idx, lim_dist = limits
        nc = len(contacts)
        frames = contacts.frames
        if frames is None:
            frames = tangent_frames(contacts.normal) if nc else np.zeros((0, 3, 3))
        J, b, G, g, MJt, Ms = assemble_problem(
            contacts.pos, frames, self.geom_joint[contacts.geom1], self.geom_joint[contacts.geom2],
            contacts.dist, Jw, self.support, self.tree_lo, self.tree_hi, lim_idx, lim_dist,
            self.lim_v, self.lim_sign, dt, self.erp, self.skin, Minv, v_free)
        cons = Constraints(J, b, nc, contacts.mu, frames, contacts, lim_idx, lim_dist, contacts.dist)
        return cons, G, g, MJt, Ms
