"""Mocap bodies (MJCF ``<body mocap="true">``): bodies whose pose the user sets, as MuJoCo's
``data.mocap_pos`` / ``data.mocap_quat``.

A mocap body is a child of the world without joints. It is not part of the state ``(q, v)`` and
no force moves it: the user places it before a step with ``Simulator.set_mocap(name, pos,
quat)`` (``quat`` in MuJoCo's order ``w x y z``, like ``mocap_quat``). Its geoms collide with the
bodies that move (never with the world or another mocap body: neither has a degree of freedom).

**Velocity.** MuJoCo gives a mocap body no velocity (its ``cvel`` is zero: it has no joint), so a
paddle moving into a box is felt only as penetration, which its soft contact pushes out. diffgym's
contacts are hard velocity constraints, so a moving mocap body carries a velocity: the contact
rows hold the velocity of the moving body relative to the mocap body's surface at the contact
point, ``w(p) = vel + angvel x (p - pos)`` (world frame), in the offset ``b`` of all three rows
(normal: a box in front of the paddle leaves at the paddle's speed; tangent: friction acts on
the slip relative to the paddle). ``set_mocap`` takes it as ``vel`` / ``angvel``; without them it
is the finite difference of the pose it replaces over the time step ``dt`` (``vel = (pos -
pos_before) / dt``, ``angvel = log(R R_before^T) / dt``): calling ``set_mocap`` once before each
step with the pose of that step gives the backward difference, exact for a constant velocity.
A jump (a reset) passes ``vel=0, angvel=0``. The speculative margins of contact detection grow by
``dt`` times the mocap body's largest point speed, so a fast paddle's contacts are found before
it enters a body, as a moving body's are.

**Derivatives.** The step Jacobian (``jac.dq_dq`` ... ``jac.dv_dtau``) holds the mocap poses and
velocities as parameters: the contact points and frames move with ``q`` against a fixed mocap
geometry, and the offset ``R^T w(p)`` is differentiated with them (``d R^T w + R^T (angvel x
dp)``). The forward step adds the offsets inside the fused compiled step (``forward.
_constrained_velocity``'s ``mocap_b``) or, on the stage-by-stage path, after assembly
(``Simulator._mocap_offsets``); models with mocap bodies do not take the per-island storage of
large scenes (``island_step``) nor the compiled Jacobian route (the numpy route adds the term).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pinocchio as pin


@dataclass
class MocapBody:
    """A mocap body of the file: its pose at load (world), its geoms and their placements in
    its frame (jointless bodies under it included)."""

    name: str
    pose: pin.SE3
    geoms: np.ndarray
    local: list = field(default_factory=list)
    from_key: bool = False    # pose from a keyframe's mpos/mquat, not the body's own


def _quat_wxyz(quat, what: str) -> np.ndarray:
    qv = np.asarray(quat, dtype=float).reshape(-1)
    n2 = float(qv @ qv) if qv.shape == (4,) else float("nan")
    if not (n2 == n2 and n2 < float("inf")):        # (wrong shape, NaN or inf)
        raise ValueError(f"{what}: quat must be 4 finite numbers (w, x, y, z), got {quat!r}")
    if n2 < 1e-18:
        raise ValueError(f"{what}: quat must not be zero")
    w, x, y, z = (qv / np.sqrt(n2)).tolist()
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def _vec3(x, key: str, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim == 0:
        a = np.full(3, float(a))
    a = a.reshape(-1)
    s = float(a.sum()) if a.shape == (3,) else float("nan")
    if not (s == s and abs(s) < float("inf")):     # (wrong shape, NaN or inf)
        raise ValueError(f"{what}: {key} must be 3 finite numbers, got {x!r}")
    return a


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise a x b of (k, 3) arrays (np.cross costs ~20 us of argument handling a call)."""
    out = np.empty_like(b)
    out[:, 0] = a[:, 1] * b[:, 2] - a[:, 2] * b[:, 1]
    out[:, 1] = a[:, 2] * b[:, 0] - a[:, 0] * b[:, 2]
    out[:, 2] = a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]
    return out


