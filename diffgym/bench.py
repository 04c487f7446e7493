"""``diffgym bench``: forward-step and step-Jacobian times of diffgym next to MuJoCo (``mj_step``,
``mjd_transitionFD``) on the same file.

Both engines load the same model file and start from the same state; the step loops run side by
side in one process. Per model and engine: ``--warmup`` steps (not timed), then ``--steps`` timed
steps; this is repeated ``--repeats`` times from the initial state and the median is reported.
So both engines time the same stretch of the same trajectory regime (step ``warmup`` to
``warmup + steps`` after the same start, under the same control):

* ``cartpole`` (``assets/cartpole.xml``): pole released at 0.3 rad, zero force;
* ``hopper`` (Gymnasium's ``hopper.xml``): default pose, zero control: it drops on its foot and
  topples, so the timed steps are contact steps;
* ``go1`` (example-robot-data's URDF): the SRDF ``standing`` pose with the feet 2 mm above the
  ground, joints held by a PD on that pose (``tau = 100 (q_ref - q) - 2 qdot``, no torque limit).
  In MuJoCo the same PD is the model's own actuators (gain 100, bias ``-100 q - 2 qdot``, ctrl
  ``q_ref``), so no Python runs between its steps; diffgym computes it in the loop (~3 us).
  Two rows: ``go1`` with the URDF's 0.2 N m joint dry friction simulated in both engines
  (MuJoCo's URDF importer reads it into ``frictionloss``) and ``go1-nofric`` with it left out in
  both (diffgym ignores ``joint.frictionloss``, MuJoCo's ``dof_frictionloss`` zeroed);
* ``billiards`` (``assets/billiards.xml``): the cue ball sent at 2 m/s into the rack at rest;
* ``ur5`` (example-robot-data's UR5 URDF, fixed base, 6 joints): released 0.2-0.3 rad away from
  ``UR5_POSE`` and pulled back by a PD (gain 100, damping 2) on top of exact gravity
  compensation (pinocchio's ``g(q)``; in MuJoCo ``gravcomp = 1`` on every body and the PD as
  actuators); it swings in free space (no contacts).

``--smooth`` instead measures the smooth gradient mode against the exact one
(``diffgym.bench_smooth``).

**Torch-bridge overhead** (``--bridge-overhead``, on by default in a ``diffgym bench`` without
``--models``; ``--no-bridge-overhead`` skips it; ``--bridge`` prints only this): bridge time / raw numpy chain
of the step Jacobians for a 100-step DiffHopper-v0 rollout gradient at N = 1 and 64, the two
alternating block by block (:func:`run_bridge`); target <= 1.3.

**Step Jacobians** (``--jacobian``, on by default; ``--no-jacobian`` skips it): a second table
for ``cartpole``, ``hopper``, ``go1`` and ``ur5``. After ``--jac-warmup`` steps (200: the
hopper has landed) the same ``--jac-states`` consecutive steps are timed without and with
``jacobian=True``; central differences of our own step (``2 (2 nv + nv)`` steps, the Jacobian a
user without analytical derivatives would compute) are timed at ``--fd-states`` of those states,
and MuJoCo's ``mj_step`` and ``mjd_transitionFD`` (centered, eps 1e-6) on its own trajectory
from the same state. MuJoCo differentiates with respect to its ``nu`` actuator controls, we with
respect to all ``nv`` generalized forces; ``mjd_transitionFD`` does not support RK4, so a file
that asks for RK4 (Gymnasium's hopper) is timed with Euler in this table (said under it).
Targets printed under the table: ``jac/fwd <= 3`` and, on the hopper, our step with Jacobian
faster than MuJoCo's centered finite differences. ``--csv FILE`` also writes
``FILE_jacobian.csv`` (or ``--jacobian-csv``).

MuJoCo is a benchmark-only extra (``pip install diffgym[bench]``), imported lazily. MuJoCo
cannot read the Go1 URDF as it is (the ``base`` link's inertia matrix is singular); it is then
built through ``MjSpec`` the way diffgym reads a URDF: free-floating base, a ground plane,
robot-ground contacts only, visuals dropped, and the singular inertia replaced by a 1e-6
diagonal (the link weighs 1e-6 kg). Which route was taken is printed under the table.

The two engines do not solve the same contact problem: MuJoCo's contacts are soft and its solver
stops at its default tolerance; diffgym solves the unrelaxed NCP to ``tol`` (1e-9 m/s). Contacts
per step are diffgym's contact points (up to 4 per touching pair, including speculative ones
within the margin) and MuJoCo's ``ncon``.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .sim.forward import Simulator, SolverWarning
from .resources import asset_path
from .sim.unsupported import UnsupportedIgnoredWarning

MODELS = {
    "cartpole": "cartpole.xml",
    "hopper": "hopper_gymnasium.xml",
    "go1": "go1.urdf",
    "billiards": "billiards.xml",
    "ur5": "ur5.urdf",
}
JAC_MODELS = ("cartpole", "hopper", "go1", "ur5")    # rows of the Jacobian table

GO1_KP, GO1_KD = 100.0, 2.0       # PD holding the standing pose
GO1_CLEARANCE = 0.002             # feet start this far above the ground (m)
HOPPER_TARGET = 5.0               # the goal: a hopper step within 5x of MuJoCo's
JAC_TARGET = 3.0                  # the step with Jacobian costs at most this many forward steps
FD_EPS = 1e-6                     # central-difference step (ours and MuJoCo's mjd_transitionFD)
UR5_POSE = np.array([0.0, -1.57, 1.57, -1.57, -1.57, 0.0])   # upper arm up, forearm level
UR5_OFFSET = np.array([0.3, 0.2, -0.2, 0.3, 0.2, 0.3])       # start away from it: the arm swings
UR5_KP, UR5_KD = 100.0, 2.0       # PD on UR5_POSE on top of exact gravity compensation


class NotAvailable(Exception):
    """MuJoCo cannot run this model (the message says why)."""


@dataclass
class Row:
    name: str
    nq: int = 0
    nv: int = 0
    dt: float = float("nan")
    contacts: float = float("nan")
    contacts_mj: float = float("nan")
    t_ours: float = float("nan")          # seconds per step
    t_mj: float = float("nan")
    nonconverged: int = 0                 # diffgym steps whose solver missed its tolerance
    timed_steps: int = 0
    mj_note: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.t_ours / self.t_mj if self.t_mj > 0 else float("nan")


# -- the scenarios, diffgym side -------------------------------------------------------------
@dataclass
class Scenario:
    name: str
    path: str
    sim: Simulator
    q0: np.ndarray
    v0: np.ndarray
    control: object           # (q, v) -> tau, or None for zero torque
    q_ref: np.ndarray | None = None
    kp: float = GO1_KP        # PD gains of q_ref (MuJoCo: the same PD as actuators)
    kd: float = GO1_KD
    gravcomp: bool = False    # exact gravity compensation (MuJoCo: body gravcomp = 1)
    friction: bool = True     # joint dry friction simulated (False: left out in both engines)

    @property
    def base_nq(self) -> int:
        """Configuration entries of the free-flyer base (7) or 0 for a fixed base."""
        return 7 if self.sim.model.joints[1].shortname() == "JointModelFreeFlyer" else 0


def _lowest_point(sim: Simulator, q: np.ndarray) -> float:
    """Height of the lowest point of the robot's spheres / bounding spheres at q."""
    import pinocchio as pin
    pin.framesForwardKinematics(sim.model, sim.data, q)
    pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
    low = math.inf
    for i, g in enumerate(sim.sm.geoms):
        if g.kind == "plane" or sim.geom_model.geometryObjects[i].parentJoint == 0:
            continue
        if g.kind == "sphere":
            low = min(low, float(sim.geom_data.oMg[i].translation[2] - g.size[0]))
    return low


