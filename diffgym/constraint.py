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
import pinocchio as pin

from .collision_driver import Contacts
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


def tangent_frames(normals: np.ndarray) -> np.ndarray:
    """Orthonormal frames (k, 3, 3) whose third column is the normal."""
    n = normals / np.linalg.norm(normals, axis=1, keepdims=True)
    helper = np.zeros_like(n)
    use_x = np.abs(n[:, 0]) < 0.9
    helper[use_x, 0] = 1.0
    helper[~use_x, 1] = 1.0
    t1 = np.cross(helper, n)
    t1 /= np.linalg.norm(t1, axis=1, keepdims=True)
    t2 = np.cross(n, t1)
    return np.stack([t1, t2, n], axis=2)


def baumgarte(dist: np.ndarray, dt: float, erp: float, skin: float) -> np.ndarray:
    return np.where(dist > skin, (dist - skin) / dt + erp * skin / dt, erp * dist / dt)


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

    def active_limits(self, q: np.ndarray, v: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
        if not len(self.lim_q):
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        dist = self.lim_sign * (q[self.lim_q] - self.lim_bound)
        active = np.nonzero(dist < self.limit_margin + dt * np.abs(v[self.lim_v]))[0]
        return active, dist[active]

    def point_jacobians(self, model: pin.Model, data: pin.Data, joints: np.ndarray,
                        points: np.ndarray) -> np.ndarray:
        """Linear velocity Jacobians (k, 3, nv) of world points rigidly attached to joints."""
        out = np.zeros((len(joints), 3, self.nv))
        cache: dict[int, np.ndarray] = {}
        for i, j in enumerate(joints):
            j = int(j)
            if j == 0:
                continue
            Jj = cache.get(j)
            if Jj is None:
                Jj = pin.getJointJacobian(model, data, j, pin.LOCAL_WORLD_ALIGNED)
                cache[j] = Jj
            r = points[i] - data.oMi[j].translation
            # v_p = v_o + w x r = v_o - r x w
            out[i] = Jj[:3] - np.cross(r, Jj[3:].T).T
        return out

    def build(self, model: pin.Model, data: pin.Data, q: np.ndarray, v: np.ndarray,
              contacts: Contacts, dt: float) -> Constraints:
        """Assemble J and b. ``data`` must hold joint Jacobians at q (computeJointJacobians)."""
        nc = len(contacts)
        lim_idx, lim_dist = self.active_limits(q, v, dt)
        nl = len(lim_idx)
        J = np.zeros((3 * nc + nl, self.nv))
        b = np.zeros(3 * nc + nl)
        frames = tangent_frames(contacts.normal) if nc else np.zeros((0, 3, 3))
        if nc:
            j1 = self.geom_joint[contacts.geom1]
            j2 = self.geom_joint[contacts.geom2]
            Jp = self.point_jacobians(model, data, np.concatenate([j1, j2]),
                                      np.concatenate([contacts.pos, contacts.pos]))
            Jrel = Jp[nc:] - Jp[:nc]                                   # (nc, 3, nv)
            J[:3 * nc] = np.einsum("kai,kab->kib", frames, Jrel).reshape(3 * nc, self.nv)
            b[2:3 * nc:3] = baumgarte(contacts.dist, dt, self.erp, self.skin)
        if nl:
            rows = np.arange(3 * nc, 3 * nc + nl)
            J[rows, self.lim_v[lim_idx]] = self.lim_sign[lim_idx]
            b[3 * nc:] = baumgarte(lim_dist, dt, self.erp, self.skin)
        return Constraints(J, b, nc, contacts.mu.copy(), frames, contacts, lim_idx, lim_dist,
                           contacts.dist.copy())