class MocapState:
    """The mocap bodies of a simulator: poses, velocities, and the geoms they carry."""

    def __init__(self, sim, bodies: list[MocapBody]):
        self.bodies = list(bodies)
        self.names = tuple(b.name for b in self.bodies)
        self.index = {n: i for i, n in enumerate(self.names)}
        nm = len(self.bodies)
        self.pos = np.array([b.pose.translation for b in self.bodies], dtype=float).reshape(nm, 3)
        self.R = np.array([b.pose.rotation for b in self.bodies], dtype=float).reshape(nm, 3, 3)
        self.lin = np.zeros((nm, 3))
        self.ang = np.zeros((nm, 3))
        ngeom = len(sim.geom_model.geometryObjects)
        self.geom_body = np.full(ngeom, -1, dtype=np.int64)
        self.reach = np.zeros(nm)                    # farthest geom point from the body origin
        for i, b in enumerate(self.bodies):
            self.geom_body[b.geoms] = i
            for g, M in zip(b.geoms.tolist(), b.local):
                self.reach[i] = max(self.reach[i], float(np.linalg.norm(M.translation))
                                    + float(sim.sm.geoms[g].bound_radius))
        self.base_margin = float(sim.collision.base_margin)
        for i, b in enumerate(self.bodies):
            if b.from_key:                 # (else the geoms already sit at the file's pose)
                self._place(sim, i)

    def body(self, name) -> int:
        if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
            if not 0 <= int(name) < len(self.names):
                raise IndexError(f"mocap body index {name} out of range (the model has "
                                 f"{len(self.names)}: {list(self.names)})")
            return int(name)
        if name not in self.index:
            raise KeyError(f"no mocap body named {name!r} (mocap bodies: {list(self.names)})")
        return self.index[name]

    def moving(self) -> bool:
        return bool(np.any(self.lin) or np.any(self.ang))

    def set(self, sim, name, pos=None, quat=None, vel=None, angvel=None) -> None:
        i = self.body(name)
        what = f"set_mocap({self.names[i]!r})"
        p_new = self.pos[i] if pos is None else _vec3(pos, "pos", what)
        R_new = self.R[i] if quat is None else _quat_wxyz(quat, what)
        dt = sim.dt
        lin = ((p_new - self.pos[i]) / dt if vel is None else _vec3(vel, "vel", what))
        ang = (pin.log3(R_new @ self.R[i].T) / dt if angvel is None
               else _vec3(angvel, "angvel", what))
        self.pos[i], self.R[i] = p_new, R_new
        self.lin[i], self.ang[i] = lin, ang
        self._place(sim, i)
        # the speculative margins: a point of a mocap geom moves by up to dt * (|vel| + |angvel|
        # reach) within the step (collision_driver: the static geoms' speed bound is 0)
        speed = float(np.max(np.linalg.norm(self.lin, axis=1)
                             + np.linalg.norm(self.ang, axis=1) * self.reach, initial=0.0))
        sim.collision.base_margin = self.base_margin + dt * speed

    def _place(self, sim, i: int) -> None:
        body = self.bodies[i]
        M = pin.SE3(self.R[i].copy(), self.pos[i].copy())
        objs = sim.geom_model.geometryObjects
        W0 = sim.collision._W0
        for g, L in zip(body.geoms.tolist(), body.local):
            P = M * L
            objs[g].placement = P
            W0[g] = P.homogeneous
        trees = sim.__dict__.get("_trees")
        gv = trees.__dict__.get("_gview") if trees is not None else None
        if gv is not None:              # (its cache of the geoms' placements on their joints)
            for g in body.geoms.tolist():
                gv[3][g] = W0[g, :3, :3]
                gv[4][g] = W0[g, :3, 3]

    def point_velocity(self, geoms: np.ndarray, p: np.ndarray):
        """(k, 3) world velocity of the points p of geoms (zero where not a mocap geom), and
        the (k, 3) angular velocities of their bodies."""
        b = self.geom_body[geoms]
        on = b >= 0
        w = np.zeros((len(geoms), 3))
        om = np.zeros((len(geoms), 3))
        if on.any():
            bi = b[on]
            om[on] = self.ang[bi]
            w[on] = self.lin[bi] + _cross(self.ang[bi], p[on] - self.pos[bi])
        return w, om

    def contact_bias(self, contacts, frames) -> np.ndarray | None:
        """(nc, 3) the offsets ``R_k^T (w2(p) - w1(p))`` of the contacts' rows [t1, t2, n] (the
        mocap side's velocity at the point; None when no contact touches a moving mocap geom)."""
        nc = len(contacts)
        if not nc or not self.moving():
            return None
        g1, g2 = contacts.geom1, contacts.geom2
        if not (np.any(self.geom_body[g1] >= 0) or np.any(self.geom_body[g2] >= 0)):
            return None
        w1, _ = self.point_velocity(g1, contacts.pos)
        w2, _ = self.point_velocity(g2, contacts.pos)
        dw = w2 - w1
        return (frames * dw[:, :, None]).sum(axis=1)         # R_k^T dw_k