def scenario(name: str, path: str, friction: bool = True) -> Scenario:
    """``friction`` False: the joint dry friction left out (diffgym ignores the file's
    ``joint.frictionloss``; time_mujoco zeroes MuJoCo's ``dof_frictionloss``)."""
    if name == "ur5":
        return _ur5_scenario(path)
    # Gymnasium's hopper asks for RK4 (run with Euler, named, as the table notes say); the Go1
    # URDF's joint dry friction (0.2 N m) is simulated, as MuJoCo's URDF importer reads it into
    # frictionloss: both engines step the same model (``friction=False``: neither simulates it)
    ignore = ("option.integrator",) + (() if friction else ("joint.frictionloss",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedIgnoredWarning)
        sim = Simulator.from_file(path, ignore_unsupported=ignore)
    q, v = sim.q0, np.zeros(sim.nv)
    control = None
    q_ref = None
    if name == "cartpole":
        jid = sim.joint_id("hinge") if sim.model.existJointName("hinge") else sim.model.njoints - 1
        q[sim.model.joints[jid].idx_q] += 0.3
    elif name == "billiards":
        v[0] = 2.0                       # cue ball (identity orientation: local = world axes)
    elif name == "go1":
        q[2] += GO1_CLEARANCE - _lowest_point(sim, q)
        q_ref = sim.q0[7:].copy()
        tau = np.zeros(sim.nv)

        def control(q, v, tau=tau, q_ref=q_ref):
            tau[6:] = GO1_KP * (q_ref - q[7:]) - GO1_KD * v[6:]
            return tau
    return Scenario(name, path, sim, q, v, control, q_ref, friction=friction)


def _ur5_scenario(path: str) -> Scenario:
    """The UR5 bolted to the ground (fixed base), released 0.2-0.3 rad away from UR5_POSE and
    pulled back by a PD on top of exact gravity compensation: it swings without touching
    anything (no contacts, no joint limits)."""
    import pinocchio as pin
    sim = Simulator.from_file(path, floating_base=False)
    q_ref = UR5_POSE.copy()
    gdata = sim.model.createData()

    def control(q, v, q_ref=q_ref):
        return pin.computeGeneralizedGravity(sim.model, gdata, q) + UR5_KP * (q_ref - q) - UR5_KD * v
    return Scenario("ur5", path, sim, q_ref + UR5_OFFSET, np.zeros(sim.nv), control, q_ref,
                    kp=UR5_KP, kd=UR5_KD, gravcomp=True)


def time_diffgym(sc: Scenario, steps: int, warmup: int, repeats: int) -> tuple[float, float, int]:
    """Median seconds per step, mean contact points per timed step, non-converged steps."""
    sim = sc.sim
    zero = np.zeros(sim.nv)
    ctrl = sc.control
    times, contacts, failed = [], [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverWarning)
        for _ in range(repeats):
            sim.reset_warmstart()
            q, v = sc.q0.copy(), sc.v0.copy()
            for _ in range(warmup):
                q, v = sim.step(q, v, ctrl(q, v) if ctrl else zero)
            n_c = n_fail = 0
            t0 = time.perf_counter()
            for _ in range(steps):
                q, v = sim.step(q, v, ctrl(q, v) if ctrl else zero)
                last = sim.last
                n_c += last.num_contacts      # (not the list of mode names)
                n_fail += not last.converged
            times.append((time.perf_counter() - t0) / steps)
            contacts.append(n_c / steps)
            failed = max(failed, n_fail)
    return float(np.median(times)), float(np.mean(contacts)), failed


# -- MuJoCo side -----------------------------------------------------------------------------
def _import_mujoco():
    try:
        import mujoco
    except ImportError:
        return None
    return mujoco


def _mujoco_urdf(mujoco, sc: Scenario):
    """Build the URDF in MuJoCo as diffgym reads it; returns (model, note)."""
    try:
        mujoco.MjModel.from_xml_path(sc.path)
        first = ""
    except Exception as exc:      # noqa: BLE001 - MuJoCo raises ValueError with its message
        first = str(exc).splitlines()[0].removeprefix("Error: ")
    try:
        m, fixed = _mujoco_urdf_spec(mujoco, sc)
    except Exception as exc:   # noqa: BLE001 - an old MuJoCo without MjSpec, or a compile error
        raise NotAvailable(f"MuJoCo cannot load it ({first or 'as is: ok'}; via MjSpec: "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    floating = sc.base_nq > 0
    note = ((f"cannot load the URDF as is ({first}); " if first else "")
            + "built via MjSpec as diffgym reads URDF: "
            + ("free base" if floating else "fixed base, package:// mesh paths resolved")
            + ", ground plane, robot-ground contacts only, visuals dropped, PD as actuators"
            + (", gravity compensation as body gravcomp" if sc.gravcomp else "")
            + (f", singular inertia of link(s) {', '.join(fixed)} -> diagonal" if fixed else ""))
    return m, note


def _mujoco_urdf_spec(mujoco, sc: Scenario):
    with open(sc.path, encoding="utf-8") as fh:
        package_paths = "package://" in fh.read()
    # MuJoCo cannot open package:// mesh paths: resolve them as diffgym's URDF loader does
    spec = (mujoco.MjSpec.from_string(_resolve_package_paths(sc.path)) if package_paths
            else mujoco.MjSpec.from_file(sc.path))
    spec.compiler.discardvisual = True
    fixed = []
    for body in spec.bodies:
        fi = np.asarray(body.fullinertia, float)
        if body.explicitinertial and np.all(np.isfinite(fi)):
            I = np.array([[fi[0], fi[3], fi[4]], [fi[3], fi[1], fi[5]], [fi[4], fi[5], fi[2]]])
            if np.linalg.eigvalsh(I)[0] <= 0:
                body.fullinertia = [np.nan] * 6
                body.inertia = np.maximum(np.diag(I), 1e-9)
                fixed.append(body.name)
    root = spec.worldbody.first_body()
    if sc.sim.model.joints[1].shortname() == "JointModelFreeFlyer" and not root.joints:
        root.add_freejoint(name=sc.sim.model.names[1])
    for g in spec.geoms:                       # robot geoms touch the ground, not each other
        g.contype, g.conaffinity = 1, 0
    spec.worldbody.add_geom(name="ground", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 1],
                            contype=0, conaffinity=1)
    spec.option.timestep = sc.sim.dt
    if sc.gravcomp:
        for body in spec.bodies:
            body.gravcomp = 1.0
    if sc.q_ref is not None:
        _add_pd_actuators(mujoco, spec, sc)
    return spec.compile(), fixed


def _resolve_package_paths(path: str) -> str:
    """The URDF text with ``package://NAME/...`` replaced by absolute paths, NAME found among
    the file's ancestors (as diffgym's URDF loader resolves them)."""
    import re
    with open(path, encoding="utf-8") as fh:
        text = fh.read()

    def repl(match):
        rel = match.group(1)
        anc = os.path.dirname(os.path.abspath(path))
        for _ in range(6):
            anc = os.path.dirname(anc)
            cand = os.path.join(anc, rel)
            if os.path.exists(cand):
                return cand
        return match.group(0)
    return re.sub(r"package://([^\"'<>]+)", repl, text)


def _add_pd_actuators(mujoco, spec, sc: Scenario) -> None:
    """The diffgym-side PD as MuJoCo actuators: force = KP ctrl - KP q - KD qdot."""
    model = sc.sim.model
    for j in range(2 if sc.base_nq else 1, model.njoints):
        act = spec.add_actuator()
        act.name = "pd_" + model.names[j]
        act.target = model.names[j]
        act.trntype = mujoco.mjtTrn.mjTRN_JOINT
        act.gaintype = mujoco.mjtGain.mjGAIN_FIXED
        act.gainprm = [sc.kp] + [0.0] * (len(act.gainprm) - 1)
        act.biastype = mujoco.mjtBias.mjBIAS_AFFINE
        act.biasprm = [0.0, -sc.kp, -sc.kd] + [0.0] * (len(act.biasprm) - 3)
        act.ctrllimited = 0
        act.forcelimited = 0


def _quat_xyzw_to_matrix(x, y, z, w) -> np.ndarray:
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def mujoco_state(mujoco, m, sc: Scenario) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qpos, qvel, ctrl of MuJoCo for the scenario's diffgym state (joints matched by name)."""
    model, sim = sc.sim.model, sc.sim
    qpos, qvel = m.qpos0.copy(), np.zeros(m.nv)
    ctrl = np.zeros(m.nu)
    J = mujoco.mjtJoint
    # the diffgym configuration of MuJoCo's qpos0: the MJCF default pose (diffgym's q0 for an
    # MJCF file); for a URDF the zero joint angles (diffgym's q0 is then the SRDF pose)
    if sc.path.lower().endswith(".urdf"):
        import pinocchio as pin
        q_at_mj0 = pin.neutral(model)
    else:
        q_at_mj0 = sim.sm.q0
    for j in range(1, model.njoints):
        name, jm = model.names[j], model.joints[j]
        if jm.shortname() == "JointModelSpherical" and name.endswith("_rot") and j > 1 \
                and model.joints[j - 1].shortname() == "JointModelTranslation":
            continue                     # the rotation half of an MJCF free joint (done below)
        jid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            # an MJCF <freejoint/> without a name: the joint of the body of the same name
            bid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, name.rsplit("_joint", 1)[0])
            if bid < 0 or m.body_jntnum[bid] != 1:
                raise NotAvailable(f"joint {name!r} has no MuJoCo counterpart")
            jid = int(m.body_jntadr[bid])
        qa, da, typ = int(m.jnt_qposadr[jid]), int(m.jnt_dofadr[jid]), int(m.jnt_type[jid])
        iq, iv = jm.idx_q, jm.idx_v
        q, v = sc.q0[iq:iq + jm.nq], sc.v0[iv:iv + jm.nv]
        if typ == J.mjJNT_FREE and jm.nq == 3:          # MJCF free joint: translation + ball
            jr = model.joints[j + 1]
            qr, vr = sc.q0[jr.idx_q:jr.idx_q + 4], sc.v0[jr.idx_v:jr.idx_v + 3]
            qpos[qa:qa + 3], qvel[da:da + 3] = q, v            # both: world axes
            qpos[qa + 3:qa + 7] = [qr[3], qr[0], qr[1], qr[2]]
            qvel[da + 3:da + 6] = vr                           # both: body axes
        elif typ == J.mjJNT_FREE and jm.nq == 7:
            qpos[qa:qa + 3] = q[:3]
            qpos[qa + 3:qa + 7] = [q[6], q[3], q[4], q[5]]
            qvel[da:da + 3] = _quat_xyzw_to_matrix(*q[3:7]) @ v[:3]   # MuJoCo: world axes
            qvel[da + 3:da + 6] = v[3:6]                               # both: body axes
        elif typ == J.mjJNT_BALL and jm.nq == 4:
            qpos[qa:qa + 4] = [q[3], q[0], q[1], q[2]]
            qvel[da:da + 3] = v
        elif typ in (J.mjJNT_HINGE, J.mjJNT_SLIDE) and jm.nq == 1:
            # offsets from each engine's default pose (their zero references may differ)
            qpos[qa] = m.qpos0[qa] + (q[0] - q_at_mj0[iq])
            qvel[da] = v[0]
        else:
            raise NotAvailable(f"joint {name!r}: no state mapping for this joint type")
    if sc.q_ref is not None:
        for a in range(m.nu):
            jid = int(m.actuator_trnid[a, 0])
            name = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, jid)
            jm = model.joints[model.getJointId(name)]
            ctrl[a] = sc.q_ref[jm.idx_q - sc.base_nq]
    return qpos, qvel, ctrl


