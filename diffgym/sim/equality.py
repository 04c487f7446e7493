"""Equality constraints, joint dry friction, ball-joint limits and fixed tendons (issue 15).

These elements add rows to the same unrelaxed velocity-level constraint problem as contacts and
joint limits (``sigma = J v1 + b``, ``v1 = v_free + M^-1 J^T lam``, impulses ``lam``). Their
rows come after the contact and joint-limit rows, one kind each:

- **bilateral** (``KIND_EQ``): MJCF ``<equality>`` ``connect`` (3 rows: the world velocity of
  body 2's anchor point relative to body 1's), ``weld`` (those 3 at body 2's ``anchor`` plus 3
  rows of relative angular velocity ``w2 - w1``, world axes) and ``joint`` (``q1 - q1_0 =
  P(q2 - q2_0)``, one row ``v1 - P'(q2 - q2_0) v2``): ``sigma = 0``, ``lam`` free. Position drift
  is corrected as for joint limits and resting contacts: ``b = erp * phi / dt`` (Baumgarte,
  ``phi`` the position error: anchor separation, the world rotation vector
  ``log3(R2 (R1 R_rel)^T)``, the joint-coupling residual). A connect or weld side on a mocap
  body (``mocap1``/``mocap2``: MuJoCo's way to drag a body by a target) has no dof: its pose is
  the one ``Simulator.set_mocap`` set, and its velocity enters the offset, ``b = erp phi / dt +
  w2 - w1`` (``w`` the mocap side's point velocity ``vel + angvel x (p - pos)``, ``angvel`` for
  the rotation rows; zero for a side on a body); ``mocap_derivatives`` gives ``d b / d(mocap
  pos, rot, vel, angvel)`` for ``jac.dv_dmocap`` (diffgym.sim.mocap.mocap_jacobian);
- **dry friction** (``KIND_FRICTION``, joint ``frictionloss`` f): one row per dof ``sigma =
  v1[d]``, ``|lam| <= f dt``: sticking (``sigma = 0``) inside the box, sliding at the bound
  opposite to the velocity (``lam = -f dt sign(sigma)``);
- **unilateral** (``KIND_LIMIT``): a ball joint's ``range`` (MuJoCo: the joint's rotation angle
  ``theta = |log3(R)| <= range[1]``; row ``-axis^T w``, distance ``range[1] - theta``) and a
  fixed tendon's ``range`` (``L = sum coef_i q_i``, rows ``+-coef^T v``), with the joint limits'
  Baumgarte / speculative offset and reach (``dist < margin + dt |J v|``).

Fixed tendons also give passive forces (``stiffness``: ``-k (L - L_rest) coef``, ``damping``:
``-d (coef^T v) coef``) and actuator transmissions (``<motor tendon=...>``: ``tau += gear ctrl
coef``, see :class:`diffgym.sim.model.Actuator`).

**Solve.** Models with such rows are assembled in Python (contact and joint-limit rows, then
these) and the mixed problem is solved by a compiled kernel (``equality_kernels.mixed_solve``, its
one implementation; under ``SolverSettings(compiled=False)`` or another solver class its reduced
NCPs go to that solver's ``solve``; the fused compiled call of ``diffgym.sim.forward`` serves models without these rows). Rows that do
not depend on the state (dry friction alone) are built once. The mixed problem is solved
exactly by an active set
over the new rows: bilateral rows, sticking friction rows and active unilateral rows are
equalities and are eliminated (Schur complement, minimum-norm where redundant, e.g. a planar
loop's out-of-plane rows); sliding friction rows and inactive unilateral rows hold fixed
impulses; the remaining contact / joint-limit problem is the ordinary NCP, solved by the
simulator's :class:`~diffgym.sim.solver.NCPSolver`. Rows violating their mode's inequality switch
mode and the solve repeats (usually 1-3 rounds). Where a round's reduced problem defeats stage 1
or the rounds end unconverged, the whole problem is solved by proximal-point iterations
(``equality_kernels.mixed_prox``, method ``"mixedprox"``: each iteration the problem of ``G +
rho I``, whose impulses are unique, by the same compiled rounds) until its natural residual is
within the tolerance; the later stages (ADMM, PGS: Python) only where that fails. (Sticking
joint-friction rows weld links into rigid groups: a robot lying on the ground then touches it
at several points of one group, the reduced problem is rank deficient and its impulses are not
unique; Talos after its fall, tests/test_rows_contacts.py.)

**Problems without a solution.** Rigid equality rows, rigid contacts and Coulomb friction can
admit no impulses at all (Painleve): a box on the floor connected at a point above it and
dragged sideways needs a normal impulse ``N (w - mu h) = 0.25 m v`` at its leading edge (``w``
its half-width, ``h`` the point's height above the floor), which has no solution ``N >= 0`` for
``mu >= w / h``. Such a step is reported, not hidden: ``converged=False`` and a
``SolverWarning`` (method ``"soft"``), and its answer is defined: the solution of the problem
with every row made slightly compliant, ``G + rho I`` (``equality_kernels.mixed_soft``), whose
velocities are within O(rho) of their limit as ``rho -> 0`` while its impulses grow like ``1 /
rho`` along rows that move nothing (there the reported impulses are not physical), instead of
an iterative stage's last iterate (tests/test_rows_contacts.py).

**Derivatives.** The mode system of :mod:`diffgym.sim.derivatives` takes these rows as it takes
joint limits: equality modes ``d sigma = 0`` (bilateral, sticking, active), fixed-impulse modes
``d lam = 0`` (sliding at the constant bound, inactive). The rows' kinematic terms are closed
form (``ExtraRows.kinematic_derivatives``): ``d(J(q) v1 + b(q))/dq`` at fixed ``v1`` from
pinocchio's joint velocity derivatives (connect, weld; the weld's rotation error through
``Jlog3``) or by hand (joint coupling, ball axis, tendons); connect and weld impulses enter
pinocchio's ABA derivatives as external forces fixed in the joint frames, as contact impulses
do, plus the turning of their world-fixed direction; the other rows' impulses as joint torques
plus ``d(J(q)^T lam)/dq``. ``kinematic_derivatives_fd`` (central differences of the rows'
kinematics alone, step ``KIN_FD_EPS``) is the test oracle of those terms.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pinocchio as pin

KIND_EQ, KIND_FRICTION, KIND_LIMIT = 0, 1, 2
KIN_FD_EPS = 1e-6


@dataclass
class Connect:
    name: str
    body1: str
    body2: str            # "world" allowed
    jid1: int
    jid2: int
    anchor1: np.ndarray   # in joint jid1's frame (the mocap body's frame if mocap1 >= 0)
    anchor2: np.ndarray   # in joint jid2's frame (the mocap body's frame if mocap2 >= 0)
    mocap1: int = -1      # side 1 on mocap body mocap1 (its pose set by the user), else -1
    mocap2: int = -1


@dataclass
class Weld:
    name: str
    body1: str
    body2: str
    jid1: int
    jid2: int
    T1: pin.SE3           # body 1 frame in joint jid1's frame (the mocap body's if mocap1 >= 0)
    T2: pin.SE3           # body 2 frame in joint jid2's frame (the mocap body's if mocap2 >= 0)
    rel: pin.SE3          # target pose of body 2 in body 1's frame
    anchor: np.ndarray    # the weld point, in body 2's frame
    mocap1: int = -1      # side 1 on mocap body mocap1 (its pose set by the user), else -1
    mocap2: int = -1


@dataclass
class JointCoupling:
    name: str
    joint1: str
    joint2: str | None
    q1: int               # idx_q / idx_v of joint 1 (and 2, -1 without joint 2)
    v1: int
    q2: int
    v2: int
    ref1: float
    ref2: float
    poly: np.ndarray      # (5,) MuJoCo's polycoef


@dataclass
class BallLimit:
    joint: str
    idx_q: int            # quaternion x y z w at idx_q:idx_q + 4
    idx_v: int
    angle: float          # the largest rotation angle (rad)


@dataclass
class FixedTendon:
    name: str
    dofs: np.ndarray      # (n,) idx_v of the joints
    qidx: np.ndarray      # (n,) idx_q
    coef: np.ndarray      # (n,)
    range: tuple[float, float] | None = None
    stiffness: float = 0.0
    spring: tuple[float, float] = (0.0, 0.0)     # rest length (dead band lo, hi)
    damping: float = 0.0


@dataclass
class ConstraintSpec:
    """The issue-15 elements of a model (``SimModel.constraint_spec``)."""

    connects: list[Connect] = field(default_factory=list)
    welds: list[Weld] = field(default_factory=list)
    couplings: list[JointCoupling] = field(default_factory=list)
    frictionloss: dict[int, float] = field(default_factory=dict)    # idx_v -> force (N or N m)
    ball_limits: list[BallLimit] = field(default_factory=list)
    tendons: list[FixedTendon] = field(default_factory=list)

    def has_rows(self) -> bool:
        return bool(self.connects or self.welds or self.couplings or self.frictionloss
                    or self.ball_limits or any(t.range is not None for t in self.tendons))

    def has_passive(self) -> bool:
        return any(t.stiffness or t.damping for t in self.tendons)

    def empty(self) -> bool:
        return not (self.has_rows() or self.has_passive())


def _skew(p):
    return np.array([[0.0, -p[2], p[1]], [p[2], 0.0, -p[0]], [-p[1], p[0], 0.0]])


@dataclass
class RowSet:
    """The new rows of one step (after the contact and joint-limit rows)."""

    J: np.ndarray          # (mx, nv)
    b: np.ndarray          # (mx,)
    kind: np.ndarray       # (mx,) KIND_*
    bound: np.ndarray      # (mx,) friction rows: the impulse bound f dt; else 0
    ids: list              # (mx,) a stable identity per row (warm start)
    labels: list           # (mx,) e.g. "connect c1 [x]", "frictionloss hinge", "ball b (limit)"
    select: tuple          # which unilateral rows were within reach (for re-evaluation)
    phi: np.ndarray | None = None    # (mx,) position error (equality) or distance (limits)

    @property
    def m(self) -> int:
        return int(self.J.shape[0])


class _LaterStages:
    """A solver whose ``solve`` runs ``solver``'s stages from stage 2 on (stage 1 failed,
    compiled): the reduced problem of a round of ``ExtraRows._solve_compiled``."""

    def __init__(self, solver):
        self.solver = solver
        self.settings = solver.settings
        self.method = None

    def solve(self, G, g, nc, mu, lam0=None, modes0=None):
        return self.solver._solve(G, g, nc, mu, lam0, modes0, stage1=False)


class _JointKin:
    """The kinematics of single joints for the connect and weld rows, computed on the per-tree
    groups of :mod:`diffgym.sim.trees` (each group's own small Model and Data; a whole-model
    Data is cubic in nv), or on one Data of the model where it is a single group. Global joint
    ids in, (., nv) Jacobians in the global velocity layout out."""

    def __init__(self, model: pin.Model, joints):
        from .trees import TreeGroups
        self.model, self.nv = model, model.nv
        tg = TreeGroups(model)
        if tg.single:
            # (j0 = 1: local joint ids are the global ones; v0 = 0)
            self._groups = [(1, 0, model, model.createData())] if joints else []
            self._of = {j: 0 for j in joints}
        else:
            starts = np.array([g.j0 for g in tg.groups])
            used = sorted({int(np.searchsorted(starts, j, side="right")) - 1 for j in joints})
            self._groups = [(tg.groups[i].j0, tg.groups[i].v0, tg.groups[i].model,
                             tg.groups[i].data) for i in used]
            pos = {gi: k for k, gi in enumerate(used)}
            self._of = {j: pos[int(np.searchsorted(starts, j, side="right")) - 1] for j in joints}
        self._qr = []
        for j0, v0, m, _ in self._groups:
            jm = self.model.joints[j0]
            self._qr.append((jm.idx_q, jm.idx_q + m.nq, v0, v0 + m.nv))

    def update(self, q, v=None):
        """Placements and joint Jacobians at q (``v`` given: also the velocities and the
        velocity derivatives at (q, v), zero acceleration)."""
        for (j0, v0, m, d), (qa, qb, va, vb) in zip(self._groups, self._qr):
            if v is None:
                pin.forwardKinematics(m, d, q[qa:qb])
            else:
                pin.computeForwardKinematicsDerivatives(m, d, q[qa:qb], v[va:vb], np.zeros(m.nv))
            pin.computeJointJacobians(m, d, q[qa:qb])

    def _at(self, j):
        j0, v0, m, d = self._groups[self._of[j]]
        return j - j0 + 1, v0, m, d

    def _cols(self, A, v0):
        out = np.zeros((A.shape[0], self.nv))
        out[:, v0:v0 + A.shape[1]] = A
        return out

    def oMi(self, j) -> pin.SE3:
        jl, _, _, d = self._at(j)
        return d.oMi[jl]

    def jacobian(self, j, frame) -> np.ndarray:
        jl, v0, m, d = self._at(j)
        return self._cols(np.reshape(pin.getJointJacobian(m, d, jl, frame), (6, -1)), v0)

    def velocity_derivative(self, j, frame) -> np.ndarray:
        jl, v0, m, d = self._at(j)
        return self._cols(np.reshape(pin.getJointVelocityDerivatives(m, d, jl, frame)[0],
                                     (6, -1)), v0)

    def velocity(self, j) -> pin.Motion:
        jl, _, _, d = self._at(j)
        return d.v[jl]


class ExtraRows:
    """Builds, solves and differentiates the rows of a :class:`ConstraintSpec`."""

    def __init__(self, sm, spec: ConstraintSpec, erp: float, skin: float, margin: float):
        self.sm = sm
        self.spec = spec
        self.model = sm.model
        self.nv = self.model.nv
        # the joints of the connect and weld rows: their kinematics on the per-tree groups
        jids = {j for c in spec.connects for j in (c.jid1, c.jid2)}
        jids |= {j for w in spec.welds for j in (w.jid1, w.jid2)}
        self._kin = _JointKin(self.model, sorted(j for j in jids if j))
        self.erp, self.skin, self.margin = float(erp), float(skin), float(margin)
        # the mocap bodies' state (diffgym.sim.mocap.MocapState, set by the Simulator) when a
        # connect or weld has a side on a mocap body
        self.mocap = None
        self.has_mocap = any(max(c.mocap1, c.mocap2) >= 0 for c in spec.connects) or \
            any(max(w.mocap1, w.mocap2) >= 0 for w in spec.welds)
        self._warm: dict = {}
        # a name per velocity (labels of the friction rows): the joint, [k] for multi-dof joints
        self.dof_names = []
        for j in range(1, self.model.njoints):
            jm = self.model.joints[j]
            self.dof_names += [self.model.names[j] + (f"[{k}]" if jm.nv > 1 else "")
                               for k in range(jm.nv)]
        # tendon passive forces: constant matrices
        nv = self.nv
        self.passive = spec.has_passive()
        self.Kd = np.zeros((nv, nv))
        for t in spec.tendons:
            if t.damping:
                c = np.zeros(nv)
                np.add.at(c, t.dofs, t.coef)
                self.Kd -= t.damping * np.outer(c, c)
        self._tcoef = []
        for t in spec.tendons:
            c = np.zeros(nv)
            np.add.at(c, t.dofs, t.coef)
            self._tcoef.append(c)

    # -- passive forces of the tendons ---------------------------------------------------
    def tendon_length(self, k: int, q: np.ndarray) -> float:
        t = self.spec.tendons[k]
        return float(np.dot(t.coef, q[t.qidx]))

    def passive_forces(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        f = self.Kd @ v
        for k, t in enumerate(self.spec.tendons):
            if t.stiffness:
                L = self.tendon_length(k, q)
                lo, hi = t.spring
                s = L - hi if L > hi else (L - lo if L < lo else 0.0)
                f -= t.stiffness * s * self._tcoef[k]
        return f

    def passive_jacobians(self, q: np.ndarray):
        """(d f/dq, d f/dv) of passive_forces (q in tangent coordinates: tendons act on scalar
        joints, whose tangent and configuration coordinates agree)."""
        Kq = np.zeros((self.nv, self.nv))
        for k, t in enumerate(self.spec.tendons):
            if t.stiffness:
                L = self.tendon_length(k, q)
                lo, hi = t.spring
                if L > hi or L < lo or lo == hi:     # (no dead band: always the spring)
                    Kq -= t.stiffness * np.outer(self._tcoef[k], self._tcoef[k])
        return Kq, self.Kd

    # -- the rows ------------------------------------------------------------------------
    def _kinematics(self, q):
        self._kin.update(q)
        return self._kin

    def _mocap_pose(self, i):
        """(R, pos) of mocap body i as the user set it."""
        mz = self.mocap
        if mz is None:                                            # pragma: no cover
            raise RuntimeError("an equality names a mocap body but the rows have no mocap state")
        return mz.R[i], mz.pos[i]

    def _frame(self, kin, jid, mocap, T):
        """World pose of a frame T fixed to joint jid (or to mocap body ``mocap`` >= 0)."""
        if mocap >= 0:
            R, p = self._mocap_pose(mocap)
            return pin.SE3(R.copy(), p.copy()) * T
        return kin.oMi(jid) * T if jid else T

    def _point(self, kin, jid, p_local, mocap=-1):
        """World position of a point fixed to joint jid (or to mocap body ``mocap`` >= 0: no
        dof, a zero Jacobian) and its (3, nv) world Jacobian."""
        if mocap >= 0:
            R, p = self._mocap_pose(mocap)
            return R @ p_local + p, np.zeros((3, self.nv))
        if jid == 0:
            return p_local.copy(), np.zeros((3, self.nv))
        M = kin.oMi(jid)
        p = M.rotation @ p_local + M.translation
        J6 = kin.jacobian(jid, pin.WORLD)
        return p, J6[:3] - _skew(p) @ J6[3:]

    def _rot(self, kin, jid, mocap=-1):
        if mocap >= 0:
            return self._mocap_pose(mocap)[0].copy(), np.zeros((3, self.nv))
        if jid == 0:
            return np.eye(3), np.zeros((3, self.nv))
        J6 = kin.jacobian(jid, pin.WORLD)
        return kin.oMi(jid).rotation.copy(), J6[3:].copy()

    def _eval(self, q, v, dt, select=None):
        """(J, phi-or-dist, kind, bound, ids, labels, select) of the rows at q. ``select``:
        the unilateral rows to keep (None: those within reach at (q, v))."""
        spec, nv = self.spec, self.nv
        Js, ph, kinds, bounds, ids, labels = [], [], [], [], [], []
        wb = []        # the mocap sides' velocity in the rows' offsets (0 elsewhere)
        need_kin = bool(spec.connects or spec.welds)
        data = self._kinematics(q) if need_kin else None
        for i, c in enumerate(spec.connects):
            p1, J1 = self._point(data, c.jid1, c.anchor1, c.mocap1)
            p2, J2 = self._point(data, c.jid2, c.anchor2, c.mocap2)
            Js.append(J2 - J1)
            ph.extend((p2 - p1).tolist())
            wb.extend((self._mocap_point_velocity(c.mocap2, p2)
                       - self._mocap_point_velocity(c.mocap1, p1)).tolist())
            kinds += [KIND_EQ] * 3
            bounds += [0.0] * 3
            ids += [("connect", i, a) for a in range(3)]
            labels += [f"connect {c.name} [{a}]" for a in "xyz"]
        for i, w in enumerate(spec.welds):
            M1 = self._frame(data, w.jid1, w.mocap1, w.T1)
            M2 = self._frame(data, w.jid2, w.mocap2, w.T2)
            a2 = w.T2.rotation @ w.anchor + w.T2.translation         # in joint 2's frame
            a1 = w.T1.act(w.rel.act(w.anchor))                       # target, joint 1's frame
            p1, J1 = self._point(data, w.jid1, a1, w.mocap1)
            p2, J2 = self._point(data, w.jid2, a2, w.mocap2)
            R1, W1 = self._rot(data, w.jid1, w.mocap1)
            R2, W2 = self._rot(data, w.jid2, w.mocap2)
            err = pin.log3(M2.rotation @ (M1.rotation @ w.rel.rotation).T)
            Js += [J2 - J1, W2 - W1]
            ph.extend((p2 - p1).tolist() + err.tolist())
            wb.extend((self._mocap_point_velocity(w.mocap2, p2)
                       - self._mocap_point_velocity(w.mocap1, p1)).tolist()
                      + (self._mocap_angular_velocity(w.mocap2)
                         - self._mocap_angular_velocity(w.mocap1)).tolist())
            kinds += [KIND_EQ] * 6
            bounds += [0.0] * 6
            ids += [("weld", i, a) for a in range(6)]
            labels += [f"weld {w.name} [{a}]" for a in ("x", "y", "z", "rx", "ry", "rz")]
        for i, c in enumerate(spec.couplings):
            row = np.zeros(nv)
            row[c.v1] = 1.0
            x = q[c.q2] - c.ref2 if c.q2 >= 0 else 0.0
            P = c.poly
            val = P[0] + P[1] * x + P[2] * x ** 2 + P[3] * x ** 3 + P[4] * x ** 4
            if c.v2 >= 0:
                row[c.v2] -= P[1] + 2 * P[2] * x + 3 * P[3] * x ** 2 + 4 * P[4] * x ** 3
            Js.append(row[None])
            ph.append(q[c.q1] - c.ref1 - val)
            kinds.append(KIND_EQ)
            bounds.append(0.0)
            ids.append(("joint", i, 0))
            labels.append(f"joint {c.name}")
        for d, f in sorted(spec.frictionloss.items()):
            row = np.zeros(nv)
            row[d] = 1.0
            Js.append(row[None])
            ph.append(0.0)
            kinds.append(KIND_FRICTION)
            bounds.append(f * dt)
            ids.append(("frictionloss", d, 0))
            labels.append(f"frictionloss {self.dof_names[d]}")
        cand = []          # unilateral rows: (row, dist, id, label)
        for i, bl in enumerate(spec.ball_limits):
            quat = pin.Quaternion(q[bl.idx_q + 3], *q[bl.idx_q:bl.idx_q + 3])
            r = pin.log3(quat.toRotationMatrix())
            th = float(np.linalg.norm(r))
            row = np.zeros(nv)
            if th > 1e-12:
                row[bl.idx_v:bl.idx_v + 3] = -r / th
            cand.append((row, bl.angle - th, ("ball", i, 0), f"ball {bl.joint} (limit)"))
        for i, t in enumerate(spec.tendons):
            if t.range is None:
                continue
            c = self._tcoef[i]
            L = float(np.dot(t.coef, q[t.qidx]))
            cand.append((c.copy(), L - t.range[0], ("tendon", i, 0), f"tendon {t.name} (lower)"))
            cand.append((-c, t.range[1] - L, ("tendon", i, 1), f"tendon {t.name} (upper)"))
        if select is None:
            select = tuple(k for k, (row, dist, _, _) in enumerate(cand)
                           if dist < self.margin + dt * abs(float(row @ v)))
        for k in select:
            row, dist, rid, lab = cand[k]
            Js.append(row[None])
            ph.append(dist)
            kinds.append(KIND_LIMIT)
            bounds.append(0.0)
            ids.append(rid)
            labels.append(lab)
        J = np.vstack(Js) if Js else np.zeros((0, nv))
        wbv = np.zeros(len(ph))
        wbv[:len(wb)] = wb
        return (J, np.array(ph, dtype=float), np.array(kinds, dtype=np.int64),
                np.array(bounds, dtype=float), ids, labels, select, wbv)

    def _mocap_point_velocity(self, i, p):
        """World velocity of the point p fixed to mocap body i (zero for i < 0): ``vel +
        angvel x (p - pos)``, the ``vel``/``angvel`` of ``Simulator.set_mocap``."""
        if i < 0:
            return np.zeros(3)
        mz = self.mocap
        return mz.lin[i] + np.cross(mz.ang[i], p - mz.pos[i])

    def _mocap_angular_velocity(self, i):
        return np.zeros(3) if i < 0 else self.mocap.ang[i].copy()

    def _offsets(self, phi, kind, dt):
        erp, skin = self.erp, self.skin
        b = np.where(kind == KIND_EQ, erp * phi / dt, 0.0)
        lim = kind == KIND_LIMIT
        if lim.any():
            d = phi[lim]
            b[lim] = np.where(d > skin, (d - skin) / dt + erp * skin / dt, erp * d / dt)
        return b

    def rows(self, q, v, dt) -> RowSet:
        spec = self.spec
        if not (spec.connects or spec.welds or spec.couplings or spec.ball_limits
                or any(t.range is not None for t in spec.tendons)):
            # dry friction only: rows independent of (q, v), built once per dt (read-only)
            c = self.__dict__.get("_const_rows")
            if c is None or c[0] != dt:
                J, phi, kind, bound, ids, labels, select, _ = self._eval(q, v, dt)
                b = self._offsets(phi, kind, dt)
                for x in (J, phi, kind, bound, b):
                    x.flags.writeable = False
                c = self._const_rows = (dt, (J, b, kind, bound, ids, labels, select, phi))
            return RowSet(*c[1])
        J, phi, kind, bound, ids, labels, select, wb = self._eval(q, v, dt)
        # (wb: a mocap side's velocity, which the other side must match, sigma = J v1 + b)
        return RowSet(J, self._offsets(phi, kind, dt) + wb, kind, bound, ids, labels, select,
                      phi)

    def spatial_rows(self, rs: RowSet) -> np.ndarray:
        """(mx,) bool: the rows whose impulses act as forces on bodies (connect, weld), which
        the step derivatives take as external forces fixed in the joint frames (as contact
        impulses); the other rows' impulses act as joint torques ``J^T lam``."""
        return np.array([rid[0] in ("connect", "weld") for rid in rs.ids], dtype=bool)

    def kinematic_derivatives(self, q, v1, lam_x, rs: RowSet, dt, fext=None):
        """Closed form of the rows' kinematic terms: ``Dq = d(J(q) v1 + b(q))/dq`` at fixed
        v1 (mx, nv) and ``corr`` (nv, nv): for the joint-torque rows ``d(J(q)^T lam)/dq`` at fixed
        lam, for the spatial rows (connect, weld) its part that the external forces fixed in the
        joint frames (added to ``fext``, a list of pin.Force per joint, as impulse / dt) do not
        carry: the world-fixed direction of the force turning relative to the body.

        A point ``a`` fixed to joint j (frame rotation R, local velocity (vl, wl), local
        Jacobian (Jl_lin, Jl_ang)): its world velocity is ``R u``, ``u = vl + wl x a``, with
        ``d(R u)/dq = R (-[u]x Jl_ang + dvl/dq - [a]x dwl/dq)`` (pinocchio's
        getJointVelocityDerivatives in the LOCAL frame); a world force ``f`` applied there is
        the local wrench ``(f_l, a x f_l)``, ``f_l = R^T f``, ``d f_l/dq = [f_l]x Jl_ang``."""
        model = self.model
        nv, mx = self.nv, rs.m
        Dq = np.zeros((mx, nv))
        corr = np.zeros((nv, nv))
        spec = self.spec
        erp, skin = self.erp, self.skin
        kind, phi = rs.kind, rs.phi
        # Baumgarte part of the equality rows: b = erp phi / dt, d phi/dq = J (connect, weld
        # translation, joint coupling); the weld's rotation rows are corrected below
        eq = kind == KIND_EQ
        Dq[eq] = (erp / dt) * rs.J[eq]
        row = 0
        if spec.connects or spec.welds:
            data = self._kin
            data.update(q, v1)
            cache = {}

            def joint(j):
                if j not in cache:
                    Jl = data.jacobian(j, pin.LOCAL)
                    dV = data.velocity_derivative(j, pin.LOCAL)
                    vel = data.velocity(j)
                    cache[j] = (data.oMi(j).rotation.copy(), Jl, dV, vel.linear.copy(),
                                vel.angular.copy())
                return cache[j]

            def point_terms(j, a, f_world):
                """(d v_p/dq (3, nv), corr contribution (nv, nv)) of point a on joint j
                carrying world impulse f_world; adds the body-fixed part to fext."""
                if j == 0:
                    return np.zeros((3, nv)), 0.0
                R, Jl, dV, vl, wl = joint(j)
                Ja = Jl[3:]
                u = vl + np.cross(wl, a)
                dvp = R @ (-_skew(u) @ Ja + dV[:3] - _skew(a) @ dV[3:])
                fl = R.T @ f_world
                if fext is not None:
                    fext[j] = fext[j] + pin.Force(fl / dt, np.cross(a, fl) / dt)
                dfl = _skew(fl) @ Ja
                c = Jl[:3].T @ dfl + Jl[3:].T @ (_skew(a) @ dfl)
                return dvp, c

            def rot_terms(j, t_world):
                if j == 0:
                    return np.zeros((3, nv)), np.zeros((3, nv)), 0.0
                R, Jl, dV, vl, wl = joint(j)
                Ja = Jl[3:]
                dw = R @ (-_skew(wl) @ Ja + dV[3:])
                tl = R.T @ t_world
                if fext is not None:
                    fext[j] = fext[j] + pin.Force(np.zeros(3), tl / dt)
                return dw, R @ Ja, Jl[3:].T @ (_skew(tl) @ Ja)

            for c in spec.connects:
                lam = lam_x[row:row + 3]
                d2, c2 = point_terms(c.jid2, c.anchor2, lam)
                d1, c1 = point_terms(c.jid1, c.anchor1, -lam)
                Dq[row:row + 3] += d2 - d1
                corr += c2 + c1
                row += 3
            for w in spec.welds:
                lam = lam_x[row:row + 3]
                a2 = w.T2.rotation @ w.anchor + w.T2.translation
                a1 = w.T1.act(w.rel.act(w.anchor))
                d2, c2 = point_terms(w.jid2, a2, lam)
                d1, c1 = point_terms(w.jid1, a1, -lam)
                Dq[row:row + 3] += d2 - d1
                corr += c2 + c1
                tq = lam_x[row + 3:row + 6]
                dw2, W2, c2 = rot_terms(w.jid2, tq)
                dw1, W1, c1 = rot_terms(w.jid1, -tq)
                corr += c2 + c1
                # the rotation error e = log3(E), E = R2 (R1 R_rel)^T: de = Jlog3(E) E^T (W2 - E W1)
                M1 = self._frame(data, w.jid1, w.mocap1, w.T1)
                M2 = self._frame(data, w.jid2, w.mocap2, w.T2)
                E = M2.rotation @ (M1.rotation @ w.rel.rotation).T
                W1 = W1 if w.jid1 else np.zeros((3, nv))
                W2 = W2 if w.jid2 else np.zeros((3, nv))
                Dq[row + 3:row + 6] = dw2 - dw1 + (erp / dt) * (pin.Jlog3(E) @ E.T @ (W2 - E @ W1))
                row += 6
        for c in spec.couplings:
            if c.v2 >= 0:
                x = q[c.q2] - c.ref2
                P = c.poly
                ddP = 2 * P[2] + 6 * P[3] * x + 12 * P[4] * x ** 2
                Dq[row, c.v2] -= ddP * v1[c.v2]
                corr[c.v2, c.v2] -= ddP * lam_x[row]
            row += 1
        row += len(spec.frictionloss)
        # unilateral rows (ball joints, tendons): the offset's gain times d dist/dq, plus the
        # ball row's turning axis
        lim = np.flatnonzero(kind == KIND_LIMIT)
        for i in lim.tolist():
            d = phi[i]
            gain = 1.0 / dt if d > skin else erp / dt
            rid = rs.ids[i]
            if rid[0] == "tendon":
                Dq[i] = gain * rs.J[i]
                continue
            bl = spec.ball_limits[rid[1]]
            sl = slice(bl.idx_v, bl.idx_v + 3)
            Rb = pin.Quaternion(q[bl.idx_q + 3], *q[bl.idx_q:bl.idx_q + 3]).toRotationMatrix()
            r = pin.log3(Rb)
            th = float(np.linalg.norm(r))
            if th < 1e-12:
                continue
            ax = r / th
            Jl = pin.Jlog3(Rb)
            dax = (np.eye(3) - np.outer(ax, ax)) @ Jl / th        # d axis / d(local rotation)
            Dq[i, sl] = -v1[sl] @ dax - gain * (ax @ Jl)
            corr[sl, sl] -= lam_x[i] * dax
        return Dq, corr

    def mocap_derivatives(self, q, rs: RowSet, dt, mz=None) -> np.ndarray:
        """``d b / d m`` (mx, 12 nm): the offsets of the rows with respect to the mocap bodies'
        parameters, 12 columns per body in file order: position (3), rotation (3, a world
        rotation vector: ``R <- exp(d theta) R``), ``vel`` (3), ``angvel`` (3). Only the connect
        and weld rows with a mocap side depend on them (their Jacobians do not: the other side
        is fixed to its own body), through the position error ``phi`` (``b = erp phi / dt``) and
        the mocap side's velocity: for a point ``p = pos + R a`` of mocap body i, ``dp = dpos -
        [p - pos]x dtheta``, ``w(p) = vel + angvel x (p - pos)``, ``dw = [angvel]x (-[p -
        pos]x dtheta) + dvel - [p - pos]x dangvel``; the weld's rotation error ``log3(E)``, ``E
        = R2 (R1 R_rel)^T``: ``Jlog3(E) E^T dtheta2`` (side 2), ``-Jlog3(E) dtheta1`` (side 1)."""
        mz = self.mocap if mz is None else mz       # (a step's copy: diffgym.sim.mocap)
        nm = 0 if mz is None else len(mz.names)
        D = np.zeros((rs.m, 12 * nm))
        if not self.has_mocap or not nm:
            return D
        g = self.erp / dt
        keep = self.mocap
        self.mocap = mz                             # (_point, _frame read the poses from it)
        try:
            return self._mocap_derivatives(q, rs, D, g, mz)
        finally:
            self.mocap = keep

    def _mocap_derivatives(self, q, rs, D, g, mz):

        def point(row, i, p, sgn):
            if i < 0:
                return
            r = p - mz.pos[i]
            Sr = _skew(r)
            c = 12 * i
            D[row:row + 3, c:c + 3] += sgn * g * np.eye(3)
            D[row:row + 3, c + 3:c + 6] += sgn * (-g * Sr - _skew(mz.ang[i]) @ Sr)
            D[row:row + 3, c + 6:c + 9] += sgn * np.eye(3)
            D[row:row + 3, c + 9:c + 12] += sgn * (-Sr)

        kin = self._kinematics(q)
        row = 0
        for c in self.spec.connects:
            if max(c.mocap1, c.mocap2) >= 0:
                p1, _ = self._point(kin, c.jid1, c.anchor1, c.mocap1)
                p2, _ = self._point(kin, c.jid2, c.anchor2, c.mocap2)
                point(row, c.mocap1, p1, -1.0)
                point(row, c.mocap2, p2, 1.0)
            row += 3
        for w in self.spec.welds:
            if max(w.mocap1, w.mocap2) >= 0:
                a2 = w.T2.rotation @ w.anchor + w.T2.translation
                a1 = w.T1.act(w.rel.act(w.anchor))
                p1, _ = self._point(kin, w.jid1, a1, w.mocap1)
                p2, _ = self._point(kin, w.jid2, a2, w.mocap2)
                point(row, w.mocap1, p1, -1.0)
                point(row, w.mocap2, p2, 1.0)
                M1 = self._frame(kin, w.jid1, w.mocap1, w.T1)
                M2 = self._frame(kin, w.jid2, w.mocap2, w.T2)
                E = M2.rotation @ (M1.rotation @ w.rel.rotation).T
                Jl = pin.Jlog3(E)
                r3 = slice(row + 3, row + 6)
                if w.mocap2 >= 0:
                    c = 12 * w.mocap2
                    D[r3, c + 3:c + 6] += g * (Jl @ E.T)
                    D[r3, c + 9:c + 12] += np.eye(3)
                if w.mocap1 >= 0:
                    c = 12 * w.mocap1
                    D[r3, c + 3:c + 6] -= g * Jl
                    D[r3, c + 9:c + 12] -= np.eye(3)
            row += 6
        return D

    def kinematic_derivatives_fd(self, q, v1, lam_x, rs: RowSet, dt):
        """(d(J(q) v1 + b(q))/dq (mx, nv), d(J(q)^T lam_x)/dq (nv, nv)) at fixed v1, lam_x, by
        central differences of the rows' kinematics on the tangent space."""
        nv, mx = self.nv, rs.m
        Dq = np.zeros((mx, nv))
        corr = np.zeros((nv, nv))
        h = KIN_FD_EPS
        for k in range(nv):
            e = np.zeros(nv)
            e[k] = h
            out = []
            for s in (1.0, -1.0):
                qs = pin.integrate(self.model, q, s * e)
                J, phi, kind, _, _, _, _, wb = self._eval(qs, v1, dt, rs.select)
                out.append((J @ v1 + self._offsets(phi, kind, dt) + wb, J.T @ lam_x))
            Dq[:, k] = (out[0][0] - out[1][0]) / (2 * h)
            corr[:, k] = (out[0][1] - out[1][1]) / (2 * h)
        return Dq, corr

    # -- the mixed solve -----------------------------------------------------------------
    def solve(self, solver, G, g, nc, nl, mu, rs: RowSet, lam0=None, modes0=None):
        """The exact solution of the problem with the new rows after the ``3 nc + nl``
        standard ones (module docstring). Returns (lam, sigma, contact modes, active flags of
        the joint-limit rows then of the new rows (True: an equality mode), iterations,
        residual, converged, method, xmode) with ``xmode`` per new row: 0 equality, +1 fixed at
        ``-bound`` (friction sliding with sigma > 0), -1 fixed at ``+bound``, 2 inactive."""
        s0 = 3 * nc + nl
        mx = G.shape[0] - s0
        kind = rs.kind
        # warm start of the new rows' modes, and the cold modes (the rounds restart from them
        # once if the warm start cycles)
        cold = np.zeros(mx, dtype=np.int64)
        for i in range(mx):
            if kind[i] == KIND_LIMIT:
                cold[i] = 0 if g[s0 + i] < 0 else 2
        xmode = cold.copy()
        for i in range(mx):
            w = self._warm.get(rs.ids[i])
            if w is not None:
                xmode[i] = w
        # the compiled NCPSolver: the reduced NCPs' stage 1 inside the kernel (later stages,
        # rarely, here); any other solver (compiled=False, a user's subclass) gets every
        # reduced NCP through its own solve()
        delegate = not (type(solver).__name__ == "NCPSolver" and solver.settings.compiled)
        return self._solve_compiled(solver, G, g, nc, nl, mu, rs, xmode, lam0, modes0, delegate,
                                    cold)

    def _solve_compiled(self, solver, G, g, nc, nl, mu, rs, xmode, lam0, modes0, delegate=False,
                        cold=None):
        """``solve`` by its one implementation, diffgym.sim.equality_kernels.mixed_solve. A round
        whose reduced stage 1 fails has its reduced problem solved here from stage 2 on, and the
        kernel resumes with that result; ``delegate``: every round's reduced problem is solved
        here by ``solver.solve``."""
        from .equality_kernels import mixed_prox, mixed_residual, mixed_soft, mixed_solve
        st = solver.settings
        f64 = np.float64
        G = np.ascontiguousarray(G, dtype=f64)
        g = np.ascontiguousarray(g, dtype=f64)
        nc, nl = int(nc), int(nl)
        mu = np.ascontiguousarray(mu, dtype=f64).reshape(nc)
        kind = np.ascontiguousarray(rs.kind, dtype=np.int64)
        bound = np.ascontiguousarray(rs.bound, dtype=f64)
        lam0 = np.zeros(0) if lam0 is None else np.ascontiguousarray(lam0, dtype=f64)
        has = modes0 is not None
        modes0 = np.zeros(0, dtype=np.int64) if modes0 is None else np.ascontiguousarray(modes0, dtype=np.int64)
        mx = G.shape[0] - 3 * nc - nl
        state = (0, 0, np.zeros((61, mx), dtype=np.int64), 0)
        cold = xmode.copy() if cold is None else np.ascontiguousarray(cold, dtype=np.int64)
        xmode = np.ascontiguousarray(xmode, dtype=np.int64)
        restarted = False
        inj = (False, np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), 0, 0.0,
               False, True)
        later = solver if delegate else _LaterStages(solver)
        xmode_in, modes_in, has_in = xmode, modes0, has
        knobs = (float(st.tol), float(st.mode_tol), int(st.newton_iter), int(st.mode_rounds),
                 int(st.newton_budget))
        prox_its = -1                # (-1: the proximal-point solve has not run)
        for _ in range(62):          # (at most one call per round, 60 rounds, and the first)
            out = mixed_solve(G, g, nc, nl, mu, kind, bound, xmode, lam0, modes0, has, *knobs,
                              *state, *inj, bool(delegate), cold, restarted)
            ok, lam, sigma, modes, lact, xmode, its, resid, conv, elim, stt = out
            if ok and (conv or delegate or prox_its >= 0):
                break
            if not delegate and prox_its < 0:
                # a round's reduced stage 1 failed, or the rounds ended unconverged: the
                # proximal-point solve of the whole problem (its compiled rounds only), and the
                # later stages (Python) only where it fails (equality_kernels.mixed_prox)
                px = mixed_prox(G, g, nc, nl, mu, kind, bound, xmode_in, modes_in, has_in, *knobs,
                                cold)
                prox_its = int(px[6])
                if px[0]:
                    _, lam, sigma, modes, lact, xmode, its, resid = px
                    return self._result(rs, lam, sigma, modes, lact, xmode,
                                        int(its) + int(out[6]), resid, True, "mixedprox")
                if ok:
                    break
            rnd, its0, seen, nseen, Gs, gs, lam0, modes0, has, restarted = stt
            r = self._solve_reduced(later, Gs, gs, np.diagonal(G)[:3 * nc + nl].copy(), nc, nl,
                                    mu, lam0 if len(lam0) else None, modes0 if has else None)
            state = (rnd, its0, seen, nseen)
            inj = (True, np.ascontiguousarray(r.lam, dtype=f64),
                   np.ascontiguousarray(r.modes, dtype=np.int64),
                   np.ascontiguousarray(r.limit_active, dtype=bool), int(r.iterations),
                   float(r.residual), r.method == "elimination", bool(r.converged))
            method_r = r.method
        else:                                                    # pragma: no cover
            raise RuntimeError("equality_kernels.mixed_solve did not finish its rounds")
        if prox_its > 0:
            its = int(its) + prox_its
        if not delegate and not conv:
            # no stage solved it (a problem without a solution, e.g. rigid rows and Coulomb
            # friction in a Painleve-type inconsistency): the slightly compliant problem's
            # solution (equality_kernels.mixed_soft), reported unconverged
            sf = mixed_soft(G, g, nc, nl, mu, kind, bound, xmode_in, modes_in, has_in, *knobs,
                            cold)
            its = int(its) + int(sf[5])
            if sf[0]:
                lam, modes, lact, xmode = sf[1], sf[2], sf[3], sf[4]
                resid, sigma = mixed_residual(G, g, nc, nl, mu, kind, bound, lam)
                return self._result(rs, lam, sigma, modes, lact, xmode, its, resid, False,
                                    "soft")
        if elim:
            method = "elimination"
        elif inj[0] and stt[0] == state[0]:       # (the last round's reduced solve: here)
            method = method_r
        else:
            method = "newton"
        return self._result(rs, lam, sigma, modes, lact, xmode, its, resid, conv, method)

    def _result(self, rs, lam, sigma, modes, lact, xmode, its, resid, conv, method):
        """``_solve_compiled``'s answer; the rows' modes kept to warm-start the next step."""
        self._warm = {rs.ids[i]: int(x) for i, x in enumerate(xmode.tolist())}
        return (lam, sigma, modes, np.concatenate([lact, xmode == 0]), int(its), float(resid),
                bool(conv), method, xmode)

    @staticmethod
    def _solve_reduced(solver, Gs, gs, d0, nc, nl, mu, lam0, modes0):
        """The contact / joint-limit NCP left after the equalities are eliminated. A contact
        (all 3 rows) or limit whose impulse no longer moves anything (its diagonal of the Schur
        complement ``Gs`` below 1e-12 of its diagonal ``d0`` in ``G``: e.g. a body welded to the
        world resting on the ground) is left out, breaking / inactive with zero impulse: its
        velocity is set by the equalities alone."""
        from .solver import SolverResult
        ds = np.diagonal(Gs)
        dead = ds <= 1e-12 * np.maximum(d0, 1e-300)
        kc = ~dead[:3 * nc].reshape(nc, 3).all(axis=1) if nc else np.zeros(0, dtype=bool)
        kl = ~dead[3 * nc:]
        if kc.all() and kl.all():
            return solver.solve(np.ascontiguousarray(Gs), np.ascontiguousarray(gs), nc,
                                np.ascontiguousarray(mu, dtype=float), lam0, modes0)
        rows = np.concatenate([(3 * np.flatnonzero(kc)[:, None] + np.arange(3)).ravel(),
                               3 * nc + np.flatnonzero(kl)]).astype(np.int64)
        ncs = int(kc.sum())
        m = 3 * nc + nl
        lam = np.zeros(m)
        sigma = gs.copy()
        modes = np.zeros(nc, dtype=np.int64)
        act = np.zeros(nl, dtype=bool)
        if not len(rows):
            return SolverResult(lam, sigma, modes, act, 0, 0.0, True, "elimination")
        sub0 = None if lam0 is None else np.ascontiguousarray(lam0[rows])
        subm = None if modes0 is None else np.ascontiguousarray(np.concatenate(
            [modes0[:nc][kc], modes0[nc:][kl]]) if len(modes0) > nc else modes0[:nc][kc])
        r = solver.solve(np.ascontiguousarray(Gs[np.ix_(rows, rows)]),
                         np.ascontiguousarray(gs[rows]), ncs,
                         np.ascontiguousarray(np.asarray(mu, dtype=float)[kc]), sub0, subm)
        lam[rows] = r.lam
        sigma = Gs @ lam + gs
        modes[kc] = r.modes
        act[kl] = r.limit_active
        return SolverResult(lam, sigma, modes, act, r.iterations, r.residual, r.converged,
                            r.method)

    def reset_warm(self):
        self._warm = {}
