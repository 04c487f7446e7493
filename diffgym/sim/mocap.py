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

**Equalities.** A connect or weld with a side on a mocap body (or a jointless body under one)
holds the other body to the pose the user sets: :mod:`diffgym.sim.equality` reads the mocap
side's pose in the rows' position error and its velocity (``vel + angvel x (p - pos)``, and
``angvel`` for a weld's rotation rows) in their offsets (``ExtraRows.mocap``, this state).

**Derivatives.** The step Jacobian (``jac.dq_dq`` ... ``jac.dv_dtau``) holds the mocap poses and
velocities as parameters: the contact points and frames move with ``q`` against a fixed mocap
geometry, and the offset ``R^T w(p)`` is differentiated with them (``d R^T w + R^T (angvel x
dp)``). ``jac.dq_dmocap`` / ``jac.dv_dmocap`` (:func:`mocap_jacobian`) are the derivatives with
respect to the mocap parameters themselves (12 columns a body: ``pos``, ``rot``, ``vel``,
``angvel``). The forward step adds the offsets inside the fused compiled step (``forward.
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


# -- derivatives with respect to the mocap bodies' parameters ----------------------------------
# 12 columns per mocap body, in file order: position (3), rotation (3: a world rotation vector,
# R <- exp(dtheta) R), vel (3), angvel (3)
MOCAP_FD_EPS = 1e-7        # the collision output's central difference (collision_fd_eps)


class _Snapshot:
    """The mocap state of one step (poses, velocities; the geoms' tables shared)."""

    def __init__(self, mz: "MocapState"):
        self.names, self.bodies, self.geom_body = mz.names, mz.bodies, mz.geom_body
        self.pos, self.R = mz.pos.copy(), mz.R.copy()
        self.lin, self.ang = mz.lin.copy(), mz.ang.copy()


class MocapColumns:
    """``jac.dq_dmocap`` / ``dv_dmocap`` / ``mocap_note`` of one step, computed when first read
    (:func:`mocap_jacobian`: a step Jacobian that does not read them costs nothing more), from
    the step's cache and the mocap state it was taken with (a copy: ``set_mocap`` after the step
    does not change them). Pickled as its values."""

    def __init__(self, sim, C, note=None):
        self._out = (None, None, note) if note is not None else None
        self._args = None if note is not None else (sim, C, _Snapshot(sim._mocap))

    def value(self):
        if self._out is None:
            sim, C, snap = self._args
            self._out = mocap_jacobian(sim, C, snap)
            self._args = None
        return self._out

    def __getstate__(self):
        return {"_out": self.value(), "_args": None}


def _collision_fd_mocap(sim, cons, ks: np.ndarray, mz, C_q):
    """(dp, dn, dd) of the contacts ks (len(ks), 3, 6 nm) etc. with respect to the poses of
    the mocap bodies (columns 6 i .. 6 i + 6: position, rotation of body i): a central
    difference of the collision output alone (coal's narrow phase on the pair, as
    ``derivatives._collision_fd``, the route of pairs without a closed form), the mocap body's
    geoms moved, everything else at the step's q."""
    from .derivatives import _collision_fd_context, _pair_output
    nm = len(mz.names)
    n = len(ks)
    dp = np.zeros((n, 3, 6 * nm))
    dn = np.zeros((n, 3, 6 * nm))
    dd = np.zeros((n, 6 * nm))
    if not n:
        return dp, dn, dd
    c = cons.contacts
    gdata, nph = _collision_fd_context(sim, C_q)
    base = {}
    for i, b in enumerate(mz.bodies):         # (every mocap geom at the step's pose)
        M = pin.SE3(mz.R[i].copy(), mz.pos[i].copy())
        for g, L in zip(b.geoms.tolist(), b.local):
            base[g] = M * L
            gdata.oMg[g] = base[g]
    h = MOCAP_FD_EPS
    bodies = np.maximum(mz.geom_body[c.geom1[ks]], mz.geom_body[c.geom2[ks]])
    for i, b in enumerate(mz.bodies):
        rows = np.flatnonzero(bodies == i)
        if not len(rows):
            continue
        for a in range(6):
            outs = []
            for sgn in (1.0, -1.0):
                e = np.zeros(6)
                e[a] = sgn * h
                R = pin.exp3(e[3:]) @ mz.R[i]
                M = pin.SE3(R, mz.pos[i] + e[:3])
                for g, L in zip(b.geoms.tolist(), b.local):
                    gdata.oMg[g] = M * L
                nph.new_placements()
                outs.append({int(r): _pair_output(nph, gdata, c, int(ks[r])) for r in rows})
            for g in b.geoms.tolist():
                gdata.oMg[g] = base[g]
            for r in rows.tolist():
                (pa, na, da), (pb, nb, db) = outs[0][r], outs[1][r]
                dp[r][:, 6 * i + a] = (pa - pb) / (2 * h)
                dn[r][:, 6 * i + a] = (na - nb) / (2 * h)
                dd[r][6 * i + a] = (da - db) / (2 * h)
    nph.new_placements()
    return dp, dn, dd


def mocap_jacobian(sim, C=None, mz=None):
    """``(dq_dmocap, dv_dmocap, note)``: the derivatives of the step's ``(q1, v1)`` (tangent rows,
    nv each) with respect to the mocap bodies' parameters (12 columns per body, file order:
    ``pos``, ``rot`` (a world rotation vector, ``R <- exp(dtheta) R``), ``vel``, ``angvel``; the
    pose and velocity ``Simulator.set_mocap`` set before the step), or ``(None, None, why)``
    where they are not computed.

    The parameters enter the step's constraint rows only (never the free motion): the rows of
    contacts with a mocap geom (their points, frames and distances move with its pose: coal's
    output differenced, ``_collision_fd_mocap``; their offsets hold its velocity at the point)
    and the connect / weld rows with a mocap side (``ExtraRows.mocap_derivatives``, closed
    form). At fixed ``(q, v, tau)``, ``d sigma = J M^-1 dF + D`` with ``dF = d(J^T lam)/dm`` at
    fixed impulses and ``D`` the rows' own change at fixed ``v1``; the impulses' change comes from
    the step's mode system (``A dlam = -W (J M^-1 dF + D)``, as for ``q``), ``dv1 = M^-1 (dF +
    J^T dlam)`` and ``dq1 = dt dIntegrate/dv dv1``."""
    from . import derivatives as _d
    from .constraint import baumgarte_gain, depenetration_speed
    C = sim.cache if C is None else C
    mz = sim._mocap if mz is None else mz         # (the state of the step: a _Snapshot)
    nm = len(mz.names)
    nv, dt = sim.nv, sim.dt
    ncol = 12 * nm
    cons, res = C["cons"], C["res"]
    zero = (np.zeros((nv, ncol)), np.zeros((nv, ncol)), None)
    if cons is None or not cons.m:
        return zero
    if C.get("impact_times") is not None or C.get("impact_pre") is not None \
            or _d._restitution(cons) is not None:
        return None, None, "restitution (Newton's impact law) in the step"
    nc, m = cons.nc, cons.m
    q, v1 = C["q"], C["v1"]
    D = np.zeros((m, ncol))
    dF = np.zeros((nv, ncol))
    c = cons.contacts
    ks = np.zeros(0, dtype=np.int64)
    if nc:
        mb1, mb2 = mz.geom_body[c.geom1], mz.geom_body[c.geom2]
        ks = np.flatnonzero((mb1 >= 0) | (mb2 >= 0))
    if len(ks):
        for S, _ in _d.realizable_islands(sim, cons):
            if np.any(np.isin(S // 3, ks) & (S < 3 * nc)):
                return None, None, ("the realizable drift correction projected the offsets of "
                                    "a contact with a mocap geom")
        dp6, dn6, dd6 = _collision_fd_mocap(sim, cons, ks, mz, q)
        n = len(ks)
        # the pose columns (6 per body) into the 12 of each body
        dp = np.zeros((n, 3, ncol))
        dn = np.zeros((n, 3, ncol))
        dd = np.zeros((n, ncol))
        for i in range(nm):
            dp[:, :, 12 * i:12 * i + 6] = dp6[:, :, 6 * i:6 * i + 6]
            dn[:, :, 12 * i:12 * i + 6] = dn6[:, :, 6 * i:6 * i + 6]
            dd[:, 12 * i:12 * i + 6] = dd6[:, 6 * i:6 * i + 6]
        gj = sim.constraints.geom_joint
        g1, g2 = c.geom1[ks], c.geom2[ks]
        j1s, j2s = gj[g1], gj[g2]
        # (a Data of its own: the columns may be read after later steps, whose kinematics
        # the simulator's own arrays hold)
        data = sim.__dict__.get("_dmocap_data")
        if data is None:
            data = sim.__dict__["_dmocap_data"] = sim.model.createData()
        kin = _d._Kin(sim.model, data, q, v1, np.concatenate([j1s, j2s]))
        p = c.pos[ks]
        R = cons.frames[ks]
        lam = res.lam[:3 * nc].reshape(nc, 3)[ks]
        f_world = np.einsum("kij,kj->ki", R, lam)
        dR = _d._frame_derivatives(c.normal[ks], dn)             # (n, 3, 3, ncol)
        df = np.einsum("kijn,kj->kin", dR, lam)
        vrel = np.zeros((n, 3))
        dvrel = np.zeros((n, 3, ncol))
        for js, gs, sgn in ((j1s, g1, -1.0), (j2s, g2, 1.0)):
            # the moving bodies' side: v(p) = v_o + w x (p - o); at fixed (q, v1) only p moves
            if np.any(js):
                Jj, o, w, _ = kin.stacked(js)
                Jw = Jj[:, 3:]
                Jp = Jj[:, :3] - _d._cross(p - o, Jw)
                vrel += sgn * (Jp @ v1)
                dvrel += sgn * _d._cross(w, dp)
                # d(J^T lam)/dm at fixed lam: Jp^T df + Jw^T (dp x f)
                fs = sgn * f_world
                X = sgn * df
                Y = _d._cross(-fs, dp)                              # dp x fs
                dF += Jp.reshape(-1, nv).T @ X.reshape(-1, ncol) \
                    + Jw.reshape(-1, nv).T @ Y.reshape(-1, ncol)
            # the mocap side: w(p) = vel + angvel x (p - pos)
            mb = mz.geom_body[gs]
            on = np.flatnonzero(mb >= 0)
            for r in on.tolist():
                i = int(mb[r])
                rr = p[r] - mz.pos[i]
                om = mz.ang[i]
                vrel[r] += sgn * (mz.lin[i] + np.cross(om, rr))
                dpr = dp[r].copy()
                dpr[:, 12 * i:12 * i + 3] -= np.eye(3)            # d(p - pos)
                dvrel[r] += sgn * (_skew3(om) @ dpr)
                dvrel[r][:, 12 * i + 6:12 * i + 9] += sgn * np.eye(3)
                dvrel[r][:, 12 * i + 9:12 * i + 12] += sgn * (-_skew3(rr))
        Dk = np.einsum("kain,ka->kin", dR, vrel) + np.einsum("kai,kan->kin", R, dvrel)
        cb = sim.constraints
        gain = baumgarte_gain(cons.dist[ks], dt, cb.erp, cb.skin, depenetration_speed(sim.solver))
        Dk[:, 2, :] += gain[:, None] * dd
        rows = (3 * ks[:, None] + np.arange(3)).ravel()
        D[rows] = Dk.reshape(-1, ncol)
    xr = getattr(cons, "extra", None)
    ex = sim.__dict__.get("_extra")
    if xr is not None and xr.m and ex is not None:
        s0 = 3 * nc + len(cons.limits)
        D[s0:] += ex.mocap_derivatives(q, xr, dt, mz)
    if not D.any() and not dF.any():
        return zero
    Minv = C["Minv"]
    if Minv is None:
        trees = sim.__dict__.get("_trees")
        Minv = trees.minverse(q) if trees is not None else \
            pin.computeMinverse(sim.model, sim.model.createData(), q)
    Minv = np.asarray(Minv, dtype=float).reshape(nv, nv)
    Minv = np.triu(Minv) + np.triu(Minv, 1).T            # (only the upper triangle may be filled)
    J = np.asarray(cons.J, dtype=float)
    A, W = _d._mode_system(res, C["G"], nc, cons.mu)
    MdF = Minv @ dF
    dlam = _d._solve_min_norm(A, -(W @ (J @ MdF + D)))
    dv = MdF + Minv @ (J.T @ dlam)
    dI_dv = pin.dIntegrate(sim.model, q, v1 * dt, pin.ArgumentPosition.ARG1)
    return dt * dI_dv @ dv, dv, None


def _skew3(x):
    return np.array([[0.0, -x[2], x[1]], [x[2], 0.0, -x[0]], [-x[1], x[0], 0.0]])