def mujoco_model(mujoco, sc: Scenario):
    """MuJoCo's model of the scenario's file, (model, note); raises NotAvailable."""
    note = ""
    if sc.path.lower().endswith(".urdf"):
        m, note = _mujoco_urdf(mujoco, sc)
    else:
        try:
            m = mujoco.MjModel.from_xml_path(sc.path)
        except Exception as exc:  # noqa: BLE001
            raise NotAvailable(f"MuJoCo cannot load it: {str(exc).splitlines()[0]}") from exc
    if abs(m.opt.timestep - sc.sim.dt) > 1e-12:
        raise NotAvailable(f"time steps differ (MuJoCo {m.opt.timestep}, diffgym {sc.sim.dt})")
    return m, note


def time_mujoco(mujoco, sc: Scenario, steps: int, warmup: int, repeats: int):
    """(median seconds per step, mean ncon, note); raises NotAvailable."""
    m, note = mujoco_model(mujoco, sc)
    if not sc.friction:
        m.dof_frictionloss[:] = 0.0
    qpos, qvel, ctrl = mujoco_state(mujoco, m, sc)
    d = mujoco.MjData(m)
    step = mujoco.mj_step
    times, contacts = [], []
    for _ in range(repeats):
        mujoco.mj_resetData(m, d)
        d.qpos[:] = qpos
        d.qvel[:] = qvel
        d.ctrl[:] = ctrl
        for _ in range(warmup):
            step(m, d)
        n_c = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            step(m, d)
            n_c += d.ncon
        times.append((time.perf_counter() - t0) / steps)
        contacts.append(n_c / steps)
    return float(np.median(times)), float(np.mean(contacts)), note


# -- step Jacobians ---------------------------------------------------------------------------
@dataclass
class JacRow:
    """One row of the Jacobian table; times are seconds per step / per Jacobian."""

    name: str
    nv: int = 0
    nu_mj: int = 0
    states: int = 0
    fd_states: int = 0
    contacts: float = float("nan")
    t_fwd: float = float("nan")           # our forward step
    t_jac: float = float("nan")           # our step with jacobian=True
    t_fd: float = float("nan")            # central differences of our step (6 nv steps)
    t_mj: float = float("nan")            # mj_step
    t_mjd: float = float("nan")           # mjd_transitionFD, centered
    nonconverged: int = 0
    mj_note: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def jac_ratio(self) -> float:
        return self.t_jac / self.t_fwd if self.t_fwd > 0 else float("nan")

    @property
    def fd_ratio(self) -> float:
        return self.t_fd / self.t_jac if self.t_jac > 0 else float("nan")

    @property
    def mjd_ratio(self) -> float:
        return self.t_jac / self.t_mjd if self.t_mjd > 0 else float("nan")


def fd_step_jacobian(sim: Simulator, q: np.ndarray, v: np.ndarray, tau: np.ndarray,
                     eps: float = FD_EPS) -> np.ndarray:
    """d(q1, v1)/d(q, v, tau) (2nv, 3nv) by central differences of our step: 2 (2nv + nv)
    steps, q perturbed in the tangent space (what a user without step Jacobians would do)."""
    import pinocchio as pin
    nv, model = sim.nv, sim.model
    out = np.empty((2 * nv, 3 * nv))
    e = np.zeros(nv)
    for col in range(3 * nv):
        i = col % nv
        res = []
        for sgn in (1.0, -1.0):
            e[i] = sgn * eps
            if col < nv:
                res.append(sim.step(pin.integrate(model, q, e), v, tau))
            elif col < 2 * nv:
                res.append(sim.step(q, v + e, tau))
            else:
                res.append(sim.step(q, v, tau + e))
        e[i] = 0.0
        (qa, va), (qb, vb) = res
        out[:nv, col] = pin.difference(model, qb, qa) / (2 * eps)
        out[nv:, col] = (va - vb) / (2 * eps)
    return out


def time_jacobian_diffgym(sc: Scenario, states: int, warmup: int, fd_states: int, repeats: int):
    """Median seconds per forward step, per step with Jacobian (both over the same ``states``
    steps after ``warmup``), per finite-difference Jacobian (at the first ``fd_states`` of
    those states); mean contacts per step; non-converged steps."""
    sim = sc.sim
    zero = np.zeros(sim.nv)
    ctrl = sc.control
    t_fwd, t_jac, t_fd, contacts, failed = [], [], [], [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverWarning)
        # one untimed step with Jacobian: module import and per-model set-up are not timed
        sim.step(sc.q0, sc.v0, ctrl(sc.q0, sc.v0) if ctrl else zero, jacobian=True)
        for _ in range(repeats):
            for kind in ("fwd", "jac", "fd"):
                sim.reset_warmstart()
                q, v = sc.q0.copy(), sc.v0.copy()
                for _ in range(warmup):
                    q, v = sim.step(q, v, ctrl(q, v) if ctrl else zero)
                n_c = n_fail = 0
                if kind == "fd":
                    taken = []
                    for _ in range(fd_states):
                        tau = (ctrl(q, v) if ctrl else zero).copy()
                        taken.append((q, v, tau))
                        q, v = sim.step(q, v, tau)
                    t0 = time.perf_counter()
                    for qs, vs, taus in taken:
                        fd_step_jacobian(sim, qs, vs, taus)
                    t_fd.append((time.perf_counter() - t0) / max(1, fd_states))
                    continue
                jac = kind == "jac"
                t0 = time.perf_counter()
                for _ in range(states):
                    if jac:
                        q, v, _j = sim.step(q, v, ctrl(q, v) if ctrl else zero, jacobian=True)
                    else:
                        q, v = sim.step(q, v, ctrl(q, v) if ctrl else zero)
                    n_c += sim.last.num_contacts
                    n_fail += not sim.last.converged
                (t_jac if jac else t_fwd).append((time.perf_counter() - t0) / states)
                contacts.append(n_c / states)
                failed = max(failed, n_fail)
    return (float(np.median(t_fwd)), float(np.median(t_jac)), float(np.median(t_fd)),
            float(np.mean(contacts)), failed)


def time_jacobian_mujoco(mujoco, sc: Scenario, states: int, warmup: int, fd_states: int,
                         repeats: int):
    """Median seconds per mj_step (over ``states`` steps after ``warmup``) and per centered
    ``mjd_transitionFD`` (at ``fd_states`` of those states, eps FD_EPS); (t_step, t_fd, nu, note)."""
    m, note = mujoco_model(mujoco, sc)
    if m.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4:
        # mjd_transitionFD does not support RK4; diffgym integrates with semi-implicit Euler
        m.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
        note = (note + "; " if note else "") + "file asks for RK4, timed with Euler (mjd_transitionFD has no RK4)"
    qpos, qvel, ctrl = mujoco_state(mujoco, m, sc)
    d = mujoco.MjData(m)
    nx = 2 * m.nv + m.na
    A = np.zeros((nx, nx))
    B = np.zeros((nx, m.nu))
    t_step, t_fd = [], []
    for _ in range(repeats):
        for kind in ("step", "fd"):
            mujoco.mj_resetData(m, d)
            d.qpos[:], d.qvel[:], d.ctrl[:] = qpos, qvel, ctrl
            for _ in range(warmup):
                mujoco.mj_step(m, d)
            if kind == "step":
                t0 = time.perf_counter()
                for _ in range(states):
                    mujoco.mj_step(m, d)
                t_step.append((time.perf_counter() - t0) / states)
            else:
                total = 0.0
                for _ in range(fd_states):
                    t0 = time.perf_counter()
                    mujoco.mjd_transitionFD(m, d, FD_EPS, True, A, B if m.nu else None, None, None)
                    total += time.perf_counter() - t0
                    mujoco.mj_step(m, d)
                t_fd.append(total / max(1, fd_states))
    return float(np.median(t_step)), float(np.median(t_fd)), int(m.nu), note


def run_jacobians(names: list[str], states: int, warmup: int, fd_states: int,
                  repeats: int) -> list[JacRow]:
    mujoco = _import_mujoco()
    rows = []
    for name in names:
        row = JacRow(name, states=states, fd_states=fd_states)
        rows.append(row)
        try:
            path = asset_path(MODELS[name])
        except FileNotFoundError as exc:
            row.notes.append(f"model file missing: {exc}")
            continue
        sc = scenario(name, path)
        row.nv = sc.sim.nv
        row.t_fwd, row.t_jac, row.t_fd, row.contacts, row.nonconverged = time_jacobian_diffgym(
            sc, states, warmup, fd_states, repeats)
        if row.nonconverged:
            row.notes.append(f"diffgym solver missed tol on {row.nonconverged}/{states} steps")
        if mujoco is None:
            row.notes.append("MuJoCo n/a: not installed")
            continue
        try:
            row.t_mj, row.t_mjd, row.nu_mj, row.mj_note = time_jacobian_mujoco(
                mujoco, sc, states, warmup, fd_states, repeats)
        except NotAvailable as exc:
            row.notes.append(f"MuJoCo n/a: {exc}")
    return rows


_JAC_COLUMNS = [("model", 9, "<"), ("nv", 3, ">"), ("contacts", 8, ">"), ("fwd us", 8, ">"),
                ("jac us", 8, ">"), ("jac/fwd", 7, ">"), ("ourFD us", 9, ">"), ("FD/jac", 7, ">"),
                ("mj_step us", 10, ">"), ("mjdFD us", 9, ">"), ("jac/mjdFD", 9, ">")]


def format_jacobian_table(rows: list[JacRow]) -> str:
    lines = ["  ".join(f"{h:{a}{w}}" for h, w, a in _JAC_COLUMNS) + "  note"]
    for r in rows:
        cells = [r.name, str(r.nv) if r.nv else "n/a", _fmt(r.contacts, ".1f"),
                 _fmt(r.t_fwd * 1e6, ".1f"), _fmt(r.t_jac * 1e6, ".1f"), _fmt(r.jac_ratio, ".2f"),
                 _fmt(r.t_fd * 1e6, ".0f"), _fmt(r.fd_ratio, ".1f"), _fmt(r.t_mj * 1e6, ".1f"),
                 _fmt(r.t_mjd * 1e6, ".1f"), _fmt(r.mjd_ratio, ".2f")]
        lines.append("  ".join(f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, _JAC_COLUMNS))
                     + "  " + "; ".join(r.notes))
    return "\n".join(lines)


def write_jacobian_csv(rows: list[JacRow], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "nv", "mujoco_nu", "states", "fd_states", "contacts_diffgym",
                    "forward_us", "jacobian_us", "jacobian_over_forward", "diffgym_fd_us",
                    "fd_over_jacobian", "mj_step_us", "mjd_transitionFD_us",
                    "jacobian_over_mjd_fd", "note"])
        for r in rows:
            w.writerow([r.name, r.nv, r.nu_mj, r.states, r.fd_states, f"{r.contacts:.3f}",
                        f"{r.t_fwd * 1e6:.2f}", f"{r.t_jac * 1e6:.2f}", f"{r.jac_ratio:.3f}",
                        f"{r.t_fd * 1e6:.2f}", f"{r.fd_ratio:.3f}", f"{r.t_mj * 1e6:.2f}",
                        f"{r.t_mjd * 1e6:.2f}", f"{r.mjd_ratio:.3f}",
                        "; ".join(r.notes + ([r.mj_note] if r.mj_note else []))])


def _jacobian_report(rows: list[JacRow], states: int, warmup: int, fd_states: int,
                     repeats: int) -> None:
    print("Step Jacobians: d(q1, v1)/d(q, v, tau)")
    print(format_jacobian_table(rows))
    print()
    print(f"median of {repeats} repeats; forward and jac: {states} consecutive steps after {warmup} "
          f"warm-up steps (the same states); ourFD: central differences of our step, 2(2nv+nv) "
          f"steps, eps {FD_EPS:g}, at the first {fd_states} of those states; mjdFD: MuJoCo's "
          f"mjd_transitionFD(centered=True, eps {FD_EPS:g}) on its own trajectory of the same "
          "file, state and control (its B is w.r.t. its nu actuator controls, ours w.r.t. all nv "
          "generalized forces).")
    met = [r.name for r in rows if np.isfinite(r.jac_ratio) and r.jac_ratio <= JAC_TARGET]
    missed = [f"{r.name} ({r.jac_ratio:.2f}x)" for r in rows
              if np.isfinite(r.jac_ratio) and r.jac_ratio > JAC_TARGET]
    print(f"jac/fwd target (<= {JAC_TARGET:g}x): met on {', '.join(met) or 'none'}"
          + (f"; NOT met on {', '.join(missed)}" if missed else ""))
    for r in rows:
        if r.name == "hopper" and np.isfinite(r.mjd_ratio):
            verdict = "met" if r.mjd_ratio < 1.0 else "NOT met"
            print(f"hopper target (our step with Jacobian faster than MuJoCo's centered FD): {verdict} "
                  f"({r.t_jac * 1e6:.0f} us vs {r.t_mjd * 1e6:.0f} us)")
    for r in rows:
        if r.mj_note:
            print(f"{r.name}: MuJoCo {r.mj_note}")


# -- report ----------------------------------------------------------------------------------
_COLUMNS = [("model", 10, "<"), ("nq/nv", 7, ">"), ("contacts", 8, ">"), ("mj-contacts", 11, ">"),
            ("diffgym us/step", 15, ">"), ("steps/s", 8, ">"), ("MuJoCo us/step", 14, ">"),
            ("mj steps/s", 10, ">"), ("ratio", 7, ">")]


def _fmt(x: float, spec: str) -> str:
    return format(x, spec) if np.isfinite(x) else "n/a"


def format_table(rows: list[Row]) -> str:
    lines = ["  ".join(f"{h:{a}{w}}" for h, w, a in _COLUMNS) + "  note"]
    for r in rows:
        cells = [r.name, f"{r.nq}/{r.nv}" if r.nq else "n/a", _fmt(r.contacts, ".1f"),
                 _fmt(r.contacts_mj, ".1f"), _fmt(r.t_ours * 1e6, ".1f"),
                 _fmt(1.0 / r.t_ours if r.t_ours > 0 else math.nan, ".0f"),
                 _fmt(r.t_mj * 1e6, ".1f"), _fmt(1.0 / r.t_mj if r.t_mj > 0 else math.nan, ".0f"),
                 (f"{r.ratio:.1f}x" if np.isfinite(r.ratio) else "n/a")]
        note = "; ".join(r.notes)
        lines.append("  ".join(f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, _COLUMNS)) + "  " + note)
    return "\n".join(lines)


def write_csv(rows: list[Row], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "nq", "nv", "dt", "contacts_diffgym", "contacts_mujoco",
                    "diffgym_us_per_step", "mujoco_us_per_step", "ratio",
                    "diffgym_nonconverged_steps", "timed_steps", "note"])
        for r in rows:
            w.writerow([r.name, r.nq, r.nv, r.dt, f"{r.contacts:.3f}", f"{r.contacts_mj:.3f}",
                        f"{r.t_ours * 1e6:.2f}", f"{r.t_mj * 1e6:.2f}", f"{r.ratio:.3f}",
                        r.nonconverged, r.timed_steps, "; ".join(r.notes + ([r.mj_note] if r.mj_note else []))])


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per model and repeat")
    parser.add_argument("--models", nargs="*", default=None, help=f"subset of {list(MODELS)}")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before timing")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (the median is reported)")
    parser.add_argument("--csv", default=None, help="also write the table to this CSV file "
                        "(and the Jacobian table to FILE_jacobian.csv unless --jacobian-csv)")
    parser.add_argument("--jacobian", action=argparse.BooleanOptionalAction, default=True,
                        help=f"also time step Jacobians on {', '.join(JAC_MODELS)} (default: on)")
    parser.add_argument("--jac-states", type=int, default=100,
                        help="steps timed with and without jacobian=True per model and repeat")
    parser.add_argument("--jac-warmup", type=int, default=200,
                        help="untimed steps before the Jacobian timings (the hopper has landed)")
    parser.add_argument("--fd-states", type=int, default=5,
                        help="states at which the finite-difference Jacobians are timed")
    parser.add_argument("--jacobian-csv", default=None, help="write the Jacobian table to this CSV")
    from .bench_scaling import add_arguments as scaling_arguments
    scaling_arguments(parser)
    parser.add_argument("--smooth", action="store_true",
                        help="instead: the smooth gradient mode against the exact one (gradients "
                             "swept across the hopper's foot strike and the cart-pole's rail stop; "
                             "cost of a smooth step Jacobian on hopper, go1, billiards)")
    parser.add_argument("--bridge", action="store_true",
                        help="instead: the torch bridge's overhead on a 100-step hopper rollout gradient "
                             "(N = 1, 64; --repeats rounds)")
    parser.add_argument("--bridge-overhead", action=argparse.BooleanOptionalAction, default=None,
                        help="after the tables, also the torch bridge's overhead (as --bridge; "
                             "default: on when no --models subset is given)")
    return parser


def run(names: list[str], steps: int, warmup: int = 20, repeats: int = 3) -> tuple[list[Row], str | None]:
    mujoco = _import_mujoco()
    missing = None if mujoco is not None else "mujoco not installed: pip install diffgym[bench]"
    rows = []
    # the Go1 twice: its URDF joint friction left out in both engines (the contact kernels
    # alone) and simulated in both (like with like)
    runs = [(n, f) for n in names for f in ((False, True) if n == "go1" else (True,))]
    for name, friction in runs:
        row = Row(name if friction else name + "-nofric", timed_steps=steps)
        rows.append(row)
        try:
            path = asset_path(MODELS[name])
        except FileNotFoundError as exc:
            row.notes.append(f"model file missing: {exc}")
            continue
        sc = scenario(name, path, friction)
        if name == "go1":
            row.notes.append("joint friction 0.2 N m in both engines" if friction else
                             "joint friction left out in both (MuJoCo dof_frictionloss = 0)")
        row.nq, row.nv, row.dt = sc.sim.nq, sc.sim.nv, sc.sim.dt
        row.t_ours, row.contacts, row.nonconverged = time_diffgym(sc, steps, warmup, repeats)
        if row.nonconverged:
            row.notes.append(f"diffgym solver missed tol on {row.nonconverged}/{steps} steps")
        if mujoco is None:
            row.notes.append("MuJoCo n/a: not installed")
            continue
        try:
            row.t_mj, row.contacts_mj, row.mj_note = time_mujoco(mujoco, sc, steps, warmup, repeats)
        except NotAvailable as exc:
            row.notes.append(f"MuJoCo n/a: {exc}")
    return rows, missing


def run_bridge(args) -> int:
    """``diffgym bench --bridge``: the torch bridge's overhead on a 100-step DiffHopper-v0 rollout
    gradient, N = 1 and 64: (reset, 100 steps of ``TorchVecEnv.step`` in float32 as SHAC runs it,
    ``loss.backward()``) against the bare numpy chain of the same step Jacobians (N separate
    environments, ``step_with_jacobian``, reverse chain ``g <- J^T g`` per copy, cut where an
    episode ends). Both roll out the same uniform random actions from the same seeds, with the
    loss sum_k sum_i (r + c . obs); a float64 bridge is checked to give the numpy chain's
    gradient first. Blocks alternate (raw, bridge) for N = 1 then 64, ``--repeats`` rounds; the
    ratio is the median of the per-round ratios. All in this process (``num_workers=1``)."""
    import gymnasium as gym
    import torch

    import diffgym
    import diffgym.envs  # noqa: F401  (registers the ids)
    from diffgym.torch_bridge import TorchVecEnv

    env_id, steps, sizes, seed = "DiffHopper-v0", 100, (1, 64), 0
    rounds = max(1, int(getattr(args, "repeats", 3) or 1))
    reps = {1: 8, 64: 1}                 # rollouts per block: blocks of comparable length
    setups = {}
    for n in sizes:
        rng = np.random.default_rng(n)
        envs = [gym.make(env_id).unwrapped for _ in range(n)]
        # float32-representable actions: the float32 bridge steps exactly the raw chain's rollout
        A = rng.uniform(-1.0, 1.0, (steps, n, envs[0].n_a)).astype(np.float32).astype(np.float64)
        c = rng.standard_normal(envs[0].obs_dim) * 0.01
        venv = diffgym.make_vec(env_id, n, num_workers=1)
        setups[n] = (envs, A, c, venv, TorchVecEnv(venv, dtype=torch.float32),
                     TorchVecEnv(venv, dtype=torch.float64))

    def raw(n):
        envs, A, c, *_ = setups[n]
        for i, e in enumerate(envs):
            e.reset(seed=seed + i)
        jacs, done = [], np.zeros((steps, n), dtype=bool)
        for k in range(steps):
            row = []
            for i, e in enumerate(envs):
                o, r, te, tr, _, j = e.step_with_jacobian(A[k, i])
                row.append(j)
                if te or tr:
                    done[k, i] = True
                    e.reset()
            jacs.append(row)
        gA, g0 = np.empty_like(A), []
        for i in range(n):
            g = np.zeros(envs[i].n_x)
            for k in range(steps - 1, -1, -1):
                j = jacs[k][i]
                # obs_k of a row whose episode ended is the reset observation: no gradient
                g = np.zeros_like(g) if done[k, i] else g + j.obs_state.T @ c
                gA[k, i] = j.state_action.T @ g + j.reward_action
                g = j.state_state.T @ g + j.reward_state
            g0.append(g)
        return gA, np.stack(g0)

    def bridge(n, tenv):
        _, A, c, *_ = setups[n]
        tenv.reset(seed=seed)
        At = torch.tensor(A, dtype=tenv.dtype, requires_grad=True)
        ct = torch.tensor(c, dtype=tenv.dtype)
        rs, os_ = [], []
        for a in At.unbind(0):                  # per-step actions, as a policy would give them
            obs, r, *_ = tenv.step(a)
            rs.append(r)
            os_.append(obs)
        (torch.stack(rs).sum() + (torch.stack(os_) @ ct).sum()).backward()
        return At.grad, tenv.initial_state.grad

    print(f"torch bridge overhead: {steps}-step {env_id} rollout gradient (actions and initial "
          f"state), bridge time / raw numpy chain of the step Jacobians", flush=True)
    for n in sizes:                                         # warm-up and the gradient check
        gA, g0 = raw(n)
        bA, b0 = bridge(n, setups[n][5])
        err = max(float(np.abs(bA.numpy() - gA).max() / max(1.0, np.abs(gA).max())),
                  float(np.abs(b0.numpy()[:, :g0.shape[1]] - g0).max() / max(1.0, np.abs(g0).max())))
        print(f"  N = {n}: float64 bridge gradient vs numpy chain, max relative difference {err:.1e}")
        bridge(n, setups[n][4])
    times = {(n, kind): [] for n in sizes for kind in ("raw", "bridge")}
    cpu = {(n, kind): [] for n in sizes for kind in ("raw", "bridge")}
    for _ in range(rounds):
        for n in sizes:
            for kind in ("raw", "bridge"):
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(reps[n]):
                    raw(n) if kind == "raw" else bridge(n, setups[n][4])
                times[n, kind].append((time.perf_counter() - t0) / reps[n])
                cpu[n, kind].append((time.process_time() - c0) / reps[n])
    print(f"{'N':>4}{'raw chain s':>13}{'bridge s':>11}{'ratio':>8}{'CPU-time ratio':>16}   (target <= 1.3)")
    for n in sizes:
        r, b = np.array(times[n, "raw"]), np.array(times[n, "bridge"])
        ratio = float(np.median(b / r))
        cratio = float(np.median(np.array(cpu[n, "bridge"]) / np.array(cpu[n, "raw"])))
        print(f"{n:>4}{np.median(r):>13.3f}{np.median(b):>11.3f}{ratio:>7.2f}x{cratio:>15.2f}x   "
              f"{'met' if ratio <= 1.3 else 'NOT met'}; per round: "
              + " ".join(f"{x:.2f}" for x in b / r))
    print(f"median over {rounds} rounds (blocks alternate raw / bridge, N = 1 x{reps[1]} rollouts, "
          f"N = 64 x{reps[64]}); float32 bridge (as SHAC), in this process; the CPU-time ratio "
          "(process time) is less sensitive to other load on a shared machine")
    for n in sizes:
        setups[n][3].close()
    return 0


def main(args) -> int:
    if getattr(args, "scaling", False):
        from .bench_scaling import main as scaling_main
        return scaling_main(args)
    names = getattr(args, "models", None) or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    if getattr(args, "bridge", False):
        return run_bridge(args)
    if getattr(args, "smooth", False):
        from .bench_smooth import main as smooth_main
        return smooth_main(args)
    steps = int(getattr(args, "steps", 2000))
    warmup = int(getattr(args, "warmup", 20) or 0)
    repeats = max(1, int(getattr(args, "repeats", 3) or 1))
    if steps < 1:
        raise SystemExit(f"--steps must be positive, got {steps}")
    rows, missing = run(names, steps, warmup, repeats)
    print(format_table(rows))
    print()
    print(f"median of {repeats} repeats of {steps} steps after {warmup} warm-up steps, same file, "
          "same initial state and control for both engines; ratio = diffgym / MuJoCo step time.")
    if missing:
        print(f"MuJoCo columns are n/a: {missing}")
    for r in rows:
        if r.mj_note:
            print(f"{r.name}: MuJoCo {r.mj_note}")
    for r in rows:
        if r.name == "hopper" and np.isfinite(r.ratio):
            verdict = "met" if r.ratio <= HOPPER_TARGET else "NOT met"
            print(f"hopper target (diffgym within {HOPPER_TARGET:g}x of MuJoCo): {verdict} "
                  f"({r.ratio:.1f}x)")
    import pinocchio
    mj = _import_mujoco()
    blas = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "default"
    print(f"python {platform.python_version()}, numpy {np.__version__}, pinocchio "
          f"{pinocchio.__version__}, mujoco {mj.__version__ if mj else 'n/a'}, "
          f"{platform.machine()} x{os.cpu_count()}, BLAS threads {blas} (MuJoCo is single-threaded; "
          "OPENBLAS_NUM_THREADS=1 is faster for diffgym's small dense solves)")
    out = getattr(args, "csv", None)
    if out:
        write_csv(rows, out)
        print(f"wrote {out}")
    if getattr(args, "jacobian", False):
        jnames = [n for n in names if n in JAC_MODELS] if getattr(args, "models", None) else list(JAC_MODELS)
        if jnames:
            jstates = int(getattr(args, "jac_states", 100))
            jwarm = int(getattr(args, "jac_warmup", 200))
            fd_states = int(getattr(args, "fd_states", 5))
            if jstates < 1 or fd_states < 1 or jwarm < 0:
                raise SystemExit(f"--jac-states and --fd-states must be positive and --jac-warmup "
                                 f">= 0, got {jstates}, {fd_states}, {jwarm}")
            jrows = run_jacobians(jnames, jstates, jwarm, fd_states, repeats)
            print()
            _jacobian_report(jrows, jstates, jwarm, fd_states, repeats)
            jout = getattr(args, "jacobian_csv", None) or (
                os.path.splitext(out)[0] + "_jacobian.csv" if out else None)
            if jout:
                write_jacobian_csv(jrows, jout)
                print(f"wrote {jout}")
    # default (None): with the full table only; a Namespace built without the option (as the
    # tests') skips it: it takes minutes
    bridge = getattr(args, "bridge_overhead", False)
    if bridge or (bridge is None and getattr(args, "models", None) is None):
        print()
        run_bridge(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(add_arguments(argparse.ArgumentParser(prog="python -m diffgym.bench",
                                                        description=__doc__.splitlines()[0])).parse_args()))
